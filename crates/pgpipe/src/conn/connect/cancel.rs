//! Cancel requests: a new socket to where the connection went, with its
//! TLS settings, given up only once the server has closed it.
//!
//! As libpq does, nothing is sent after the request: no end of the sending
//! half, no TLS `close_notify`. PgBouncer before 1.20 exits (pgbouncer#801)
//! when a cancel request's client ends its socket before the bouncer has
//! passed the request on; and until then the request may be dropped.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio_postgres::tls::{ChannelBinding, TlsConnect, TlsStream};
use tokio_postgres::{Config, NoTls};

use super::socket::PeerAddr;
use crate::conn::tls::{Erased, Tls, TlsSocket};

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

impl Peer {
    /// Where a connection to `addr` went, checked against `hostname` by
    /// TLS; cancel requests get `config`'s connect timeout.
    pub(super) fn new(addr: PeerAddr, hostname: &str, tls: &Tls, config: &Config) -> Peer {
        Peer {
            addr,
            hostname: hostname.to_owned(),
            tls: tls.clone(),
            timeout: config
                .get_connect_timeout()
                .copied()
                .unwrap_or(CANCEL_TIMEOUT),
        }
    }
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
                if let Some(connector) = peer.tls.connect_to(&peer.hostname) {
                    let _ = token
                        .cancel_query_raw(TlsSocket::new(stream), UntilClosedTls(connector))
                        .await;
                    return;
                }
                let _ = token.cancel_query_raw(UntilClosed(stream), NoTls).await;
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

/// A cancel request's socket (or its TLS stream), whose shutdown sends
/// nothing and only waits for the server to close its end: the server
/// signals the backend before it does, so once the request "finished", the
/// backend has been told.
#[derive(Debug)]
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
        // Read (and drop) until the server closes: it answers a cancel
        // request with nothing but that. A TLS stream closed without its
        // `close_notify` is an error, and closed all the same.
        let mut scratch = [0u8; 64];
        loop {
            let mut buf = ReadBuf::new(&mut scratch);
            match std::task::ready!(Pin::new(&mut self.0).poll_read(cx, &mut buf)) {
                Ok(()) if !buf.filled().is_empty() => {}
                _ => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl<S: TlsStream + Unpin> TlsStream for UntilClosed<S> {
    fn channel_binding(&self) -> ChannelBinding {
        self.0.channel_binding()
    }
}

/// The pool's connector, its stream an [`UntilClosed`] one: its shutdown
/// would otherwise send TLS `close_notify` and end the sending half.
struct UntilClosedTls(Erased);

type Handshake<T> =
    Pin<Box<dyn Future<Output = Result<T, <Erased as TlsConnect<TlsSocket>>::Error>> + Send>>;

impl TlsConnect<TlsSocket> for UntilClosedTls {
    type Stream = UntilClosed<<Erased as TlsConnect<TlsSocket>>::Stream>;
    type Error = <Erased as TlsConnect<TlsSocket>>::Error;
    type Future = Handshake<Self::Stream>;

    fn connect(self, socket: TlsSocket) -> Self::Future {
        let handshake = self.0.connect(socket);
        Box::pin(async move { Ok(UntilClosed(handshake.await?)) })
    }
}
