//! Opening the socket, the way tokio-postgres does: each resolved address
//! in turn within the connect timeout, `TCP_NODELAY`, keepalives,
//! `tcp_user_timeout`, Unix sockets.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio_postgres::Config;
use tokio_postgres::config::Host;

use super::connect_error;
use crate::error::{Error, ErrorKind};

/// A TCP or Unix socket.
#[derive(Debug)]
pub(crate) enum Socket {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

/// Where a socket went: an address, or a Unix socket's path.
#[derive(Debug, Clone)]
pub(super) enum PeerAddr {
    Tcp(std::net::SocketAddr),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

pub(super) async fn open_socket(
    config: &Config,
    host: &Host,
    port: u16,
) -> Result<(Socket, PeerAddr), Error> {
    match host {
        Host::Tcp(name) => {
            let addrs = with_timeout(config, tokio::net::lookup_host((name.as_str(), port)))
                .await?
                .collect::<Vec<_>>();
            let mut last = None;
            for addr in addrs {
                match with_timeout(config, TcpStream::connect(addr)).await {
                    Ok(stream) => {
                        configure_tcp(config, &stream).map_err(socket_error)?;
                        return Ok((Socket::Tcp(stream), PeerAddr::Tcp(addr)));
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| connect_error("host resolved to no address")))
        }
        #[cfg(unix)]
        Host::Unix(dir) => {
            let path = dir.join(format!(".s.PGSQL.{port}"));
            let stream = with_timeout(config, UnixStream::connect(&path)).await?;
            Ok((Socket::Unix(stream), PeerAddr::Unix(path)))
        }
    }
}

fn configure_tcp(config: &Config, stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let sock = SockRef::from(stream);
    #[cfg(target_os = "linux")]
    if let Some(timeout) = config.get_tcp_user_timeout() {
        sock.set_tcp_user_timeout(Some(*timeout))?;
    }
    if config.get_keepalives() {
        let mut keepalive = TcpKeepalive::new().with_time(config.get_keepalives_idle());
        if let Some(interval) = config.get_keepalives_interval() {
            keepalive = keepalive.with_interval(interval);
        }
        #[cfg(not(windows))]
        if let Some(retries) = config.get_keepalives_retries() {
            keepalive = keepalive.with_retries(retries);
        }
        sock.set_tcp_keepalive(&keepalive)?;
    }
    Ok(())
}

async fn with_timeout<T>(
    config: &Config,
    future: impl Future<Output = io::Result<T>>,
) -> Result<T, Error> {
    let timeout: Option<Duration> = config.get_connect_timeout().copied();
    let result = match timeout {
        Some(timeout) => match tokio::time::timeout(timeout, future).await {
            Ok(result) => result,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection timed out",
            )),
        },
        None => future.await,
    };
    result.map_err(socket_error)
}

fn socket_error(e: io::Error) -> Error {
    Error::with_source(
        ErrorKind::Connect,
        "could not open a socket to the server",
        e,
    )
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_flush(cx),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
