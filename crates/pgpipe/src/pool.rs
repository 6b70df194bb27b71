//! [`Pool`]: the public face of the crate.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use deadpool::Runtime;
use tokio::sync::Semaphore;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::builder::PoolBuilder;
use crate::config::PoolConfig;
use crate::connection::{Connection, Owner};
use crate::error::{Error, ErrorKind};
use crate::exec::{self, Answer, Limits, Op, Prepare, Target};
use crate::executor;
use crate::hol::Costs;
use crate::manager::Manager;
use crate::metrics::{self, Metrics, Mode};
use crate::session;
use crate::shared::SharedConn;
use crate::shared::SharedSet;
use crate::status::Status;
use crate::tls::Tls;
use crate::wire::PoolWire;

/// How often the pool's housekeeping runs, and so the tick of its clock.
const TICK: Duration = Duration::from_millis(100);
/// A shared connection with nothing in flight for this many ticks goes back
/// to the idle pool.
const SHARED_IDLE_TICKS: u64 = 10;
/// The round-trip estimate's window, in ticks.
const RTT_WINDOW_TICKS: u64 = 50;

/// A pool of PostgreSQL connections whose queries, with
/// [`pipelining`](PoolBuilder::pipelining) on, share connections and are
/// pipelined.
///
/// Cheap to clone: clones share one pool. See the [crate docs](crate) for
/// what may run on the shared path and what needs [`get`](Pool::get).
#[derive(Clone)]
pub struct Pool {
    pub(crate) inner: Arc<PoolInner>,
}

pub(crate) struct PoolInner {
    pub(crate) config: PoolConfig,
    pub(crate) pg: deadpool::managed::Pool<Manager>,
    pub(crate) shared: SharedSet,
    /// Places for exclusive checkouts (`max_exclusive`).
    pub(crate) exclusive: Arc<Semaphore>,
    /// The tasks holding those places.
    pub(crate) claims: Mutex<Vec<Owner>>,
    pub(crate) exclusive_claims: AtomicUsize,
    pub(crate) exclusive_waiting: AtomicUsize,
    closed: AtomicBool,
    housekeeping: AtomicBool,
    /// What the connections' socket taps report.
    pub(crate) wire: Arc<PoolWire>,
    /// Metric handles, when a registry was given.
    pub(crate) metrics: Option<Arc<Metrics>>,
    /// Most pipelined queries in flight at once since the last scrape.
    pub(crate) depth_high: AtomicU64,
    /// How long statements take, for head-of-line-aware routing.
    pub(crate) costs: Costs,
}

/// What [`Pool::new`] needs besides the settings.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) registry: Option<prometheus::Registry>,
    pub(crate) name: String,
    pub(crate) tls: Tls,
}

impl Pool {
    /// Starts building a pool.
    pub fn builder() -> PoolBuilder {
        PoolBuilder::default()
    }

    pub(crate) fn new(
        server: tokio_postgres::Config,
        config: PoolConfig,
        setup: Setup,
    ) -> Result<Pool, Error> {
        let metrics = match &setup.registry {
            Some(_) => Some(Arc::new(Metrics::new(&setup.name).map_err(|e| {
                Error::config(format!("invalid metrics for pool \"{}\": {e}", setup.name))
            })?)),
            None => None,
        };
        let wire = Arc::new(PoolWire::new(metrics.clone()));
        let manager = Manager {
            config: server,
            statement_cache_capacity: config.statement_cache_capacity,
            max_lifetime: config.max_lifetime,
            wire: Arc::clone(&wire),
            tls: setup.tls,
        };
        let pg = deadpool::managed::Pool::builder(manager)
            .max_size(config.max_size)
            .runtime(Runtime::Tokio1)
            .build()
            .expect("a runtime is set, so deadpool's build cannot fail");
        let inner = Arc::new(PoolInner {
            exclusive: Arc::new(Semaphore::new(config.exclusive_limit())),
            config,
            pg,
            shared: SharedSet::default(),
            claims: Mutex::new(Vec::new()),
            exclusive_claims: AtomicUsize::new(0),
            exclusive_waiting: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            housekeeping: AtomicBool::new(false),
            wire,
            metrics,
            depth_high: AtomicU64::new(0),
            costs: Costs::default(),
        });
        if let (Some(registry), Some(metrics)) = (&setup.registry, &inner.metrics) {
            metrics::register(registry, Arc::downgrade(&inner), metrics, &setup.name)?;
        }
        Ok(Pool { inner })
    }

    /// Runs a query and returns its rows.
    ///
    /// With pipelining on, the query goes to a shared connection and is
    /// pipelined with other tasks' queries; with it off, it borrows an
    /// exclusive connection for the one query. Either way the statement is
    /// prepared once per connection and cached.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotAllowedOnShared`](crate::ErrorKind::NotAllowedOnShared)
    /// for SQL that changes session state, [`ErrorKind::Db`](crate::ErrorKind::Db)
    /// when the server rejects the query, [`ErrorKind::Params`](crate::ErrorKind::Params)
    /// for parameters that do not fit, [`ErrorKind::ConnectionLost`](crate::ErrorKind::ConnectionLost),
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout),
    /// [`ErrorKind::QueueFull`](crate::ErrorKind::QueueFull),
    /// [`ErrorKind::Closed`](crate::ErrorKind::Closed) and
    /// [`ErrorKind::Connect`](crate::ErrorKind::Connect) from the pool.
    pub async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        self.run(sql, params, Op::Query, false)
            .await
            .map(Answer::into_rows)
    }

    /// Runs a query that must return exactly one row.
    ///
    /// # Errors
    ///
    /// As [`query`](Pool::query), and [`ErrorKind::RowCount`](crate::ErrorKind::RowCount)
    /// for zero rows or more than one.
    pub async fn query_one(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row, Error> {
        executor::exactly_one(self.query(sql, params).await?)
    }

    /// Runs a query that returns at most one row.
    ///
    /// # Errors
    ///
    /// As [`query`](Pool::query), and [`ErrorKind::RowCount`](crate::ErrorKind::RowCount)
    /// for more than one row.
    pub async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        executor::at_most_one(self.query(sql, params).await?)
    }

    /// Runs a statement and returns how many rows it affected.
    ///
    /// # Errors
    ///
    /// As [`query`](Pool::query).
    pub async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error> {
        self.run(sql, params, Op::Execute, false)
            .await
            .map(|a| a.rows_affected())
    }

    /// Runs one query; `slow` is the caller's word that it is slow.
    pub(crate) async fn run(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        op: Op,
        slow: bool,
    ) -> Result<Answer, Error> {
        let inner = &self.inner;
        let Some(metrics) = &inner.metrics else {
            return self.run_unobserved(sql, params, op, slow, None).await;
        };
        let mode = if inner.config.pipelining {
            Mode::Pipelined
        } else {
            Mode::Exclusive
        };
        let start = Instant::now();
        let result = self
            .run_unobserved(sql, params, op, slow, Some(start))
            .await;
        metrics.query(mode, start.elapsed(), result.as_ref().map(drop));
        result
    }

    async fn run_unobserved(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        op: Op,
        slow: bool,
        waiting: Option<Instant>,
    ) -> Result<Answer, Error> {
        session::check(sql)?;
        let inner = &self.inner;
        if inner.is_closed() {
            return Err(Error::closed());
        }
        inner.start_housekeeping();
        let limits = inner.limits();
        if !inner.config.pipelining {
            let conn = inner.checkout().await?;
            inner.waited(waiting);
            let conn = conn.pg_conn();
            let cancel = || conn.cancel();
            return inner
                .run_alone(conn.target(), cancel, sql, params, op)
                .await;
        }
        // Head-of-line awareness: is this query known to be slow?
        let hol = inner.config.slow_query_threshold.map(|threshold| {
            let key = Costs::key(sql);
            (key, slow || inner.costs.is_slow(key, threshold))
        });
        let slow = hol.is_some_and(|(_, slow)| slow);
        // A query that never left the client (its connection died first)
        // is run on another connection; once sent, never again.
        let mut attempts = 0;
        loop {
            let slot = inner.reserve(slow).await?;
            let admitted = hol.map(|_| Instant::now());
            if attempts == 0 {
                inner.waited(waiting);
            }
            let window = inner.config.batch_window;
            if slot.ahead > 0 && !window.is_zero() {
                let held = Instant::now();
                slot.conn.gate.pass(window, inner.config.max_batch).await;
                if let Some(metrics) = &inner.metrics {
                    metrics.flush_wait.observe(held.elapsed().as_secs_f64());
                }
            }
            let conn = &slot.conn;
            let target = conn.conn().target();
            let run = exec::run(target, Prepare::Spawned(conn), sql, params, op, limits);
            let result = inner
                .within_deadline(run, || inner.late_on_shared(conn))
                .await;
            if let (Some((key, _)), Some(admitted), Ok(_)) = (hol, admitted, &result) {
                inner.costs.observe(key, admitted.elapsed());
            }
            if let Err(e) = &result {
                if e.kind() == ErrorKind::ConnectionLost {
                    // The connection is going (a FATAL error arrives before
                    // the socket closes): hand no freed place on it to a
                    // waiting query, which would be lost with it.
                    inner.retire(conn);
                }
            }
            match result {
                Err(e) if e.is_unsent() && attempts < 2 => attempts += 1,
                result => return result,
            }
        }
    }

    /// Checks out an exclusive connection: for transactions, session
    /// settings, `LISTEN`, `COPY`, cursors, temp tables, advisory locks.
    ///
    /// Exclusive checkouts and shared connections draw from one `max_size`;
    /// at most `max_exclusive` connections are checked out at once, and a
    /// checkout that finds every connection shared makes one drain and
    /// return.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) after `wait_timeout`,
    /// [`ErrorKind::Deadlock`](crate::ErrorKind::Deadlock) when this task
    /// already holds every place it could wait for,
    /// [`ErrorKind::Closed`](crate::ErrorKind::Closed),
    /// [`ErrorKind::Connect`](crate::ErrorKind::Connect).
    pub async fn get(&self) -> Result<Connection, Error> {
        self.inner.start_housekeeping();
        let waiting = self.inner.metrics.as_ref().map(|_| Instant::now());
        let conn = self.inner.checkout().await?;
        self.inner.waited(waiting);
        Ok(conn)
    }

    /// A snapshot of the pool's connections and queues.
    pub fn status(&self) -> Status {
        self.inner.status()
    }

    /// Closes the pool: new queries and checkouts fail with
    /// [`ErrorKind::Closed`](crate::ErrorKind::Closed) at once, and so do
    /// waiting ones. Queries already running finish; their connections
    /// close when they do.
    pub fn close(&self) {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::Release);
        inner.exclusive.close();
        inner.pg.close();
        inner.retire_all();
        inner.shared.queue.fail_all(Error::closed);
    }

    /// True after [`close`](Pool::close).
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }
}

impl PoolInner {
    pub(crate) fn status(&self) -> Status {
        let pg = self.pg.status();
        let (shared, in_flight) = self.shared_counts();
        let exclusive_waiting = self.exclusive_waiting.load(Ordering::Acquire);
        let exclusive = self
            .exclusive_claims
            .load(Ordering::Acquire)
            .saturating_sub(exclusive_waiting);
        Status {
            max_size: self.config.max_size,
            size: pg.size,
            idle: pg.available,
            shared,
            exclusive,
            in_flight,
            waiting: self.shared.queue.len(),
            exclusive_waiting,
        }
    }

    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_bytes: self.config.max_result_bytes,
            max_rows: self.config.max_result_rows,
            drain: false,
        }
    }

    /// Runs one query on a connection the caller has to itself (an
    /// exclusive checkout, a transaction), within `query_timeout`; past it,
    /// `cancel` is called, which can only hit this query.
    pub(crate) async fn run_alone(
        &self,
        target: Target<'_>,
        cancel: impl FnOnce(),
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        op: Op,
    ) -> Result<Answer, Error> {
        let run = exec::run(target, Prepare::Inline, sql, params, op, self.limits());
        self.within_deadline(run, cancel).await
    }

    /// Runs `query` within `query_timeout`, calling `late` if it runs out.
    pub(crate) async fn within_deadline<T>(
        &self,
        query: impl Future<Output = Result<T, Error>>,
        late: impl FnOnce(),
    ) -> Result<T, Error> {
        let Some(deadline) = self.config.query_timeout else {
            return query.await;
        };
        match tokio::time::timeout(deadline, query).await {
            Ok(result) => result,
            Err(_) => {
                late();
                Err(Error::timeout("the query to finish (query_timeout)"))
            }
        }
    }

    /// A query ran out of time on a shared connection. Whatever holds it up
    /// would hold up new queries too: route no more work there. A cancel
    /// request hits whatever the backend runs, so send one only if this
    /// query is the only one in flight there; else let it finish, its
    /// answer discarded (tokio-postgres reads past it).
    pub(crate) fn late_on_shared(&self, conn: &Arc<SharedConn>) {
        let alone = conn.in_flight() <= 1 && conn.state().wire_depth() <= 1;
        self.retire(conn);
        if alone {
            conn.conn().cancel();
        }
    }

    /// Records how long a query or checkout waited for its connection.
    pub(crate) fn waited(&self, since: Option<Instant>) {
        if let (Some(metrics), Some(since)) = (&self.metrics, since) {
            metrics
                .connection_wait
                .observe(since.elapsed().as_secs_f64());
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Starts the housekeeping task on first use (the builder may run
    /// outside a runtime, so it cannot start it). It holds only a weak
    /// reference and ends when the pool is dropped or closed.
    pub(crate) fn start_housekeeping(self: &Arc<Self>) {
        if self.housekeeping.load(Ordering::Relaxed)
            || self.housekeeping.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let pool = Arc::downgrade(self);
        tokio::spawn(housekeeping(pool));
    }
}

async fn housekeeping(pool: Weak<PoolInner>) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        if pool.is_closed() {
            return;
        }
        let tick = pool.wire.clock.fetch_add(1, Ordering::Relaxed) + 1;
        if tick % RTT_WINDOW_TICKS == 0 {
            pool.wire.rtt.rotate();
            pool.costs.rotate();
        }
        pool.watch_stalls(TICK);
        pool.expire(TICK);
        pool.prune();
        pool.rebalance();
        pool.retire_idle(SHARED_IDLE_TICKS);
        // A safety net: waiters are normally admitted the moment room
        // appears.
        pool.dispatch();
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.inner.config)
            .field("status", &self.status())
            .finish()
    }
}
