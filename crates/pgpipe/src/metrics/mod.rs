//! Prometheus metrics, registered into the caller's registry.
//!
//! Two kinds of figures:
//!
//! - **Events**, counted where they happen with pre-resolved metric handles
//!   (atomics, no lock, no allocation): queries by mode and outcome, their
//!   durations, waits, rejections, connections opened and closed, and, in the
//!   socket tap, batch sizes and round trips saved.
//! - **Latency saved**, an estimate of the same pool without pipelining,
//!   folded by the housekeeping tick from what the pool counts anyway
//!   ([`saved`]).
//! - **State**, read from the pool when Prometheus scrapes: connections by
//!   state, pipeline depth, queue depth, the round-trip estimate.
//!
//! Every series carries a constant `pool` label, so several pools can share
//! one registry. Label values come from fixed lists; no SQL, parameter,
//! error message or user name ever becomes a label.

mod collector;
mod counting;
mod families;
mod histogram;
pub(crate) mod hosts;
mod labels;
mod saved;

use std::time::Duration;

use prometheus::{Histogram, IntCounter, IntCounterVec};

pub(crate) use collector::{Snapshot, register};
pub(crate) use counting::Counting;
use families::{NAMESPACE, SECONDS, opts};
pub(crate) use histogram::Buckets;
use histogram::Family;
pub(crate) use hosts::HostMetrics;
pub(crate) use labels::{CloseReason, Labels, Mode, QuarantineReason};
use labels::{Outcome, PoolerError, Rejection};
pub(crate) use saved::Saved;

use crate::error::{Error, ErrorKind};

/// Handles the socket tap updates for every write and read.
#[derive(Debug)]
pub(crate) struct WireMetrics {
    pub(crate) batch_size: Histogram,
    pub(crate) round_trips_saved: IntCounter,
    /// Read groups: Syncs dropped, reads per group, reads run again.
    pub(crate) syncs_saved: IntCounter,
    pub(crate) group_size: Histogram,
    pub(crate) resent: IntCounter,
    /// Statements the server stopped at the head-of-line budget on a shared
    /// connection, run again on a connection of their own.
    pub(crate) evicted: IntCounter,
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
    /// By [`Mode`].
    durations: Box<[Buckets]>,
    pub(crate) connection_wait: Buckets,
    pub(crate) flush_wait: Histogram,
    /// Pipelined queries in flight when one was admitted, itself included.
    pub(crate) in_flight: Buckets,
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
    /// Latency saved: what it is folded from, and its counters.
    pub(crate) saved: Saved,
    // The families, for collection.
    queries_vec: IntCounterVec,
    checkouts_vec: IntCounterVec,
    pooler_errors_vec: IntCounterVec,
    durations_family: Family,
    connection_wait_family: Family,
    in_flight_family: Family,
    rejected_vec: IntCounterVec,
    closed_vec: IntCounterVec,
    quarantined_vec: IntCounterVec,
}

impl Metrics {
    /// Records a finished query.
    pub(crate) fn query(&self, mode: Mode, elapsed: Duration, result: Result<(), &Error>) {
        self.queries[mode as usize][Outcome::of(result) as usize].inc();
        self.durations[mode as usize].observe_duration(elapsed);
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

    /// Records a statement the server answered on a held connection (see
    /// the tap's `held`), ok or with an error, `elapsed` after the write
    /// that carried it.
    pub(crate) fn statement(&self, mode: Mode, elapsed: Duration, ok: bool) {
        let outcome = if ok { Outcome::Ok } else { Outcome::DbError };
        self.queries[mode as usize][outcome as usize].inc();
        self.durations[mode as usize].observe_duration(elapsed);
    }

    /// Records a request written on a held connection whose answer never
    /// came: the connection ended first.
    pub(crate) fn statement_lost(&self, mode: Mode, elapsed: Duration) {
        self.queries[mode as usize][Outcome::ConnectionLost as usize].inc();
        self.durations[mode as usize].observe_duration(elapsed);
    }

    /// Records a query whose caller dropped it before it finished.
    fn cancelled(&self, mode: Mode, elapsed: Duration) {
        self.queries[mode as usize][Outcome::Cancelled as usize].inc();
        self.durations[mode as usize].observe_duration(elapsed);
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

    /// Statement-cache misses so far.
    pub(crate) fn statement_misses(&self) -> u64 {
        self.statement_misses.get()
    }

    pub(crate) fn closed(&self, reason: CloseReason) {
        self.closed[reason as usize].inc();
    }

    /// Folds latency saved (see [`saved`]): a pipelining lane's
    /// housekeeping tick calls this.
    pub(crate) fn fold_saved(&self, max_size: usize, rtt: Option<Duration>) {
        let durations = &self.durations[Mode::Pipelined as usize];
        let checkouts = &self.durations[Mode::Checkout as usize];
        self.saved.fold(durations, checkouts, max_size, rtt);
    }
}
