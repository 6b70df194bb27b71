//! [`Pool`]: the public face of the crate. Every public method is a short
//! delegate: routing among hosts lives in [`hosts`](crate::hosts), one
//! query on one lane in [`lane::query`](crate::lane::query), the shared
//! path in [`shared`](crate::shared), checkouts in
//! [`exclusive`](crate::exclusive), batches in [`batch`](crate::batch).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::answer::{Op, at_most_one, exactly_one};
use crate::batch::Batch;
use crate::builder::PoolBuilder;
use crate::config::{PoolConfig, deadline_after};
use crate::error::Error;
use crate::error::ErrorKind;
use crate::exclusive::{Connection, Holder, NotBegun, OwnedTransaction};
use crate::hosts::dispatch;
use crate::hosts::{Endpoint, HostSettings, Hosts};
use crate::lane::{Lane, Setup};
use crate::routed::Routed;
use crate::slow::Slow;
use crate::status::Status;
use crate::target::{Consistency, TargetSessionAttrs, WriteToken};

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
        let hosts = Hosts::build(endpoints, config, setup, settings)?;
        Ok(Pool {
            hosts: Arc::new(hosts),
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
        let answer = self.hosts.run(sql, params, Op::Query, false).await?;
        Ok(answer.into_rows())
    }

    /// Runs a query that must return exactly one row.
    ///
    /// # Errors
    ///
    /// As [`query`](Pool::query), and [`ErrorKind::RowCount`](crate::ErrorKind::RowCount)
    /// for zero rows or more than one.
    pub async fn query_one(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row, Error> {
        exactly_one(self.query(sql, params).await?)
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
        at_most_one(self.query(sql, params).await?)
    }

    /// Runs a statement and returns how many rows it affected.
    ///
    /// # Errors
    ///
    /// As [`query`](Pool::query).
    pub async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error> {
        let answer = self.hosts.run(sql, params, Op::Execute, false).await?;
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
        Slow::new(&self.hosts, None)
    }

    /// Starts an isolated batch: each item succeeds or fails alone. See
    /// [`Batch`].
    pub fn batch(&self) -> Batch<'_> {
        Batch::new(&self.hosts, false)
    }

    /// Starts an atomic batch: all items in one transaction, committed only
    /// if every one succeeds. See [`Batch`].
    pub fn atomic_batch(&self) -> Batch<'_> {
        Batch::new(&self.hosts, true)
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
        dispatch::on_target(&self.hosts, target, |lane| lane.checkout_counted(holder)).await
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
        Routed::new(&self.hosts, Consistency::Eventual)
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
        Routed::new(&self.hosts, consistency)
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
            .and_then(|answer| exactly_one(answer.into_rows()).ok())
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

    /// Every lane of every host (the read lanes made so far).
    fn lanes(&self) -> impl Iterator<Item = &Arc<Lane>> {
        self.hosts
            .hosts
            .iter()
            .flat_map(|host| std::iter::once(&host.write).chain(host.read_made()))
    }
}

/// The primary's WAL position and timeline, right behind a write.
const TOKEN_SQL: &str = "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int, \
     (pg_current_wal_insert_lsn() - '0/0')::int8";

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("config", self.hosts.hosts[0].write.config())
            .field("status", &self.status())
            .finish()
    }
}
