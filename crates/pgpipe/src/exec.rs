//! Running one query on one connection: cached statement, parameter check,
//! execution, and the one-time retry when the server dropped the plan.

use std::sync::Arc;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

use crate::error::{Error, ErrorKind};
use crate::manager::PgConn;
use crate::shared::SharedConn;
use crate::statement_cache::{self, Lookup};

/// A query's parameters, as tokio-postgres takes them.
pub(crate) type Params<'a, 'b> = &'a [&'b (dyn ToSql + Sync)];

/// How a cache miss is prepared.
#[derive(Debug)]
pub(crate) enum Prepare<'a> {
    /// In the caller's task: for exclusive connections, whose single user
    /// would only wait anyway.
    Inline,
    /// In a task of its own, so that the callers waiting for it are not
    /// stranded, and no statement is left half-made on the server, when the
    /// task that missed first is cancelled.
    Spawned(&'a Arc<SharedConn>),
}

/// What a query returns.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Query,
    Execute,
}

#[derive(Debug)]
pub(crate) enum Output {
    Rows(Vec<Row>),
    Count(u64),
}

/// Runs `sql` on `conn`.
pub(crate) async fn run(
    conn: &PgConn,
    prepare: Prepare<'_>,
    sql: &str,
    params: Params<'_, '_>,
    op: Op,
) -> Result<Output, Error> {
    let mut healed = false;
    loop {
        let (statement, generation) = statement(conn, &prepare, sql).await?;
        check_params(&statement, params)?;
        let result = match op {
            Op::Query => conn
                .client
                .query(&statement, params)
                .await
                .map(Output::Rows),
            Op::Execute => conn
                .client
                .execute(&statement, params)
                .await
                .map(Output::Count),
        };
        match result {
            Ok(output) => return Ok(output),
            // The server refused the cached plan before running anything:
            // forget it, prepare again, and retry once.
            Err(e) if !healed && is_stale_statement(&e) => {
                conn.cache.invalidate(sql, generation);
                healed = true;
            }
            Err(e) => return Err(Error::from_query(e, conn.client.is_closed())),
        }
    }
}

/// The cached statement for `sql`, prepared once per connection however many
/// tasks ask at the same time.
pub(crate) async fn statement(
    conn: &PgConn,
    prepare: &Prepare<'_>,
    sql: &str,
) -> Result<(Statement, u64), Error> {
    loop {
        match conn.cache.lookup(sql) {
            Lookup::Ready(statement, generation) => return Ok((statement, generation)),
            Lookup::Pending(receiver, generation) => match statement_cache::wait(receiver).await {
                Some(Ok(statement)) => return Ok((statement, generation)),
                Some(Err(e)) => {
                    return Err(Error::from_shared_prepare(&e, conn.client.is_closed()));
                }
                None => continue, // its preparer was cancelled; look again
            },
            Lookup::Miss(ticket) => match prepare {
                Prepare::Inline => {
                    let result = conn.client.prepare(ticket.sql()).await.map_err(Arc::new);
                    let generation = conn.cache.complete(ticket, result.clone());
                    return match result {
                        Ok(statement) => Ok((statement, generation)),
                        Err(e) => Err(Error::from_shared_prepare(&e, conn.client.is_closed())),
                    };
                }
                Prepare::Spawned(shared) => {
                    let shared = Arc::clone(shared);
                    tokio::spawn(async move {
                        let conn = shared.conn();
                        let result = conn.client.prepare(ticket.sql()).await.map_err(Arc::new);
                        conn.cache.complete(ticket, result);
                    });
                    // Loop round to wait for it like everyone else.
                }
            },
        }
    }
}

fn check_params(statement: &Statement, params: Params<'_, '_>) -> Result<(), Error> {
    let expected = statement.params().len();
    if params.len() == expected {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Params,
            format!(
                "the statement takes {expected} parameters but {} were given",
                params.len()
            ),
        ))
    }
}

/// `0A000 cached plan must not change result type` (the table changed under a
/// prepared `SELECT *`) or `26000` (the statement is gone, e.g. after
/// `DISCARD ALL`). Both are raised before the statement runs.
fn is_stale_statement(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        return false;
    };
    match db.code() {
        c if *c == SqlState::INVALID_SQL_STATEMENT_NAME => true,
        c if *c == SqlState::FEATURE_NOT_SUPPORTED => {
            db.routine() == Some("RevalidateCachedQuery") || db.message().contains("cached plan")
        }
        _ => false,
    }
}

impl Output {
    pub(crate) fn rows(self) -> Vec<Row> {
        match self {
            Output::Rows(rows) => rows,
            Output::Count(_) => Vec::new(),
        }
    }

    pub(crate) fn count(self) -> u64 {
        match self {
            Output::Count(n) => n,
            Output::Rows(rows) => rows.len() as u64,
        }
    }
}
