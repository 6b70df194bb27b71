//! [`Executor`]: one trait for everything that runs queries, so that code
//! written once runs pipelined on the pool or inside a transaction.

mod exclusive;
mod rows;

use async_trait::async_trait;
use tokio_postgres::Row;
use tokio_postgres::types::{BorrowToSql, ToSql, Type};

use crate::answer::{at_most_one, exactly_one};
use crate::error::Error;
use crate::exclusive::Holder;
use crate::pool::{self, Pool};
use crate::routed::Routed;
use crate::slow::Slow;
use crate::statement::{Statement, ToQuery};
use rows::RawParam;
pub use rows::RowStream;

/// Runs queries: implemented by [`Pool`] (pipelined, with pipelining on),
/// [`Connection`](crate::Connection) (an exclusive checkout),
/// [`Transaction`](crate::Transaction),
/// [`OwnedTransaction`](crate::OwnedTransaction), [`Slow`] and
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
/// Queries take what tokio-postgres' take ([`ToQuery`]): SQL text, a
/// [`Statement`] from [`prepare`](Executor::prepare) (which runs anywhere,
/// by its SQL), or, on a checkout, a tokio-postgres `Statement` prepared on
/// it. With the trait in scope, `conn.query(…)` on a [`Connection`](crate::Connection) or a
/// [`Transaction`](crate::Transaction) calls this trait (pgpipe's caps, deadline and `Error`)
/// rather than tokio-postgres' method of the same name; whichever runs it,
/// every statement on a checkout is counted in the metrics.
///
/// Code written for deadpool-postgres' `GenericClient` ports by its
/// shapes: `prepare_cached`, then `query(&statement, …)`, `query_raw` with
/// an iterator of parameters, `query_typed` with the types beside the
/// values.
///
/// ```no_run
/// use pgpipe::{Error, Executor};
///
/// async fn names(db: &impl Executor, ids: &[i64]) -> Result<Vec<String>, Error> {
///     let statement = db.prepare_cached("SELECT name FROM users WHERE id = $1").await?;
///     let mut names = Vec::new();
///     for id in ids {
///         if let Some(row) = db.query_opt(&statement, &[id]).await? {
///             names.push(row.get(0));
///         }
///     }
///     Ok(names)
/// }
/// ```
#[async_trait]
pub trait Executor: Send + Sync {
    /// Runs a query and returns its rows.
    async fn query<Q>(&self, query: &Q, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error>
    where
        Q: ToQuery + ?Sized;

    /// Runs a statement and returns how many rows it affected.
    async fn execute<Q>(&self, query: &Q, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error>
    where
        Q: ToQuery + ?Sized;

    /// Prepares `sql`: the server checks it and says its parameter and
    /// column types. Every executor caches each statement per connection,
    /// so this is [`prepare_cached`](Executor::prepare_cached).
    async fn prepare(&self, sql: &str) -> Result<Statement, Error>;

    /// As [`prepare`](Executor::prepare).
    async fn prepare_cached(&self, sql: &str) -> Result<Statement, Error> {
        self.prepare(sql).await
    }

    /// Runs `sql` unprepared, its parameters' types given beside their
    /// values rather than inferred by the server, in one round trip (as
    /// tokio-postgres' method of the same name). On a checkout or a
    /// transaction it runs there; on the pool it runs on a connection
    /// checked out for it, since the pipelined path runs statements
    /// prepared with the server's types (cast in SQL instead, `$1::text`,
    /// to pipeline it).
    async fn query_typed(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error>;

    /// Runs a query that must return exactly one row; else
    /// [`ErrorKind::RowCount`](crate::ErrorKind::RowCount).
    async fn query_one<Q>(&self, query: &Q, params: &[&(dyn ToSql + Sync)]) -> Result<Row, Error>
    where
        Q: ToQuery + ?Sized,
    {
        exactly_one(self.query(query, params).await?)
    }

    /// Runs a query that returns at most one row; more is
    /// [`ErrorKind::RowCount`](crate::ErrorKind::RowCount).
    async fn query_opt<Q>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error>
    where
        Q: ToQuery + ?Sized,
    {
        at_most_one(self.query(query, params).await?)
    }

    /// As [`query`](Executor::query), with tokio-postgres' `query_raw`
    /// shape: parameters from any iterator (`Vec<String>`,
    /// `slice.iter()`), rows as a stream.
    async fn query_raw<Q, P, I>(&self, query: &Q, params: I) -> Result<RowStream, Error>
    where
        Q: ToQuery + ?Sized,
        P: BorrowToSql + Send + Sync + std::fmt::Debug,
        I: IntoIterator<Item = P> + Send,
        I::IntoIter: ExactSizeIterator + Send,
    {
        let held: Vec<RawParam<P>> = params.into_iter().map(RawParam).collect();
        let params: Vec<&(dyn ToSql + Sync)> = held.iter().map(|p| p as _).collect();
        Ok(RowStream::new(self.query(query, &params).await?))
    }
}

/// The pool's handles run queries by their SQL on any connection; a
/// statement is prepared on one of the primary's.
macro_rules! executor_by_handle {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl Executor for $ty {
            async fn query<Q>(
                &self,
                query: &Q,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<Vec<Row>, Error>
            where
                Q: ToQuery + ?Sized,
            {
                <$ty>::query(self, query, params).await
            }

            async fn execute<Q>(&self, query: &Q, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error>
            where
                Q: ToQuery + ?Sized,
            {
                <$ty>::execute(self, query, params).await
            }

            async fn prepare(&self, sql: &str) -> Result<Statement, Error> {
                exclusive::prepare_for_pool(self.hosts(), sql).await
            }

            async fn query_typed(
                &self,
                sql: &str,
                params: &[(&(dyn ToSql + Sync), Type)],
            ) -> Result<Vec<Row>, Error> {
                let conn = pool::checkout(self.hosts(), Holder::Caller).await?;
                conn.query_typed(sql, params).await
            }
        }
    )*};
}

executor_by_handle!(Pool, Slow<'_>, Routed<'_>);

/// A reference runs queries as what it refers to, so `&pool` and `&tx` can
/// be passed on by value too.
#[async_trait]
impl<E: Executor + ?Sized> Executor for &E {
    async fn query<Q>(&self, query: &Q, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error>
    where
        Q: ToQuery + ?Sized,
    {
        (**self).query(query, params).await
    }

    async fn execute<Q>(&self, query: &Q, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error>
    where
        Q: ToQuery + ?Sized,
    {
        (**self).execute(query, params).await
    }

    async fn prepare(&self, sql: &str) -> Result<Statement, Error> {
        (**self).prepare(sql).await
    }

    async fn query_typed(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        (**self).query_typed(sql, params).await
    }
}
