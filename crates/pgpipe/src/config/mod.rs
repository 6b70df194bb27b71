//! The pool's settings as plain data, with every default documented; the
//! values derived from them. Their checks are in `validate`.

mod effective;
mod validate;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::pooler::{Pooler, Prepare};
use crate::target::ReplicaFallback;

/// How pipelined queries are spread over connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Routing {
    /// Send each query to the connection with the fewest queries in flight,
    /// and open another connection (up to `max_size`) as soon as every open
    /// one is busy. Uses more server backends sooner; on a server with few
    /// cores that costs tail latency (backends wait for a core).
    Spread,
    /// Send each query to the oldest connection that has room, and open
    /// another only when every open one holds `max_pipeline_depth` queries.
    /// Uses the fewest server backends and makes the biggest batches;
    /// connections beyond what the load needs drain and go back to idle.
    /// Measured best overall (see the guide's
    /// [sizing and waiting](crate::guide::configuration#sizing-and-waiting)).
    #[default]
    Fill,
}

/// When the pool cleans a shared session behind a query; see the guide's
/// [what runs on the shared path](crate::guide::shared_path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum SessionCleanup {
    /// Behind every statement whose code the guard cannot read: `DO`,
    /// `CALL`, and calls of functions that are not PostgreSQL's own. Code
    /// that runs without being named in the SQL (triggers, row-level
    /// security policies, views, column defaults) is not seen: choose
    /// [`EveryQuery`](SessionCleanup::EveryQuery) if yours may change the
    /// session.
    #[default]
    UnknownCode,
    /// Behind every query on the shared path (about 45 µs of server time
    /// each, no extra round trip).
    EveryQuery,
}

/// Every setting of a [`Pool`](crate::Pool), with its default.
///
/// [`PoolBuilder`](crate::PoolBuilder) sets these one by one; this struct is
/// for code that keeps settings as data.
///
/// With the `serde` feature it deserializes, every key optional (missing
/// keys keep their defaults, unknown keys are errors), durations in human
/// form (`"250ms"`, `"30s"`, `"10min"`). From the environment, with the
/// [`config`](https://docs.rs/config) crate, as deadpool-postgres users do:
///
/// ```ignore
/// // PGPIPE__MAX_SIZE=16 PGPIPE__PIPELINING=true PGPIPE__WAIT_TIMEOUT=2s
/// let settings: pgpipe::PoolConfig = config::Config::builder()
///     .add_source(config::Environment::with_prefix("PGPIPE").separator("__").try_parsing(true))
///     .build()?
///     .try_deserialize()?;
/// let pool = pgpipe::Pool::builder().url(&url).pool_config(settings).build()?;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
#[non_exhaustive]
pub struct PoolConfig {
    /// Most connections open at once, shared and exclusive together.
    ///
    /// Default: 4 × the number of CPUs, as deadpool.
    pub max_size: usize,
    /// Whether `query`, `query_one`, `query_opt` and `execute` share
    /// connections between tasks and pipeline their queries (`true`), or
    /// borrow an exclusive connection for each query, as deadpool-postgres
    /// does (`false`).
    ///
    /// Default: `false`.
    pub pipelining: bool,
    /// Most queries in flight on one shared connection. A query that finds
    /// every connection at this depth (and no room for another connection)
    /// waits. While exclusive checkouts hold connections the shared path
    /// could otherwise open, its connections may go deeper, up to a total
    /// of `max_pipeline_depth` × `max_size` (not behind a pooler that cannot
    /// track a pipeline). With [`Routing::Fill`] it is also the load at which another
    /// connection is opened.
    ///
    /// Default: 128, chosen by measurement (docs/benchmarks.md, #25: eight
    /// paired rounds against 64): at 512 tasks on 4 connections, 1.26× the
    /// throughput at a 1 ms round trip and the same at loopback (where the
    /// p99 rose from 4.4 to 6.1 ms), head-of-line latency unchanged.
    pub max_pipeline_depth: usize,
    /// How pipelined queries are spread over connections.
    ///
    /// Default: [`Routing::Fill`].
    pub routing: Routing,
    /// How long queries that arrive for a connection that already has work
    /// in flight are held back, so that they are written together. Never
    /// applied to an idle connection. Zero sends each query as soon as it
    /// arrives; tokio-postgres still writes everything queued while its
    /// writer was busy in one flush.
    ///
    /// tokio's timer ticks in milliseconds, so a window under 1 ms acts as
    /// 1 ms (or ends earlier, when `max_batch` queries are waiting).
    ///
    /// Default: zero.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub batch_window: Duration,
    /// Most queries released together from one `batch_window`; the window
    /// closes early when this many are waiting.
    ///
    /// Default: 64.
    pub max_batch: usize,
    /// Most tasks waiting for room on the shared path at once. Past this,
    /// queries fail at once with [`ErrorKind::QueueFull`](crate::ErrorKind::QueueFull).
    ///
    /// Default: 4096.
    pub queue_capacity: usize,
    /// Longest a query waits for room, or `get()` for a connection, before
    /// failing with [`ErrorKind::Timeout`](crate::ErrorKind::Timeout).
    ///
    /// Default: 30 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub wait_timeout: Duration,
    /// Longest a new connection may take to open (socket, TLS and
    /// authentication), unless the connection config sets its own
    /// `connect_timeout`.
    ///
    /// Default: 10 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub connect_timeout: Duration,
    /// Most prepared statements cached per connection.
    ///
    /// Default: 256.
    pub statement_cache_capacity: usize,
    /// Most connections checked out with [`Pool::get`](crate::Pool::get) at
    /// once, so that exclusive users cannot take every connection from the
    /// shared path. `None` picks the default.
    ///
    /// Default: with pipelining, `max_size - 1` (at least 1); without,
    /// `max_size`.
    pub max_exclusive: Option<usize>,
    /// The `pool` label on the pool's metrics. `None` picks the default.
    ///
    /// Default: `host:port/dbname` of the first host.
    pub pool_name: Option<String>,
    /// A deadline for each query's execution, once it has a connection (the
    /// wait has `wait_timeout`). A query past it fails with
    /// [`ErrorKind::QueryTimeout`](crate::ErrorKind::QueryTimeout): it may
    /// have run. On a shared connection the pool stops routing new work to
    /// that connection and cancels the query on the server only if nothing
    /// else is in flight there (a cancel hits whatever the backend runs),
    /// else lets it finish and discards the answer. A cancelled query's
    /// outcome is awaited (the cancel request with the connection's TLS and
    /// connect timeout, then the answer, within 5 s, else the connection is
    /// closed), so no late cancel can hit the connection's next statement:
    /// the call can return a little after the deadline.
    ///
    /// Default: none.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub query_timeout: Option<Duration>,
    /// The server-side `statement_timeout` of every connection, set at
    /// connect time. A query past it fails with SQLSTATE `57014`, alone.
    ///
    /// Default: none (the server's setting).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub statement_timeout: Option<Duration>,
    /// A shared connection with queries in flight that receives nothing for
    /// this long is killed, and its queries fail with
    /// [`ErrorKind::ConnectionLost`](crate::ErrorKind::ConnectionLost): a
    /// stalled network or a hung backend would otherwise hold every query
    /// on it. Exclusive connections are left alone (long reports belong
    /// there). Where the server stops the session's statements at the
    /// [`head_of_line_budget`](Self::head_of_line_budget), silence past
    /// the budget and this long is a stall whatever runs there; a session
    /// under no budget of the pool's, running a statement the pool learned
    /// is slow, is left to `query_timeout`. `None` turns the watchdog off.
    ///
    /// Default: 60 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub stall_timeout: Option<Duration>,
    /// Connections older than this are retired: no new work, in-flight work
    /// finishes, then they close. Each connection's lifetime varies by up to
    /// a tenth, so that connections opened together do not all close
    /// together.
    ///
    /// Default: 30 min.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub max_lifetime: Option<Duration>,
    /// Idle connections unused for this long are closed, down to
    /// `min_idle`.
    ///
    /// Default: 10 min.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub idle_timeout: Option<Duration>,
    /// Connections kept open however idle the pool is: opened as soon as the
    /// pool is built inside a runtime (else at its first use), and opened
    /// again when one closes. At most `max_size`.
    ///
    /// Default: 0.
    pub min_idle: usize,
    /// Most bytes of rows one `query` may return; past it the query fails
    /// with [`ErrorKind::TooLarge`](crate::ErrorKind::TooLarge) (the rest of
    /// its answer is read and discarded, and nobody else is affected).
    ///
    /// Default: 64 MiB.
    pub max_result_bytes: Option<usize>,
    /// Most rows one `query` may return, likewise.
    ///
    /// Default: none.
    pub max_result_rows: Option<usize>,
    /// Head-of-line awareness on the shared path: a statement whose fastest
    /// recent run took this much longer than the fastest query of the pool
    /// is treated as slow, and so is a query run through
    /// [`Pool::slow`](crate::Pool::slow). Slow queries go to the connection
    /// with the fewest slow queries in flight; fast ones avoid connections
    /// that carry a slow query, or that owe answers and have read none for
    /// this long, so that they do not wait behind it. `None` routes by load
    /// alone.
    ///
    /// Default: 5 ms.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub slow_query_threshold: Option<Duration>,
    /// The head-of-line budget: how long one statement may hold a shared
    /// connection's pipeline. Shared connections run with this
    /// `statement_timeout` in their session (set when a connection joins
    /// the shared path, unless the session's own is already shorter), so
    /// the *server* stops a statement that waits on a lock or runs long
    /// before the queries pipelined behind it wait longer: its implicit
    /// transaction rolls back, nothing it did commits, and its neighbours go
    /// on. The pool then runs it again, on a connection of its own, within
    /// the caller's `query_timeout` (the caller sees latency, not an error)
    /// and remembers it: its next runs never share a pipeline.
    ///
    /// Behind a transaction pooler, where a session setting would reach
    /// other clients, each shared statement carries it instead: it runs in a
    /// transaction block of its own (`BEGIN`, a transaction-local
    /// `statement_timeout`, the statement, `COMMIT`, sent together), which
    /// costs the server two small statements more per query there; set
    /// `None` to send statements bare.
    ///
    /// Default: 100 ms (see the guide's head-of-line section for why).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub head_of_line_budget: Option<Duration>,
    /// With the `tracing` feature: a query through the pool or one of its
    /// handles that takes at least this long, waiting included, is logged
    /// as a `warn` event (target `pgpipe::slow`) with its duration, its
    /// first keyword, its pool and its outcome (never SQL text or
    /// parameters). `None` logs none.
    ///
    /// Default: 1 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub log_slow_statements: Option<Duration>,
    /// When a shared session is cleaned behind a query.
    ///
    /// Default: [`SessionCleanup::UnknownCode`].
    pub session_cleanup: SessionCleanup,
    /// Settings every connection starts with (`search_path`, `TimeZone`,
    /// `app.tenant` …), sent in the start-up packet: they are the session's
    /// defaults, so every reset and cleanup returns to them, and no `SET` is
    /// needed (none is allowed on the shared path).
    ///
    /// Default: none.
    pub session_settings: BTreeMap<String, String>,
    /// SQL run on every new connection, and again after every session reset
    /// and cleanup, so that what it sets up is always there (one or more
    /// `;`-separated statements, as a simple query). For settings prefer
    /// `session_settings`; do not change settings the server reports
    /// (`application_name`, `TimeZone` …: that looks like session state on
    /// the wire) and do not `PREPARE` (a cleanup would find it).
    ///
    /// Default: none.
    pub after_connect: Option<String>,
    /// The server-side pooler between the pool and PostgreSQL, and what it
    /// guarantees; see [`Pooler`].
    ///
    /// Default: [`Pooler::None`].
    pub pooler: Pooler,
    /// How statements are prepared; `None` picks by the pooler:
    /// [`Prepare::Unnamed`] through a transaction pooler that does not map
    /// named statements, else [`Prepare::Named`].
    ///
    /// Default: `None`.
    pub prepare: Option<Prepare>,
    /// With several hosts: how often every host's role and lag are checked
    /// (also at once when a write meets a read-only host, a write route's
    /// connection breaks, or a standby is promoted).
    ///
    /// Default: 2 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub host_recheck: Duration,
    /// With several hosts: a standby further behind the primary than this
    /// serves no reads until it catches up.
    ///
    /// Default: none (any standby that is up).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub max_replica_lag: Option<Duration>,
    /// Where a read goes when no standby fits.
    ///
    /// Default: [`ReplicaFallback::Primary`].
    pub replica_fallback: ReplicaFallback,
    /// With several hosts and none the primary: how long a write waits for
    /// one to be elected before it fails with
    /// [`ErrorKind::NoPrimary`](crate::ErrorKind::NoPrimary). It waits in
    /// no queue of its own; its `wait_timeout` still applies once it has a
    /// primary.
    ///
    /// Default: zero (fail at once).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub failover_wait: Duration,
    /// Reads that go out in one write on a shared connection share one
    /// `Sync` (one transaction, one `ReadyForQuery`, one flush on the
    /// server): through [`Pool::read`](crate::Pool::read) on read-only
    /// sessions, and plain reads through [`Pool::query`](crate::Pool::query)
    /// on the primary's, behind a head that makes the group read-only. Each
    /// still gets its own answer, and one that fails fails alone (the others
    /// are run again). See the guide's [read groups](crate::guide::read_groups).
    ///
    /// Default: `true`.
    pub read_groups: bool,
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        PoolConfig {
            max_size: cpus * 4,
            pipelining: false,
            max_pipeline_depth: DEFAULT_DEPTH,
            routing: Routing::default(),
            batch_window: Duration::ZERO,
            max_batch: 64,
            queue_capacity: 4096,
            wait_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            statement_cache_capacity: 256,
            max_exclusive: None,
            pool_name: None,
            query_timeout: None,
            statement_timeout: None,
            stall_timeout: Some(Duration::from_secs(60)),
            max_lifetime: Some(Duration::from_secs(30 * 60)),
            idle_timeout: Some(Duration::from_secs(10 * 60)),
            min_idle: 0,
            max_result_bytes: Some(64 << 20),
            max_result_rows: None,
            slow_query_threshold: Some(Duration::from_millis(5)),
            head_of_line_budget: Some(DEFAULT_BUDGET),
            log_slow_statements: Some(Duration::from_secs(1)),
            session_cleanup: SessionCleanup::default(),
            session_settings: BTreeMap::new(),
            after_connect: None,
            pooler: Pooler::None,
            prepare: None,
            host_recheck: Duration::from_secs(2),
            max_replica_lag: None,
            replica_fallback: ReplicaFallback::Primary,
            failover_wait: Duration::ZERO,
            read_groups: true,
        }
    }
}

/// The instant `after` from now; a duration too long to add means "never"
/// (thirty years), not a panic.
pub(crate) fn deadline_after(after: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 24 * 3600))
}

/// `max_pipeline_depth`'s default.
const DEFAULT_DEPTH: usize = 128;

/// `head_of_line_budget`'s default: well above a web service's ordinary
/// statement (so a statement is rarely stopped and run again), well below
/// what a neighbour notices as a stall (the benchmark's fault workloads).
pub(crate) const DEFAULT_BUDGET: Duration = Duration::from_millis(100);
