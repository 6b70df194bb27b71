//! Running one query on one connection: cached statement, parameter check,
//! execution, and the one-time retry when the server dropped the plan.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use futures_core::Stream;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Statement};

use crate::error::{Error, ErrorKind};
use crate::manager::PgConn;
use crate::shared::SharedConn;
use crate::statement_cache::{self, Lookup, StatementCache};
use crate::wire::{ConnState, DEAD};

/// A query's parameters, as tokio-postgres takes them.
pub(crate) type Params<'a, 'b> = &'a [&'b (dyn ToSql + Sync)];

/// Where a query runs: a connection's client (or a transaction on it), the
/// connection's statement cache and what its tap sees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) client: &'a Client,
    pub(crate) cache: &'a Arc<StatementCache>,
    pub(crate) state: &'a ConnState,
    /// Whether a cached plan the server refused is prepared again and the
    /// query retried. Not inside a transaction: the refusal aborted it.
    pub(crate) heal: bool,
}

impl Target<'_> {
    pub(crate) fn is_dead(&self) -> bool {
        self.client.is_closed() || self.state.load.load(Ordering::Acquire) & DEAD != 0
    }
}

impl PgConn {
    /// The connection as a place to run queries, outside any transaction.
    pub(crate) fn target(&self) -> Target<'_> {
        Target {
            client: &self.client,
            cache: &self.cache,
            state: &self.state,
            heal: true,
        }
    }
}

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Query,
    Execute,
}

/// What one query of a [`Batch`](crate::Batch) returned: its rows, or for
/// an [`execute`](crate::Batch::execute) item the number of rows it
/// affected.
#[derive(Debug)]
#[non_exhaustive]
pub enum Answer {
    /// The rows of a `query` item.
    Rows(Vec<Row>),
    /// The affected-row count of an `execute` item.
    Count(u64),
}

/// Caps on one query's answer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Limits {
    pub(crate) max_bytes: Option<usize>,
    pub(crate) max_rows: Option<usize>,
    /// Past a cap, read the rest of the answer (keeping nothing) to learn
    /// whether the statement itself succeeded, instead of leaving it to the
    /// connection. Atomic batches need that: a hidden error means their
    /// transaction was rolled back.
    pub(crate) drain: bool,
}

/// The server drops the connection on a message of 1 GiB or more (the
/// protocol's own length field would allow 2 GiB).
const MAX_MESSAGE: usize = (1 << 30) - 1;

/// Runs `sql` on `target`.
///
/// Errors of a query that never left the client (its statement could not be
/// prepared because the connection died, or the connection died before it
/// was sent) are marked [`unsent`](Error::unsent): the pool may run it on
/// another connection.
pub(crate) async fn run(
    target: Target<'_>,
    prepare: Prepare<'_>,
    sql: &str,
    params: Params<'_, '_>,
    op: Op,
    limits: Limits,
) -> Result<Answer, Error> {
    check_sql(sql)?;
    let mut healed = !target.heal;
    loop {
        let (statement, generation) = prepared(target, &prepare, sql).await?;
        check(&statement, params, false)?;
        match send(target, &statement, params, op, limits).await {
            // The server refused the cached plan before running anything:
            // forget it, prepare again, and retry once.
            Err(e) if is_stale_statement(&e) => {
                target.cache.invalidate(sql, generation);
                if healed {
                    return Err(e);
                }
                healed = true;
            }
            result => return result,
        }
    }
}

/// Refuses SQL text the server would not accept in one message.
pub(crate) fn check_sql(sql: &str) -> Result<(), Error> {
    if sql.len() >= MAX_MESSAGE {
        return Err(too_large_request(sql.len()));
    }
    Ok(())
}

/// The cached statement for `sql`, with a lost connection marked unsent.
pub(crate) async fn prepared(
    target: Target<'_>,
    prepare: &Prepare<'_>,
    sql: &str,
) -> Result<(Statement, u64), Error> {
    match statement(target, prepare, sql).await {
        Err(e) if e.kind() == ErrorKind::ConnectionLost => Err(e.unsent()),
        found => found,
    }
}

/// Checks that `params` fit `statement`, before anything is sent. With
/// `every`, values of fixed-size types are encoded too, so that a type
/// mismatch surfaces here rather than when tokio-postgres encodes the
/// request (which then sends nothing for this query, and everything else).
pub(crate) fn check(
    statement: &Statement,
    params: Params<'_, '_>,
    every: bool,
) -> Result<(), Error> {
    check_params(statement, params)?;
    check_size(statement, params, every)
}

/// Sends a checked query and reads its answer. The request is handed to
/// the connection on the first poll, so futures polled in order are sent
/// in order.
pub(crate) async fn send(
    target: Target<'_>,
    statement: &Statement,
    params: Params<'_, '_>,
    op: Op,
    limits: Limits,
) -> Result<Answer, Error> {
    if target.is_dead() {
        return Err(Error::new(ErrorKind::ConnectionLost, "the connection closed").unsent());
    }
    match op {
        Op::Query => collect(target, statement, params, limits).await,
        Op::Execute => target
            .client
            .execute(statement, params)
            .await
            .map(Answer::Count)
            .map_err(|e| Error::from_query(e, target.client.is_closed())),
    }
}

/// Reads a query's rows, within `limits`. Past a limit the rest of the
/// answer is left to the connection, which reads and discards it (or, with
/// `drain`, read here and dropped): the connection stays in step and its
/// other queries are unaffected.
async fn collect(
    target: Target<'_>,
    statement: &Statement,
    params: Params<'_, '_>,
    limits: Limits,
) -> Result<Answer, Error> {
    let failed = |e: tokio_postgres::Error| Error::from_query(e, target.client.is_closed());
    let stream = target
        .client
        .query_raw(statement, params.iter().copied())
        .await
        .map_err(failed)?;
    let mut stream = std::pin::pin!(stream);
    let (mut rows, mut bytes) = (Vec::new(), 0usize);
    let mut too_large = None;
    while let Some(row) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
        let row = row.map_err(failed)?;
        if too_large.is_some() {
            continue; // draining
        }
        bytes += row.raw_size_bytes();
        too_large = past_limits(limits, bytes, rows.len());
        match &too_large {
            None => rows.push(row),
            Some(_) if limits.drain => rows = Vec::new(),
            Some(_) => break,
        }
    }
    match too_large {
        Some(message) => Err(Error::new(ErrorKind::TooLarge, message)),
        None => Ok(Answer::Rows(rows)),
    }
}

/// Why an answer of `rows` rows so far and `bytes` bytes with the next row
/// is over `limits`, if it is.
fn past_limits(limits: Limits, bytes: usize, rows: usize) -> Option<String> {
    if let Some(max) = limits.max_bytes.filter(|max| bytes > *max) {
        return Some(format!(
            "the result passed max_result_bytes ({max} bytes) after {rows} rows"
        ));
    }
    if let Some(max) = limits.max_rows.filter(|max| rows >= *max) {
        return Some(format!("the result passed max_result_rows ({max})"));
    }
    None
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
fn check_size(statement: &Statement, params: Params<'_, '_>, every: bool) -> Result<(), Error> {
    let mut total = 64 + 8 * params.len();
    for (i, (param, ty)) in params.iter().zip(statement.params()).enumerate() {
        if !every && FIXED_SIZE.contains(ty) {
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
    conn: Target<'_>,
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
pub(crate) fn is_stale_statement(e: &Error) -> bool {
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

impl Answer {
    /// The rows; none for an `execute` item.
    pub fn rows(&self) -> &[Row] {
        match self {
            Answer::Rows(rows) => rows,
            Answer::Count(_) => &[],
        }
    }

    /// The rows, taken; none for an `execute` item.
    pub fn into_rows(self) -> Vec<Row> {
        match self {
            Answer::Rows(rows) => rows,
            Answer::Count(_) => Vec::new(),
        }
    }

    /// Rows affected (`execute`), or rows returned (`query`).
    pub fn rows_affected(&self) -> u64 {
        match self {
            Answer::Count(n) => *n,
            Answer::Rows(rows) => rows.len() as u64,
        }
    }
}
