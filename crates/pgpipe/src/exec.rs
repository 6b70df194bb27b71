//! Running one query on one connection: cached statement, parameter check,
//! execution, and the one-time retry when the server dropped the plan.

use std::sync::Arc;

use bytes::BytesMut;
use futures_core::Stream;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
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

/// Caps on one query's answer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Limits {
    pub(crate) max_bytes: Option<usize>,
    pub(crate) max_rows: Option<usize>,
}

/// The server drops the connection on a message of 1 GiB or more (the
/// protocol's own length field would allow 2 GiB).
const MAX_MESSAGE: usize = (1 << 30) - 1;

/// Runs `sql` on `conn`.
///
/// Errors of a query that never left the client (its statement could not be
/// prepared because the connection died, or the connection died before it
/// was sent) are marked [`unsent`](Error::unsent): the pool may run it on
/// another connection.
pub(crate) async fn run(
    conn: &PgConn,
    prepare: Prepare<'_>,
    sql: &str,
    params: Params<'_, '_>,
    op: Op,
    limits: Limits,
) -> Result<Output, Error> {
    if sql.len() >= MAX_MESSAGE {
        return Err(too_large_request(sql.len()));
    }
    let mut healed = false;
    loop {
        let (statement, generation) = match statement(conn, &prepare, sql).await {
            Ok(found) => found,
            Err(e) if e.kind() == ErrorKind::ConnectionLost => return Err(e.unsent()),
            Err(e) => return Err(e),
        };
        check_params(&statement, params)?;
        check_size(&statement, params)?;
        if conn.is_dead() {
            return Err(Error::new(ErrorKind::ConnectionLost, "the connection closed").unsent());
        }
        let result = match op {
            Op::Query => collect(conn, &statement, params, limits).await,
            Op::Execute => conn
                .client
                .execute(&statement, params)
                .await
                .map(Output::Count)
                .map_err(|e| Error::from_query(e, conn.client.is_closed())),
        };
        match result {
            Ok(output) => return Ok(output),
            // The server refused the cached plan before running anything:
            // forget it, prepare again, and retry once.
            Err(e) if !healed && is_stale_statement(&e) => {
                conn.cache.invalidate(sql, generation);
                healed = true;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Reads a query's rows, within `limits`. Past a limit the rest of the
/// answer is left to the connection, which reads and discards it: the
/// connection stays in step and its other queries are unaffected.
async fn collect(
    conn: &PgConn,
    statement: &Statement,
    params: Params<'_, '_>,
    limits: Limits,
) -> Result<Output, Error> {
    let failed = |e: tokio_postgres::Error| Error::from_query(e, conn.client.is_closed());
    let stream = conn
        .client
        .query_raw(statement, params.iter().copied())
        .await
        .map_err(failed)?;
    let mut stream = std::pin::pin!(stream);
    let (mut rows, mut bytes) = (Vec::new(), 0usize);
    while let Some(row) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
        let row = row.map_err(failed)?;
        bytes += row.raw_size_bytes();
        if limits.max_bytes.is_some_and(|max| bytes > max) {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "the result passed max_result_bytes ({} bytes) after {} rows",
                    limits.max_bytes.unwrap_or_default(),
                    rows.len()
                ),
            ));
        }
        if limits.max_rows.is_some_and(|max| rows.len() >= max) {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "the result passed max_result_rows ({})",
                    limits.max_rows.unwrap_or_default()
                ),
            ));
        }
        rows.push(row);
    }
    Ok(Output::Rows(rows))
}

fn too_large_request(bytes: usize) -> Error {
    Error::new(
        ErrorKind::TooLarge,
        format!(
            "the request is {bytes} bytes; the server accepts messages under 1 GiB and would \
             drop the connection (and every query sharing it); nothing was sent"
        ),
    )
}

/// Types whose values have a fixed, small size: no need to measure them.
const FIXED_SIZE: &[Type] = &[
    Type::BOOL,
    Type::CHAR,
    Type::INT2,
    Type::INT4,
    Type::INT8,
    Type::OID,
    Type::FLOAT4,
    Type::FLOAT8,
    Type::DATE,
    Type::TIME,
    Type::TIMETZ,
    Type::TIMESTAMP,
    Type::TIMESTAMPTZ,
    Type::INTERVAL,
    Type::UUID,
    Type::MONEY,
];

thread_local! {
    /// Where parameters are encoded to be measured; reused, so measuring
    /// allocates nothing in the common case.
    static SCRATCH: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

/// Refuses a request the server would not accept before it is encoded for
/// real: a Bind message of 1 GiB or more makes the server drop the
/// connection, and with it every query pipelined on it. Variable-size
/// parameters are encoded once into a scratch buffer to learn their size.
fn check_size(statement: &Statement, params: Params<'_, '_>) -> Result<(), Error> {
    let mut total = 64 + 8 * params.len();
    for (i, (param, ty)) in params.iter().zip(statement.params()).enumerate() {
        if FIXED_SIZE.contains(ty) {
            continue;
        }
        let size = SCRATCH.with(|scratch| {
            let mut buf = scratch.borrow_mut();
            buf.clear();
            let result = param.to_sql_checked(ty, &mut buf).map(|_| buf.len());
            if buf.capacity() > 1 << 20 {
                *buf = BytesMut::new(); // do not keep a huge buffer around
            }
            result
        });
        match size {
            Ok(size) => total = total.saturating_add(size),
            Err(e) => {
                return Err(Error::with_source(
                    ErrorKind::Params,
                    format!("parameter ${} cannot be sent as {ty}", i + 1),
                    e,
                ));
            }
        }
        if total >= MAX_MESSAGE {
            return Err(too_large_request(total));
        }
    }
    Ok(())
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
fn is_stale_statement(e: &Error) -> bool {
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
