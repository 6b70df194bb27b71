//! `pgpipe-probe URL`: what sits behind a PostgreSQL URL, and the
//! `Pooler` setting that is safe there (see the library's docs).

use std::process::ExitCode;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url] = args.as_slice() else {
        eprintln!(
            "usage: pgpipe-probe URL\n\nfinds out whether a server, a session pooler or a \
             transaction pooler answers at URL (its first host, without TLS), what it keeps \
             (pipelined answers, named statements, session state, cancel requests), and \
             prints the pgpipe Pooler setting that is safe there"
        );
        return ExitCode::from(2);
    };
    match pgpipe_probe::probe(url).await {
        Ok(findings) => {
            println!("{findings}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
