//! The metric families: their names, help texts and buckets, and
//! [`Metrics::new`], which makes them and resolves every labelled child
//! once, so that counting an event is an index and an atomic add.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts};

use super::histogram::{Family, Unit};
use super::{
    CloseReason, Labels, Metrics, Mode, Outcome, PoolerError, QuarantineReason, Rejection, Saved,
    WireMetrics,
};

pub(super) const NAMESPACE: &str = "pgpipe";

/// Buckets for durations, from 100 µs (a LAN round trip) to 10 s.
pub(super) const SECONDS: &[f64] = &[
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

pub(super) fn opts(name: &str, help: &str, pool: &Labels) -> Opts {
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
                "Queries finished, by how they ran and how they ended (a checkout's: every statement the server answered on it).",
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
        let modes: Vec<&'static str> = Mode::ALL.iter().map(|m| m.label()).collect();
        let durations_family = Family::new(
            "query_duration_seconds",
            "Time from a query's call to its answer, waiting included.",
            pool,
            Unit::Seconds,
            SECONDS,
            Some(("mode", &modes)),
        )?;
        let durations = (0..modes.len())
            .map(|i| durations_family.child(i))
            .collect();
        let connection_wait_family = Family::new(
            "connection_wait_seconds",
            "Time a query or checkout waited for a connection (or room on a shared one).",
            pool,
            Unit::Seconds,
            SECONDS,
            None,
        )?;
        let in_flight_family = Family::new(
            "pipeline_in_flight",
            "Pipelined queries in flight on the shared path when a query was admitted, \
             itself included (a batch's items count one each).",
            pool,
            Unit::Count,
            IN_FLIGHT,
            None,
        )?;
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
            connection_wait: connection_wait_family.child(0),
            flush_wait: Histogram::with_opts(histogram(
                "pipeline_flush_wait_seconds",
                "Time a pipelined query was held in the batch window before being sent: \
                 the cost of batching.",
                pool,
                WAIT_SECONDS,
            ))?,
            in_flight: in_flight_family.child(0),
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
                    "Queries (the client's Sync messages, before read groups share them) per \
                     socket write on shared connections.",
                    pool,
                    BATCH,
                ))?,
                round_trips_saved: IntCounter::with_opts(opts(
                    "pipeline_round_trips_saved_total",
                    "Queries written to a shared connection that already had a query in \
                     flight, and so did not pay a round trip of their own.",
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
                evicted: IntCounter::with_opts(opts(
                    "head_of_line_evicted_total",
                    "Statements the server stopped at the head-of-line budget on a shared \
                     connection (nothing they did committed), run again on a connection of \
                     their own; their next runs go there from the start.",
                    pool,
                ))?,
                quarantined: children(
                    &quarantined_vec,
                    QuarantineReason::ALL,
                    QuarantineReason::label,
                ),
            },
            saved: Saved::new(pool)?,
            queries_vec,
            checkouts_vec,
            pooler_errors_vec,
            durations_family,
            connection_wait_family,
            in_flight_family,
            rejected_vec,
            closed_vec,
            quarantined_vec,
        })
    }
}
