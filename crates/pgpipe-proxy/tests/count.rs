//! The proxy counts what a client sends, reading frame headers only.

use pgpipe_proxy::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod support;
use support::echo_server;

/// A start-up packet with no parameters (protocol 3.0).
const STARTUP: [u8; 8] = [0, 0, 0, 8, 0, 3, 0, 0];

/// `Parse` of `SELECT 1` as the unnamed statement.
fn parse() -> Vec<u8> {
    let body = b"\0SELECT 1\0\0\0";
    let mut out = vec![b'P'];
    out.extend_from_slice(&(4 + body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

const SYNC: [u8; 5] = [b'S', 0, 0, 0, 4];

/// Writes `bytes` and waits for the echo server to send them back: by then
/// the proxy has counted them.
async fn send(stream: &mut TcpStream, bytes: &[u8]) {
    stream.write_all(bytes).await.unwrap();
    let mut back = vec![0u8; bytes.len()];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(back, bytes);
}

#[tokio::test]
async fn connections_are_counted_by_their_first_parse() {
    let server = echo_server().await;
    let proxy = Proxy::builder(server.to_string()).start().unwrap();
    let mut first = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut second = TcpStream::connect(proxy.addr()).await.unwrap();
    send(&mut first, &STARTUP).await;
    send(&mut second, &STARTUP).await;
    send(&mut first, &[parse(), parse(), SYNC.to_vec()].concat()).await;
    send(&mut second, &SYNC).await;
    let stats = proxy.stats().upstream;
    assert_eq!((stats.parses, stats.connections_with_parses), (2, 1));
    send(&mut first, &[parse(), SYNC.to_vec()].concat()).await;
    send(&mut second, &[parse(), SYNC.to_vec()].concat()).await;
    let stats = proxy.stats().upstream;
    assert_eq!((stats.parses, stats.connections_with_parses), (4, 2));
}
