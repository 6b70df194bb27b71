//! Opening a connection whose socket the pool can watch.
//!
//! `tokio_postgres::Config::connect` opens its own socket, which the pool
//! could not observe. So the pool opens the socket itself, the way
//! tokio-postgres does (each host in turn, each resolved address, the connect
//! timeout, `TCP_NODELAY`, keepalives, `tcp_user_timeout`, Unix sockets),
//! wraps it in a [`TappedStream`] and hands it to
//! [`Config::connect_raw`](tokio_postgres::Config::connect_raw).
//!
//! Not carried over: `load_balance_hosts=random` (hosts are tried in order)
//! and `target_session_attrs`, which the pool checks itself after connecting.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio_postgres::config::{Host, TargetSessionAttrs};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls};

use super::notifications::Notifications;
use super::tap::TappedStream;
#[cfg(feature = "rustls")]
use super::tls::Tapped;
use super::tls::Tls;
use super::{ConnState, PoolWire};
use crate::error::{Error, ErrorKind};

/// A TCP or Unix socket.
#[derive(Debug)]
pub(crate) enum Socket {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

/// The stream type of every pooled connection.
pub(crate) type PgStream = TappedStream<Socket>;

/// Where a connection went, and how to reach it again: a cancel request
/// opens a socket there, with the connection's TLS settings (a TLS-only
/// endpoint drops plaintext, and the cancel key is a secret) and within the
/// connect timeout.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    addr: PeerAddr,
    /// The host name TLS checks the certificate against.
    hostname: String,
    tls: Tls,
    timeout: Duration,
}

#[derive(Debug, Clone)]
enum PeerAddr {
    Tcp(std::net::SocketAddr),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

/// The task-side half of a connection that drives its I/O, whatever its
/// stream type (plain or TLS).
pub(crate) type Io = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

/// A new connection and its I/O half.
pub(crate) type Connected = (Client, Io);

/// Connects to the first host of `config` that accepts, returning the client,
/// its connection half and where it went.
pub(crate) async fn connect(
    config: &Config,
    state: Arc<ConnState>,
    wire: &Arc<PoolWire>,
    tls: &Tls,
    notifications: &Arc<Notifications>,
) -> Result<(Connected, Peer), Error> {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    let count = hosts.len().max(addrs.len());
    if count == 0 {
        return Err(connect_error("no host given"));
    }
    let mut last = None;
    for i in 0..count {
        let port = port_for(config, i);
        let host = match (addrs.get(i), hosts.get(i)) {
            (Some(ip), _) => Host::Tcp(ip.to_string()),
            (None, Some(host)) => host.clone(),
            (None, None) => continue,
        };
        // TLS checks the certificate against the host name, never against
        // a `hostaddr`.
        let hostname = match hosts.get(i) {
            Some(Host::Tcp(name)) => name.as_str(),
            _ => "",
        };
        // Where, for the error: never the user or the password.
        let place = match &host {
            Host::Tcp(name) => format!("{name}:{port}/{}", config.get_dbname().unwrap_or("")),
            #[cfg(unix)]
            Host::Unix(dir) => format!(
                "{}:{port}/{}",
                dir.display(),
                config.get_dbname().unwrap_or("")
            ),
        };
        match open_socket(config, &host, port).await {
            Ok((socket, addr)) => {
                let stream = TappedStream::new(socket, Arc::clone(&state), Arc::clone(wire));
                let tap = (&state, wire, notifications);
                match handshake(config, stream, tls, hostname, tap).await {
                    Ok(connected) => {
                        let peer = Peer {
                            addr,
                            hostname: hostname.to_owned(),
                            tls: tls.clone(),
                            timeout: config
                                .get_connect_timeout()
                                .copied()
                                .unwrap_or(CANCEL_TIMEOUT),
                        };
                        return Ok((connected, peer));
                    }
                    Err(e) => last = Some(Error::connect(e).at(&place)),
                }
            }
            Err(e) => last = Some(e.at(&place)),
        }
    }
    Err(last.unwrap_or_else(|| connect_error("no usable host")))
}

/// Start-up and authentication, over TLS when it is configured (and the
/// server agrees, or `sslmode=require` insists).
async fn handshake(
    config: &Config,
    stream: PgStream,
    tls: &Tls,
    hostname: &str,
    (state, wire, notifications): (&Arc<ConnState>, &Arc<PoolWire>, &Arc<Notifications>),
) -> Result<Connected, tokio_postgres::Error> {
    let notifications = Arc::clone(notifications);
    #[cfg(feature = "rustls")]
    if let Some(rustls) = &tls.rustls {
        use tokio_postgres::tls::MakeTlsConnect;
        let Ok(connector) =
            MakeTlsConnect::<PgStream>::make_tls_connect(&mut rustls.clone(), hostname);
        let tapped = Tapped {
            inner: connector,
            state: Arc::clone(state),
            wire: Arc::clone(wire),
        };
        let (client, connection) = config.connect_raw(stream, tapped).await?;
        return Ok((client, Box::pin(drive(connection, notifications))));
    }
    let _ = (tls, hostname, state, wire);
    let (client, connection) = config.connect_raw(stream, NoTls).await?;
    Ok((client, Box::pin(drive(connection, notifications))))
}

/// Drives a connection's I/O as tokio-postgres' own `Connection` future
/// does, but hands each `NOTIFY` that arrives to `notifications` instead of
/// dropping it (notices are dropped, as tokio-postgres does after logging).
fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    notifications: Arc<Notifications>,
) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    std::future::poll_fn(move |cx| {
        loop {
            match connection.poll_message(cx) {
                Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => notifications.push(n),
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    })
}

fn port_for(config: &Config, i: usize) -> u16 {
    let ports = config.get_ports();
    ports.get(i).or(ports.first()).copied().unwrap_or(5432)
}

async fn open_socket(config: &Config, host: &Host, port: u16) -> Result<(Socket, PeerAddr), Error> {
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

fn connect_error(message: &str) -> Error {
    Error::new(ErrorKind::Connect, message)
}

/// How long a cancel request may take when the connection has no connect
/// timeout of its own.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks the server to cancel whatever `token`'s backend is running, over a
/// new socket to `peer`, with the connection's TLS settings; returns once
/// the server has taken the request (it closes the socket), or the connect
/// timeout passed. Best effort: a failure leaves the query to finish.
pub(crate) async fn send_cancel_request(peer: &Peer, token: &tokio_postgres::CancelToken) {
    let request = async {
        match &peer.addr {
            PeerAddr::Tcp(addr) => {
                let Ok(stream) = TcpStream::connect(addr).await else {
                    return;
                };
                let stream = UntilClosed(stream);
                #[cfg(feature = "rustls")]
                if let Some(rustls) = &peer.tls.rustls {
                    use tokio_postgres::tls::MakeTlsConnect;
                    let Ok(connector) = MakeTlsConnect::<UntilClosed<TcpStream>>::make_tls_connect(
                        &mut rustls.clone(),
                        &peer.hostname,
                    );
                    let _ = token.cancel_query_raw(stream, connector).await;
                    return;
                }
                let _ = (&peer.tls, &peer.hostname);
                let _ = token.cancel_query_raw(stream, NoTls).await;
            }
            #[cfg(unix)]
            PeerAddr::Unix(path) => {
                if let Ok(stream) = UnixStream::connect(path).await {
                    let _ = token.cancel_query_raw(UntilClosed(stream), NoTls).await;
                }
            }
        }
    };
    let _ = tokio::time::timeout(peer.timeout, request).await;
}

/// A cancel request's socket, whose shutdown completes only when the server
/// closes its end: the server signals the backend before it does, so once
/// the request "finished", the backend has been told.
struct UntilClosed<S>(S);

impl<S: AsyncRead + Unpin> AsyncRead for UntilClosed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for UntilClosed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(Pin::new(&mut self.0).poll_shutdown(cx))?;
        // Read (and drop) until the server closes: it answers a cancel
        // request with nothing but that.
        let mut scratch = [0u8; 64];
        loop {
            let mut buf = ReadBuf::new(&mut scratch);
            std::task::ready!(Pin::new(&mut self.0).poll_read(cx, &mut buf))?;
            if buf.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// Runs the `target_session_attrs` check that `connect_raw` skips.
pub(crate) async fn check_session_attrs(config: &Config, client: &Client) -> Result<(), Error> {
    let wanted = config.get_target_session_attrs();
    if wanted == TargetSessionAttrs::Any {
        return Ok(());
    }
    let rows = client
        .simple_query("SHOW transaction_read_only")
        .await
        .map_err(Error::connect)?;
    let read_only = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(|v| v == "on"),
        _ => None,
    });
    match (wanted, read_only) {
        (TargetSessionAttrs::ReadWrite, Some(true)) => {
            Err(connect_error("database does not allow writes"))
        }
        (TargetSessionAttrs::ReadOnly, Some(false)) => {
            Err(connect_error("database is not read only"))
        }
        _ => Ok(()),
    }
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
