//! [`PoolBuilder`]: the one way to make a [`Pool`].

use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::{Host, SslMode};

use crate::config::{PoolConfig, Routing, SessionCleanup};
use crate::conn::tls::Tls;
use crate::error::{Error, ErrorKind};
use crate::hosts::HostSettings;
use crate::pool::{Endpoint, Pool, Setup};
use crate::pooler::{Pooler, Prepare};
use crate::target::{ReplicaFallback, TargetSessionAttrs};

fn parse(url: &str) -> Result<tokio_postgres::Config, String> {
    tokio_postgres::Config::from_str(url)
        .map_err(|e| format!("the connection string does not parse: {e}"))
}

/// Builds a [`Pool`]; start with [`Pool::builder`].
///
/// ```
/// # fn main() -> Result<(), pgpipe::Error> {
/// let pool = pgpipe::Pool::builder()
///     .url("postgres://postgres@127.0.0.1:5432/postgres")
///     .max_size(4)
///     .pipelining(true)
///     .build()?; // does not connect yet
/// # let _ = pool;
/// # Ok(())
/// # }
/// ```
#[must_use = "builder does nothing itself, use `.build()` to build it"]
#[derive(Debug, Default)]
pub struct PoolBuilder {
    server: Option<Result<tokio_postgres::Config, String>>,
    config: PoolConfig,
    registry: Option<prometheus::Registry>,
    tls: Tls,
    /// Whether `max_pipeline_depth` was set, not left at its default: a
    /// depth above 1 asked for through a pooler that cannot track a
    /// pipeline is refused, not quietly lowered.
    depth_given: bool,
    /// Standbys (or any further hosts), as given to [`replicas`](Self::replicas).
    replicas: Vec<Result<tokio_postgres::Config, String>>,
    /// `target_session_attrs` from the URL, which tokio-postgres is never
    /// shown.
    target: Option<Result<TargetSessionAttrs, String>>,
}

impl PoolBuilder {
    /// The server, as a `postgres://` URL or a libpq `key=value` string. A
    /// string that does not parse is reported by [`build`](Self::build).
    ///
    /// A URL may name several hosts (`postgres://u@db1:5432,db2:5432/app`)
    /// and libpq's `target_session_attrs` (all six values): the pool then
    /// learns each host's role, as with [`replicas`](Self::replicas), and
    /// [`Pool::get`] reaches the kind of host the target names.
    pub fn url(mut self, url: &str) -> Self {
        match crate::target::take_target(url) {
            Ok((url, target)) => {
                self.server = Some(parse(&url));
                self.target = target.map(Ok);
            }
            Err(e) => self.target = Some(Err(e.to_string())),
        }
        self
    }

    /// The primary (or a writer endpoint), as [`url`](Self::url) takes it.
    /// Where it points is a first guess: every host's role is learned from
    /// the server, and a promoted standby becomes the primary.
    pub fn primary(self, url: &str) -> Self {
        self.url(url)
    }

    /// Standbys that reads through [`Pool::read`] may use, each a URL.
    /// Their roles, too, are learned from the servers, and re-checked
    /// every [`host_recheck`](Self::host_recheck).
    ///
    /// ```
    /// # fn main() -> Result<(), pgpipe::Error> {
    /// let pool = pgpipe::Pool::builder()
    ///     .primary("postgres://app@writer:5432/app")
    ///     .replicas(["postgres://app@reader-1:5432/app", "postgres://app@reader-2:5432/app"])
    ///     .max_replica_lag(std::time::Duration::from_secs(1))
    ///     .pipelining(true)
    ///     .build()?;
    /// # let _ = pool;
    /// # Ok(())
    /// # }
    /// ```
    pub fn replicas<'u>(mut self, urls: impl IntoIterator<Item = &'u str>) -> Self {
        self.replicas = urls
            .into_iter()
            .map(|url| match crate::target::take_target(url) {
                Ok((url, None)) => parse(&url),
                Ok((_, Some(_))) => Err(
                    "target_session_attrs belongs to the primary's URL (or .url()), not to a \
                     replica's: the pool routes to replicas by role"
                        .to_owned(),
                ),
                Err(e) => Err(e.to_string()),
            })
            .collect();
        self
    }

    /// How often every host's role and lag are checked. Default: 2 s.
    pub fn host_recheck(mut self, every: Duration) -> Self {
        self.config.host_recheck = every;
        self
    }

    /// A standby further behind than this serves no reads until it catches
    /// up. Default: none.
    pub fn max_replica_lag(mut self, lag: impl Into<Option<Duration>>) -> Self {
        self.config.max_replica_lag = lag.into();
        self
    }

    /// Where a read goes when no standby fits. Default:
    /// [`ReplicaFallback::Primary`].
    pub fn replica_fallback(mut self, fallback: ReplicaFallback) -> Self {
        self.config.replica_fallback = fallback;
        self
    }

    /// Whether reads through [`Pool::read`] that go out together share one
    /// `Sync`; see [`PoolConfig::read_groups`]. Default: `true`.
    pub fn read_groups(mut self, on: bool) -> Self {
        self.config.read_groups = on;
        self
    }

    /// How long a write waits for a primary to be elected. Default: zero.
    pub fn failover_wait(mut self, wait: Duration) -> Self {
        self.config.failover_wait = wait;
        self
    }

    /// The server, as a tokio-postgres config.
    pub fn config(mut self, config: tokio_postgres::Config) -> Self {
        self.server = Some(Ok(config));
        self
    }

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

    /// Most queries in flight on one shared connection. Default: 64.
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

    /// When a shared session is cleaned behind a query: see
    /// [`PoolConfig::session_cleanup`] and [`SessionCleanup`]. Default:
    /// behind code the guard cannot read.
    pub fn session_cleanup(mut self, cleanup: SessionCleanup) -> Self {
        self.config.session_cleanup = cleanup;
        self
    }

    /// Connects with TLS (rustls), when the server offers it (`sslmode=prefer`,
    /// the default) or always (`sslmode=require`). Which certificate
    /// authorities are trusted is `config`'s to say, and the certificate
    /// must name the connection's host: both checks fail closed.
    ///
    /// ```no_run
    /// # fn demo(roots: pgpipe::rustls::RootCertStore) -> Result<(), pgpipe::Error> {
    /// let tls = pgpipe::rustls::ClientConfig::builder()
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
        self.tls.rustls = Some(tokio_postgres_rustls::MakeRustlsConnect::new(config));
        self
    }

    /// Registers the pool's metrics (see the README's list) into `registry`.
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

    /// Checks the settings and makes the pool. Connects lazily: no
    /// connection is opened until the first query or [`Pool::get`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] when no server was given, the connection
    /// string does not parse, or the settings do not fit together (see
    /// [`PoolConfig`]).
    pub fn build(self) -> Result<Pool, Error> {
        if let Some(Err(message)) = &self.target {
            return Err(Error::config(message.clone()));
        }
        let mut server = match self.server {
            None => return Err(Error::config("no server given: call .url() or .config()")),
            Some(Err(message)) => return Err(Error::new(ErrorKind::Config, message)),
            Some(Ok(server)) => server,
        };
        if server.get_hosts().is_empty() && server.get_hostaddrs().is_empty() {
            return Err(Error::config("the connection config names no host"));
        }
        if server.get_ssl_mode() == SslMode::Require && !self.tls.is_configured() {
            return Err(Error::config(
                "sslmode=require needs TLS: give the builder a rustls ClientConfig with \
                 .tls() (feature `rustls`)",
            ));
        }
        self.config.validate().map_err(Error::config)?;
        if self.depth_given && self.config.max_pipeline_depth > 1 {
            self.config
                .check_depth_through_pooler()
                .map_err(Error::config)?;
        }
        if server.get_connect_timeout().is_none() {
            server.connect_timeout(self.config.connect_timeout);
        }
        // So that the pool's backends can be told apart in
        // `pg_stat_activity`; the URL's own `application_name` wins.
        if server.get_application_name().is_none() {
            server.application_name(DEFAULT_APPLICATION_NAME);
        }
        // Set in the start-up packet: session defaults, not `SET`s that a
        // reset would undo.
        let mut startup: Vec<(String, String)> =
            self.config.session_settings.clone().into_iter().collect();
        if let Some(timeout) = self.config.statement_timeout {
            let millis = timeout.as_millis().max(1).to_string();
            startup.push(("statement_timeout".into(), millis));
        }
        if !startup.is_empty() {
            let mut options = server.get_options().unwrap_or_default().to_owned();
            for (name, value) in &startup {
                if !options.is_empty() {
                    options.push(' ');
                }
                options.push_str(&format!("-c {name}={}", escape_option(value)));
            }
            server.options(&options);
        }
        let name = self
            .config
            .pool_name
            .clone()
            .unwrap_or_else(|| default_pool_name(&server));
        let target = match self.target {
            None => None,
            Some(Ok(target)) => Some(target),
            Some(Err(message)) => return Err(Error::config(message)),
        };
        let mut servers = vec![server.clone()];
        for replica in self.replicas {
            let mut replica = replica.map_err(Error::config)?;
            if replica.get_hosts().is_empty() && replica.get_hostaddrs().is_empty() {
                return Err(Error::config("a replica's connection string names no host"));
            }
            if replica.get_ssl_mode() == SslMode::Require && !self.tls.is_configured() {
                return Err(Error::config(
                    "a replica's sslmode=require needs TLS: give the builder a rustls \
                     ClientConfig with .tls() (feature `rustls`)",
                ));
            }
            if replica.get_connect_timeout().is_none() {
                replica.connect_timeout(self.config.connect_timeout);
            }
            if replica.get_application_name().is_none() {
                replica.application_name(DEFAULT_APPLICATION_NAME);
            }
            if !startup.is_empty() {
                replica.options(server.get_options().unwrap_or_default());
            }
            servers.push(replica);
        }
        let read_only = match self.config.pooler {
            Pooler::None => ReadOnly::Options,
            Pooler::Session => ReadOnly::AfterConnect,
            _ => ReadOnly::NotEnforced,
        };
        let mut endpoints: Vec<Endpoint> = Vec::new();
        for server in &servers {
            for endpoint in split_hosts(server, read_only)? {
                if endpoints.iter().any(|e| e.label == endpoint.label) {
                    return Err(Error::config(format!(
                        "{} is listed twice; give each host once",
                        endpoint.label
                    )));
                }
                endpoints.push(endpoint);
            }
        }
        // Where `get()` and `begin()` go when the URL names no target: the
        // primary, waiting for one within `failover_wait` as a write does
        // (libpq's `any` would take a standby while none is elected, and a
        // transaction's writes would fail there with 25006).
        let default_target = match target {
            Some(target) => target,
            None if endpoints.len() > 1 => TargetSessionAttrs::Primary,
            None => TargetSessionAttrs::Any,
        };
        let settings = HostSettings {
            recheck: self.config.host_recheck,
            max_lag: self.config.max_replica_lag,
            fallback: self.config.replica_fallback,
            failover_wait: self.config.failover_wait,
            default_target,
        };
        let setup = Setup {
            registry: self.registry,
            name,
            tls: self.tls,
        };
        Pool::new(endpoints, self.config.effective(), setup, settings)
    }
}

/// A value for the start-up `options`, where spaces separate arguments and a
/// backslash escapes the next character.
fn escape_option(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        if c == ' ' || c == '\\' {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The `application_name` of the pool's connections when the URL names none.
pub(crate) const DEFAULT_APPLICATION_NAME: &str = "pgpipe";

/// How a read lane's sessions are made read-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadOnly {
    /// `-c default_transaction_read_only=on` in the start-up `options`.
    Options,
    /// A `SET` after connecting: session poolers (PgBouncer refuses
    /// `options`) keep one server session per client connection.
    AfterConnect,
    /// Behind a transaction pooler no session outlives a transaction.
    NotEnforced,
}

/// One endpoint per host of `server` (a multi-host URL names several),
/// with its read-only twin.
fn split_hosts(
    server: &tokio_postgres::Config,
    read_only: ReadOnly,
) -> Result<Vec<Endpoint>, Error> {
    let hosts = server.get_hosts();
    let addrs = server.get_hostaddrs();
    let ports = server.get_ports();
    let count = hosts.len().max(addrs.len());
    if ports.len() > 1 && ports.len() != count {
        return Err(Error::config(format!(
            "{} ports for {count} hosts: give one port for every host, or one for all",
            ports.len()
        )));
    }
    let mut endpoints = Vec::with_capacity(count);
    for i in 0..count {
        let mut one = without_hosts(server);
        let name = match (addrs.get(i), hosts.get(i)) {
            (Some(ip), host) => {
                one.hostaddr(*ip);
                if let Some(Host::Tcp(host)) = host {
                    one.host(host);
                }
                ip.to_string()
            }
            (None, Some(Host::Tcp(host))) => {
                one.host(host);
                host.clone()
            }
            #[cfg(unix)]
            (None, Some(Host::Unix(path))) => {
                one.host_path(path);
                path.display().to_string()
            }
            (None, None) => continue,
        };
        // libpq: one port for all hosts, or one per host.
        let port = match ports {
            [] => 5432,
            [only] => *only,
            many => *many.get(i).ok_or_else(|| {
                Error::config("give one port for every host, or one for all of them")
            })?,
        };
        one.port(port);
        let mut read = one.clone();
        if read_only == ReadOnly::Options {
            let mut options = read.get_options().unwrap_or_default().to_owned();
            if !options.is_empty() {
                options.push(' ');
            }
            options.push_str("-c default_transaction_read_only=on");
            read.options(&options);
        }
        endpoints.push(Endpoint {
            label: format!("{name}:{port}"),
            write: one,
            read,
            read_after_connect: read_only == ReadOnly::AfterConnect,
            read_only: read_only != ReadOnly::NotEnforced,
        });
    }
    Ok(endpoints)
}

/// `server`'s settings, with no host, address or port: tokio-postgres
/// offers no way to remove them from a config.
fn without_hosts(server: &tokio_postgres::Config) -> tokio_postgres::Config {
    let mut one = tokio_postgres::Config::new();
    if let Some(user) = server.get_user() {
        one.user(user);
    }
    if let Some(password) = server.get_password() {
        one.password(password);
    }
    if let Some(dbname) = server.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = server.get_options() {
        one.options(options);
    }
    if let Some(name) = server.get_application_name() {
        one.application_name(name);
    }
    if let Some(timeout) = server.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = server.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = server.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = server.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.ssl_mode(server.get_ssl_mode())
        .ssl_negotiation(server.get_ssl_negotiation())
        .keepalives(server.get_keepalives())
        .keepalives_idle(server.get_keepalives_idle())
        .channel_binding(server.get_channel_binding());
    one
}

/// `host:port/dbname`, from the first host.
fn default_pool_name(server: &tokio_postgres::Config) -> String {
    let host = match (server.get_hostaddrs().first(), server.get_hosts().first()) {
        (Some(ip), _) => ip.to_string(),
        (None, Some(Host::Tcp(host))) => host.clone(),
        #[cfg(unix)]
        (None, Some(Host::Unix(path))) => path.display().to_string(),
        (None, None) => "unknown".into(),
    };
    let port = server.get_ports().first().copied().unwrap_or(5432);
    // Without a database name the server uses the user's; the label never
    // names the user, so it names no database then.
    match server.get_dbname() {
        Some(db) => format!("{host}:{port}/{db}"),
        None => format!("{host}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(builder: PoolBuilder) -> Result<Pool, Error> {
        builder.url("postgres://u:sentinel-pw@127.0.0.1/db").build()
    }

    #[test]
    fn invalid_settings_are_build_errors() {
        let cases: Vec<PoolBuilder> = vec![
            Pool::builder().max_size(0),
            Pool::builder().max_pipeline_depth(0),
            Pool::builder().max_batch(0),
            Pool::builder().statement_cache_capacity(0),
            Pool::builder().batch_window(Duration::from_millis(1)),
            Pool::builder()
                .pipelining(true)
                .batch_window(Duration::from_secs(2)),
            Pool::builder().max_size(2).max_exclusive(3),
            Pool::builder().max_exclusive(0),
            Pool::builder().connect_timeout(Duration::ZERO),
        ];
        for builder in cases {
            let debug = format!("{builder:?}");
            let error = build(builder).expect_err(&debug);
            assert_eq!(error.kind(), ErrorKind::Config, "{debug}");
        }
    }

    #[test]
    fn missing_or_broken_server_is_a_build_error() {
        let error = Pool::builder().build().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Config);
        let error = Pool::builder().url("postgres://[::1").build().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Config);
        let error = Pool::builder()
            .url("postgres://u:sentinel-pw@127.0.0.1/db?sslmode=require")
            .build()
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Config);
        assert!(!error.to_string().contains("sentinel-pw"));
    }

    #[test]
    fn replica_settings_are_checked_at_build() {
        let url = "postgres://u@127.0.0.1/db";
        let cases: Vec<PoolBuilder> = vec![
            Pool::builder()
                .url(url)
                .replicas(["postgres://u@127.0.0.2/db?target_session_attrs=standby"]),
            Pool::builder().url(url).replicas(["postgres:///db"]),
            Pool::builder()
                .url(url)
                .replicas(["postgres://u@127.0.0.2/db?sslmode=require"]),
            Pool::builder()
                .url(url)
                .replicas(["postgres://u@127.0.0.1/db"]),
            Pool::builder()
                .url(url)
                .host_recheck(Duration::from_millis(1)),
            Pool::builder().url("postgres://u@a,b/db?target_session_attrs=nope"),
            Pool::builder().url("postgres://u@a:1,b:2,c:3/db?port=1,2"),
        ];
        for builder in cases {
            let debug = format!("{builder:?}");
            let error = builder.build().expect_err(&debug);
            assert_eq!(error.kind(), ErrorKind::Config, "{debug}: {error}");
        }
        let error = Pool::builder()
            .url("postgres://u@a/db?target_session_attrs=nope")
            .build()
            .unwrap_err();
        assert!(error.to_string().contains("nope"), "{error}");
        Pool::builder()
            .url("postgres://u@a:1,b:2/db?target_session_attrs=prefer-standby")
            .replicas(["postgres://u@c:3/db"])
            .build()
            .unwrap();
    }

    #[test]
    fn debug_output_hides_the_password() {
        let builder = Pool::builder().url("postgres://u:sentinel-pw@127.0.0.1/db");
        assert!(!format!("{builder:?}").contains("sentinel-pw"));
        let pool = builder.build().unwrap();
        assert!(!format!("{pool:?}").contains("sentinel-pw"));
    }

    #[test]
    fn defaults_build() {
        let pool = build(Pool::builder().pipelining(true)).unwrap();
        let status = pool.status();
        assert_eq!(status.size, 0, "lazy: nothing is opened by build()");
    }
}
