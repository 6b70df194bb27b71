//! The little HTTP the rig speaks to Patroni's REST API and HAProxy's
//! stats page.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The whole answer to `GET path` on `127.0.0.1:port`, if it answers
/// within 2 s at each step: a frozen agent's listen queue fills, and a
/// connect without a bound would then wait out SYN retries (a minute).
pub(super) fn http_get(port: u16, path: &str) -> Option<String> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let bound = Duration::from_secs(2);
    let mut stream = TcpStream::connect_timeout(&address, bound).ok()?;
    stream.set_read_timeout(Some(bound)).ok()?;
    stream.set_write_timeout(Some(bound)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = Vec::new();
    // A read that times out keeps what came before it.
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8(answer).ok()
}

/// The status code of `GET path` on `127.0.0.1:port`, if it answers.
pub(super) fn http_status(port: u16, path: &str) -> Option<u16> {
    http_get(port, path)?.split(' ').nth(1)?.parse().ok()
}
