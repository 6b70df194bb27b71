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
//!
//! - here: [`connect`], the start-up over TLS or not, and the driver of
//!   the connection's I/O, which hands `NOTIFY`s on;
//! - [`socket`]: opening the TCP or Unix socket as tokio-postgres would;
//! - [`cancel`]: where the connection went ([`Peer`]), and cancel requests
//!   sent there.

mod cancel;
mod socket;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::config::{Host, TargetSessionAttrs};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls};

use super::notifications::Notifications;
use super::tap::TappedStream;
use super::tls::{Tapped, Tls, TlsSocket};
use super::{ConnState, PoolWire};
use crate::error::{Error, ErrorKind};
pub(crate) use cancel::{Peer, send_cancel_request};
use socket::{Socket, open_socket};

/// The stream type of every pooled connection.
pub(crate) type PgStream = TappedStream<Socket>;

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
                        let peer = Peer::new(addr, hostname, tls, config);
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
    if let Some(connector) = tls.connect_to(hostname) {
        let tapped = Tapped {
            inner: connector,
            state: Arc::clone(state),
            wire: Arc::clone(wire),
        };
        let (client, connection) = config.connect_raw(TlsSocket::new(stream), tapped).await?;
        return Ok((client, Box::pin(drive(connection, notifications))));
    }
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

pub(super) fn connect_error(message: &str) -> Error {
    Error::new(ErrorKind::Connect, message)
}
