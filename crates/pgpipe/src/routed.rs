//! [`Routed`]: the read handle, whose queries a standby may serve.

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::answer::{Op, Reply, at_most_one, exactly_one};
use crate::batch::Batch;
use crate::error::Error;
use crate::statement::{ToQuery, pool_sql};
use std::sync::Arc;
use std::time::Duration;

use crate::hosts::Hosts;
use crate::lane::settings::How;
use crate::slow::Slow;
use crate::target::Consistency;
use crate::within::Within;

/// Reads that a standby may serve; from [`Pool::read`](crate::Pool::read) or
/// [`Pool::read_with`](crate::Pool::read_with).
///
/// Each query goes to a standby within `max_replica_lag` (round robin),
/// else by the pool's [`ReplicaFallback`](crate::ReplicaFallback). It runs
/// read-only wherever it lands: a write fails with SQLSTATE 25006, on a
/// standby and on the primary alike. A read that a standby cancels for a
/// recovery conflict (40001), or whose standby connection breaks, runs once
/// more on another host: nothing it did can have been written.
#[derive(Debug, Clone, Copy)]
pub struct Routed<'a> {
    hosts: &'a Arc<Hosts>,
    consistency: Consistency,
}

impl<'a> Routed<'a> {
    pub(crate) fn new(hosts: &'a Arc<Hosts>, consistency: Consistency) -> Routed<'a> {
        Routed { hosts, consistency }
    }

    /// Runs `sql` as a read of this handle's consistency: the dispatcher's
    /// own future, with no layer of this handle's around it.
    fn run(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        op: Op,
    ) -> impl Future<Output = Result<Reply, Error>> {
        self.hosts
            .run_as(sql, params, op, How::PLAIN, Some(self.consistency))
    }

    /// The pool's hosts.
    pub(crate) fn hosts(&self) -> &Arc<Hosts> {
        self.hosts
    }

    /// As [`Pool::query`](crate::Pool::query), as a read.
    ///
    /// # Errors
    ///
    /// As [`Pool::query`](crate::Pool::query), and [`ErrorKind::NoReplica`](crate::ErrorKind::NoReplica)
    /// when no standby fits and the fallback is `Fail`.
    pub async fn query<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        let answer = self.run(pool_sql(query)?, params, Op::Query).await?;
        Ok(answer.into_rows())
    }

    /// As [`Pool::query_one`](crate::Pool::query_one), as a read.
    ///
    /// # Errors
    ///
    /// As [`query`](Routed::query), and [`ErrorKind::RowCount`](crate::ErrorKind::RowCount).
    pub async fn query_one<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        exactly_one(self.run(pool_sql(query)?, params, Op::First).await?)
    }

    /// As [`Pool::query_opt`](crate::Pool::query_opt), as a read.
    ///
    /// # Errors
    ///
    /// As [`query`](Routed::query), and [`ErrorKind::RowCount`](crate::ErrorKind::RowCount).
    pub async fn query_opt<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        at_most_one(self.run(pool_sql(query)?, params, Op::First).await?)
    }

    /// As [`Pool::execute`](crate::Pool::execute), as a read: a statement that writes fails with
    /// 25006.
    ///
    /// # Errors
    ///
    /// As [`query`](Routed::query).
    pub async fn execute<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        let answer = self.run(pool_sql(query)?, params, Op::Execute).await?;
        Ok(answer.rows_affected())
    }

    /// An isolated batch of reads, sent together to one host.
    pub fn batch(&self) -> Batch<'a> {
        Batch::read(self.hosts, self.consistency)
    }

    /// The same reads, marked slow; see [`Pool::slow`](crate::Pool::slow).
    pub fn slow(&self) -> Slow<'a> {
        Slow::new(self.hosts, Some(self.consistency))
    }

    /// The same reads, each under `timeout` instead of the pool's
    /// `query_timeout`; see [`Pool::within`](crate::Pool::within).
    pub fn within(&self, timeout: Duration) -> Within<'a> {
        Within::new(self.hosts, Some(self.consistency), false, timeout)
    }
}
