//! TLS through any tokio-postgres connector, arranged so that the pool
//! still sees the protocol: its tap sits above the encryption, not below
//! it.
//!
//! A connector is anything that implements tokio-postgres'
//! [`MakeTlsConnect`] for [`TlsSocket`] (`postgres-openssl`,
//! `postgres-native-tls`, `tokio-postgres-rustls`, or one of the
//! application's own); the pool keeps it type-erased ([`Tls`]), so a pool's
//! type does not name it. Certificate and host-name checks are the
//! connector's, except where pgpipe makes the connector itself from a URL's
//! `sslmode=verify-ca`/`verify-full` and `sslrootcert` ([`roots`], with
//! the `rustls` feature). Cancel requests go through the same connector.

#[cfg(feature = "rustls")]
pub(crate) mod roots;
mod socket;

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use super::tap::TappedStream;
use super::{ConnState, PoolWire};
pub use socket::TlsSocket;

/// What libpq's `sslmode` asks to verify of the server's certificate,
/// beyond what tokio-postgres knows (`require` and below).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    /// `verify-ca`: signed by a trusted authority, whatever name it bears.
    Ca,
    /// `verify-full`: that, and it names the host connected to.
    Full,
}

/// A connector's stream, type-erased: read, written and asked for its
/// channel binding.
pub(crate) trait TlsIo: AsyncRead + AsyncWrite + Unpin + Send {
    fn binding(&self) -> ChannelBinding;
}

impl<S: AsyncRead + AsyncWrite + TlsStream + Unpin + Send> TlsIo for S {
    fn binding(&self) -> ChannelBinding {
        self.channel_binding()
    }
}

impl TlsStream for Box<dyn TlsIo> {
    fn channel_binding(&self) -> ChannelBinding {
        (**self).binding()
    }
}

type BoxError = Box<dyn StdError + Send + Sync>;
type Handshake = Pin<Box<dyn Future<Output = Result<Box<dyn TlsIo>, BoxError>> + Send>>;

/// A connector, type-erased.
trait MakeTls: Send + Sync {
    /// The TLS handshake over `socket`, for `host` (the certificate's
    /// name to check).
    fn handshake(&self, host: &str, socket: TlsSocket) -> Handshake;
}

impl<M> MakeTls for M
where
    M: MakeTlsConnect<TlsSocket> + Clone + Send + Sync,
    M::Stream: TlsStream + Unpin + Send + 'static,
    M::TlsConnect: Send + 'static,
    M::Error: Into<BoxError>,
    <M::TlsConnect as TlsConnect<TlsSocket>>::Future: Send + 'static,
    <M::TlsConnect as TlsConnect<TlsSocket>>::Error: Into<BoxError>,
{
    fn handshake(&self, host: &str, socket: TlsSocket) -> Handshake {
        match self.clone().make_tls_connect(host) {
            Ok(connect) => {
                let handshake = connect.connect(socket);
                Box::pin(async move {
                    let stream = handshake.await.map_err(Into::into)?;
                    Ok(Box::new(stream) as Box<dyn TlsIo>)
                })
            }
            Err(e) => {
                let e = e.into();
                Box::pin(async move { Err(e) })
            }
        }
    }
}

/// The pool's TLS set-up: a connector, or none (plaintext only).
#[derive(Clone, Default)]
pub(crate) struct Tls {
    connector: Option<Arc<dyn MakeTls>>,
    /// What made it, for `Debug`.
    name: &'static str,
}

impl Tls {
    /// TLS through `connector`; `name` says what it is, for `Debug`.
    pub(crate) fn new<M>(connector: M, name: &'static str) -> Tls
    where
        M: MakeTlsConnect<TlsSocket> + Clone + Send + Sync + 'static,
        M::Stream: TlsStream + Unpin + Send + 'static,
        M::TlsConnect: Send + 'static,
        M::Error: Into<BoxError>,
        <M::TlsConnect as TlsConnect<TlsSocket>>::Future: Send + 'static,
        <M::TlsConnect as TlsConnect<TlsSocket>>::Error: Into<BoxError>,
    {
        Tls {
            connector: Some(Arc::new(connector)),
            name,
        }
    }

    pub(crate) fn is_configured(&self) -> bool {
        self.connector.is_some()
    }

    /// A tokio-postgres connector for one connection to `host`, or `None`
    /// without TLS.
    pub(crate) fn connect_to(&self, host: &str) -> Option<Erased> {
        self.connector.as_ref().map(|connector| Erased {
            connector: Arc::clone(connector),
            host: host.to_owned(),
        })
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.connector {
            Some(_) => write!(f, "Tls({})", self.name),
            None => f.write_str("Tls(none)"),
        }
    }
}

/// The pool's connector for one connection, as tokio-postgres takes one.
pub(crate) struct Erased {
    connector: Arc<dyn MakeTls>,
    host: String,
}

impl TlsConnect<TlsSocket> for Erased {
    type Stream = Box<dyn TlsIo>;
    type Error = BoxError;
    type Future = Handshake;

    fn connect(self, socket: TlsSocket) -> Handshake {
        self.connector.handshake(&self.host, socket)
    }
}

/// Wraps a TLS connector so that the stream it makes is tapped: the tap
/// reads the plaintext protocol.
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
