//! [`TlsSocket`]: what the pool hands a TLS connector to encrypt.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The socket a TLS connector encrypts: a connection's (with the pool's
/// tap below the encryption, counting bytes) or a cancel request's.
///
/// A connector given to
/// [`PoolBuilder::tls_connector`](crate::PoolBuilder::tls_connector)
/// implements tokio-postgres' `MakeTlsConnect<TlsSocket>`; the connectors
/// of `postgres-openssl`, `postgres-native-tls` and `tokio-postgres-rustls`
/// do for any stream that reads and writes, this one included.
pub struct TlsSocket(Box<dyn Raw>);

/// What a socket under TLS must do.
pub(crate) trait Raw: AsyncRead + AsyncWrite + Unpin + Send + Sync + fmt::Debug {}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + Sync + fmt::Debug> Raw for S {}

impl TlsSocket {
    pub(crate) fn new(socket: impl Raw + 'static) -> TlsSocket {
        TlsSocket(Box::new(socket))
    }
}

impl fmt::Debug for TlsSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TlsSocket").field(&self.0).finish()
    }
}

impl AsyncRead for TlsSocket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsSocket {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}
