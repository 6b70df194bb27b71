//! Errors from deadpool and tokio-postgres, sorted into kinds: what the
//! server, the connection and the cause's type say.

use std::error::Error as StdError;
use std::io;
use std::sync::Arc;

use deadpool::managed::{PoolError, TimeoutType};
use tokio_postgres::error::DbError;

use super::skipped::is_skip;
use super::{Error, ErrorKind, Inner, Source};

impl Error {
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
        Inner::of(kind, None, Some(Source::SharedPg(Arc::clone(error))))
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
