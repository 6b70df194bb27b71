//! A load generator for the example service: `CONCURRENCY` clients (16),
//! each on a keep-alive connection, reading accounts and, one request in
//! ten, moving money between them, against `TARGET` (`127.0.0.1:3000`).
//!
//! ```text
//! cargo run --release -p pgpipe-examples --bin web-service &
//! cargo run --release -p pgpipe-examples --bin load-generator
//! ```
//!
//! It prints the requests per second by HTTP status every `REPORT`
//! seconds (5), and stops after `DURATION` seconds (0, the default: never),
//! on Ctrl-C or on `SIGTERM`. A client that cannot connect (the service is
//! starting, or stopping) tries again every half second. `ACCOUNTS` (1000)
//! is how many accounts the service has.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

/// Answers by status since the last report (`0`: no answer).
type Counts = Arc<Mutex<BTreeMap<u16, u64>>>;

fn setting(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .map_err(|_| format!("{name}={text}: expected a whole number")),
        Err(_) => Ok(default),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let target = std::env::var("TARGET").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let clients = setting("CONCURRENCY", 16)?;
    let accounts = setting("ACCOUNTS", 1000)?.max(2);
    let report = Duration::from_secs(setting("REPORT", 5)?.max(1));
    let duration = setting("DURATION", 0)?;
    let counts = Counts::default();
    for client in 0..clients {
        let (target, counts) = (target.clone(), Arc::clone(&counts));
        tokio::spawn(async move {
            let mut n = client;
            loop {
                let Some(mut sender) = connect(&target).await else {
                    *counts.lock().unwrap().entry(0).or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                };
                // One connection for as long as it answers.
                while let Some(status) = request(&mut sender, n, accounts).await {
                    *counts.lock().unwrap().entry(status).or_default() += 1;
                    n += clients;
                }
            }
        });
    }
    println!("{clients} clients against http://{target}");
    let deadline = (duration > 0).then(|| Instant::now() + Duration::from_secs(duration));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + report, report);
    let stop = pgpipe_examples::shutdown::signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            signal = &mut stop => {
                println!("{signal}: stopping");
                return Ok(());
            }
        }
        let counts = std::mem::take(&mut *counts.lock().unwrap());
        let line: Vec<String> = counts
            .iter()
            .map(|(status, n)| match status {
                0 => format!("no connection {:.0}/s", *n as f64 / report.as_secs_f64()),
                _ => format!("{status} {:.0}/s", *n as f64 / report.as_secs_f64()),
            })
            .collect();
        println!("{}", line.join(", "));
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(());
        }
    }
}

async fn connect(target: &str) -> Option<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(target).await.ok()?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    Some(sender)
}

/// The `n`th request: a read, or every tenth a transfer of 1 to the next
/// account. `None` when the connection is gone.
async fn request(sender: &mut SendRequest<Full<Bytes>>, n: u64, accounts: u64) -> Option<u16> {
    let id = n % accounts + 1;
    let (method, path, body) = if n % 10 == 0 {
        let to = id % accounts + 1;
        let body = format!(r#"{{"from": {id}, "to": {to}, "amount": 1}}"#);
        (Method::POST, "/transfers".to_string(), body)
    } else {
        (Method::GET, format!("/accounts/{id}"), String::new())
    };
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "bank")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .ok()?;
    sender.ready().await.ok()?;
    let response = sender.send_request(request).await.ok()?;
    let status = response.status().as_u16();
    // Read the body to the end, so the connection can carry the next one.
    response.into_body().collect().await.ok()?;
    Some(status)
}
