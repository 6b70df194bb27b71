//! [`Within`]: a handle whose queries each run under a deadline of the
//! caller's own.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::answer::{Op, Reply, at_most_one, exactly_one};
use crate::error::Error;
use crate::hosts::Hosts;
use crate::lane::settings::How;
use crate::statement::{ToQuery, pool_sql};
use crate::target::Consistency;

/// Queries under a deadline of their own; see
/// [`Pool::within`](crate::Pool::within).
#[derive(Debug, Clone, Copy)]
pub struct Within<'a> {
    hosts: &'a Arc<Hosts>,
    /// Reads through [`Pool::read`](crate::Pool::read): where they may go.
    read: Option<Consistency>,
    how: How,
}

impl Within<'_> {
    pub(crate) fn new(
        hosts: &Arc<Hosts>,
        read: Option<Consistency>,
        slow: bool,
        timeout: Duration,
    ) -> Within<'_> {
        Within {
            hosts,
            read,
            how: How {
                slow,
                timeout: Some(timeout),
            },
        }
    }

    /// Runs `sql` where this handle sends it, under its deadline.
    async fn run(&self, sql: &str, params: &[&(dyn ToSql + Sync)], op: Op) -> Result<Reply, Error> {
        if self.how.timeout == Some(Duration::ZERO) {
            return Err(Error::config(
                "a query's timeout (Pool::within) must be above zero",
            ));
        }
        self.hosts
            .run_as(sql, params, op, self.how, self.read)
            .await
    }

    /// As [`Pool::query`](crate::Pool::query), under this handle's
    /// deadline.
    ///
    /// # Errors
    ///
    /// As [`Pool::query`](crate::Pool::query); `QueryTimeout` past the
    /// deadline.
    pub async fn query<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        let answer = self.run(pool_sql(query)?, params, Op::Query).await?;
        Ok(answer.into_rows())
    }

    /// As [`Pool::query_one`](crate::Pool::query_one), under this handle's
    /// deadline.
    ///
    /// # Errors
    ///
    /// As [`Pool::query_one`](crate::Pool::query_one); `QueryTimeout` past
    /// the deadline.
    pub async fn query_one<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        exactly_one(self.run(pool_sql(query)?, params, Op::First).await?)
    }

    /// As [`Pool::query_opt`](crate::Pool::query_opt), under this handle's
    /// deadline.
    ///
    /// # Errors
    ///
    /// As [`Pool::query_opt`](crate::Pool::query_opt); `QueryTimeout` past
    /// the deadline.
    pub async fn query_opt<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        at_most_one(self.run(pool_sql(query)?, params, Op::First).await?)
    }

    /// As [`Pool::execute`](crate::Pool::execute), under this handle's
    /// deadline.
    ///
    /// # Errors
    ///
    /// As [`Pool::execute`](crate::Pool::execute); `QueryTimeout` past the
    /// deadline.
    pub async fn execute<Q: ToQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        let answer = self.run(pool_sql(query)?, params, Op::Execute).await?;
        Ok(answer.rows_affected())
    }
}
