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

use std::sync::atomic::Ordering;
use std::sync::{Mutex, Weak};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::{
    Counter, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, proto,
};

use crate::error::{Error, ErrorKind};
use crate::pool::PoolInner;

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

/// How a query was run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Pipelined = 0,
    Exclusive = 1,
}

const MODES: [&str; 2] = ["pipelined", "exclusive"];

/// How a query ended, as a label value.
const OUTCOMES: [&str; 7] = [
    "ok",
    "db_error",
    "client_error",
    "connection_lost",
    "timeout",
    "rejected",
    "connect_error",
];

fn outcome(result: Result<(), &Error>) -> usize {
    match result.err().map(Error::kind) {
        None => 0,
        Some(ErrorKind::Db) => 1,
        Some(
            ErrorKind::Params | ErrorKind::RowCount | ErrorKind::Protocol | ErrorKind::TooLarge,
        ) => 2,
        Some(ErrorKind::ConnectionLost) => 3,
        Some(ErrorKind::Timeout) => 4,
        Some(ErrorKind::Connect) => 6,
        Some(_) => 5, // queue full, closed, not allowed on shared, deadlock, config
    }
}

/// Why the pool refused a query before running it.
const REJECTIONS: [&str; 5] = [
    "queue_full",
    "timeout",
    "closed",
    "not_allowed_on_shared",
    "deadlock",
];

fn rejection(kind: ErrorKind) -> Option<usize> {
    match kind {
        ErrorKind::QueueFull => Some(0),
        ErrorKind::Timeout => Some(1),
        ErrorKind::Closed => Some(2),
        ErrorKind::NotAllowedOnShared => Some(3),
        ErrorKind::Deadlock => Some(4),
        _ => None,
    }
}

/// Why a connection was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// Its I/O ended: the server or the network dropped it.
    Broken = 0,
    /// Its session could not be reset before sharing it.
    ResetFailed = 1,
    /// The pool was closed or shrunk.
    Shutdown = 2,
    /// It reached `max_lifetime`.
    MaxLifetime = 3,
    /// It sat unused for `idle_timeout`.
    Idle = 4,
    /// The watchdog killed it: queries in flight, nothing received for
    /// `stall_timeout`.
    Stalled = 5,
}

impl CloseReason {
    pub(crate) fn from_u8(n: u8) -> Option<CloseReason> {
        Some(match n {
            0 => CloseReason::Broken,
            1 => CloseReason::ResetFailed,
            2 => CloseReason::Shutdown,
            3 => CloseReason::MaxLifetime,
            4 => CloseReason::Idle,
            5 => CloseReason::Stalled,
            _ => return None,
        })
    }
}

const CLOSE_REASONS: [&str; 6] = [
    "broken",
    "reset_failed",
    "shutdown",
    "max_lifetime",
    "idle",
    "stalled",
];

/// Why a shared connection was quarantined.
pub(crate) const QUARANTINE_REASONS: [&str; 2] = ["transaction", "session_state"];

/// Handles the socket tap updates for every write and read.
#[derive(Debug)]
pub(crate) struct WireMetrics {
    pub(crate) batch_size: Histogram,
    pub(crate) round_trips_saved: IntCounter,
    pub(crate) latency_saved: Counter,
    pub(crate) quarantined: [IntCounter; 2],
}

/// The pool's metric handles.
#[derive(Debug)]
pub(crate) struct Metrics {
    queries: [[IntCounter; OUTCOMES.len()]; 2],
    durations: [Histogram; 2],
    pub(crate) connection_wait: Histogram,
    pub(crate) flush_wait: Histogram,
    inflight_failed: IntCounter,
    rejected: [IntCounter; REJECTIONS.len()],
    pub(crate) created: IntCounter,
    closed: [IntCounter; CLOSE_REASONS.len()],
    pub(crate) wire: WireMetrics,
    // The families, for collection.
    queries_vec: IntCounterVec,
    durations_vec: HistogramVec,
    rejected_vec: IntCounterVec,
    closed_vec: IntCounterVec,
    quarantined_vec: IntCounterVec,
}

fn opts(name: &str, help: &str, pool: &str) -> Opts {
    Opts::new(name, help)
        .namespace(NAMESPACE)
        .const_label("pool", pool)
}

fn histogram(name: &str, help: &str, pool: &str, buckets: &[f64]) -> HistogramOpts {
    HistogramOpts::new(name, help)
        .namespace(NAMESPACE)
        .const_label("pool", pool)
        .buckets(buckets.to_vec())
}

fn children<const N: usize>(vec: &IntCounterVec, values: [&str; N]) -> [IntCounter; N] {
    values.map(|value| vec.with_label_values(&[value]))
}

impl Metrics {
    pub(crate) fn new(pool: &str) -> Result<Metrics, prometheus::Error> {
        let queries_vec = IntCounterVec::new(
            opts(
                "queries_total",
                "Queries finished, by how they ran and how they ended.",
                pool,
            ),
            &["mode", "outcome"],
        )?;
        let queries = MODES.map(|mode| OUTCOMES.map(|o| queries_vec.with_label_values(&[mode, o])));
        let durations_vec = HistogramVec::new(
            histogram(
                "query_duration_seconds",
                "Time from a query's call to its answer, waiting included.",
                pool,
                SECONDS,
            ),
            &["mode"],
        )?;
        let durations = MODES.map(|mode| durations_vec.with_label_values(&[mode]));
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
            inflight_failed: IntCounter::with_opts(opts(
                "pipeline_inflight_failed_total",
                "Pipelined queries failed because their shared connection broke under them.",
                pool,
            ))?,
            rejected: children(&rejected_vec, REJECTIONS),
            created: IntCounter::with_opts(opts(
                "connections_created_total",
                "Connections opened.",
                pool,
            ))?,
            closed: children(&closed_vec, CLOSE_REASONS),
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
                quarantined: children(&quarantined_vec, QUARANTINE_REASONS),
            },
            queries_vec,
            durations_vec,
            rejected_vec,
            closed_vec,
            quarantined_vec,
        })
    }

    /// Records a finished query.
    pub(crate) fn query(&self, mode: Mode, elapsed: Duration, result: Result<(), &Error>) {
        let mode = mode as usize;
        self.queries[mode][outcome(result)].inc();
        self.durations[mode].observe(elapsed.as_secs_f64());
        if let Err(error) = result {
            if let Some(reason) = rejection(error.kind()) {
                self.rejected[reason].inc();
            }
            if mode == Mode::Pipelined as usize && error.kind() == ErrorKind::ConnectionLost {
                self.inflight_failed.inc();
            }
        }
    }

    pub(crate) fn closed(&self, reason: CloseReason) {
        self.closed[reason as usize].inc();
    }
}

/// The pool's state, read at scrape time, plus every event metric.
pub(crate) struct PoolCollector {
    pool: Weak<PoolInner>,
    depth: IntGauge,
    depth_max: IntGauge,
    queue_depth: IntGauge,
    queue_capacity: IntGauge,
    rtt: Gauge,
    latency_saved_recent: Gauge,
    connections: IntGaugeVec,
    connections_max: IntGauge,
    pending: IntGauge,
    /// Latency saved and pipelined queries at the last scrape, for the
    /// recent average.
    last: Mutex<(f64, u64)>,
    descs: Vec<Desc>,
}

impl PoolCollector {
    fn new(pool: Weak<PoolInner>, name: &str) -> Result<PoolCollector, prometheus::Error> {
        let gauge = |metric: &str, help: &str| IntGauge::with_opts(opts(metric, help, name));
        let mut collector = PoolCollector {
            pool,
            depth: gauge(
                "pipeline_depth",
                "Queries written to shared connections and awaiting their answer now.",
            )?,
            depth_max: gauge(
                "pipeline_depth_max",
                "Most pipelined queries in flight at once since the last scrape.",
            )?,
            queue_depth: gauge(
                "pipeline_queue_depth",
                "Pipelined queries submitted but not yet written: waiting for room, or \
                 admitted and on their way to the socket.",
            )?,
            queue_capacity: gauge(
                "pipeline_queue_capacity",
                "Most queries that may wait for room (queue_capacity).",
            )?,
            rtt: Gauge::with_opts(opts(
                "pipeline_rtt_seconds",
                "Round-trip estimate: a smoothed average of solitary round trips (a write to \
                 an idle connection until its first answer), leaving out any over 1.5 times \
                 the recent minimum (slow queries, answers read late).",
                name,
            ))?,
            latency_saved_recent: Gauge::with_opts(opts(
                "pipeline_latency_saved_seconds",
                "Estimate: latency saved per pipelined query since the last scrape.",
                name,
            ))?,
            connections: IntGaugeVec::new(
                opts("connections", "Open connections, by use.", name),
                &["state"],
            )?,
            connections_max: gauge("connections_max", "Most connections the pool may open.")?,
            pending: gauge(
                "pending_requests",
                "Queries and checkouts waiting for a connection.",
            )?,
            last: Mutex::new((0.0, 0)),
            descs: Vec::new(),
        };
        for state in ["idle", "shared", "exclusive"] {
            collector.connections.with_label_values(&[state]);
        }
        collector.descs = collector
            .gauges()
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned())
            .collect();
        Ok(collector)
    }

    fn gauges(&self) -> [&dyn Collector; 9] {
        [
            &self.depth,
            &self.depth_max,
            &self.queue_depth,
            &self.queue_capacity,
            &self.rtt,
            &self.latency_saved_recent,
            &self.connections,
            &self.connections_max,
            &self.pending,
        ]
    }

    fn refresh(&self, pool: &PoolInner) {
        let status = pool.status();
        let wire = pool.shared_wire_depth();
        self.depth.set(wire as i64);
        self.depth_max.set(
            pool.depth_high
                .swap(status.in_flight as u64, Ordering::AcqRel) as i64,
        );
        let unwritten = (status.in_flight as u64).saturating_sub(wire) + status.waiting as u64;
        self.queue_depth.set(unwritten as i64);
        self.queue_capacity
            .set(i64::try_from(pool.config.queue_capacity).unwrap_or(i64::MAX));
        self.rtt.set(
            pool.wire
                .rtt
                .estimate()
                .map_or(f64::NAN, |d| d.as_secs_f64()),
        );
        self.connections
            .with_label_values(&["idle"])
            .set(status.idle as i64);
        self.connections
            .with_label_values(&["shared"])
            .set(status.shared as i64);
        self.connections
            .with_label_values(&["exclusive"])
            .set(status.exclusive as i64);
        self.connections_max.set(status.max_size as i64);
        self.pending
            .set((status.waiting + status.exclusive_waiting) as i64);
        if let Some(metrics) = &pool.metrics {
            let saved = metrics.wire.latency_saved.get();
            let queries: u64 = metrics.queries[Mode::Pipelined as usize]
                .iter()
                .map(IntCounter::get)
                .sum();
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            let (d_saved, d_queries) = (saved - last.0, queries.saturating_sub(last.1));
            if d_queries > 0 {
                self.latency_saved_recent.set(d_saved / d_queries as f64);
            }
            *last = (saved, queries);
        }
    }
}

impl Collector for PoolCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let Some(pool) = self.pool.upgrade() else {
            return Vec::new();
        };
        self.refresh(&pool);
        self.gauges().iter().flat_map(|c| c.collect()).collect()
    }
}

/// Registers the pool's metrics: the state read at scrape time, and every
/// event metric (each a handle on the same counters the pool updates).
pub(crate) fn register(
    registry: &Registry,
    pool: Weak<PoolInner>,
    metrics: &Metrics,
    name: &str,
) -> Result<(), Error> {
    let fail = |e: prometheus::Error| {
        Error::config(format!(
            "could not register the metrics of pool \"{name}\" (is another pool of that \
             name in this registry?): {e}"
        ))
    };
    let state = PoolCollector::new(pool, name).map_err(fail)?;
    let mut collectors: Vec<Box<dyn Collector>> = vec![
        Box::new(state),
        Box::new(metrics.queries_vec.clone()),
        Box::new(metrics.durations_vec.clone()),
        Box::new(metrics.connection_wait.clone()),
        Box::new(metrics.flush_wait.clone()),
        Box::new(metrics.inflight_failed.clone()),
        Box::new(metrics.rejected_vec.clone()),
        Box::new(metrics.created.clone()),
        Box::new(metrics.closed_vec.clone()),
        Box::new(metrics.quarantined_vec.clone()),
        Box::new(metrics.wire.batch_size.clone()),
        Box::new(metrics.wire.round_trips_saved.clone()),
        Box::new(metrics.wire.latency_saved.clone()),
    ];
    for collector in collectors.drain(..) {
        registry.register(collector).map_err(fail)?;
    }
    Ok(())
}
