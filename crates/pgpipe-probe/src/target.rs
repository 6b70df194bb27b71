//! Where the URL's first host is, and the probe's sockets to it.

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio_postgres::Config;
use tokio_postgres::config::Host;

use crate::{Error, PATIENCE};

/// What a socket of the probe's does.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Io for S {}

/// A TCP or Unix socket.
pub(crate) type Socket = Box<dyn Io>;

/// The URL's first host and port.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Tcp(String, u16),
    Unix(PathBuf),
}

impl Target {
    pub(crate) fn of(config: &Config) -> Result<Target, Error> {
        let port = config.get_ports().first().copied().unwrap_or(5432);
        match config.get_hosts().first() {
            Some(Host::Tcp(host)) => Ok(Target::Tcp(host.clone(), port)),
            Some(Host::Unix(dir)) => Ok(Target::Unix(dir.join(format!(".s.PGSQL.{port}")))),
            None => Err(Error::new("the URL names no host".into())),
        }
    }

    /// A new socket to it within [`PATIENCE`], and the socket's own
    /// address for TCP.
    pub(crate) async fn connect(&self) -> Result<(Socket, Option<SocketAddr>), Error> {
        let connected = tokio::time::timeout(PATIENCE, async {
            match self {
                Target::Tcp(host, port) => {
                    let stream = TcpStream::connect((host.as_str(), *port)).await?;
                    let local = stream.local_addr().ok();
                    Ok::<_, Error>((Box::new(stream) as Socket, local))
                }
                Target::Unix(path) => {
                    Ok((Box::new(UnixStream::connect(path).await?) as Socket, None))
                }
            }
        })
        .await;
        connected.map_err(|_| Error::new(format!("no connection within {PATIENCE:?}")))?
    }
}
