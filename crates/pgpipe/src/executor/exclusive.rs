//! The [`Executor`] of a checkout and of a transaction on it: SQL through
//! the connection's statement cache; a tokio-postgres `Statement`
//! prepared on the connection, or a typed query, as given.

use std::sync::Arc;

use async_trait::async_trait;
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::Executor;
use crate::answer::{Op, Reply};
use crate::conn::run::{self, Prepared};
use crate::error::{Error, ErrorKind};
use crate::exclusive::{Connection, Holder, OnConnection, OwnedTransaction, Transaction};
use crate::hosts::Hosts;
use crate::pool;
use crate::statement::{QueryRef, Statement, ToQuery, query_ref};

/// Runs `query` where `on` runs its queries.
async fn run_on(
    on: &(impl OnConnection + Sync),
    query: QueryRef<'_>,
    params: &[&(dyn ToSql + Sync)],
    op: Op,
) -> Result<Reply, Error> {
    let (target, settings) = on.place();
    match query {
        QueryRef::Sql(sql) => run::run_for_holder(target, sql, params, op, settings).await,
        QueryRef::Prepared(statement) => {
            let given = Prepared::Named(statement.clone(), 0);
            run::run_given(target, "", given, params, op, settings).await
        }
    }
}

/// Runs `sql` unprepared, with the caller's types, where `on` runs its
/// queries.
async fn run_typed(
    on: &(impl OnConnection + Sync),
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<Row>, Error> {
    let (target, settings) = on.place();
    let types: Arc<[Type]> = params.iter().map(|(_, ty)| ty.clone()).collect();
    let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(value, _)| *value).collect();
    let given = Prepared::Unnamed(types);
    run::run_given(target, sql, given, &values, Op::Query, settings)
        .await
        .map(Reply::into_rows)
}

/// Prepares `sql` in the connection's statement cache.
async fn prepare_on(on: &(impl OnConnection + Sync), sql: &str) -> Result<Statement, Error> {
    let (target, _) = on.place();
    let prepared = run::named_statement(target, sql).await?;
    Ok(Statement::new(sql, prepared))
}

macro_rules! executor_on_connection {
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
                run_on(self, query_ref(query), params, Op::Query)
                    .await
                    .map(Reply::into_rows)
            }

            async fn execute<Q>(&self, query: &Q, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error>
            where
                Q: ToQuery + ?Sized,
            {
                run_on(self, query_ref(query), params, Op::Execute)
                    .await
                    .map(|answer| answer.rows_affected())
            }

            async fn prepare(&self, sql: &str) -> Result<Statement, Error> {
                prepare_on(self, sql).await
            }

            async fn query_typed(
                &self,
                sql: &str,
                params: &[(&(dyn ToSql + Sync), Type)],
            ) -> Result<Vec<Row>, Error> {
                run_typed(self, sql, params).await
            }
        }
    )*};
}

executor_on_connection!(Connection, Transaction<'_>, OwnedTransaction);

/// The pool's handles' [`prepare`](Executor::prepare): on one of the
/// primary's connections, into its statement cache; behind a transaction
/// pooler, where statements are unnamed, described inside `BEGIN …
/// ROLLBACK` (the statement then runs by its SQL, unnamed, anywhere).
pub(super) async fn prepare_for_pool(hosts: &Arc<Hosts>, sql: &str) -> Result<Statement, Error> {
    let conn = pool::checkout(hosts, Holder::Pool).await?;
    match prepare_on(&conn, sql).await {
        Err(e) if e.kind() == ErrorKind::NotSupported => {}
        prepared => return prepared,
    }
    let client = conn.client();
    let failed = |e| Error::from_query(e, client.is_closed());
    client.batch_execute("BEGIN").await.map_err(failed)?;
    let prepared = client.prepare(sql).await.map_err(failed);
    client.batch_execute("ROLLBACK").await.map_err(failed)?;
    Ok(Statement::new(sql, prepared?))
}
