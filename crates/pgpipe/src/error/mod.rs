//! The crate's one error type.
//!
//! [`Error`] and its constructors and `Display` live here; its kinds in
//! `kind`, the sorting of deadpool's and tokio-postgres' errors into kinds
//! in `classify`, and the read groups' skipped-query errors in `skipped`.

mod classify;
mod kind;
mod skipped;

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use tokio_postgres::error::{DbError, SqlState};

pub(crate) use classify::pooler_found_no_server;
pub use kind::ErrorKind;
pub(crate) use skipped::{SKIP_FILE, SKIP_ROUTINE, SKIPPED};

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
    /// Past its deadline, the server stopped it: nothing it did committed.
    stopped: bool,
    /// Refused unsent because its connection was quarantined (another
    /// task's statement left state there): see [`Error::quarantined`].
    quarantined: bool,
}

impl Inner {
    fn of(kind: ErrorKind, message: Option<String>, source: Option<Source>) -> Error {
        Error(Box::new(Inner {
            kind,
            message,
            source,
            unsent: false,
            ran: false,
            stopped: false,
            quarantined: false,
        }))
    }
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
    /// your own transaction, the transaction decides), and for a
    /// [`ErrorKind::QueryTimeout`] whose statement the server stopped (under
    /// the head-of-line budget or a deadline the server enforced: its
    /// implicit transaction was rolled back, and it never runs later).
    pub fn may_have_run(&self) -> bool {
        match self.0.kind {
            ErrorKind::ConnectionLost => !self.0.unsent,
            ErrorKind::QueryTimeout => !self.0.stopped,
            ErrorKind::TooLarge => self.0.ran,
            _ => false,
        }
    }

    /// True for [`ErrorKind::Closed`].
    pub fn is_closed(&self) -> bool {
        self.0.kind == ErrorKind::Closed
    }

    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Inner::of(kind, Some(message.into()), None)
    }

    fn with_pg(kind: ErrorKind, error: tokio_postgres::Error) -> Error {
        Inner::of(kind, None, Some(Source::Pg(error)))
    }

    pub(crate) fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> Error {
        Inner::of(
            kind,
            Some(message.into()),
            Some(Source::Other(source.into())),
        )
    }

    /// Marks an error of a query that never left the client, so the pool
    /// may run it on another connection.
    pub(crate) fn unsent(mut self) -> Error {
        self.0.unsent = true;
        self
    }

    /// A query admitted to a shared connection that was quarantined
    /// before the query went out (`reason`: the quarantine's label):
    /// nothing ran, and it runs elsewhere (see `lane::retry`).
    pub(crate) fn quarantined(reason: &str) -> Error {
        let mut error = Error::new(
            ErrorKind::ConnectionLost,
            format!(
                "the shared connection was quarantined ({reason}) before this query was sent; \
                 nothing ran"
            ),
        )
        .unsent();
        error.0.quarantined = true;
        error
    }

    /// Whether [`quarantined`](Error::quarantined) made it.
    pub(crate) fn is_quarantined(&self) -> bool {
        self.0.quarantined
    }

    /// Marks the error of a statement the server stopped at the pool's
    /// head-of-line budget (an isolated batch's item): nothing it did
    /// committed, and it may run again where nothing ran behind it.
    pub(crate) fn mark_stopped(&mut self) {
        self.0.stopped = true;
    }

    /// Whether the server stopped the statement at the pool's budget or at
    /// a deadline it enforced: nothing it did committed.
    pub(crate) fn is_stopped(&self) -> bool {
        self.0.stopped
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

    /// A write that waited for the old primary's lane when another host was
    /// elected: it never left the client, so the dispatcher runs it on the
    /// new primary at once (`hosts/dispatch.rs`).
    pub(crate) fn primary_moved() -> Error {
        Error::new(
            ErrorKind::NoPrimary,
            "another host was elected primary while it waited for the old one; it never ran",
        )
        .unsent()
    }

    /// Past `query_timeout`, a query the server stopped (or that never
    /// started again after the server stopped it): it did not run.
    pub(crate) fn query_timeout_stopped(what: &str) -> Error {
        let mut error = Error::new(
            ErrorKind::QueryTimeout,
            format!("the query ran past query_timeout and did not run: {what}"),
        );
        error.0.stopped = true;
        error
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
