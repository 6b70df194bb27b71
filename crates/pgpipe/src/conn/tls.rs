//! TLS, with the `rustls` feature, arranged so that the pool still sees the
//! protocol: its tap sits above the encryption, not below it.
//!
//! Certificate and host-name checks are rustls': the `ClientConfig` given
//! to [`PoolBuilder::tls`](crate::PoolBuilder::tls) decides which
//! authorities are trusted, and the connection's host name (not a
//! `hostaddr`) is checked against the certificate. tokio-postgres itself
//! only knows `sslmode` `disable`, `prefer` (the default: TLS if the server
//! offers it) and `require`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio_postgres::tls::{ChannelBinding, TlsConnect, TlsStream};

use super::tap::TappedStream;
use super::{ConnState, PoolWire};

/// The pool's TLS set-up: none, or a rustls connector.
#[derive(Clone, Default)]
pub(crate) struct Tls {
    #[cfg(feature = "rustls")]
    pub(crate) rustls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
}

impl Tls {
    pub(crate) fn is_configured(&self) -> bool {
        #[cfg(feature = "rustls")]
        return self.rustls.is_some();
        #[cfg(not(feature = "rustls"))]
        return false;
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_configured() {
            "Tls(rustls)"
        } else {
            "Tls(none)"
        })
    }
}

/// Wraps a TLS connector so that the stream it makes is tapped: the tap
/// reads the plaintext protocol.
#[cfg_attr(not(feature = "rustls"), allow(dead_code))]
pub(crate) struct Tapped<T> {
    pub(crate) inner: T,
    pub(crate) state: Arc<ConnState>,
    pub(crate) wire: Arc<PoolWire>,
}

impl<S, T> TlsConnect<S> for Tapped<T>
where
    T: TlsConnect<S>,
    T::Future: Send + 'static,
    T::Stream: Send + 'static,
{
    type Stream = TappedStream<T::Stream>;
    type Error = T::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Stream, T::Error>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let Tapped { inner, state, wire } = self;
        let handshake = inner.connect(stream);
        Box::pin(async move { Ok(TappedStream::new(handshake.await?, state, wire)) })
    }
}

impl<S: TlsStream + Unpin> TlsStream for TappedStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        self.get_ref().channel_binding()
    }
}
