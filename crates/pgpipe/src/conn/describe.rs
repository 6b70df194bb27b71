//! [`Descriptions`]: the parameter types of each SQL text, learned once per
//! pool, for unnamed statements ([`Prepare::Unnamed`](crate::Prepare::Unnamed)).
//!
//! An unnamed statement's run is Parse("")/Bind/Describe/Execute/Sync in one
//! group, and the Bind needs the parameters' types. They are learned with a
//! named statement, on a connection of the pool's own (no user's session,
//! no neighbour in a pipeline), inside `BEGIN … ROLLBACK`: a transaction
//! pooler keeps one server for a transaction, so the statement is prepared,
//! described and closed on the same server, and none outlives it.
//!
//! Inside a transaction the types are learned on the transaction's own
//! connection instead ([`describe_here`]): the transaction pins one server
//! behind a pooler, and a statement that names a table the transaction
//! created, or resolves through its `SET LOCAL search_path`, or waits for a
//! lock the transaction holds, only describes there. The describer serves
//! the rest, one description at a time, each bounded by the pool's
//! `query_timeout` (else `wait_timeout`), after which its connection is
//! closed and the caller told that nothing ran.
//!
//! tokio-postgres resolves types that are not PostgreSQL's own (enums,
//! composites, domains as parameters) with named statements that it caches
//! on its client for good. Those would outlive the transaction, so a
//! statement using such a type is refused, its lookups are deallocated
//! before the transaction ends, and the connection is closed.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use super::{ConnState, Manager, PgConn};
use crate::error::{Error, ErrorKind};
use crate::metrics::CloseReason;
use crate::sync::lock;

/// What a description found: the parameter types, or why the statement is
/// refused (kept, so that a refused statement is not described again).
type Found = Result<Arc<[Type]>, Arc<str>>;

/// Parameter types by SQL text, and the connection that learns them.
pub(crate) struct Descriptions {
    types: Mutex<HashMap<Arc<str>, Found>>,
    /// Most SQL texts remembered; past it one is forgotten per new one.
    capacity: usize,
    /// Where descriptions are made, one at a time; opened on first use.
    describer: tokio::sync::Mutex<Option<PgConn>>,
    /// Opens the describer as the pool opens its connections.
    opener: Manager,
    /// How long one description may take, waiting for the describer
    /// included.
    limit: std::time::Duration,
}

/// Why a description failed, and whether its connection must go.
struct Failure {
    error: Error,
    retire: bool,
}

impl Descriptions {
    pub(crate) fn new(
        opener: Manager,
        capacity: usize,
        limit: std::time::Duration,
    ) -> Descriptions {
        Descriptions {
            types: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
            describer: tokio::sync::Mutex::new(None),
            opener,
            limit,
        }
    }

    /// The parameter types of `sql`, described on first use.
    ///
    /// # Errors
    ///
    /// The server's error for SQL it refuses; [`ErrorKind::NotSupported`]
    /// for a statement with a type that is not PostgreSQL's own;
    /// [`ErrorKind::Connect`] when no connection could be opened to
    /// describe it. Nothing of the query itself was sent.
    pub(crate) async fn param_types(self: &Arc<Self>, sql: &str) -> Result<Arc<[Type]>, Error> {
        if let Some(found) = self.known(sql) {
            return found;
        }
        // In a task of its own: a caller that gives up (a dropped future)
        // must not stop a description half-way, with its transaction open
        // and its named statement not yet closed.
        let descriptions = Arc::clone(self);
        let sql = sql.to_owned();
        tokio::spawn(async move { descriptions.describe(&sql).await })
            .await
            .unwrap_or_else(|e| {
                Err(Error::new(
                    ErrorKind::Protocol,
                    format!("describing the statement failed: {e}"),
                ))
            })
    }

    /// Describes `sql` on the describer, one description at a time, within
    /// the limit.
    async fn describe(&self, sql: &str) -> Result<Arc<[Type]>, Error> {
        let too_long = || {
            Error::new(
                ErrorKind::Timeout,
                format!(
                    "describing the statement's parameters took over {:?} (a lock it waits \
                     for?); nothing of the query was sent",
                    self.limit
                ),
            )
            .unsent()
        };
        let deadline = tokio::time::Instant::now() + self.limit;
        let Ok(mut describer) = tokio::time::timeout_at(deadline, self.describer.lock()).await
        else {
            return Err(too_long());
        };
        match tokio::time::timeout_at(deadline, self.describe_on(&mut describer, sql)).await {
            Ok(found) => found,
            Err(_) => {
                // Its transaction may be open, its statement not closed.
                *describer = None;
                Err(too_long())
            }
        }
    }

    async fn describe_on(
        &self,
        describer: &mut Option<PgConn>,
        sql: &str,
    ) -> Result<Arc<[Type]>, Error> {
        // Another query may have described it while this one waited.
        if let Some(found) = self.known(sql) {
            return found;
        }
        if describer.as_ref().is_none_or(PgConn::is_dead) {
            *describer = None;
            *describer = Some(self.opener.open().await.map_err(|e| {
                Error::new(
                    ErrorKind::Connect,
                    format!("no connection to describe the statement on: {}", e.detail()),
                )
            })?);
        }
        let Some(conn) = describer.as_ref() else {
            unreachable!("opened just above");
        };
        match describe_in_transaction(&conn.client, sql).await {
            Ok(types) => {
                self.remember(sql, Ok(Arc::clone(&types)));
                Ok(types)
            }
            Err(Failure { error, retire }) => {
                if error.kind() == ErrorKind::NotSupported {
                    self.remember(sql, Err(Arc::from(error.detail())));
                }
                if retire || conn.is_dead() {
                    *describer = None;
                }
                Err(error)
            }
        }
    }

    /// What an earlier description of `sql` found.
    pub(crate) fn known(&self, sql: &str) -> Option<Result<Arc<[Type]>, Error>> {
        let cache = lock(&self.types);
        Some(match cache.get(sql)? {
            Ok(types) => Ok(Arc::clone(types)),
            Err(why) => Err(Error::new(ErrorKind::NotSupported, why.to_string())),
        })
    }

    fn remember(&self, sql: &str, found: Found) {
        let mut cache = lock(&self.types);
        if cache.len() >= self.capacity {
            if let Some(old) = cache.keys().next().cloned() {
                cache.remove(&old);
            }
        }
        cache.insert(Arc::from(sql), found);
    }
}

/// The parameter types of `sql`, learned on the connection of the
/// transaction it is about to run in (`client`, `state`): prepared,
/// described and closed there, so that it sees what the transaction sees.
/// Nothing is remembered for the pool: another session may resolve the
/// same text differently.
///
/// # Errors
///
/// The server's error for SQL it refuses (which aborts the transaction, as
/// the statement itself would); [`ErrorKind::NotSupported`] for a type that
/// is not PostgreSQL's own, after which the connection is closed when it
/// comes back (tokio-postgres cached its type look-ups on it as named
/// statements).
pub(crate) async fn describe_here(
    client: &Client,
    state: &ConnState,
    sql: &str,
) -> Result<Arc<[Type]>, Error> {
    let statement = client
        .prepare(sql)
        .await
        .map_err(|e| Error::from_query(e, client.is_closed()))?;
    types_of(statement).map_err(|ty| {
        state.life.closing(CloseReason::ResetFailed);
        not_ours(&ty, "; the connection is closed when it comes back")
    })
}

/// The parameter types of a statement just prepared, or the first type
/// that is not PostgreSQL's own. The statement is dropped, so its Close
/// goes out now (inside the transaction it was prepared in).
fn types_of(statement: Statement) -> Result<Arc<[Type]>, Type> {
    match custom_type(&statement) {
        None => Ok(statement.params().into()),
        Some(ty) => Err(ty),
    }
}

/// Why a statement with type `ty` is refused with unnamed statements.
fn not_ours(ty: &Type, and_then: &str) -> Error {
    Error::new(
        ErrorKind::NotSupported,
        format!(
            "the statement uses type {ty}, which is not PostgreSQL's own; with unnamed \
             statements (through a transaction pooler) only built-in types work: cast it to \
             text (`$1::text::{ty}`, `SELECT col::text`); nothing was run{and_then}"
        ),
    )
}

/// Prepares, describes and closes `sql` inside `BEGIN … ROLLBACK`.
async fn describe_in_transaction(client: &Client, sql: &str) -> Result<Arc<[Type]>, Failure> {
    let failed = |e: tokio_postgres::Error| Failure {
        error: Error::from_query(e, client.is_closed()),
        retire: true,
    };
    client.batch_execute("BEGIN").await.map_err(failed)?;
    let outcome = match client.prepare(sql).await {
        Ok(statement) => match types_of(statement) {
            Ok(types) => Ok(types),
            Err(ty) => {
                // tokio-postgres' own lookups of the type: named
                // statements, cached on this client. Gone from the server
                // here, and with the client when it closes.
                let _ = client.batch_execute("DEALLOCATE ALL").await;
                Err(Failure {
                    error: not_ours(&ty, ""),
                    retire: true,
                })
            }
        },
        Err(e) => Err(Failure {
            error: Error::from_query(e, client.is_closed()),
            retire: false,
        }),
    };
    // Nothing was written; an aborted transaction needs this too.
    client.batch_execute("ROLLBACK").await.map_err(failed)?;
    outcome
}

/// The first type of the statement, parameter or column, that is not one
/// of PostgreSQL's built-in types.
fn custom_type(statement: &Statement) -> Option<Type> {
    statement
        .params()
        .iter()
        .chain(statement.columns().iter().map(|c| c.type_()))
        .find(|ty| Type::from_oid(ty.oid()).is_none())
        .cloned()
}

impl fmt::Debug for Descriptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptions")
            .field("described", &lock(&self.types).len())
            .finish_non_exhaustive()
    }
}
