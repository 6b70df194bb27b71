//! [`ErrorKind`]: what went wrong, for a caller's `match`, and the words
//! each kind puts first in an error's `Display` text.

// For the doc links to `Error`'s methods.
#[cfg(doc)]
use super::Error;

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
    pub(super) fn describe(self) -> &'static str {
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
