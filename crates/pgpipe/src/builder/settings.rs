//! The builder's setters of the pool's settings: all at once
//! (`pool_config`), or one [`PoolConfig`] field each (`max_size` …
//! `session_cleanup`, `pool_name`); and what it is set up with
//! (`tls_connector`, `tls`, `registry`).

use std::time::Duration;

use tokio_postgres::tls::{MakeTlsConnect, TlsConnect, TlsStream};

use super::PoolBuilder;
use crate::config::{PoolConfig, Routing, SessionCleanup};
use crate::conn::tls::{Tls, TlsSocket};
use crate::pooler::{Pooler, Prepare};
// For doc links only.
#[cfg(doc)]
use crate::pool::Pool;

impl PoolBuilder {
    /// All pool settings at once; see [`PoolConfig`] for the defaults.
    pub fn pool_config(mut self, config: PoolConfig) -> Self {
        self.config = config;
        self.depth_given = false;
        self
    }

    /// Most connections, shared and exclusive together. Default: 4 × CPUs.
    pub fn max_size(mut self, max_size: usize) -> Self {
        self.config.max_size = max_size;
        self
    }

    /// Share connections between tasks and pipeline their queries.
    /// Default: `false` (one exclusive connection per query).
    pub fn pipelining(mut self, on: bool) -> Self {
        self.config.pipelining = on;
        self
    }

    /// Most queries in flight on one shared connection. Default: 128.
    pub fn max_pipeline_depth(mut self, depth: usize) -> Self {
        self.config.max_pipeline_depth = depth;
        self.depth_given = true;
        self
    }

    /// How queries are spread over shared connections. Default:
    /// [`Routing::Fill`].
    pub fn routing(mut self, routing: Routing) -> Self {
        self.config.routing = routing;
        self
    }

    /// How long to hold queries for a busy connection so they are written
    /// together. Default: zero. See [`PoolConfig::batch_window`].
    pub fn batch_window(mut self, window: Duration) -> Self {
        self.config.batch_window = window;
        self
    }

    /// Most queries released together from one batch window. Default: 64.
    pub fn max_batch(mut self, queries: usize) -> Self {
        self.config.max_batch = queries;
        self
    }

    /// Most tasks waiting for room at once. Default: 4096.
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.config.queue_capacity = capacity;
        self
    }

    /// Longest wait for room or a connection. Default: 30 s. Zero fails at
    /// once when nothing is free.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.config.wait_timeout = timeout;
        self
    }

    /// Longest time to open a connection, unless the connection config sets
    /// `connect_timeout`. Default: 10 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Most prepared statements cached per connection. Default: 256.
    pub fn statement_cache_capacity(mut self, capacity: usize) -> Self {
        self.config.statement_cache_capacity = capacity;
        self
    }

    /// Most connections checked out with [`Pool::get`] at once. Default:
    /// `max_size - 1` with pipelining (at least 1), else `max_size`.
    pub fn max_exclusive(mut self, max: usize) -> Self {
        self.config.max_exclusive = Some(max);
        self
    }

    /// A deadline for each query's execution. Default: none. See
    /// [`PoolConfig::query_timeout`].
    pub fn query_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.config.query_timeout = timeout.into();
        self
    }

    /// The server-side pooler between the pool and PostgreSQL; see
    /// [`Pooler`]. Default: [`Pooler::None`].
    pub fn pooler(mut self, pooler: Pooler) -> Self {
        self.config.pooler = pooler;
        self
    }

    /// How statements are prepared; see [`Prepare`]. Default: picked by the
    /// pooler.
    pub fn prepare(mut self, prepare: Prepare) -> Self {
        self.config.prepare = Some(prepare);
        self
    }

    /// The server-side `statement_timeout`, set at connect time. Default:
    /// the server's.
    pub fn statement_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.config.statement_timeout = timeout.into();
        self
    }

    /// How long a shared connection with queries in flight may receive
    /// nothing before it is killed. Default: 60 s; `None` turns it off.
    pub fn stall_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.config.stall_timeout = timeout.into();
        self
    }

    /// Connections older than this drain and close. Default: 30 min.
    pub fn max_lifetime(mut self, lifetime: impl Into<Option<Duration>>) -> Self {
        self.config.max_lifetime = lifetime.into();
        self
    }

    /// Idle connections unused for this long close (down to `min_idle`).
    /// Default: 10 min.
    pub fn idle_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.config.idle_timeout = timeout.into();
        self
    }

    /// A setting every connection starts with, in the start-up packet (as
    /// `options=-c name=value` would): it survives every session reset and
    /// cleanup, where a `SET` would not (and is refused on the shared path).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), pgpipe::Error> {
    /// let pool = pgpipe::Pool::builder()
    ///     .url("postgres://app@db.internal/orders")
    ///     .session_setting("search_path", "app, public")
    ///     .session_setting("TimeZone", "UTC")
    ///     .build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn session_setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.config
            .session_settings
            .insert(name.into(), value.into());
        self
    }

    /// SQL run on every new connection and again after every session reset
    /// and cleanup; see [`PoolConfig::after_connect`].
    pub fn after_connect(mut self, sql: impl Into<String>) -> Self {
        self.config.after_connect = Some(sql.into());
        self
    }

    /// Connections kept open however idle the pool is; see
    /// [`PoolConfig::min_idle`]. Default: 0.
    pub fn min_idle(mut self, connections: usize) -> Self {
        self.config.min_idle = connections;
        self
    }

    /// Most bytes of rows one query may return. Default: 64 MiB.
    pub fn max_result_bytes(mut self, bytes: impl Into<Option<usize>>) -> Self {
        self.config.max_result_bytes = bytes.into();
        self
    }

    /// Most rows one query may return. Default: none.
    pub fn max_result_rows(mut self, rows: impl Into<Option<usize>>) -> Self {
        self.config.max_result_rows = rows.into();
        self
    }

    /// How much slower than the pool's fastest query a statement must be,
    /// at its fastest, to be routed as slow, away from the fast queries'
    /// pipelines; `None` routes by load alone. See
    /// [`PoolConfig::slow_query_threshold`]. Default: 5 ms.
    pub fn slow_query_threshold(mut self, threshold: impl Into<Option<Duration>>) -> Self {
        self.config.slow_query_threshold = threshold.into();
        self
    }

    /// How long one statement may hold a shared connection's pipeline
    /// before the server stops it and the pool runs it again on a
    /// connection of its own; `None` turns it off. See
    /// [`PoolConfig::head_of_line_budget`]. Default: 100 ms.
    pub fn head_of_line_budget(mut self, budget: impl Into<Option<Duration>>) -> Self {
        self.config.head_of_line_budget = budget.into();
        self
    }

    /// With the `tracing` feature, logs a query that takes at least
    /// `threshold` as a `warn` event (target `pgpipe::slow`); `None` logs
    /// none. See [`PoolConfig::log_slow_statements`]. Default: 1 s.
    pub fn log_slow_statements(mut self, threshold: impl Into<Option<Duration>>) -> Self {
        self.config.log_slow_statements = threshold.into();
        self
    }

    /// When a shared session is cleaned behind a query: see
    /// [`PoolConfig::session_cleanup`] and [`SessionCleanup`]. Default:
    /// behind code the guard cannot read.
    pub fn session_cleanup(mut self, cleanup: SessionCleanup) -> Self {
        self.config.session_cleanup = cleanup;
        self
    }

    /// Connects with TLS through `connector`, any tokio-postgres connector
    /// (`postgres_openssl::MakeTlsConnector`,
    /// `postgres_native_tls::MakeTlsConnector`,
    /// `tokio_postgres_rustls::MakeRustlsConnect`, or one of your own):
    /// when the server offers it (`sslmode=prefer`, the default) or always
    /// (`sslmode=require`, `verify-ca`, `verify-full`). Which authorities
    /// are trusted and whether the host name is checked are the
    /// connector's to decide (the three named check both by default).
    /// Cancel requests go through it too; the pool's tap sits above the
    /// encryption, so pipelining and the metrics see the protocol.
    ///
    /// ```no_run
    /// # fn demo(connector: tokio_postgres_rustls::MakeRustlsConnect) -> Result<(), pgpipe::Error> {
    /// let pool = pgpipe::Pool::builder()
    ///     .url("postgres://app@db.example.com/app?sslmode=verify-full")
    ///     .tls_connector(connector)
    ///     .build()?;
    /// # let _ = pool;
    /// # Ok(())
    /// # }
    /// ```
    pub fn tls_connector<M>(mut self, connector: M) -> Self
    where
        M: MakeTlsConnect<TlsSocket> + Clone + Send + Sync + 'static,
        M::Stream: TlsStream + Unpin + Send + 'static,
        M::TlsConnect: Send + 'static,
        M::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        <M::TlsConnect as TlsConnect<TlsSocket>>::Future: Send + 'static,
        <M::TlsConnect as TlsConnect<TlsSocket>>::Error:
            Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.tls = Tls::new(connector, "connector");
        self
    }

    /// Connects with TLS through rustls with `config`, as
    /// [`tls_connector`](Self::tls_connector) does: its authorities are
    /// trusted and the certificate must name the connection's host. Build
    /// `config` with the crypto provider your application uses
    /// (`builder_with_provider`): this crate enables none, so it cannot
    /// make `ClientConfig::builder()` ambiguous.
    ///
    /// Without a connector, a URL's `sslmode=verify-full` or `verify-ca`
    /// with `sslrootcert=/path/root.crt` makes one (rustls, with the
    /// process' default provider): see the guide's configuration page.
    ///
    /// ```no_run
    /// # fn demo(
    /// #     roots: pgpipe::rustls::RootCertStore,
    /// #     provider: std::sync::Arc<pgpipe::rustls::crypto::CryptoProvider>,
    /// # ) -> Result<(), Box<dyn std::error::Error>> {
    /// let tls = pgpipe::rustls::ClientConfig::builder_with_provider(provider)
    ///     .with_safe_default_protocol_versions()?
    ///     .with_root_certificates(roots)
    ///     .with_no_client_auth();
    /// let pool = pgpipe::Pool::builder()
    ///     .url("postgres://app@db.example.com/app?sslmode=require")
    ///     .tls(tls)
    ///     .build()?;
    /// # let _ = pool;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "rustls")]
    pub fn tls(mut self, config: rustls::ClientConfig) -> Self {
        let connector = tokio_postgres_rustls::MakeRustlsConnect::new(config);
        self.tls = Tls::new(connector, "rustls");
        self
    }

    /// Registers the pool's metrics (see the guide's
    /// [list](crate::guide::observability#metrics)) into `registry`.
    /// Without one the pool keeps no metrics beyond [`Pool::status`].
    pub fn registry(mut self, registry: &prometheus::Registry) -> Self {
        self.registry = Some(registry.clone());
        self
    }

    /// The value of the `pool` label on every metric, so that several pools
    /// can share a registry. Default: `host:port/dbname` of the first host
    /// (`host:port` when the URL names no database; never the user or
    /// password).
    pub fn pool_name(mut self, name: impl Into<String>) -> Self {
        self.config.pool_name = Some(name.into());
        self
    }
}
