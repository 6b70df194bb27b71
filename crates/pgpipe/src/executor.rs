//! [`Executor`]: one trait for everything that runs queries, so that code
//! written once runs pipelined on the pool or inside a transaction.

use async_trait::async_trait;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::answer::{Answer, Op, at_most_one, exactly_one};
use crate::error::Error;
use crate::exclusive::{Connection, OwnedTransaction, Transaction};
use crate::pool::Pool;
use crate::routed::Routed;
use crate::slow::Slow;

/// Runs queries: implemented by [`Pool`] (pipelined, with pipelining on),
/// [`Connection`] (an exclusive checkout), [`Transaction`],
/// [`OwnedTransaction`], [`Slow`] and
/// [`Routed`] (reads, from [`Pool::read`]).
///
/// tokio-postgres' own `GenericClient` is sealed, and covers neither a pool
/// nor pgpipe's statement cache. Every implementation here prepares each
/// SQL text once per connection and caches it, checks parameters before
/// sending, and returns pgpipe's [`Error`].
///
/// Write data access once, generic over where it runs:
///
/// ```no_run
/// use pgpipe::{Error, Executor};
///
/// async fn balance(db: &impl Executor, id: i64) -> Result<i64, Error> {
///     let row = db
///         .query_one("SELECT balance FROM accounts WHERE id = $1", &[&id])
///         .await?;
///     Ok(row.get(0))
/// }
///
/// # async fn demo(pool: pgpipe::Pool) -> Result<(), Error> {
/// // Pipelined with every other task's queries:
/// let shared = balance(&pool, 1).await?;
/// // Inside a transaction, on a connection of its own:
/// let mut conn = pool.get().await?;
/// let tx = conn.transaction().await?;
/// let locked = balance(&tx, 1).await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
///
/// With the trait in scope, `conn.query(…)` on a [`Connection`] or a
/// [`Transaction`] calls this trait (SQL text, cached, pgpipe's `Error`)
/// rather than tokio-postgres' method of the same name, which also takes a
/// prepared `Statement`; call that one as `conn.client().query(&statement,
/// …)` or `tokio_postgres::Client::query(&conn, …)`.
#[async_trait]
pub trait Executor: Send + Sync {
    /// Runs a query and returns its rows.
    async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error>;

    /// Runs a statement and returns how many rows it affected.
    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error>;

    /// Runs a query that must return exactly one row; else
    /// [`ErrorKind::RowCount`](crate::ErrorKind::RowCount).
    async fn query_one(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row, Error> {
        exactly_one(self.query(sql, params).await?)
    }

    /// Runs a query that returns at most one row; more is
    /// [`ErrorKind::RowCount`](crate::ErrorKind::RowCount).
    async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        at_most_one(self.query(sql, params).await?)
    }
}

#[async_trait]
impl Executor for Pool {
    async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error> {
        Pool::query(self, sql, params).await
    }

    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error> {
        Pool::execute(self, sql, params).await
    }
}

#[async_trait]
impl Executor for Slow<'_> {
    async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error> {
        Slow::query(self, sql, params).await
    }

    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error> {
        Slow::execute(self, sql, params).await
    }
}

#[async_trait]
impl Executor for Routed<'_> {
    async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error> {
        Routed::query(self, sql, params).await
    }

    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error> {
        Routed::execute(self, sql, params).await
    }
}

/// Exclusive connections and transactions both run one query at a time
/// through their own `run`.
macro_rules! executor_by_run {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl Executor for $ty {
            async fn query(
                &self,
                sql: &str,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<Vec<Row>, Error> {
                self.run(sql, params, Op::Query).await.map(Answer::into_rows)
            }

            async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error> {
                self.run(sql, params, Op::Execute)
                    .await
                    .map(|a| a.rows_affected())
            }
        }
    )*};
}

executor_by_run!(Connection, Transaction<'_>, OwnedTransaction);

/// A reference runs queries as what it refers to, so `&pool` and `&tx` can
/// be passed on by value too.
#[async_trait]
impl<E: Executor + ?Sized> Executor for &E {
    async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error> {
        (**self).query(sql, params).await
    }

    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error> {
        (**self).execute(sql, params).await
    }
}
