//! [`Pool`]: the public face of the crate. Every public method is a short
//! delegate: one query lives in [`query`](crate::query), the shared path in
//! [`shared`](crate::shared), checkouts in [`exclusive`](crate::exclusive),
//! batches in [`batch`](crate::batch).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use deadpool::Runtime;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::answer::{Answer, Op};
use crate::batch::Batch;
use crate::builder::PoolBuilder;
use crate::config::{PoolConfig, deadline_after};
use crate::conn::describe::Descriptions;
use crate::conn::run::{Limits, RunSettings};
use crate::conn::state::Behind;
use crate::conn::tls::Tls;
use crate::conn::{Manager, PoolWire};
use crate::error::Error;
use crate::error::ErrorKind;
use crate::exclusive::{Connection, Exclusive, Holder, NotBegun, OwnedTransaction};
use crate::hosts::dispatch::{self, Query};
use crate::hosts::{Host, HostSettings, Hosts};
use crate::metrics::{self, Metrics, Mode, Snapshot};
use crate::metrics::{HostMetrics, Labels};
use crate::pooler::Prepare;
use crate::routed::Routed;
use crate::shared::{Counts, Router};
use crate::slow::Slow;
use crate::status::Status;
use crate::target::{Consistency, TargetSessionAttrs, WriteToken};
use crate::{executor, housekeeping, query};

/// How many connections `begin()` tries when the last user's session
/// cannot be reset on one (each such connection is closed).
const BEGIN_ATTEMPTS: u32 = 3;

/// A pool of PostgreSQL connections whose queries, with
/// [`pipelining`](PoolBuilder::pipelining) on, share connections and are
/// pipelined.
///
/// Cheap to clone: clones share one pool. See the [crate docs](crate) for
/// what may run on the shared path and what needs [`get`](Pool::get).
///
/// A pool may span a primary and its standbys (see
/// [`PoolBuilder::replicas`]): its queries go to the primary, and reads
/// marked with [`read`](Pool::read) to a standby.
#[derive(Clone)]
pub struct Pool {
    hosts: Arc<Hosts>,
}

/// One lane of one host: a pool of connections to one server. Each owns
/// its state; this struct only holds them together.
pub(crate) struct PoolInner {
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
    /// pool (see [`atomic_batch_quota`]).
    atomic_batches: Option<tokio::sync::Semaphore>,
    /// The `pool` label of its metrics, and of its trace spans.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    name: String,
}

/// What [`Pool::new`] needs besides the settings.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) registry: Option<prometheus::Registry>,
    pub(crate) name: String,
    pub(crate) tls: Tls,
}

/// Everything one lane is made from; a read lane is made at its first use,
/// so a pool that never reads through [`Pool::read`] opens and exports
/// nothing for it.
#[derive(Debug, Clone)]
pub(crate) struct LaneRecipe {
    server: tokio_postgres::Config,
    config: PoolConfig,
    labels: Labels,
    registry: Option<prometheus::Registry>,
    tls: Tls,
    /// Whether this lane exports the pool's `pgpipe_build_info` (one per pool).
    build_info: bool,
}

impl LaneRecipe {
    pub(crate) fn make(&self) -> Result<Arc<PoolInner>, Error> {
        PoolInner::new(self.clone())
    }

    /// Makes the lane; if its metrics cannot be registered (another pool
    /// took its name in the registry since), without them.
    pub(crate) fn make_or_without_metrics(&self) -> Arc<PoolInner> {
        self.make().unwrap_or_else(|_error| {
            crate::trace::pool_warn!(
                pool = %self.labels,
                error = %_error,
                "a read lane's metrics could not be registered; it runs without them"
            );
            PoolInner::new(LaneRecipe {
                registry: None,
                ..self.clone()
            })
            .expect("a lane without metrics is always made")
        })
    }
}

/// One configured server: its `host:port` label and how to reach it.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    pub(crate) label: String,
    pub(crate) write: tokio_postgres::Config,
    /// The same, opened read-only.
    pub(crate) read: tokio_postgres::Config,
    /// Whether the read lane's sessions are made read-only with a `SET`
    /// (through a session pooler, which refuses start-up `options`).
    pub(crate) read_after_connect: bool,
    /// Whether the read lane's sessions are read-only at all (not behind a
    /// transaction pooler).
    pub(crate) read_only: bool,
}

impl Pool {
    /// Starts building a pool.
    pub fn builder() -> PoolBuilder {
        PoolBuilder::default()
    }

    pub(crate) fn new(
        endpoints: Vec<Endpoint>,
        config: PoolConfig,
        setup: Setup,
        settings: HostSettings,
    ) -> Result<Pool, Error> {
        let several = endpoints.len() > 1;
        let reads_enforced = endpoints.iter().all(|e| e.read_only);
        let mut hosts = Vec::with_capacity(endpoints.len());
        for (i, endpoint) in endpoints.into_iter().enumerate() {
            let recipe = |server, config, lane: &'static str| LaneRecipe {
                server,
                config,
                labels: Labels {
                    pool: setup.name.clone(),
                    host: several.then(|| endpoint.label.clone()),
                    lane: Some(lane),
                },
                registry: setup.registry.clone(),
                tls: setup.tls.clone(),
                build_info: i == 0 && lane == "write",
            };
            let mut write_config = config.clone();
            // With several hosts, connections open on demand: idle ones
            // kept on every host would mostly wait on standbys' write lanes.
            if several {
                write_config.min_idle = 0;
            }
            let mut read_config = config.clone();
            read_config.min_idle = 0;
            if endpoint.read_after_connect {
                let set = "SET default_transaction_read_only = on";
                read_config.after_connect = Some(match &config.after_connect {
                    Some(sql) => format!("{set}; {sql}"),
                    None => set.to_owned(),
                });
            }
            let write = recipe(endpoint.write, write_config, "write").make()?;
            let read = recipe(endpoint.read, read_config, "read");
            hosts.push(Host::new(endpoint.label, write, read));
        }
        let registry = setup.registry.as_ref();
        let metrics = match registry {
            Some(registry) if several || settings.default_target != TargetSessionAttrs::Any => {
                let labels: Vec<&str> = hosts.iter().map(|h| h.label.as_str()).collect();
                Some(HostMetrics::register(registry, &setup.name, &labels)?)
            }
            _ => None,
        };
        Ok(Pool {
            hosts: Arc::new(Hosts::new(hosts, settings, metrics, reads_enforced)),
        })
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
    /// for parameters that do not fit, [`ErrorKind::ConnectionLost`](crate::ErrorKind::ConnectionLost)
    /// and [`ErrorKind::QueryTimeout`](crate::ErrorKind::QueryTimeout) (both: it
    /// may have run; see [`Error::may_have_run`](crate::Error::may_have_run)),
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) (never ran),
    /// [`ErrorKind::QueueFull`](crate::ErrorKind::QueueFull),
    /// [`ErrorKind::Closed`](crate::ErrorKind::Closed) and
    /// [`ErrorKind::Connect`](crate::ErrorKind::Connect) from the pool.
    pub async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        let answer = self.run(sql, params, Op::Query, false).await?;
        Ok(answer.into_rows())
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
        let answer = self.run(sql, params, Op::Execute, false).await?;
        Ok(answer.rows_affected())
    }

    /// Marks the queries run through the returned handle as slow (reports,
    /// long aggregates): on the shared path they go to the connection with
    /// the fewest slow queries in flight, and fast queries avoid connections
    /// that carry one, so that they do not wait behind it in the pipeline.
    ///
    /// The pool also learns habitually slow statements by itself (see
    /// [`PoolBuilder::slow_query_threshold`](crate::PoolBuilder::slow_query_threshold));
    /// this is for queries it has not seen yet, or whose speed depends on
    /// their parameters.
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// let report = pool
    ///     .slow()
    ///     .query("SELECT region, sum(amount) FROM orders GROUP BY region", &[])
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn slow(&self) -> Slow<'_> {
        Slow::new(self, None)
    }

    /// Starts an isolated batch: each item succeeds or fails alone. See
    /// [`Batch`].
    pub fn batch(&self) -> Batch<'_> {
        Batch::new(self, false)
    }

    /// Starts an atomic batch: all items in one transaction, committed only
    /// if every one succeeds. See [`Batch`].
    pub fn atomic_batch(&self) -> Batch<'_> {
        Batch::new(self, true)
    }

    /// Checks out an exclusive connection: for transactions, session
    /// settings, `LISTEN`, `COPY`, cursors, temp tables, advisory locks.
    ///
    /// Exclusive checkouts and shared connections draw from one `max_size`;
    /// at most `max_exclusive` connections are checked out at once, and a
    /// checkout that finds every connection shared makes one drain and
    /// return.
    ///
    /// With several hosts it is a connection to the primary (or to the host
    /// the URL's `target_session_attrs` names), waiting for one within
    /// `failover_wait` while none is elected, as a write does.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) after `wait_timeout`,
    /// [`ErrorKind::Deadlock`](crate::ErrorKind::Deadlock) when this task
    /// already holds every place it could wait for,
    /// [`ErrorKind::Closed`](crate::ErrorKind::Closed),
    /// [`ErrorKind::Connect`](crate::ErrorKind::Connect).
    pub async fn get(&self) -> Result<Connection, Error> {
        self.get_with(self.hosts.settings.default_target).await
    }

    /// Checks out an exclusive connection to a host of the kind `target`
    /// names (libpq's `target_session_attrs`; see [`TargetSessionAttrs`]),
    /// as [`get`](Pool::get) does. Connections to a standby, or opened
    /// read-only on the primary, refuse writes with SQLSTATE 25006.
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// use pgpipe::TargetSessionAttrs;
    /// let standby = pool.get_with(TargetSessionAttrs::PreferStandby).await?;
    /// let rows = standby.query("SELECT count(*) FROM orders", &[]).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get`](Pool::get), and [`ErrorKind::NoPrimary`](crate::ErrorKind::NoPrimary)
    /// or [`ErrorKind::NoReplica`](crate::ErrorKind::NoReplica) when no host
    /// of that kind is up.
    pub async fn get_with(&self, target: TargetSessionAttrs) -> Result<Connection, Error> {
        self.get_as(target, Holder::Caller).await
    }

    async fn get_as(
        &self,
        target: TargetSessionAttrs,
        holder: Holder,
    ) -> Result<Connection, Error> {
        let deadline = self.hosts.failover_deadline();
        let mut waits = 0;
        loop {
            let conn = self.checkout_as(target, holder).await;
            // No connection to the host the target named: it may be gone.
            // With several hosts, wait for a round of checks within
            // `failover_wait` and ask again.
            let refused = conn.as_ref().is_err_and(|e| e.kind() == ErrorKind::Connect);
            if refused
                && self.hosts.single().is_none()
                && self.hosts.wait_to_retry(&mut waits, deadline).await
            {
                continue;
            }
            return conn;
        }
    }

    /// Begins a transaction on a connection of its own, which goes back to
    /// the pool when the transaction ends. Cheaper than [`get`](Pool::get)
    /// and [`Connection::transaction`] by a round trip: the session reset
    /// between users rides along with the `BEGIN` and the `COMMIT` instead
    /// of costing a round trip before the `BEGIN`. See [`OwnedTransaction`].
    ///
    /// ```no_run
    /// use pgpipe::Executor;
    ///
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// let tx = pool.begin().await?;
    /// tx.execute("INSERT INTO audit (event) VALUES ($1)", &[&"login"]).await?;
    /// tx.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get`](Pool::get). A connection lost, or a session that could
    /// not be reset, before the transaction began is closed and another is
    /// tried, three in all; past that the error (`ConnectionLost` or the
    /// reset's own) says nothing ran (`may_have_run()` is false). The
    /// transaction runs where [`get`](Pool::get) would check out; see
    /// [`begin_with`](Pool::begin_with) for another kind of host.
    ///
    /// [`ErrorKind::ConnectionLost`]: crate::ErrorKind::ConnectionLost
    pub async fn begin(&self) -> Result<OwnedTransaction, Error> {
        self.begin_with(self.hosts.settings.default_target).await
    }

    /// Begins a transaction as [`begin`](Pool::begin) does, on a host of
    /// the kind `target` names, as [`get_with`](Pool::get_with) checks out.
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// use pgpipe::{Executor, TargetSessionAttrs};
    /// // A consistent snapshot for several reads, on a standby if one is up.
    /// let tx = pool.begin_with(TargetSessionAttrs::PreferStandby).await?;
    /// tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", &[]).await?;
    /// let orders = tx.query("SELECT * FROM orders", &[]).await?;
    /// let lines = tx.query("SELECT * FROM order_lines", &[]).await?;
    /// tx.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`begin`](Pool::begin) and [`get_with`](Pool::get_with).
    pub async fn begin_with(&self, target: TargetSessionAttrs) -> Result<OwnedTransaction, Error> {
        let mut attempts = 0;
        loop {
            let conn = self.get_as(target, Holder::Begin).await?;
            match OwnedTransaction::begin(conn).await {
                Ok(tx) => return Ok(tx),
                Err(NotBegun::Failed(error)) if error.kind() != ErrorKind::ConnectionLost => {
                    return Err(error);
                }
                // That connection is closed: another one, as a checkout
                // whose reset failed would take.
                Err(NotBegun::ResetFailed(error) | NotBegun::Failed(error)) => {
                    attempts += 1;
                    if attempts >= BEGIN_ATTEMPTS {
                        return Err(error);
                    }
                }
            }
        }
    }

    async fn checkout_as(
        &self,
        target: TargetSessionAttrs,
        holder: Holder,
    ) -> Result<Connection, Error> {
        let lane = self.hosts.lane_for(target).await?;
        let waiting = lane.metrics.as_ref().map(|_| Instant::now());
        let checkout = lane.checkout(holder);
        #[cfg(feature = "tracing")]
        let checkout = tracing::Instrument::instrument(
            checkout,
            tracing::info_span!(target: "pgpipe", "pgpipe.checkout", pgpipe.pool = %lane.name),
        );
        let conn = checkout.await;
        lane.waited(waiting);
        if let Some(metrics) = &lane.metrics {
            metrics.checkout(conn.as_ref().map(drop));
        }
        conn
    }

    /// A handle whose queries are reads that a standby may serve: a
    /// standby within `max_replica_lag`, else (by
    /// [`replica_fallback`](PoolBuilder::replica_fallback)) the primary,
    /// through connections opened read-only. With one host, the primary's
    /// read-only connections: a write through this handle fails with 25006
    /// there as it would on a standby.
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// let rows = pool.read().query("SELECT id, name FROM products", &[]).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn read(&self) -> Routed<'_> {
        Routed::new(self, Consistency::Eventual)
    }

    /// As [`read`](Pool::read), seeing at least what `consistency` asks:
    /// [`Consistency::AtLeast`] a write's [`WriteToken`] (read your own
    /// writes), or [`Consistency::Strong`] (the primary).
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// use pgpipe::Consistency;
    /// let (_, token) = pool
    ///     .execute_tracked("UPDATE users SET name = $1 WHERE id = $2", &[&"Ada", &7i64])
    ///     .await?;
    /// let me = pool
    ///     .read_with(Consistency::AtLeast(token))
    ///     .query_one("SELECT name FROM users WHERE id = $1", &[&7i64])
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn read_with(&self, consistency: Consistency) -> Routed<'_> {
        Routed::new(self, consistency)
    }

    /// As [`execute`](Pool::execute), and returns where the write left the
    /// primary's WAL, for [`Consistency::AtLeast`]. The position is read on
    /// the same connection right behind the write, in the same round trip.
    /// If it cannot be read (the write succeeded all the same), the token
    /// is [`WriteToken::PRIMARY`]: reads with it go to the primary.
    ///
    /// # Errors
    ///
    /// As [`execute`](Pool::execute).
    pub async fn execute_tracked(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(u64, WriteToken), Error> {
        let mut batch = self.batch();
        batch.execute(sql, params);
        batch.query(TOKEN_SQL, &[]);
        let mut results = batch.run().await?.into_iter();
        let (Some(written), Some(token)) = (results.next(), results.next()) else {
            unreachable!("a batch answers every item");
        };
        let written = written?.rows_affected();
        // The write is done: whatever happens to the position query, report
        // it, with a token that sends its reads to the primary if the
        // position could not be read.
        let token = token
            .ok()
            .and_then(|answer| executor::exactly_one(answer.into_rows()).ok())
            .and_then(|row| {
                let timeline = row.try_get::<_, i32>(0).ok()?;
                let lsn = row.try_get::<_, i64>(1).ok()?;
                Some(WriteToken {
                    timeline: u32::try_from(timeline).ok()?,
                    lsn: u64::try_from(lsn).ok()?,
                })
            })
            .unwrap_or(WriteToken::PRIMARY);
        Ok((written, token))
    }

    /// A snapshot of the pool's connections and queues (every host's and
    /// lane's together).
    pub fn status(&self) -> Status {
        self.lanes().map(|lane| lane.status()).sum()
    }

    /// Closes the pool: new queries and checkouts fail with
    /// [`ErrorKind::Closed`](crate::ErrorKind::Closed) at once, and so do
    /// waiting ones. Queries already running finish; their connections
    /// close when they do.
    pub fn close(&self) {
        self.hosts.close();
    }

    /// Closes the pool as [`close`](Pool::close) does, then waits until the
    /// work already running has finished and every connection has closed,
    /// or `timeout` has passed: for a graceful shutdown. Returns whether all
    /// of it finished in time.
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) {
    /// if !pool.close_and_wait(std::time::Duration::from_secs(10)).await {
    ///     eprintln!("shutting down with queries still running");
    /// }
    /// # }
    /// ```
    pub async fn close_and_wait(&self, timeout: Duration) -> bool {
        self.close();
        let deadline = deadline_after(timeout);
        loop {
            let status = self.status();
            if status.size == 0 && status.in_flight == 0 && status.exclusive == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// True after [`close`](Pool::close).
    pub fn is_closed(&self) -> bool {
        self.hosts.is_closed()
    }

    /// Runs one query on the primary; `slow` is the caller's word that it
    /// is slow.
    pub(crate) async fn run(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        op: Op,
        slow: bool,
    ) -> Result<Answer, Error> {
        if let Some(host) = self.hosts.single() {
            return query::run(&host.write, sql, params, op, slow).await;
        }
        let query = Query {
            sql,
            params,
            op,
            slow,
        };
        dispatch::write(&self.hosts, query).await
    }

    /// Runs one query on the primary, or as a read of `read`.
    pub(crate) async fn run_as(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        op: Op,
        slow: bool,
        read: Option<Consistency>,
    ) -> Result<Answer, Error> {
        match read {
            None => self.run(sql, params, op, slow).await,
            Some(consistency) => {
                let query = Query {
                    sql,
                    params,
                    op,
                    slow,
                };
                dispatch::read(&self.hosts, consistency, query).await
            }
        }
    }

    pub(crate) fn hosts(&self) -> &Arc<Hosts> {
        &self.hosts
    }

    /// Every lane of every host (the read lanes made so far).
    fn lanes(&self) -> impl Iterator<Item = &Arc<PoolInner>> {
        self.hosts
            .hosts
            .iter()
            .flat_map(|host| std::iter::once(&host.write).chain(host.read_made()))
    }
}

/// The primary's WAL position and timeline, right behind a write.
const TOKEN_SQL: &str = "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int, \
     (pg_current_wal_insert_lsn() - '0/0')::int8";

impl PoolInner {
    /// Makes one lane.
    fn new(recipe: LaneRecipe) -> Result<Arc<PoolInner>, Error> {
        let LaneRecipe {
            server,
            config,
            labels,
            registry,
            tls,
            build_info,
        } = recipe;
        // A read lane's shared connections group the reads of one write
        // under one Sync; not behind a transaction pooler, where sessions
        // are not read-only and only one query is on the wire.
        let read_groups =
            labels.lane == Some("read") && config.read_groups && !config.pooler.is_transaction();
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
            .then(|| tokio::sync::Semaphore::new(atomic_batch_quota(config.max_size)));
        let inner = Arc::new(PoolInner {
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

    /// Closes the lane; see [`Pool::close`].
    pub(crate) fn close(&self) {
        self.router.close();
        self.exclusive.close();
        if let Some(quota) = &self.atomic_batches {
            quota.close();
        }
        self.pg.close();
    }

    /// With pipelining, a place among the atomic batches that may run at
    /// once, waited for until `deadline`; `None` (no wait) without. A task
    /// that holds every exclusive place there is gets `Deadlock` at once,
    /// as its checkout would.
    pub(crate) async fn atomic_batch_place(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<Option<tokio::sync::SemaphorePermit<'_>>, Error> {
        let Some(quota) = &self.atomic_batches else {
            return Ok(None);
        };
        match quota.try_acquire() {
            Ok(permit) => return Ok(Some(permit)),
            Err(tokio::sync::TryAcquireError::Closed) => return Err(Error::closed()),
            Err(tokio::sync::TryAcquireError::NoPermits) => {}
        }
        self.exclusive.would_wait_for_itself()?;
        let _waiting = self.exclusive.waiting_for_place();
        match tokio::time::timeout_at(deadline, quota.acquire()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            Ok(Err(_)) => Err(Error::closed()),
            Err(_) => Err(Error::timeout(
                "a place among the atomic batches running at once",
            )),
        }
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

    /// Checks out an exclusive connection; see [`Pool::get`].
    pub(crate) async fn checkout(self: &Arc<Self>, holder: Holder) -> Result<Connection, Error> {
        housekeeping::start(self);
        self.exclusive.checkout(&self.router, holder).await
    }

    /// As [`checkout`](PoolInner::checkout), waiting until `deadline`.
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
        if let (Some(metrics), Some(since)) = (&self.metrics, since) {
            metrics
                .connection_wait
                .observe(since.elapsed().as_secs_f64());
        }
    }

    /// Whether the housekeeping task was started; sets it.
    pub(crate) fn claim_housekeeping(&self) -> bool {
        !(self.housekeeping.load(Ordering::Relaxed)
            || self.housekeeping.swap(true, Ordering::AcqRel))
    }
}

/// Most atomic batches that run at once on a pipelined pool: half of
/// `max_size` (at least one). Each holds a connection of its own for its
/// transaction; past half the pool they squeeze the pipelined reads beside
/// them (measured at 1 ms RTT, pool of 4, 10% of tasks running atomic
/// batches: the reads kept 0.73 of their throughput alone with 3 batches at
/// once, 0.81 with 2, and the batches still ran at 3.4 × deadpool's
/// transactions on the same pool size; docs/benchmarks.md).
fn atomic_batch_quota(max_size: usize) -> usize {
    (max_size / 2).max(1)
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

impl fmt::Debug for PoolInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolInner")
            .field("name", &self.name)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.hosts.hosts[0].write.config)
            .field("status", &self.status())
            .finish()
    }
}
