//! Prometheus metrics, registered into the caller's registry.
//!
//! Two kinds of figures:
//!
//! - **Events**, counted where they happen with pre-resolved metric handles
//!   (atomics, no lock, no allocation): queries by mode and outcome, their
//!   durations, waits, rejections, connections opened and closed, and, in the
//!   socket tap, batch sizes, round trips saved and latency saved.
//! - **State**, read from the pool when Prometheus scrapes: connections by
//!   state, pipeline depth, queue depth, the round-trip estimate.
//!
//! Every series carries a constant `pool` label, so several pools can share
//! one registry. Label values come from fixed lists; no SQL, parameter,
//! error message or user name ever becomes a label.

mod collector;

use std::time::{Duration, Instant};

use prometheus::{
    Counter, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts,
};

pub(crate) use collector::{Snapshot, register};

pub(crate) mod hosts;
pub(crate) use hosts::HostMetrics;

use crate::error::{Error, ErrorKind};

const NAMESPACE: &str = "pgpipe";

/// Buckets for durations, from 100 µs (a LAN round trip) to 10 s.
const SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Buckets for the batch window's wait, from 10 µs.
const WAIT_SECONDS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1,
];
/// Buckets for queries per write: 1, 2, 4 … 256.
const BATCH: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
/// Buckets for queries in flight: 1, 2, 4 … 4096.
const IN_FLIGHT: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

/// A fixed set of label values: each variant knows its own, and `ALL`
/// lists them in declaration order, so that `variant as usize` indexes it.
macro_rules! labels {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $label:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum $name {
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            pub(crate) const ALL: &[$name] = &[$($name::$variant,)*];

            pub(crate) fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)*
                }
            }
        }
    };
}

labels! {
    /// How a query was run.
    Mode {
        Pipelined = "pipelined",
        Exclusive = "exclusive",
    }
}

labels! {
    /// How a query ended.
    Outcome {
        Ok = "ok",
        DbError = "db_error",
        ClientError = "client_error",
        ConnectionLost = "connection_lost",
        Timeout = "timeout",
        /// Queue full, closed, not allowed on shared, deadlock, config, and
        /// the items of an atomic batch that another item aborted.
        Rejected = "rejected",
        ConnectError = "connect_error",
        /// Ran past `query_timeout` (it may have run).
        QueryTimeout = "query_timeout",
        /// Its caller dropped it before it finished (a `select!`, a
        /// `try_join!` whose sibling failed, a request that went away).
        Cancelled = "cancelled",
    }
}

impl Outcome {
    fn of(result: Result<(), &Error>) -> Outcome {
        match result.err().map(Error::kind) {
            None => Outcome::Ok,
            Some(ErrorKind::Db) => Outcome::DbError,
            Some(
                ErrorKind::Params | ErrorKind::RowCount | ErrorKind::Protocol | ErrorKind::TooLarge,
            ) => Outcome::ClientError,
            Some(ErrorKind::ConnectionLost) => Outcome::ConnectionLost,
            Some(ErrorKind::Timeout) => Outcome::Timeout,
            Some(ErrorKind::QueryTimeout) => Outcome::QueryTimeout,
            Some(ErrorKind::Connect) => Outcome::ConnectError,
            Some(_) => Outcome::Rejected,
        }
    }
}

labels! {
    /// Why the pool refused a query before running it.
    Rejection {
        QueueFull = "queue_full",
        Timeout = "timeout",
        Closed = "closed",
        NotAllowedOnShared = "not_allowed_on_shared",
        Deadlock = "deadlock",
    }
}

impl Rejection {
    fn of(kind: ErrorKind) -> Option<Rejection> {
        match kind {
            ErrorKind::QueueFull => Some(Rejection::QueueFull),
            ErrorKind::Timeout => Some(Rejection::Timeout),
            ErrorKind::Closed => Some(Rejection::Closed),
            ErrorKind::NotAllowedOnShared => Some(Rejection::NotAllowedOnShared),
            ErrorKind::Deadlock => Some(Rejection::Deadlock),
            _ => None,
        }
    }
}

labels! {
    /// Why a connection was closed.
    CloseReason {
        /// Its I/O ended: the server or the network dropped it.
        Broken = "broken",
        /// Its session could not be reset before sharing it.
        ResetFailed = "reset_failed",
        /// The pool was closed or shrunk.
        Shutdown = "shutdown",
        /// It reached `max_lifetime`.
        MaxLifetime = "max_lifetime",
        /// It sat unused for `idle_timeout`.
        Idle = "idle",
        /// The watchdog killed it: queries in flight, nothing received for
        /// `stall_timeout`.
        Stalled = "stalled",
    }
}

impl CloseReason {
    pub(crate) fn from_u8(n: u8) -> Option<CloseReason> {
        CloseReason::ALL.get(usize::from(n)).copied()
    }
}

labels! {
    /// Why a shared connection was quarantined.
    QuarantineReason {
        /// A ReadyForQuery showed a transaction left open.
        Transaction = "transaction",
        /// A reported setting changed (`ParameterStatus`).
        SessionState = "session_state",
        /// The cleanup run behind code the guard cannot read failed, or
        /// found state it cannot undo (a `PREPARE`d statement).
        Cleanup = "cleanup",
        /// A standby was promoted under the connection (`in_hot_standby`
        /// turned off): the host's role changed, not the session.
        RoleChange = "role_change",
    }
}

labels! {
    /// What a server-side pooler said.
    PoolerError {
        /// PgBouncer lost the server under the query (`server conn
        /// crashed?`): it may have run.
        ServerConnCrashed = "server_conn_crashed",
        /// PgBouncer found no server within `query_wait_timeout`.
        QueryWaitTimeout = "query_wait_timeout",
        /// PgBouncer cannot log in to the server, or has no room.
        NoServer = "no_server",
    }
}

impl PoolerError {
    fn of(error: &Error) -> Option<PoolerError> {
        let db = error.as_db_error()?;
        if db.message().starts_with("server conn crashed") {
            Some(PoolerError::ServerConnCrashed)
        } else if db.message().starts_with("query_wait_timeout") {
            Some(PoolerError::QueryWaitTimeout)
        } else if crate::error::pooler_found_no_server(db) {
            Some(PoolerError::NoServer)
        } else {
            None
        }
    }
}

/// Handles the socket tap updates for every write and read.
#[derive(Debug)]
pub(crate) struct WireMetrics {
    pub(crate) batch_size: Histogram,
    pub(crate) round_trips_saved: IntCounter,
    pub(crate) latency_saved: Counter,
    /// Read groups: Syncs dropped, reads per group, reads run again.
    pub(crate) syncs_saved: IntCounter,
    pub(crate) group_size: Histogram,
    pub(crate) resent: IntCounter,
    quarantined: Box<[IntCounter]>,
}

impl WireMetrics {
    pub(crate) fn quarantined(&self, reason: QuarantineReason) {
        self.quarantined[reason as usize].inc();
    }
}

/// The pool's metric handles.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// By [`Mode`], then [`Outcome`].
    queries: Box<[Box<[IntCounter]>]>,
    durations: Box<[Histogram]>,
    pub(crate) connection_wait: Histogram,
    pub(crate) flush_wait: Histogram,
    /// Pipelined queries in flight when one was admitted, itself included.
    pub(crate) in_flight: Histogram,
    statement_hits: IntCounter,
    statement_misses: IntCounter,
    pub(crate) statements_evicted: IntCounter,
    /// Time to open a connection, from the socket to ready.
    pub(crate) connection_open: Histogram,
    /// Time a connection from `get()` was held.
    pub(crate) exclusive_hold: Histogram,
    inflight_failed: IntCounter,
    /// `get()`s by [`Outcome`].
    checkouts: Box<[IntCounter]>,
    /// By [`PoolerError`].
    pooler_errors: Box<[IntCounter]>,
    rejected: Box<[IntCounter]>,
    pub(crate) created: IntCounter,
    /// Opens that failed: refused, unreachable, timed out, rejected at
    /// start-up or by `after_connect`.
    pub(crate) connection_errors: IntCounter,
    closed: Box<[IntCounter]>,
    pub(crate) wire: WireMetrics,
    // The families, for collection.
    queries_vec: IntCounterVec,
    checkouts_vec: IntCounterVec,
    pooler_errors_vec: IntCounterVec,
    durations_vec: HistogramVec,
    rejected_vec: IntCounterVec,
    closed_vec: IntCounterVec,
    quarantined_vec: IntCounterVec,
}

/// The `pool` label of one lane's series. Every pgpipe series has the
/// same label names whatever the pool (a registry refuses one name with
/// two sets), so a lane other than a one-host pool's write lane is told
/// apart in the value: `orders` (the write lane), `orders/read` (its read
/// lane), and with several hosts `orders@db1:5432`, `orders@db1:5432/read`.
#[derive(Debug, Clone)]
pub(crate) struct Labels {
    pub(crate) pool: String,
    pub(crate) host: Option<String>,
    pub(crate) lane: Option<&'static str>,
}

impl Labels {
    /// Just the `pool` label.
    pub(crate) fn pool(pool: &str) -> Labels {
        Labels {
            pool: pool.to_owned(),
            host: None,
            lane: None,
        }
    }

    fn value(&self) -> String {
        let mut value = self.pool.clone();
        if let Some(host) = &self.host {
            value.push('@');
            value.push_str(host);
        }
        if let Some(lane) = self.lane.filter(|&lane| lane != "write") {
            value.push('/');
            value.push_str(lane);
        }
        value
    }
}

impl std::fmt::Display for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.value())
    }
}

fn opts(name: &str, help: &str, pool: &Labels) -> Opts {
    Opts::new(name, help)
        .namespace(NAMESPACE)
        .const_label("pool", pool.value())
}

fn histogram(name: &str, help: &str, pool: &Labels, buckets: &[f64]) -> HistogramOpts {
    HistogramOpts::new(name, help)
        .namespace(NAMESPACE)
        .const_label("pool", pool.value())
        .buckets(buckets.to_vec())
}

/// One counter per label value, in the order given.
fn children<L: Copy>(
    vec: &IntCounterVec,
    all: &[L],
    label: fn(L) -> &'static str,
) -> Box<[IntCounter]> {
    all.iter()
        .map(|&l| vec.with_label_values(&[label(l)]))
        .collect()
}

impl Metrics {
    pub(crate) fn new(pool: &Labels) -> Result<Metrics, prometheus::Error> {
        let queries_vec = IntCounterVec::new(
            opts(
                "queries_total",
                "Queries finished, by how they ran and how they ended.",
                pool,
            ),
            &["mode", "outcome"],
        )?;
        let queries = Mode::ALL
            .iter()
            .map(|mode| {
                Outcome::ALL
                    .iter()
                    .map(|o| queries_vec.with_label_values(&[mode.label(), o.label()]))
                    .collect()
            })
            .collect();
        let checkouts_vec = IntCounterVec::new(
            opts(
                "checkouts_total",
                "Exclusive checkouts (get()) finished, by how they ended.",
                pool,
            ),
            &["outcome"],
        )?;
        let pooler_errors_vec = IntCounterVec::new(
            opts(
                "pooler_errors_total",
                "Errors a server-side pooler (PgBouncer) sent instead of the server, by kind.",
                pool,
            ),
            &["kind"],
        )?;
        let durations_vec = HistogramVec::new(
            histogram(
                "query_duration_seconds",
                "Time from a query's call to its answer, waiting included.",
                pool,
                SECONDS,
            ),
            &["mode"],
        )?;
        let durations = Mode::ALL
            .iter()
            .map(|mode| durations_vec.with_label_values(&[mode.label()]))
            .collect();
        let rejected_vec = IntCounterVec::new(
            opts(
                "pipeline_rejected_total",
                "Queries refused before running, by reason.",
                pool,
            ),
            &["reason"],
        )?;
        let closed_vec = IntCounterVec::new(
            opts(
                "connections_closed_total",
                "Connections closed, by reason.",
                pool,
            ),
            &["reason"],
        )?;
        let quarantined_vec = IntCounterVec::new(
            opts(
                "pipeline_quarantined_total",
                "Shared connections taken out of use because the wire showed session state \
                 (a transaction, or a changed setting).",
                pool,
            ),
            &["reason"],
        )?;
        Ok(Metrics {
            queries,
            durations,
            connection_wait: Histogram::with_opts(histogram(
                "connection_wait_seconds",
                "Time a query or checkout waited for a connection (or room on a shared one).",
                pool,
                SECONDS,
            ))?,
            flush_wait: Histogram::with_opts(histogram(
                "pipeline_flush_wait_seconds",
                "Time a pipelined query was held in the batch window before being sent: \
                 the cost of batching.",
                pool,
                WAIT_SECONDS,
            ))?,
            in_flight: Histogram::with_opts(histogram(
                "pipeline_in_flight",
                "Pipelined queries in flight on the shared path when a query was admitted, \
                 itself included (a batch's items count one each).",
                pool,
                IN_FLIGHT,
            ))?,
            statement_hits: IntCounter::with_opts(opts(
                "statement_cache_hits_total",
                "Queries whose statement was in their connection's cache.",
                pool,
            ))?,
            statement_misses: IntCounter::with_opts(opts(
                "statement_cache_misses_total",
                "Queries whose statement had to be prepared first (by them, or by a query \
                 they waited for).",
                pool,
            ))?,
            statements_evicted: IntCounter::with_opts(opts(
                "statement_cache_evictions_total",
                "Statements dropped from a full cache (statement_cache_capacity).",
                pool,
            ))?,
            connection_open: Histogram::with_opts(histogram(
                "connection_open_seconds",
                "Time to open a connection: socket, TLS, start-up and authentication.",
                pool,
                SECONDS,
            ))?,
            exclusive_hold: Histogram::with_opts(histogram(
                "exclusive_hold_seconds",
                "Time a connection checked out with get() was held by its user.",
                pool,
                SECONDS,
            ))?,
            inflight_failed: IntCounter::with_opts(opts(
                "pipeline_inflight_failed_total",
                "Pipelined queries failed because their shared connection broke under them.",
                pool,
            ))?,
            checkouts: children(&checkouts_vec, Outcome::ALL, Outcome::label),
            pooler_errors: children(&pooler_errors_vec, PoolerError::ALL, PoolerError::label),
            rejected: children(&rejected_vec, Rejection::ALL, Rejection::label),
            created: IntCounter::with_opts(opts(
                "connections_created_total",
                "Connections opened.",
                pool,
            ))?,
            connection_errors: IntCounter::with_opts(opts(
                "connection_errors_total",
                "Connections that could not be opened: refused, unreachable, timed out, \
                 rejected at start-up or by after_connect.",
                pool,
            ))?,
            closed: children(&closed_vec, CloseReason::ALL, CloseReason::label),
            wire: WireMetrics {
                batch_size: Histogram::with_opts(histogram(
                    "pipeline_batch_size",
                    "Queries (Sync messages) per socket write on shared connections.",
                    pool,
                    BATCH,
                ))?,
                round_trips_saved: IntCounter::with_opts(opts(
                    "pipeline_round_trips_saved_total",
                    "Queries written to a shared connection that already had a query in \
                     flight, and so did not pay a round trip of their own.",
                    pool,
                ))?,
                latency_saved: Counter::with_opts(opts(
                    "pipeline_latency_saved_seconds_total",
                    "Estimate: round trips saved times the round-trip estimate at the time; \
                     the time these queries would have spent waiting for a round trip each.",
                    pool,
                ))?,
                syncs_saved: IntCounter::with_opts(opts(
                    "read_group_syncs_saved_total",
                    "Syncs not sent: reads that went out in one write on a read lane's \
                     shared connection shared the last one's.",
                    pool,
                ))?,
                group_size: Histogram::with_opts(histogram(
                    "read_group_size",
                    "Reads per group (under one Sync), for groups of two or more.",
                    pool,
                    BATCH,
                ))?,
                resent: IntCounter::with_opts(opts(
                    "read_group_resent_total",
                    "Reads the server skipped because an earlier read in their group failed, \
                     run again (they had not run).",
                    pool,
                ))?,
                quarantined: children(
                    &quarantined_vec,
                    QuarantineReason::ALL,
                    QuarantineReason::label,
                ),
            },
            queries_vec,
            checkouts_vec,
            pooler_errors_vec,
            durations_vec,
            rejected_vec,
            closed_vec,
            quarantined_vec,
        })
    }

    /// Records a finished query.
    pub(crate) fn query(&self, mode: Mode, elapsed: Duration, result: Result<(), &Error>) {
        self.queries[mode as usize][Outcome::of(result) as usize].inc();
        self.durations[mode as usize].observe(elapsed.as_secs_f64());
        if let Err(error) = result {
            if let Some(reason) = Rejection::of(error.kind()) {
                self.rejected[reason as usize].inc();
            }
            if mode == Mode::Pipelined && error.kind() == ErrorKind::ConnectionLost {
                self.inflight_failed.inc();
            }
            if let Some(kind) = PoolerError::of(error) {
                self.pooler_errors[kind as usize].inc();
            }
        }
    }

    /// Records a query whose caller dropped it before it finished.
    fn cancelled(&self, mode: Mode, elapsed: Duration) {
        self.queries[mode as usize][Outcome::Cancelled as usize].inc();
        self.durations[mode as usize].observe(elapsed.as_secs_f64());
    }

    /// Records how a `get()` ended: its outcome, and for a refusal
    /// (timeout, deadlock, closed) its reason.
    pub(crate) fn checkout(&self, result: Result<(), &Error>) {
        self.checkouts[Outcome::of(result) as usize].inc();
        if let Some(reason) = result.err().and_then(|e| Rejection::of(e.kind())) {
            self.rejected[reason as usize].inc();
        }
    }

    /// Counts a statement-cache lookup.
    pub(crate) fn statement_lookup(&self, hit: bool) {
        if hit {
            self.statement_hits.inc();
        } else {
            self.statement_misses.inc();
        }
    }

    pub(crate) fn closed(&self, reason: CloseReason) {
        self.closed[reason as usize].inc();
    }
}

/// One query being counted: [`finish`](Counting::finish) records how it
/// ended; dropped before that (its caller dropped the future), it counts as
/// `cancelled`, so that every query ends under some outcome.
pub(crate) struct Counting<'a> {
    metrics: &'a Metrics,
    mode: Mode,
    start: Instant,
    done: bool,
}

impl<'a> Counting<'a> {
    pub(crate) fn start(metrics: &'a Metrics, mode: Mode) -> Counting<'a> {
        Counting {
            metrics,
            mode,
            start: Instant::now(),
            done: false,
        }
    }

    /// When the query started.
    pub(crate) fn started(&self) -> Instant {
        self.start
    }

    pub(crate) fn finish(mut self, result: Result<(), &Error>) {
        self.done = true;
        self.metrics.query(self.mode, self.start.elapsed(), result);
    }
}

impl Drop for Counting<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.cancelled(self.mode, self.start.elapsed());
        }
    }
}
