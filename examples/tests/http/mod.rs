//! A small HTTP/1.1 client for the tests: one request per connection.

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

/// One HTTP/1.1 request on a connection of its own.
pub(crate) async fn call(
    addr: std::net::SocketAddr,
    method: Method,
    path: &str,
    body: &str,
) -> (StatusCode, String) {
    let (status, _, body) = call_with_retry_after(addr, method, path, body).await;
    (status, body)
}

/// As [`call`], or `None` when the connection is refused or closed
/// without an answer.
pub(crate) async fn try_call(
    addr: std::net::SocketAddr,
    method: Method,
    path: &str,
    body: &str,
) -> Option<(StatusCode, String)> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::from(body.to_string())))
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    let status = response.status();
    let bytes = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// As [`call`], with the `Retry-After` header of the answer.
pub(crate) async fn call_with_retry_after(
    addr: std::net::SocketAddr,
    method: Method,
    path: &str,
    body: &str,
) -> (StatusCode, Option<String>, String) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        retry_after,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}
