//! [`Slow`]: a handle whose queries the router treats as slow.

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::answer::{Op, Reply, at_most_one, exactly_one};
use crate::error::Error;
use crate::statement::{ToQuery, pool_sql};
use std::sync::Arc;

use crate::hosts::Hosts;
use crate::lane::settings::How;
use crate::target::Consistency;
use crate::within::Within;
use std::time::Duration;

/// Queries the caller knows to be slow; see [`Pool::slow`](crate::Pool::slow).
#[derive(Debug, Clone, Copy)]
pub struct Slow<'a> {
    hosts: &'a Arc<Hosts>,
    /// Reads through [`Pool::read`](crate::Pool::read): where they may go.
    read: Option<Consistency>,
}

impl Slow<'_> {
    pub(crate) fn new(hosts: &Arc<Hosts>, read: Option<Consistency>) -> Slow<'_> {
        Slow { hosts, read }
    }

    /// Runs `sql` marked slow, where this handle sends it: the
    /// dispatcher's own future, with no layer of this handle's around it.
    fn run(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        op: Op,
    ) -> impl Future<Output = Result<Reply, Error>> {
        let how = How {
            slow: true,
            timeout: None,
        };
        self.hosts.run_as(sql, params, op, how, self.read)
    }

    /// The pool's hosts.
    pub(crate) fn hosts(&self) -> &Arc<Hosts> {
        self.hosts
    }

    /// The same queries, each under `timeout` instead of the pool's
    /// `query_timeout`; see [`Pool::within`](crate::Pool::within).
    pub fn within(&self, timeout: Duration) -> Within<'_> {
        Within::new(self.hosts, self.read, true, timeout)
    }

    /// As [`Pool::query`](crate::Pool::query), marked slow.
    ///
    /// # Errors
    ///
    /// As [`Pool::query`](crate::Pool::query).
    pub async fn query<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        let answer = self.run(pool_sql(query)?, params, Op::Query).await?;
        Ok(answer.into_rows())
    }

    /// As [`Pool::query_one`](crate::Pool::query_one), marked slow.
    ///
    /// # Errors
    ///
    /// As [`Pool::query_one`](crate::Pool::query_one).
    pub async fn query_one<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        exactly_one(self.run(pool_sql(query)?, params, Op::First).await?)
    }

    /// As [`Pool::query_opt`](crate::Pool::query_opt), marked slow.
    ///
    /// # Errors
    ///
    /// As [`Pool::query_opt`](crate::Pool::query_opt).
    pub async fn query_opt<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        at_most_one(self.run(pool_sql(query)?, params, Op::First).await?)
    }

    /// As [`Pool::execute`](crate::Pool::execute), marked slow.
    ///
    /// # Errors
    ///
    /// As [`Pool::execute`](crate::Pool::execute).
    pub async fn execute<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        let answer = self.run(pool_sql(query)?, params, Op::Execute).await?;
        Ok(answer.rows_affected())
    }
}
