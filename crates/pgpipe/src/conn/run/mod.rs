//! Running one query on one connection: cached statement, parameter check,
//! execution, and the one-time retry when the server dropped the plan.
//!
//! - here: where a query runs ([`Target`]), [`run`] with its self-heal,
//!   and the runs on a connection the caller has to itself;
//! - [`lookup`]: how a query runs ([`Prepared`]): its cached named
//!   statement, or its parameter types for an unnamed one;
//! - [`send`](mod@send): sending a checked query and collecting its
//!   answer within the result caps;
//! - [`cleanup`]: the session cleanup that follows code the guard cannot
//!   read;
//! - [`block`]: the head-of-line budget behind a transaction pooler, a
//!   transaction block around the statement;
//! - [`deadline`]: `query_timeout`, and what becomes of a late query
//!   (cancel, or abandon).

mod block;
mod cleanup;
mod deadline;
mod lookup;
mod send;

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::connect::{Peer, send_cancel_request};
use super::describe::Descriptions;
use super::params::{self, Params};
use super::statement_cache::{StatementCache, Ticket};
use super::{ConnState, PoolWire};
use crate::answer::{Op, Reply};
use crate::error::Error;
use crate::protocol::sql_guard;
use cleanup::send_then_clean;
pub(crate) use cleanup::{both_in_order, clean_session, forget_sequences};
pub(crate) use deadline::{Late, within_deadline};
pub(crate) use lookup::{Prepared, named_statement, prepared, prepared_now};
pub(crate) use send::{Usable, send};

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
    /// What the lane knows of its database (the cleanup's undo for
    /// installed extensions, the fewest settings a session had).
    pub(crate) wire: &'a PoolWire,
    /// Whether a cached plan the server refused is prepared again and the
    /// query retried. Not inside a transaction: the refusal aborted it.
    pub(crate) heal: bool,
}

impl Target<'_> {
    #[inline]
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

/// What goes out with a query, in the same turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Around {
    /// Nothing.
    Nothing,
    /// The session cleanup, right behind it (see [`send_then_clean`]).
    Cleanup,
    /// A transaction block of its own, under this many milliseconds of
    /// `statement_timeout`: the head-of-line budget behind a transaction
    /// pooler (see [`block`]).
    Block(u32),
}

impl Around {
    /// The cleanup behind it, or nothing.
    pub(crate) fn cleanup(clean: bool) -> Around {
        if clean {
            Around::Cleanup
        } else {
            Around::Nothing
        }
    }
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

/// Runs `sql` on `target`.
///
/// Errors of a query that never left the client (its statement could not be
/// prepared because the connection died, or the connection died before it
/// was sent) are marked [`unsent`](Error::unsent): the pool may run it on
/// another connection.
///
/// `around` says what goes out with it, in the same write: the session
/// cleanup right behind it ([`send_then_clean`]), or a transaction block
/// around it ([`block`]).
pub(crate) async fn run(
    target: Target<'_>,
    prepare: Prepare<'_>,
    sql: &str,
    params: Params<'_, '_>,
    op: Op,
    limits: Limits,
    around: Around,
) -> Result<Reply, Error> {
    params::check_sql_size(sql)?;
    let mut healed = !target.heal;
    loop {
        let statement = match prepared_now(target, sql) {
            Some(statement) => statement,
            None => prepared(target, prepare, sql).await?,
        };
        params::check_params(statement.param_types(), params, false)?;
        if target.state.traits.one_at_a_time() {
            // Boxed: only behind some poolers; the common future stays small.
            Box::pin(target.state.wire_idle()).await;
        }
        let turns = &target.state.turns;
        let result = match around {
            Around::Nothing => {
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
            }
            // Boxed: the rare paths keep the common future small.
            Around::Cleanup => {
                let query = send_then_clean(target, sql, &statement, params, op, limits);
                Box::pin(turns.send(query)).await
            }
            Around::Block(ms) => {
                let query = block::send_in_block(target, sql, &statement, params, op, limits, ms);
                Box::pin(query).await
            }
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
) -> Result<Reply, Error> {
    sql_guard::check_not_copy(sql)?;
    if target.state.traits.behind_transaction_pooler() {
        sql_guard::check_through_transaction_pooler(sql)?;
    }
    // What no reset undoes closes the connection when it comes back: the
    // tap decides that from the SQL that goes out, whoever sends it.
    run_alone(target, sql, params, op, settings, false).await
}

/// Runs a holder's statement as they give it, on a connection they hold:
/// `Prepared::Named`, a tokio-postgres `Statement` prepared on it;
/// `Prepared::Unnamed`, `sql` unprepared with the caller's own parameter
/// types (`query_typed`). Within the caps and `query_timeout`, as
/// [`run_for_holder`].
pub(crate) async fn run_given(
    target: Target<'_>,
    sql: &str,
    statement: Prepared,
    params: Params<'_, '_>,
    op: Op,
    settings: RunSettings,
) -> Result<Reply, Error> {
    if let Prepared::Unnamed(_) = statement {
        params::check_sql_size(sql)?;
        sql_guard::check_not_copy(sql)?;
    }
    params::check_params(statement.param_types(), params, false)?;
    let usable = (op, Usable::Check);
    let make = || {
        let limits = settings.limits;
        target
            .state
            .turns
            .send(send(target, sql, &statement, params, usable, limits))
    };
    within_deadline(settings.query_timeout, target, make, || Late::Cancel).await
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
) -> Result<Reply, Error> {
    let make = || {
        let limits = settings.limits;
        let around = Around::cleanup(clean);
        run(target, Prepare::Inline, sql, params, op, limits, around)
    };
    within_deadline(settings.query_timeout, target, make, || Late::Cancel).await
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
