//! How a query runs on a connection: its named statement from the
//! connection's cache (prepared once however many tasks ask), or, with
//! unnamed statements, the parameter types its SQL text was described with.

use std::sync::Arc;

use tokio_postgres::Statement;
use tokio_postgres::types::Type;

use super::{Prepare, Target};
use crate::conn::describe;
use crate::conn::statement_cache::{self, Lookup};
use crate::error::{Error, ErrorKind};

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

/// How `sql` runs on `target` when that is known now (its statement cached
/// and ready, or its parameter types described), with no future to build,
/// poll and drop: the common case. `None` leaves it to [`prepared`].
#[inline]
pub(crate) fn prepared_now(target: Target<'_>, sql: &str) -> Option<Prepared> {
    match target.descriptions {
        Some(descriptions) => descriptions.known(sql)?.ok().map(Prepared::Unnamed),
        None => {
            let (statement, generation) = target.cache.get(sql)?;
            target.state.statement_looked_up(true);
            Some(Prepared::Named(statement, generation))
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
