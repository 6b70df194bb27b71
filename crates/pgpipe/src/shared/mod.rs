//! The shared path: connections that carry queries from many tasks at once,
//! and the [`Router`] that owns them.
//!
//! Each shared connection keeps its own writer (tokio-postgres' connection
//! task, see `conn::step_aside`); there is no pool-wide write loop. A query
//! reads the current list of shared connections (one atomic load), picks one
//! ([`route`]), and claims a place on it with one compare-and-swap on that
//! connection's load word ([`admission`]). Only when nothing has room does a
//! query touch the wait [`queue`]. Admission takes no lock, except to prune
//! a retired connection from the list, which is rare.
//!
//! The router owns all of it: the set of shared connections, admission, the
//! wait queue and its hand-off, routing, opening and retiring connections
//! ([`open`]), learned costs ([`costs`]), the batch window
//! ([`batch_window`]) and the housekeeping passes over shared connections
//! ([`upkeep`]). It reads one thing it does not own: how many connections
//! exclusive checkouts have claimed ([`Claims`](crate::budget::Claims)), which bounds how many it
//! may hold.

pub(crate) mod admission;
mod batch_window;
pub(crate) mod conn;
pub(crate) mod costs;
mod deadlines;
mod note;
mod open;
pub(crate) mod queue;
pub(crate) mod route;
mod upkeep;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;

use admission::Handoff;
pub(crate) use admission::Place;
pub(crate) use conn::SharedConn;
use costs::Costs;
use note::DispatchNote;
use open::OpenFailure;
use queue::WaitQueue;

use crate::budget::Claims;
use crate::config::{PoolConfig, Routing};
use crate::conn::{Manager, PoolWire};
use crate::error::Error;
use crate::metrics::Metrics;

/// The shared path's owner; see the module docs.
pub(crate) struct Router {
    config: PoolConfig,
    /// Where connections come from, and go back to.
    pg: deadpool::managed::Pool<Manager>,
    /// The shared connections, oldest first.
    conns: ArcSwap<Vec<Arc<SharedConn>>>,
    /// Serializes changes to `conns` (rare: opens, retirements).
    edit: Mutex<()>,
    /// Connections being opened for the shared path.
    opening: AtomicUsize,
    /// Queries waiting for room.
    queue: WaitQueue<Handoff>,
    /// Whether the timer of the waiters' deadlines runs, and its wake-up
    /// (see [`deadlines`]).
    sweeping: AtomicBool,
    deadlines: Arc<tokio::sync::Notify>,
    /// Whether a dispatch is running, and whether another was asked for
    /// meanwhile (see [`admission`] and [`note`]).
    note: DispatchNote,
    /// The last failed open, while its back-off lasts.
    failure: Mutex<Option<OpenFailure>>,
    /// Until when (the pool's fine clock, nanoseconds) no open is tried; the
    /// lock-free copy of `failure`'s deadline, for routing.
    backoff_until: AtomicU64,
    /// How long statements take, for head-of-line-aware routing.
    costs: Costs,
    /// What the connections' socket taps report, and the pool's clock.
    wire: Arc<PoolWire>,
    metrics: Option<Arc<Metrics>>,
    /// Connections claimed by exclusive checkouts.
    claims: Arc<Claims>,
    closed: AtomicBool,
    /// Whether a task is opening connections up to `min_idle`.
    topping_up: AtomicBool,
}

/// Shared connections, and queries on them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub(crate) conns: usize,
    /// Admitted and not finished.
    pub(crate) in_flight: usize,
    /// Waiting for room.
    pub(crate) waiting: usize,
    /// Written and not yet answered.
    pub(crate) wire_depth: u64,
    /// Being opened for the shared path.
    pub(crate) opening: usize,
}

impl Router {
    pub(crate) fn new(
        config: PoolConfig,
        pg: deadpool::managed::Pool<Manager>,
        wire: Arc<PoolWire>,
        metrics: Option<Arc<Metrics>>,
        claims: Arc<Claims>,
    ) -> Router {
        Router {
            config,
            pg,
            conns: ArcSwap::default(),
            edit: Mutex::new(()),
            opening: AtomicUsize::new(0),
            queue: WaitQueue::default(),
            sweeping: AtomicBool::new(false),
            deadlines: Arc::default(),
            note: DispatchNote::default(),
            failure: Mutex::new(None),
            backoff_until: AtomicU64::new(0),
            costs: Costs::default(),
            wire,
            metrics,
            claims,
            closed: AtomicBool::new(false),
            topping_up: AtomicBool::new(false),
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Takes no more work: retires every shared connection (they close as
    /// their queries finish) and fails every waiting query.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.retire_all();
        self.queue.fail_all(Error::closed);
    }

    /// Fails every query waiting for room with `error`: another host was
    /// elected primary, and what waits here for the old one has not been
    /// sent (issue #47).
    pub(crate) fn fail_waiting(&self, error: impl Fn() -> Error) {
        self.queue.fail_all(error);
    }

    /// The learned costs of statements.
    pub(crate) fn costs(&self) -> &Costs {
        &self.costs
    }

    /// How many connections the shared path may hold now: what exclusive
    /// users have not claimed.
    fn shared_limit(&self) -> usize {
        self.config.max_size.saturating_sub(self.claims.reserved())
    }

    /// The most queries one shared connection may carry now.
    ///
    /// `max_pipeline_depth`, raised when exclusive checkouts hold
    /// connections the shared path could otherwise open, so that its
    /// in-flight budget (`max_pipeline_depth` × `max_size`) does not shrink
    /// under transactions. Measured at 1 ms RTT, pool of 4, 512 tasks, one
    /// task in ten in interactive transactions: with a fixed depth the
    /// transactions took three connections and the reads fell to 0.44× of
    /// their throughput alone, capped by 64 queries on the one connection
    /// left. Never raised behind a pooler that cannot track a pipeline.
    pub(crate) fn max_depth(&self) -> u64 {
        let depth = self.config.max_pipeline_depth as u64;
        let claimed = self.claims.reserved();
        if claimed == 0 || !self.config.pooler.allows_pipeline() {
            return depth;
        }
        let budget = depth.saturating_mul(self.config.max_size as u64);
        let shared = self.config.max_size.saturating_sub(claimed).max(1) as u64;
        (budget / shared).clamp(depth, 1 << 20)
    }

    fn rules(&self) -> route::Rules {
        route::Rules {
            max_depth: self.max_depth(),
            fill: self.config.routing == Routing::Fill,
            hol: self.config.slow_query_threshold.is_some(),
        }
    }

    /// Holds a query in its connection's batch window, if one is set and
    /// the query found the connection busy; see [`batch_window`].
    pub(crate) async fn batch_window(&self, place: &Place<'_>) {
        let window = self.config.batch_window;
        if place.ahead == 0 || window.is_zero() {
            return;
        }
        let held = Instant::now();
        place.conn.gate.pass(window, self.config.max_batch).await;
        if let Some(metrics) = &self.metrics {
            metrics.flush_wait.observe(held.elapsed().as_secs_f64());
        }
    }

    /// Shared connections, and queries on them.
    pub(crate) fn counts(&self) -> Counts {
        let conns = self.conns.load();
        Counts {
            conns: conns.len(),
            in_flight: conns.iter().map(|c| c.in_flight() as usize).sum(),
            waiting: self.queue.len(),
            wire_depth: conns.iter().map(|c| c.state().counts.depth()).sum(),
            opening: self.opening.load(Ordering::Acquire),
        }
    }

    /// Records how many pipelined queries were in flight, this one
    /// included, when a query was admitted (a histogram PromQL can window;
    /// no state a scrape resets).
    #[inline]
    fn note_depth(&self, in_flight: u64) {
        if let Some(metrics) = &self.metrics {
            metrics.in_flight.observe(in_flight);
        }
    }
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("conns", &self.conns.load().len())
            .field("opening", &self.opening.load(Ordering::Relaxed))
            .field("waiting", &self.queue.len())
            .finish_non_exhaustive()
    }
}
