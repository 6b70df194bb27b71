//! The crate's one error type.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::sync::Arc;

use deadpool::managed::{PoolError, TimeoutType};
use tokio_postgres::error::{DbError, SqlState};

/// What went wrong, in a form a caller can `match` on.
///
/// The list grows over time, so matches need a wildcard arm.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The server answered the query with an error (syntax error, constraint
    /// violation, division by zero …). [`Error::as_db_error`] and
    /// [`Error::code`] give the details. Only this query failed: its
    /// connection and its neighbours in the pipeline are unaffected.
    Db,
    /// The query waited longer than the pool's `wait_timeout` for a
    /// connection or for room on a shared one. It never ran: safe to retry.
    Timeout,
    /// The query was sent and did not finish within `query_timeout`. It
    /// **may have run, and committed**: alone on its connection it is
    /// cancelled, but pipelined with neighbours on a shared connection it is
    /// left to finish (a cancel would hit whatever runs). Retry only what is
    /// safe to run twice. [`Error::is_timeout`] is true for it too.
    QueryTimeout,
    /// The pool's wait queue (`queue_capacity`) was full; the query was
    /// refused without waiting.
    QueueFull,
    /// The pool has been closed with [`Pool::close`](crate::Pool::close).
    Closed,
    /// The connection carrying the query broke (the server terminated the
    /// backend, the network failed, the server shut down) while the query was
    /// in flight. The query may or may not have run on the server; the pool
    /// never retries it by itself.
    ConnectionLost,
    /// The SQL would change session state (`BEGIN`, `SET`, `LISTEN`, temp
    /// tables, advisory locks …) and was refused on the shared path. Run it on
    /// an exclusive connection from [`Pool::get`](crate::Pool::get).
    NotAllowedOnShared,
    /// The calling task holds every connection it would have to wait for
    /// (exclusive checkouts from [`Pool::get`](crate::Pool::get)), so waiting
    /// could only end in a timeout.
    Deadlock,
    /// The parameters do not fit the statement: wrong count, a value whose
    /// Rust type does not match the SQL type, or a value that cannot be
    /// encoded. Nothing was sent to the server.
    Params,
    /// `query_one` found no row or more than one; `query_opt` found more than
    /// one.
    RowCount,
    /// The pool configuration is invalid; returned by
    /// [`PoolBuilder::build`](crate::PoolBuilder::build).
    Config,
    /// A new connection could not be opened (refused, unreachable, bad
    /// credentials, timed out while connecting).
    Connect,
    /// The server sent something the client could not parse.
    Protocol,
    /// The request is larger than the server accepts (a message over
    /// 1 GiB − 1 would make it drop the connection, and every query sharing
    /// it), or the result larger than `max_result_bytes`/`max_result_rows`.
    /// Nothing else was affected.
    TooLarge,
    /// Another item of an atomic [`Batch`](crate::Batch) failed, so this one
    /// was rolled back (it ran before the failure), skipped (after it), or
    /// never sent (the failure was found before anything was sent). The
    /// message names the failing item; [`Error::as_db_error`] and
    /// [`Error::code`] give its server error, if it had one.
    BatchAborted,
    /// Transaction control (`BEGIN`, `COMMIT`, `SAVEPOINT` …) or `COPY` in an
    /// item of an atomic [`Batch`](crate::Batch), which runs its own
    /// transaction. Nothing was sent.
    NotAllowedInBatch,
    /// The statement needs an API the query methods do not offer: `COPY`
    /// through [`Executor`](crate::Executor) (use tokio-postgres'
    /// `copy_in`/`copy_out` on `conn.client()`). Nothing was sent.
    NotSupported,
    /// No host is known to be the primary (it is down, or a failover is
    /// under way, or two hosts claim the role on the same timeline), and
    /// none was elected within `failover_wait`. Nothing was sent: safe to
    /// retry. The message names each host's last known role.
    NoPrimary,
    /// A read needed a standby and none fits (none is up, all lag past
    /// `max_replica_lag`), with [`ReplicaFallback::Fail`](crate::ReplicaFallback::Fail)
    /// or [`TargetSessionAttrs::Standby`](crate::TargetSessionAttrs::Standby).
    /// Nothing was sent.
    NoReplica,
}

impl ErrorKind {
    fn describe(self) -> &'static str {
        match self {
            ErrorKind::Db => "database error",
            ErrorKind::Timeout => "timed out",
            ErrorKind::QueryTimeout => "query timed out",
            ErrorKind::QueueFull => "wait queue full",
            ErrorKind::Closed => "pool closed",
            ErrorKind::ConnectionLost => "connection lost",
            ErrorKind::NotAllowedOnShared => "not allowed on a shared connection",
            ErrorKind::Deadlock => "would deadlock",
            ErrorKind::Params => "invalid parameters",
            ErrorKind::RowCount => "unexpected number of rows",
            ErrorKind::Config => "invalid configuration",
            ErrorKind::Connect => "could not connect",
            ErrorKind::Protocol => "protocol error",
            ErrorKind::TooLarge => "too large",
            ErrorKind::BatchAborted => "batch aborted",
            ErrorKind::NotAllowedInBatch => "not allowed in an atomic batch",
            ErrorKind::NotSupported => "not supported",
            ErrorKind::NoPrimary => "no primary",
            ErrorKind::NoReplica => "no standby fits",
        }
    }
}

/// An error from the pool or from the query it ran.
///
/// Look at [`kind`](Error::kind) to decide what to do; the `Display` text is
/// for people. [`as_db_error`](Error::as_db_error) and [`code`](Error::code)
/// pass the server's error through, as in tokio-postgres.
pub struct Error(Box<Inner>);

struct Inner {
    kind: ErrorKind,
    message: Option<String>,
    source: Option<Source>,
    /// The query was never sent: the pool may run it elsewhere.
    unsent: bool,
    /// The statement ran (a result over the caps).
    ran: bool,
}

/// A skipped-query error the read-group rewriter made: its SQLSTATE, and
/// source fields that no SQL can set (a function's `RAISE … ERRCODE =
/// 'PP001'` is the function's own error, never taken for a skip).
fn is_skip(db: &tokio_postgres::error::DbError) -> bool {
    use crate::protocol::coalesce::{SKIP_FILE, SKIP_ROUTINE, SKIPPED};
    db.code().code() == SKIPPED
        && db.file() == Some(SKIP_FILE)
        && db.routine() == Some(SKIP_ROUTINE)
}

/// The cause, kept typed so that `as_db_error` works without downcasting
/// through boxes.
enum Source {
    Pg(tokio_postgres::Error),
    /// One prepare failure handed to every task that waited for it.
    SharedPg(Arc<tokio_postgres::Error>),
    Other(Box<dyn StdError + Send + Sync>),
}

impl Error {
    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The server's error, if the server reported one.
    pub fn as_db_error(&self) -> Option<&DbError> {
        match self.0.source.as_ref()? {
            Source::Pg(e) => e.as_db_error(),
            Source::SharedPg(e) => e.as_db_error(),
            Source::Other(e) => e.downcast_ref::<DbError>(),
        }
    }

    /// The SQLSTATE code of the server's error, if any.
    pub fn code(&self) -> Option<&SqlState> {
        self.as_db_error().map(DbError::code)
    }

    /// True for [`ErrorKind::Timeout`] (never ran) and
    /// [`ErrorKind::QueryTimeout`] (may have run).
    pub fn is_timeout(&self) -> bool {
        matches!(self.0.kind, ErrorKind::Timeout | ErrorKind::QueryTimeout)
    }

    /// Whether the statement may have run on the server, so that retrying it
    /// could run it twice: true for a query cut off after it was sent
    /// ([`ErrorKind::ConnectionLost`], [`ErrorKind::QueryTimeout`]), and for
    /// an answer over the result caps ([`ErrorKind::TooLarge`] after the
    /// statement ran). False for everything refused before sending
    /// ([`ErrorKind::Timeout`], [`ErrorKind::QueueFull`],
    /// [`ErrorKind::Closed`], [`ErrorKind::NotAllowedOnShared`],
    /// [`ErrorKind::Params`] …) and for a statement the server rejected
    /// ([`ErrorKind::Db`]: its implicit transaction was rolled back; inside
    /// your own transaction, the transaction decides).
    pub fn may_have_run(&self) -> bool {
        match self.0.kind {
            ErrorKind::ConnectionLost => !self.0.unsent,
            ErrorKind::QueryTimeout => true,
            ErrorKind::TooLarge => self.0.ran,
            _ => false,
        }
    }

    /// True for [`ErrorKind::Closed`].
    pub fn is_closed(&self) -> bool {
        self.0.kind == ErrorKind::Closed
    }

    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error(Box::new(Inner {
            kind,
            message: Some(message.into()),
            source: None,
            unsent: false,
            ran: false,
        }))
    }

    fn with_pg(kind: ErrorKind, error: tokio_postgres::Error) -> Error {
        Error(Box::new(Inner {
            kind,
            message: None,
            source: Some(Source::Pg(error)),
            unsent: false,
            ran: false,
        }))
    }

    pub(crate) fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> Error {
        Error(Box::new(Inner {
            kind,
            message: Some(message.into()),
            source: Some(Source::Other(source.into())),
            unsent: false,
            ran: false,
        }))
    }

    /// Marks an error of a query that never left the client, so the pool
    /// may run it on another connection.
    pub(crate) fn unsent(mut self) -> Error {
        self.0.unsent = true;
        self
    }

    /// Marks an error of a statement that ran (its answer was too large).
    pub(crate) fn ran(mut self) -> Error {
        self.0.ran = true;
        self
    }

    /// Whether [`unsent`](Error::unsent) marked it.
    pub(crate) fn is_unsent(&self) -> bool {
        self.0.unsent
    }

    pub(crate) fn config(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Config, message)
    }

    /// A commit refused because an earlier statement's error aborted the
    /// transaction: it was rolled back instead.
    pub(crate) fn aborted_commit() -> Error {
        Error::new(
            ErrorKind::Db,
            "the transaction was aborted by an earlier statement's error and was rolled \
             back; nothing was committed",
        )
    }

    pub(crate) fn closed() -> Error {
        Error::new(ErrorKind::Closed, "the pool is closed")
    }

    pub(crate) fn timeout(what: &str) -> Error {
        Error::new(ErrorKind::Timeout, format!("timed out waiting for {what}"))
    }

    /// A query ran past `query_timeout`; `what` says what became of it.
    pub(crate) fn query_timeout(what: &str) -> Error {
        Error::new(
            ErrorKind::QueryTimeout,
            format!("the query ran past query_timeout and may have run: {what}"),
        )
    }

    pub(crate) fn queue_full(capacity: usize) -> Error {
        Error::new(
            ErrorKind::QueueFull,
            format!("{capacity} queries are already waiting (queue_capacity); refused"),
        )
    }

    /// An error of `kind` caused by this one, for another query: it keeps
    /// this one's server error (so `code()` still answers) or, without one,
    /// its text.
    pub(crate) fn echo(&self, kind: ErrorKind, message: impl Into<String>) -> Error {
        let message = message.into();
        match self.as_db_error() {
            Some(db) => Error::with_source(kind, message, db.clone()),
            None => Error::new(kind, format!("{message}: {self}")),
        }
    }

    pub(crate) fn row_count(expected: &str, got: usize) -> Error {
        Error::new(
            ErrorKind::RowCount,
            format!("query returned {got} rows, expected {expected}"),
        )
    }

    /// A failure to open a connection.
    pub(crate) fn connect(error: tokio_postgres::Error) -> Error {
        Error::with_pg(ErrorKind::Connect, error)
    }

    /// Names where it happened (`host:port/db`), before what it says.
    pub(crate) fn at(mut self, place: &str) -> Error {
        self.0.message = Some(match self.0.message.take() {
            Some(message) => format!("{place}: {message}"),
            None => place.to_owned(),
        });
        self
    }

    /// Translates deadpool's error for a checkout of `what`.
    pub(crate) fn from_pool(error: PoolError<Error>, what: &str) -> Error {
        match error {
            PoolError::Backend(e) => e,
            PoolError::Closed => Error::closed(),
            PoolError::Timeout(TimeoutType::Wait) => Error::timeout(what),
            PoolError::Timeout(TimeoutType::Create) => {
                Error::new(ErrorKind::Connect, "timed out opening a connection")
            }
            PoolError::Timeout(TimeoutType::Recycle) => {
                Error::new(ErrorKind::Connect, "timed out checking an idle connection")
            }
            PoolError::NoRuntimeSpecified => Error::config("no runtime configured"),
            PoolError::PostCreateHook(e) => {
                Error::new(ErrorKind::Connect, format!("post-create hook failed: {e}"))
            }
        }
    }

    /// Classifies an error that tokio-postgres returned for a request.
    ///
    /// tokio-postgres keeps its error kinds private, so this reads what it
    /// does expose: the server's error (and its severity), whether the
    /// connection is closed, and the cause's type.
    pub(crate) fn from_query(error: tokio_postgres::Error, connection_closed: bool) -> Error {
        let kind = if let Some(db) = error.as_db_error() {
            if pooler_found_no_server(db) {
                ErrorKind::Connect
            } else if is_fatal(db) {
                ErrorKind::ConnectionLost
            } else {
                ErrorKind::Db
            }
        } else if error.is_closed() || connection_closed {
            ErrorKind::ConnectionLost
        } else {
            match error.source() {
                // An I/O error on a live connection comes either from encoding
                // the request ("value too large to transmit": nothing was
                // sent) or from parsing a response. The two differ only in
                // tokio-postgres' message.
                Some(cause) if cause.is::<io::Error>() => {
                    if error.to_string().starts_with("error encoding") {
                        ErrorKind::Params
                    } else {
                        ErrorKind::Protocol
                    }
                }
                // A conversion error from a `ToSql` implementation.
                Some(_) => ErrorKind::Params,
                // A parameter count mismatch has no cause.
                None if error.to_string().contains("parameters but got") => ErrorKind::Params,
                None => ErrorKind::Protocol,
            }
        };
        let skipped = error.as_db_error().is_some_and(is_skip);
        let error = Error::with_pg(kind, error);
        if skipped { error.unsent() } else { error }
    }

    /// The server skipped it because an earlier read in its group failed:
    /// it never ran (see `protocol::coalesce`).
    pub(crate) fn is_skipped(&self) -> bool {
        self.as_db_error().is_some_and(is_skip)
    }

    /// Like [`from_query`](Error::from_query), for a prepare failure shared
    /// by every task that waited on it.
    pub(crate) fn from_shared_prepare(error: &Arc<tokio_postgres::Error>, closed: bool) -> Error {
        let kind = match error.as_db_error() {
            Some(db) if pooler_found_no_server(db) => ErrorKind::Connect,
            Some(db) if is_fatal(db) => ErrorKind::ConnectionLost,
            Some(_) => ErrorKind::Db,
            None if closed || error.is_closed() => ErrorKind::ConnectionLost,
            None => ErrorKind::Protocol,
        };
        Error(Box::new(Inner {
            kind,
            message: None,
            source: Some(Source::SharedPg(Arc::clone(error))),
            unsent: false,
            ran: false,
        }))
    }
}

/// PgBouncer's words for a query it could not give a server: it waited
/// past `query_wait_timeout`, or logins to the server keep failing
/// (`server_login_retry`), or it cannot reach it. The query never ran, so
/// it is a [`ErrorKind::Connect`] error, not a lost connection (which may
/// have run it). PostgreSQL itself never sends these messages.
pub(crate) fn pooler_found_no_server(db: &DbError) -> bool {
    const NO_SERVER: &[&str] = &[
        "query_wait_timeout",
        "server login has been failing",
        "pgbouncer cannot connect to server",
        "no more connections allowed",
    ];
    NO_SERVER.iter().any(|m| db.message().starts_with(m))
}

/// A server error that ends the session (FATAL/PANIC, e.g. `57P01` from
/// `pg_terminate_backend`) means the connection is gone, not that the query
/// was wrong.
fn is_fatal(db: &DbError) -> bool {
    matches!(db.severity(), "FATAL" | "PANIC")
}

impl Error {
    /// The message without the kind's description in front.
    pub(crate) fn detail(&self) -> String {
        let full = self.to_string();
        let prefix = self.0.kind.describe();
        full.strip_prefix(prefix).map_or(full.clone(), |rest| {
            rest.trim_start_matches(": ").to_string()
        })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.kind.describe())?;
        if let Some(message) = &self.0.message {
            write!(f, ": {message}")?;
        }
        match &self.0.source {
            Some(Source::Pg(e)) => write_pg(f, e),
            Some(Source::SharedPg(e)) => write_pg(f, e),
            Some(Source::Other(e)) => write!(f, ": {e}"),
            None => Ok(()),
        }
    }
}

/// tokio-postgres prints "db error" for server errors and keeps the server's
/// message in the source; show the message, which is what people need.
fn write_pg(f: &mut fmt::Formatter<'_>, e: &tokio_postgres::Error) -> fmt::Result {
    match e.as_db_error() {
        Some(db) => write!(
            f,
            ": {}: {} ({})",
            db.severity(),
            db.message(),
            db.code().code()
        ),
        None => match e.source() {
            Some(cause) => write!(f, ": {e}: {cause}"),
            None => write!(f, ": {e}"),
        },
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.0.kind);
        if let Some(message) = &self.0.message {
            d.field("message", message);
        }
        match &self.0.source {
            Some(Source::Pg(e)) => d.field("source", e),
            Some(Source::SharedPg(e)) => d.field("source", e),
            Some(Source::Other(e)) => d.field("source", e),
            None => &mut d,
        };
        d.finish()
    }
}

/// For code that mixes the pool's calls with tokio-postgres calls on a
/// [`Connection`](crate::Connection), so that `?` works on both.
impl From<tokio_postgres::Error> for Error {
    fn from(error: tokio_postgres::Error) -> Error {
        let closed = error.is_closed();
        Error::from_query(error, closed)
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self.0.source.as_ref()? {
            Source::Pg(e) => Some(e),
            Source::SharedPg(e) => Some(&**e),
            Source::Other(e) => Some(&**e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<Error>();
    }

    #[test]
    fn display_names_the_kind_and_message() {
        let e = Error::queue_full(8);
        assert_eq!(e.kind(), ErrorKind::QueueFull);
        assert!(e.to_string().starts_with("wait queue full: 8 queries"));
        assert!(e.as_db_error().is_none());
    }
}
