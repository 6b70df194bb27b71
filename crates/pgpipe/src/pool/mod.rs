//! [`Pool`]: the public face of the crate. Every public method is a short
//! delegate: routing among hosts lives in [`hosts`](crate::hosts), one
//! query on one lane in [`lane::query`](crate::lane::query), the shared
//! path in [`shared`](crate::shared), checkouts in
//! [`exclusive`](crate::exclusive), batches in [`batch`](crate::batch).

mod exclusive;
mod replicas;

pub(crate) use exclusive::checkout;

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
use crate::hosts::{Endpoint, HostSettings, Hosts};
use crate::lane::{Lane, Setup};
use crate::listener::Listener;
use crate::slow::Slow;
use crate::statement::{ToQuery, pool_sql};
use crate::status::Status;
use crate::within::Within;

/// Runs one query on the primary, as an expression to `.await` in place:
/// with one host straight on its lane, with several through the
/// dispatcher. A macro, not a helper: an `async fn` between the caller and
/// the lane would be one more layer every poll of every query passes
/// through (issue #25: about 60 instructions per query a layer).
macro_rules! on_primary {
    ($pool:expr, $sql:expr, $params:expr, $op:expr) => {
        match $pool.hosts.single() {
            Some(host) => {
                let how = crate::lane::settings::How::PLAIN;
                crate::lane::query::run(&host.write, $sql, $params, $op, how).await
            }
            None => {
                $pool
                    .hosts
                    .run($sql, $params, $op, crate::lane::settings::How::PLAIN)
                    .await
            }
        }
    };
}

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
    pub async fn query<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        Ok(on_primary!(self, pool_sql(query)?, params, Op::Query)?.into_rows())
    }

    /// Runs a query that must return exactly one row.
    ///
    /// # Errors
    ///
    /// As [`query`](Pool::query), and [`ErrorKind::RowCount`](crate::ErrorKind::RowCount)
    /// for zero rows or more than one.
    pub async fn query_one<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        exactly_one(on_primary!(self, pool_sql(query)?, params, Op::First)?)
    }

    /// Runs a query that returns at most one row.
    ///
    /// # Errors
    ///
    /// As [`query`](Pool::query), and [`ErrorKind::RowCount`](crate::ErrorKind::RowCount)
    /// for more than one row.
    pub async fn query_opt<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        at_most_one(on_primary!(self, pool_sql(query)?, params, Op::First)?)
    }

    /// Runs a statement and returns how many rows it affected.
    ///
    /// # Errors
    ///
    /// As [`query`](Pool::query).
    pub async fn execute<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        Ok(on_primary!(self, pool_sql(query)?, params, Op::Execute)?.rows_affected())
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

    /// A handle whose queries each run under `timeout`, instead of the
    /// pool's [`query_timeout`](PoolBuilder::query_timeout): a deadline
    /// for one call, enforced as `query_timeout` is (see the guide's
    /// errors page: past it the call fails with `QueryTimeout`, which says
    /// whether the query may have run). A zero `timeout` is a `Config`
    /// error at the call.
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// use std::time::Duration;
    /// let rows = pool
    ///     .within(Duration::from_millis(250))
    ///     .query("SELECT id FROM sessions WHERE user_id = $1", &[&42_i64])
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn within(&self, timeout: Duration) -> Within<'_> {
        Within::new(&self.hosts, None, false, timeout)
    }

    /// A [`Listener`]: `LISTEN` on a connection of its own that is replaced
    /// when it is lost, and says when notifications may have been missed.
    /// It checks out nothing until its first `listen` or `recv`; from then
    /// on it holds one exclusive connection (one of `max_size` and of
    /// `max_exclusive`) until it is dropped or the pool closes.
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// let mut listener = pool.listener();
    /// listener.listen("orders").await?;
    /// let event = listener.recv().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn listener(&self) -> Listener {
        Listener::new(Arc::clone(&self.hosts))
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

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("config", self.hosts.hosts[0].write.config())
            .field("status", &self.status())
            .finish()
    }
}
