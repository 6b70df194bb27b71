//! A lane: one pool of connections to one server, with one kind of session
//! (a host's write lane, or its read lane, whose sessions are read-only).
//! Everything below it (the shared path, exclusive checkouts, one
//! connection) belongs to exactly one lane; everything above it
//! ([`hosts`](crate::hosts), the handles) picks a lane and hands it work.
//!
//! - `mod.rs`: [`Lane`], what it holds, and its status and metrics snapshot;
//! - [`recipe`]: what a lane is made from ([`LaneRecipe`], [`Setup`]);
//! - [`query`]: one query on one lane, end to end;
//! - [`alone`]: a query on a connection of its own;
//! - [`cost`]: what is known of a query's cost before it runs;
//! - [`evict`]: a statement stopped at the head-of-line budget, run again;
//! - [`retry`]: the one rule for running again what never ran;
//! - [`quota`]: the atomic batches that may run at once;
//! - [`housekeeping`]: the lane's 100 ms tick;
//! - [`catalog`]: the lane's view of its database's catalog.

mod alone;
pub(crate) mod catalog;
mod cost;
mod evict;
pub(crate) mod housekeeping;
pub(crate) mod query;
mod quota;
mod recipe;
pub(crate) mod retry;
pub(crate) mod settings;

use crate::protocol::coalesce::Grouping;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use deadpool::Runtime;

use crate::config::PoolConfig;
use crate::conn::describe::Descriptions;
use crate::conn::run::{Limits, RunSettings};
use crate::conn::state::Behind;
use crate::conn::{Manager, PoolWire};
use crate::error::Error;
use crate::exclusive::{Connection, Exclusive, Holder};
use crate::metrics::{self, Metrics, Mode, Snapshot};
use crate::pooler::Prepare;
use crate::shared::{Counts, Router};
use crate::status::Status;

pub(crate) use recipe::{LaneRecipe, Setup};

/// One lane of one host: a pool of connections to one server. Each part
/// owns its state; this struct only holds them together.
pub(crate) struct Lane {
    config: PoolConfig,
    pg: deadpool::managed::Pool<Manager>,
    /// The shared (pipelined) path.
    router: Arc<Router>,
    /// Exclusive checkouts.
    exclusive: Exclusive,
    /// What the connections' socket taps report, and the pool's clock.
    wire: Arc<PoolWire>,
    /// Metric handles, when a registry was given.
    metrics: Option<Arc<Metrics>>,
    /// Whether the housekeeping task was started.
    housekeeping: AtomicBool,
    /// With pipelining: atomic batches running at once, at most half the
    /// pool (see `quota.rs`).
    atomic_batches: Option<tokio::sync::Semaphore>,
    /// The `pool` label of its metrics, and of its trace spans.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    name: String,
}

impl Lane {
    /// Makes one lane.
    fn new(recipe: LaneRecipe) -> Result<Arc<Lane>, Error> {
        let LaneRecipe {
            server,
            config,
            labels,
            registry,
            tls,
            hooks,
            build_info,
        } = recipe;
        // Shared connections group the reads of one write under one Sync:
        // a read lane's on its read-only sessions, the write lane's behind
        // a read-only head per group, and only plain reads. Not behind a
        // transaction pooler, where sessions are not the lane's own and
        // only one query is on the wire.
        let read_groups = match labels.lane {
            _ if !config.read_groups || config.pooler.is_transaction() => Grouping::Off,
            Some("read") => Grouping::ReadOnlySession,
            _ => Grouping::ReadOnlyHead,
        };
        let metrics = match &registry {
            Some(_) => Some(Arc::new(Metrics::new(&labels).map_err(|e| {
                Error::config(format!("invalid metrics for pool \"{labels}\": {e}"))
            })?)),
            None => None,
        };
        let wire = Arc::new(PoolWire::new(metrics.clone()));
        let mut manager = Manager {
            config: server,
            statement_cache_capacity: config.statement_cache_capacity,
            max_lifetime: config.max_lifetime,
            wire: Arc::clone(&wire),
            tls,
            hooks,
            after_connect: config.after_connect.as_deref().map(Arc::from),
            behind: match (
                config.pooler.is_transaction(),
                config.pooler.allows_pipeline(),
            ) {
                (false, _) => Behind::Nothing,
                (true, true) => Behind::TransactionPooler,
                (true, false) => Behind::TransactionPoolerWithoutPipelines,
            },
            descriptions: None,
            read_groups,
        };
        if config.prepare_mode() == Prepare::Unnamed {
            // Descriptions are learned on a connection opened as the pool
            // opens its own.
            let describer = manager.clone();
            manager.descriptions = Some(Arc::new(Descriptions::new(
                describer,
                config.statement_cache_capacity,
                config.query_timeout.unwrap_or(config.wait_timeout),
            )));
        }
        let pg = deadpool::managed::Pool::builder(manager)
            .max_size(config.max_size)
            .runtime(Runtime::Tokio1)
            .build()
            .expect("a runtime is set, so deadpool's build cannot fail");
        let exclusive = Exclusive::new(
            pg.clone(),
            config.exclusive_limit(),
            config.wait_timeout,
            config.pipelining,
            run_settings(&config),
            metrics.clone(),
        );
        let router = Arc::new(Router::new(
            config.clone(),
            pg.clone(),
            Arc::clone(&wire),
            metrics.clone(),
            Arc::clone(exclusive.claims()),
        ));
        let atomic_batches = config
            .pipelining
            .then(|| tokio::sync::Semaphore::new(quota::atomic_batch_quota(config.max_size)));
        let inner = Arc::new(Lane {
            config,
            pg,
            router,
            exclusive,
            wire,
            metrics,
            housekeeping: AtomicBool::new(false),
            atomic_batches,
            name: labels.pool.clone(),
        });
        // Inside a runtime, `min_idle` connections open now, not at first use.
        if inner.config.min_idle > 0 && tokio::runtime::Handle::try_current().is_ok() {
            housekeeping::start(&inner);
        }
        if let (Some(registry), Some(metrics)) = (&registry, &inner.metrics) {
            let pool = Arc::downgrade(&inner);
            let snapshot = Box::new(move || pool.upgrade().map(|pool| pool.snapshot()));
            metrics::register(registry, snapshot, metrics, &labels, build_info)?;
        }
        Ok(inner)
    }

    /// Closes the lane; see [`Pool::close`](crate::Pool::close).
    pub(crate) fn close(&self) {
        self.router.close();
        self.exclusive.close();
        if let Some(quota) = &self.atomic_batches {
            quota.close();
        }
        self.pg.close();
    }

    /// How its connections are opened.
    pub(crate) fn manager(&self) -> &Manager {
        self.pg.manager()
    }

    pub(crate) fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// The pool's name (its metrics' `pool` label).
    #[cfg(feature = "tracing")]
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn router(&self) -> &Arc<Router> {
        &self.router
    }

    pub(crate) fn wire(&self) -> &PoolWire {
        &self.wire
    }

    pub(crate) fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_deref()
    }

    /// How one query runs: its answer's caps and its deadline.
    pub(crate) fn run_settings(&self) -> RunSettings {
        run_settings(&self.config)
    }

    /// How a query or batch is run, for the metrics.
    pub(crate) fn mode(&self) -> Mode {
        if self.config.pipelining {
            Mode::Pipelined
        } else {
            Mode::Exclusive
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.router.is_closed()
    }

    /// Another host was elected primary: every query and checkout still
    /// waiting on this lane fails with [`Error::primary_moved`] (nothing was
    /// sent), and the dispatcher runs it on the new one.
    pub(crate) fn primary_moved(&self) {
        self.router.fail_waiting(Error::primary_moved);
        self.exclusive.fail_waiting();
    }

    /// Checks out an exclusive connection; see [`Pool::get`](crate::Pool::get).
    pub(crate) async fn checkout(self: &Arc<Self>, holder: Holder) -> Result<Connection, Error> {
        housekeeping::start(self);
        // A caller's connection is read by its tap and reset when it comes
        // back: both by what the catalog says (a language's globals, the
        // settings a fresh session has). The pool's own checkouts are
        // what reads it, without pipelining.
        if holder != Holder::Pool {
            catalog::ready(self).await;
        }
        self.exclusive.checkout(&self.router, holder).await
    }

    /// As [`checkout`](Lane::checkout), timed in the metrics and traced.
    pub(crate) async fn checkout_counted(
        self: &Arc<Self>,
        holder: Holder,
    ) -> Result<Connection, Error> {
        let waiting = self.metrics.as_ref().map(|_| Instant::now());
        let checkout = self.checkout(holder);
        #[cfg(feature = "tracing")]
        let checkout = tracing::Instrument::instrument(
            checkout,
            tracing::info_span!(target: "pgpipe", "pgpipe.checkout", pgpipe.pool = %self.name),
        );
        let conn = checkout.await;
        self.waited(waiting);
        if let (Some(metrics), Some(waiting)) = (&self.metrics, waiting) {
            metrics.checkout(conn.as_ref().map(drop));
            metrics.saved.checkout_waited(waiting.elapsed());
        }
        conn
    }

    /// As [`checkout`](Lane::checkout), waiting until `deadline`.
    pub(crate) async fn checkout_until(
        self: &Arc<Self>,
        holder: Holder,
        deadline: tokio::time::Instant,
    ) -> Result<Connection, Error> {
        housekeeping::start(self);
        self.exclusive
            .checkout_until(&self.router, holder, deadline)
            .await
    }

    pub(crate) fn status(&self) -> Status {
        self.status_with(&self.router.counts())
    }

    fn status_with(&self, shared: &Counts) -> Status {
        let pg = self.pg.status();
        Status {
            max_size: self.config.max_size,
            size: pg.size,
            idle: pg.available,
            shared: shared.conns,
            exclusive: self.exclusive.held(),
            in_flight: shared.in_flight,
            waiting: shared.waiting,
            exclusive_waiting: self.exclusive.waiting(),
        }
    }

    /// What the metrics collector reads at a scrape.
    fn snapshot(&self) -> Snapshot {
        // One pass over the shared connections for the whole scrape.
        let shared = self.router.counts();
        Snapshot {
            status: self.status_with(&shared),
            wire_depth: shared.wire_depth,
            opening: shared.opening,
            queue_capacity: self.config.queue_capacity,
            rtt: self.wire.rtt.estimate(),
        }
    }

    /// Records how long a query or checkout waited for its connection.
    pub(crate) fn waited(&self, since: Option<Instant>) {
        self.waited_until(since, None);
    }

    /// As [`waited`](Lane::waited), the wait ending at `now` (read from the
    /// clock if `None`).
    #[inline]
    pub(crate) fn waited_until(&self, since: Option<Instant>, now: Option<Instant>) {
        if let (Some(metrics), Some(since)) = (&self.metrics, since) {
            let now = now.unwrap_or_else(Instant::now);
            let waited = now.saturating_duration_since(since);
            metrics.connection_wait.observe_duration(waited);
        }
    }

    /// Folds latency saved, with pipelining on (see
    /// [`metrics`](crate::metrics)'s `saved`).
    pub(crate) fn fold_saved(&self) {
        if let (Some(metrics), true) = (&self.metrics, self.config.pipelining) {
            metrics.fold_saved(self.config.max_size, self.wire.rtt.estimate());
        }
    }

    /// Whether the housekeeping task was started; sets it.
    pub(crate) fn claim_housekeeping(&self) -> bool {
        !(self.housekeeping.load(Ordering::Relaxed)
            || self.housekeeping.swap(true, Ordering::AcqRel))
    }
}

/// How one query runs, from the pool's settings.
fn run_settings(config: &PoolConfig) -> RunSettings {
    RunSettings {
        limits: Limits {
            max_bytes: config.max_result_bytes,
            max_rows: config.max_result_rows,
        },
        query_timeout: config.query_timeout,
    }
}

impl fmt::Debug for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lane")
            .field("name", &self.name)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}
