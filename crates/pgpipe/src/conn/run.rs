//! Running one query on one connection: cached statement, parameter check,
//! execution, and the one-time retry when the server dropped the plan.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, LazyLock};
use std::task::Poll;
use std::time::Duration;

use futures_core::Stream;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, RowStream, SimpleQueryMessage, Statement};

use super::connect::{Peer, send_cancel_request};
use super::describe::{self, Descriptions};
use super::params::{self, Params};
use super::statement_cache::{self, Lookup, StatementCache, Ticket};
use super::{ConnState, SESSION_CLEANUP};
use crate::answer::{Answer, Op};
use crate::error::{Error, ErrorKind};
use crate::metrics::{CloseReason, QuarantineReason};
use crate::protocol::sql_guard;

/// Where a query runs: a connection's client (or a transaction on it), the
/// connection's statement cache and what its tap sees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) client: &'a Client,
    pub(crate) cache: &'a Arc<StatementCache>,
    /// With unnamed statements, the pool's parameter types by SQL text
    /// (and the statement cache goes unused).
    pub(crate) descriptions: Option<&'a Arc<Descriptions>>,
    pub(crate) state: &'a ConnState,
    /// Where its socket went, for a cancel request.
    pub(crate) peer: &'a Peer,
    /// Whether a cached plan the server refused is prepared again and the
    /// query retried. Not inside a transaction: the refusal aborted it.
    pub(crate) heal: bool,
}

impl Target<'_> {
    pub(crate) fn is_dead(&self) -> bool {
        self.client.is_closed() || self.state.load.is_dead()
    }

    /// Asks the server to cancel what the backend runs now, and waits until
    /// the server took the request (or the connect timeout passed).
    pub(crate) async fn cancel_and_wait(&self) {
        send_cancel_request(self.peer, &self.client.cancel_token()).await;
    }
}

/// How a cache miss is prepared.
#[derive(Clone, Copy)]
pub(crate) enum Prepare<'a> {
    /// In the caller's task: for exclusive connections, whose single user
    /// would only wait anyway.
    Inline,
    /// In a task of its own, so that the callers waiting for it are not
    /// stranded, and no statement is left half-made on the server, when the
    /// task that missed first is cancelled. Whoever lends the connection
    /// spawns the task, and keeps the connection alive until it ends.
    Spawned(&'a dyn SpawnPrepare),
}

/// Prepares a cache miss in a task of its own; see [`Prepare::Spawned`].
pub(crate) trait SpawnPrepare: Send + Sync {
    /// Spawns a task that prepares `ticket`'s SQL and completes the ticket.
    fn spawn_prepare(&self, ticket: Ticket);
}

/// Caps on one query's answer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Limits {
    pub(crate) max_bytes: Option<usize>,
    pub(crate) max_rows: Option<usize>,
}

/// How a query on a connection of its own runs: its answer's caps and its
/// deadline.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RunSettings {
    pub(crate) limits: Limits,
    pub(crate) query_timeout: Option<Duration>,
}

/// What a query runs as.
#[derive(Debug, Clone)]
pub(crate) enum Prepared {
    /// A named statement from the connection's cache, and the cache
    /// generation it came from.
    Named(Statement, u64),
    /// The SQL text, sent as an unnamed statement with these parameter
    /// types.
    Unnamed(Arc<[Type]>),
}

impl Prepared {
    pub(crate) fn param_types(&self) -> &[Type] {
        match self {
            Prepared::Named(statement, _) => statement.params(),
            Prepared::Unnamed(types) => types,
        }
    }

    /// Forgets a named statement whose plan the server refused.
    pub(crate) fn invalidate(&self, target: Target<'_>, sql: &str) {
        if let Prepared::Named(_, generation) = self {
            target.cache.invalidate(sql, *generation);
        }
    }
}

/// How `sql` runs on `target`: its cached named statement (prepared on a
/// miss), or, with unnamed statements, its parameter types.
pub(crate) async fn prepared(
    target: Target<'_>,
    prepare: Prepare<'_>,
    sql: &str,
) -> Result<Prepared, Error> {
    match target.descriptions {
        Some(descriptions) => {
            if let Some(known) = descriptions.known(sql) {
                return known.map(Prepared::Unnamed);
            }
            if in_transaction(target).await {
                // Boxed: only inside transactions behind some poolers.
                let here = describe::describe_here(target.client, target.state, sql);
                return Box::pin(here).await.map(Prepared::Unnamed);
            }
            descriptions.param_types(sql).await.map(Prepared::Unnamed)
        }
        None => cached_statement(target, prepare, sql)
            .await
            .map(|(statement, generation)| Prepared::Named(statement, generation)),
    }
}

/// Whether `target` is inside a transaction, as the server last said (its
/// ReadyForQuery, once every answer owed is in). A shared connection never
/// is: its transactions are the pool's own atomic batches, whose items are
/// described before they are sent.
async fn in_transaction(target: Target<'_>) -> bool {
    if target.state.load.is_shared() {
        return false;
    }
    target.state.settled().await;
    matches!(target.state.session.tx_status(), b'T' | b'E')
}

/// Runs `sql` on `target`.
///
/// Errors of a query that never left the client (its statement could not be
/// prepared because the connection died, or the connection died before it
/// was sent) are marked [`unsent`](Error::unsent): the pool may run it on
/// another connection.
///
/// With `clean`, the session cleanup goes out right behind the query, in
/// the same write: see [`send_then_clean`].
pub(crate) async fn run(
    target: Target<'_>,
    prepare: Prepare<'_>,
    sql: &str,
    params: Params<'_, '_>,
    op: Op,
    limits: Limits,
    clean: bool,
) -> Result<Answer, Error> {
    params::check_sql_size(sql)?;
    let mut healed = !target.heal;
    loop {
        let statement = prepared(target, prepare, sql).await?;
        params::check_params(statement.param_types(), params, false)?;
        if target.state.traits.one_at_a_time() {
            // Boxed: only behind some poolers; the common future stays small.
            Box::pin(target.state.wire_idle()).await;
        }
        let turns = &target.state.turns;
        let result = if clean {
            // Boxed: the rare path keeps the common future small.
            Box::pin(turns.send(send_then_clean(target, sql, &statement, params, op, limits))).await
        } else {
            turns
                .send(send(
                    target,
                    sql,
                    &statement,
                    params,
                    (op, Usable::Check),
                    limits,
                ))
                .await
        };
        match result {
            // The server refused the cached plan before running anything:
            // forget it, prepare again, and retry once.
            Err(e) if is_stale_statement(&e) => {
                statement.invalidate(target, sql);
                if healed {
                    return Err(e);
                }
                healed = true;
            }
            result => return result,
        }
    }
}

/// Sends a query and, pipelined right behind it (its request is queued on
/// the connection in the same poll), the session cleanup; waits for both.
///
/// The query's code may have changed the session in ways the guard cannot
/// see. The cleanup undoes what can be undone ([`SESSION_CLEANUP`]) and
/// counts SQL-level prepared statements, which it cannot; if it fails or
/// finds any, the connection is left dirty: quarantined if shared, reset
/// before its next use. Either way that is settled before the query's
/// answer goes back to its caller, so no query admitted after that answer
/// sees the session as the query left it. Queries already pipelined between
/// the two see what it left: they were admitted while it ran.
async fn send_then_clean(
    target: Target<'_>,
    sql: &str,
    statement: &Prepared,
    params: Params<'_, '_>,
    op: Op,
    limits: Limits,
) -> Result<Answer, Error> {
    let query = send(target, sql, statement, params, (op, Usable::Check), limits);
    let cleaned = both_in_order(query, clean_session(target));
    let ((), (answer, ())) = both_in_order(forget_sequences(target), cleaned).await;
    answer
}

/// `DISCARD SEQUENCES`, pipelined right before code the guard cannot
/// read: `lastval()` and `currval()` there see no sequence state another
/// task left in the shared session (spelled out, they are refused; reached
/// through user code, this is what stops them).
pub(crate) async fn forget_sequences(target: Target<'_>) {
    if target
        .client
        .simple_query("DISCARD SEQUENCES")
        .await
        .is_err()
    {
        target.state.left_dirty(QuarantineReason::Cleanup);
    }
}

/// Polls `first` and then `second` on every wake until both are done. A
/// query future hands its request to the connection on its first poll, so
/// `second`'s requests are queued right behind `first`'s.
pub(crate) async fn both_in_order<A: Future, B: Future>(
    first: A,
    second: B,
) -> (A::Output, B::Output) {
    let (mut first, mut second) = (pin!(first), pin!(second));
    let (mut a, mut b) = (None, None);
    std::future::poll_fn(|cx| {
        if a.is_none() {
            if let Poll::Ready(output) = first.as_mut().poll(cx) {
                a = Some(output);
            }
        }
        if b.is_none() {
            if let Poll::Ready(output) = second.as_mut().poll(cx) {
                b = Some(output);
            }
        }
        match (a.take(), b.take()) {
            (Some(a), Some(b)) => Poll::Ready((a, b)),
            (taken_a, taken_b) => {
                (a, b) = (taken_a, taken_b);
                Poll::Pending
            }
        }
    })
    .await
}

/// Runs the session cleanup; see [`send_then_clean`].
pub(crate) async fn clean_session(target: Target<'_>) {
    static CLEANUP: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{SESSION_CLEANUP}; SELECT count(*) FROM pg_catalog.pg_prepared_statements \
             WHERE from_sql"
        )
    });
    let with_hook;
    let cleanup = match target.state.traits.after_connect() {
        // The pool's own set-up, again, before the count.
        Some(after) => {
            with_hook = format!(
                "{SESSION_CLEANUP}; {after}; SELECT count(*) FROM \
                 pg_catalog.pg_prepared_statements WHERE from_sql"
            );
            &with_hook
        }
        None => &*CLEANUP,
    };
    let clean = match target.client.simple_query(cleanup).await {
        Ok(messages) => {
            messages.iter().rev().find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).map(|count| count == "0"),
                _ => None,
            }) == Some(true)
        }
        Err(_) => false,
    };
    if !clean {
        target.state.left_dirty(QuarantineReason::Cleanup);
    }
}

/// Runs one of the holder's own queries on a connection checked out with
/// `get()` or a transaction on it (their [`Executor`](crate::Executor)
/// methods): no cleanup, since the session is theirs (it is reset when the
/// connection comes back), and no `COPY`, which needs tokio-postgres' own
/// copy API.
pub(crate) async fn run_for_holder(
    target: Target<'_>,
    sql: &str,
    params: Params<'_, '_>,
    op: Op,
    settings: RunSettings,
) -> Result<Answer, Error> {
    sql_guard::check_not_copy(sql)?;
    if target.state.traits.behind_transaction_pooler() {
        sql_guard::check_through_transaction_pooler(sql)?;
    }
    // What no reset undoes closes the connection when it comes back: the
    // tap decides that from the SQL that goes out, whoever sends it.
    run_alone(target, sql, params, op, settings, false).await
}

/// Runs one query on a connection the caller has to itself (an exclusive
/// checkout, a transaction), within `query_timeout`; past it, a cancel
/// request goes to the backend, which can only hit this query. With `clean`,
/// the session cleanup follows it (see [`send_then_clean`]).
pub(crate) async fn run_alone(
    target: Target<'_>,
    sql: &str,
    params: Params<'_, '_>,
    op: Op,
    settings: RunSettings,
    clean: bool,
) -> Result<Answer, Error> {
    let run = run(
        target,
        Prepare::Inline,
        sql,
        params,
        op,
        settings.limits,
        clean,
    );
    within_deadline(settings.query_timeout, target, run, || Late::Cancel).await
}

/// Whether [`send`] looks first that the connection is still usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Usable {
    /// Look: a query admitted to a connection since quarantined, or dead,
    /// fails as unsent and runs elsewhere.
    Check,
    /// The items of an atomic batch, which looked once for all of its
    /// requests: were one item to stay behind while the others went out,
    /// `COMMIT` would commit the batch without it.
    Checked,
}

/// What becomes of a query still on the wire when its deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Late {
    /// It is alone on its connection: cancel it, and wait until its answer
    /// is in, so that the connection is in step and no late cancel can hit
    /// the next statement. Past [`CANCEL_GRACE`] the connection is closed.
    Cancel,
    /// It is pipelined with neighbours: a cancel would hit whatever the
    /// backend runs, so it runs to its end and its answer is dropped.
    Abandon,
}

/// How long a cancelled query has to answer before its connection is closed.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// Waits until a cancelled query has answered and its cancel request went
/// through, or, if the connection died, only for the query.
async fn settle<T>(
    target: Target<'_>,
    mut cancel: std::pin::Pin<Box<impl Future<Output = ()>>>,
    mut query: std::pin::Pin<&mut impl Future<Output = Result<T, Error>>>,
) -> Result<T, Error> {
    let (mut cancelled, mut outcome) = (false, None);
    std::future::poll_fn(|cx| {
        if !cancelled && cancel.as_mut().poll(cx).is_ready() {
            cancelled = true;
        }
        if outcome.is_none() {
            if let Poll::Ready(result) = query.as_mut().poll(cx) {
                outcome = Some(result);
            }
        }
        match outcome.take() {
            Some(result) if cancelled || target.is_dead() => Poll::Ready(result),
            taken => {
                outcome = taken;
                Poll::Pending
            }
        }
    })
    .await
}

/// Runs `query` on `target` within `deadline`; past it, `late` decides
/// what becomes of the query (see [`Late`]).
pub(crate) async fn within_deadline<T>(
    deadline: Option<Duration>,
    target: Target<'_>,
    query: impl Future<Output = Result<T, Error>>,
    late: impl FnOnce() -> Late,
) -> Result<T, Error> {
    let Some(deadline) = deadline else {
        return query.await;
    };
    let mut query = pin!(query);
    if let Ok(result) = tokio::time::timeout(deadline, query.as_mut()).await {
        return result;
    }
    match late() {
        Late::Abandon => Err(Error::query_timeout(
            "it was pipelined with other queries, so it was not cancelled and runs to its end",
        )),
        // A cancel request through a transaction pooler reaches no server
        // while the query still waits for one, and the connection would
        // stay stuck behind it: close the connection instead. The pooler
        // then drops the query if it had no server yet, or closes the
        // server it ran on.
        Late::Cancel if target.state.traits.behind_transaction_pooler() => {
            target.state.kill(CloseReason::Broken);
            Err(Error::query_timeout(
                "its connection to the pooler was closed, which ends it there",
            ))
        }
        Late::Cancel => {
            // Boxed: a cancel request (a socket, maybe TLS) is a large
            // future, and a rare one.
            let cancel = Box::pin(target.cancel_and_wait());
            match tokio::time::timeout(CANCEL_GRACE, settle(target, cancel, query)).await {
                // Still running, or the cancel never got through: this
                // connection cannot be trusted to be in step with its next
                // user.
                Err(_) => target.state.kill(CloseReason::Broken),
                // Lost meanwhile: nothing left to hit.
                Ok(_) if target.is_dead() => {}
                // The cancel ended the query: it is used up.
                Ok(Err(e)) if e.code() == Some(&SqlState::QUERY_CANCELED) => {}
                // The query ended first, so the cancel may still be pending
                // on the backend (PostgreSQL acts on it at the next
                // statement): a throwaway statement takes it, not the next
                // caller's.
                Ok(_) => {
                    // In a turn: never between an atomic batch's requests.
                    let absorb = target
                        .state
                        .turns
                        .send(target.client.batch_execute("SELECT 1"));
                    if tokio::time::timeout(CANCEL_GRACE, absorb).await.is_err() {
                        target.state.kill(CloseReason::Broken);
                    }
                }
            }
            Err(Error::query_timeout("it was cancelled"))
        }
    }
}

/// [`cached_statement`] for a caller that asked for a named statement
/// (`prepare_cached`): refused where statements are unnamed, since a named
/// one would not survive the pooler moving the connection to another
/// server.
pub(crate) async fn named_statement(target: Target<'_>, sql: &str) -> Result<Statement, Error> {
    if target.descriptions.is_some() {
        return Err(Error::new(
            ErrorKind::NotSupported,
            "prepare_cached makes a named statement, and statements are unnamed here (a \
             transaction pooler that does not map named statements): the next transaction \
             may run on a server that does not have it; pass the SQL to the query methods \
             instead",
        ));
    }
    cached_statement(target, Prepare::Inline, sql)
        .await
        .map(|(statement, _)| statement)
}

/// The cached statement for `sql`, prepared once per connection however many
/// tasks ask at the same time. A connection lost meanwhile is marked
/// [`unsent`](Error::unsent): nothing of this query reached the server.
pub(crate) async fn cached_statement(
    conn: Target<'_>,
    prepare: Prepare<'_>,
    sql: &str,
) -> Result<(Statement, u64), Error> {
    let mut counted = false;
    loop {
        let ticket = match conn.cache.lookup(sql) {
            Lookup::Ready(statement, generation) => {
                conn.state.statement_looked_up(true);
                return Ok((statement, generation));
            }
            Lookup::Pending(receiver, generation) => match statement_cache::wait(receiver).await {
                Some(Ok(statement)) => {
                    if !counted {
                        // It waited for another query's prepare: a miss.
                        conn.state.statement_looked_up(false);
                    }
                    return Ok((statement, generation));
                }
                Some(Err(e)) => return Err(prepare_failed(&e, conn)),
                None => continue, // its preparer was cancelled; look again
            },
            Lookup::Miss(ticket) => {
                if !counted {
                    conn.state.statement_looked_up(false);
                    counted = true;
                }
                ticket
            }
        };
        match prepare {
            Prepare::Inline => {
                let prepare = conn.client.prepare(ticket.sql());
                let result = conn.state.turns.prepare(prepare).await.map_err(Arc::new);
                let generation = conn.cache.complete(ticket, result.clone());
                conn.state.statements_evicted(conn.cache.take_evicted());
                return match result {
                    Ok(statement) => Ok((statement, generation)),
                    Err(e) => Err(prepare_failed(&e, conn)),
                };
            }
            // Loop round to wait for it like everyone else.
            Prepare::Spawned(spawner) => spawner.spawn_prepare(ticket),
        }
    }
}

fn prepare_failed(e: &Arc<tokio_postgres::Error>, conn: Target<'_>) -> Error {
    let error = Error::from_shared_prepare(e, conn.client.is_closed());
    if error.kind() == ErrorKind::ConnectionLost {
        error.unsent()
    } else {
        error
    }
}

/// Sends a checked query and reads its answer. The request is handed to
/// the connection on the first poll, so futures polled in order are sent
/// in order; first-polled in one turn (see [`Turns`](super::turn::Turns)),
/// with nothing in between.
pub(crate) async fn send(
    target: Target<'_>,
    sql: &str,
    statement: &Prepared,
    params: Params<'_, '_>,
    (op, usable): (Op, Usable),
    limits: Limits,
) -> Result<Answer, Error> {
    if usable == Usable::Check {
        if target.is_dead() {
            return Err(Error::new(ErrorKind::ConnectionLost, "the connection closed").unsent());
        }
        if target.state.session.is_quarantined() {
            // Admitted before its connection was quarantined, and not yet
            // sent (it waited for a prepare, a batch window, a hand-off): it
            // goes elsewhere rather than out on a session known to be dirty.
            return Err(Error::new(
                ErrorKind::ConnectionLost,
                "the shared connection was quarantined before this query was sent; nothing ran",
            )
            .unsent());
        }
    }
    let failed = |e: tokio_postgres::Error| Error::from_query(e, target.client.is_closed());
    match (op, statement) {
        (Op::Query, statement) => collect(target, sql, statement, params, limits).await,
        (Op::Execute, Prepared::Named(statement, _)) => target
            .client
            .execute(statement, params)
            .await
            .map(Answer::Count)
            .map_err(failed),
        (Op::Execute, Prepared::Unnamed(types)) => {
            // Boxed: unnamed statements are the rare path.
            let stream = Box::pin(unnamed(target, sql, types, params))
                .await
                .map_err(failed)?;
            let mut stream = std::pin::pin!(stream);
            while let Some(row) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
                row.map_err(failed)?;
            }
            Ok(Answer::Count(stream.rows_affected().unwrap_or(0)))
        }
    }
}

/// Sends `sql` as an unnamed statement: Parse("")/Bind/Describe/Execute/
/// Sync in one group, nothing left on the server after its Sync.
async fn unnamed(
    target: Target<'_>,
    sql: &str,
    types: &[Type],
    params: Params<'_, '_>,
) -> Result<RowStream, tokio_postgres::Error> {
    let typed = params
        .iter()
        .zip(types)
        .map(|(param, ty)| (*param, ty.clone()));
    target.client.query_typed_raw(sql, typed).await
}

/// Reads a query's rows, within `limits`. Past a limit the rest of the
/// answer is read here and dropped, keeping nothing: the query keeps its
/// place until the server is done with it (so the router sees the
/// connection busy, and held up while it drains), the connection stays in
/// step, and an error hidden behind the rows still shows (an atomic batch
/// needs that: it means its transaction was rolled back).
async fn collect(
    target: Target<'_>,
    sql: &str,
    statement: &Prepared,
    params: Params<'_, '_>,
    limits: Limits,
) -> Result<Answer, Error> {
    let failed = |e: tokio_postgres::Error| Error::from_query(e, target.client.is_closed());
    let stream = match statement {
        Prepared::Named(statement, _) => {
            target
                .client
                .query_raw(statement, params.iter().copied())
                .await
        }
        // Boxed, as below: the common future stays small.
        Prepared::Unnamed(types) => Box::pin(unnamed(target, sql, types, params)).await,
    }
    .map_err(failed)?;
    let mut stream = std::pin::pin!(stream);
    let (mut rows, mut bytes) = (Vec::new(), 0usize);
    let mut too_large = None;
    let mut _draining = None;
    while let Some(row) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
        let row = row.map_err(failed)?;
        if too_large.is_some() {
            continue; // draining
        }
        bytes += row.raw_size_bytes();
        too_large = past_limits(limits, bytes, rows.len());
        if too_large.is_some() {
            rows = Vec::new();
            _draining = Some(target.state.counts.draining());
        } else {
            rows.push(row);
        }
    }
    match too_large {
        Some(message) => Err(Error::new(ErrorKind::TooLarge, message).ran()),
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
