//! The label values, each from a fixed list: how a query ran and ended, why
//! one was refused or a connection closed or quarantined, what a pooler
//! said; and the `pool` label that tells pools and lanes apart.

use crate::error::{Error, ErrorKind};

/// A fixed set of label values: each variant knows its own, and `ALL`
/// lists them in declaration order, so that `variant as usize` indexes it.
macro_rules! labels {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $label:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum $name {
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            pub(crate) const ALL: &[$name] = &[$($name::$variant,)*];

            pub(crate) fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)*
                }
            }
        }
    };
}

labels! {
    /// How a query was run.
    Mode {
        Pipelined = "pipelined",
        /// The pool's own queries with pipelining off, each on a connection
        /// it borrows.
        Exclusive = "exclusive",
        /// Statements on a connection a caller holds (`get()`, `begin()`),
        /// whichever method sent them, counted at the connection from the
        /// server's answers.
        Checkout = "checkout",
    }
}

labels! {
    /// How a query ended.
    Outcome {
        Ok = "ok",
        DbError = "db_error",
        ClientError = "client_error",
        ConnectionLost = "connection_lost",
        Timeout = "timeout",
        /// Queue full, closed, not allowed on shared, deadlock, config, and
        /// the items of an atomic batch that another item aborted.
        Rejected = "rejected",
        ConnectError = "connect_error",
        /// Ran past `query_timeout` (it may have run).
        QueryTimeout = "query_timeout",
        /// Its caller dropped it before it finished (a `select!`, a
        /// `try_join!` whose sibling failed, a request that went away).
        Cancelled = "cancelled",
    }
}

impl Outcome {
    pub(super) fn of(result: Result<(), &Error>) -> Outcome {
        match result.err().map(Error::kind) {
            None => Outcome::Ok,
            Some(ErrorKind::Db) => Outcome::DbError,
            Some(
                ErrorKind::Params | ErrorKind::RowCount | ErrorKind::Protocol | ErrorKind::TooLarge,
            ) => Outcome::ClientError,
            Some(ErrorKind::ConnectionLost) => Outcome::ConnectionLost,
            Some(ErrorKind::Timeout) => Outcome::Timeout,
            Some(ErrorKind::QueryTimeout) => Outcome::QueryTimeout,
            Some(ErrorKind::Connect) => Outcome::ConnectError,
            Some(_) => Outcome::Rejected,
        }
    }
}

labels! {
    /// Why the pool refused a query before running it.
    Rejection {
        QueueFull = "queue_full",
        Timeout = "timeout",
        Closed = "closed",
        NotAllowedOnShared = "not_allowed_on_shared",
        Deadlock = "deadlock",
    }
}

impl Rejection {
    pub(super) fn of(kind: ErrorKind) -> Option<Rejection> {
        match kind {
            ErrorKind::QueueFull => Some(Rejection::QueueFull),
            ErrorKind::Timeout => Some(Rejection::Timeout),
            ErrorKind::Closed => Some(Rejection::Closed),
            ErrorKind::NotAllowedOnShared => Some(Rejection::NotAllowedOnShared),
            ErrorKind::Deadlock => Some(Rejection::Deadlock),
            _ => None,
        }
    }
}

labels! {
    /// Why a connection was closed.
    CloseReason {
        /// Its I/O ended: the server or the network dropped it.
        Broken = "broken",
        /// Its session could not be reset before sharing it.
        ResetFailed = "reset_failed",
        /// The pool was closed or shrunk.
        Shutdown = "shutdown",
        /// It reached `max_lifetime`.
        MaxLifetime = "max_lifetime",
        /// It sat unused for `idle_timeout`.
        Idle = "idle",
        /// The watchdog killed it: queries in flight, nothing received for
        /// `stall_timeout`.
        Stalled = "stalled",
    }
}

impl CloseReason {
    pub(crate) fn from_u8(n: u8) -> Option<CloseReason> {
        CloseReason::ALL.get(usize::from(n)).copied()
    }
}

labels! {
    /// Why a shared connection was quarantined.
    QuarantineReason {
        /// A ReadyForQuery showed a transaction left open.
        Transaction = "transaction",
        /// A reported setting changed (`ParameterStatus`).
        SessionState = "session_state",
        /// The cleanup run behind code the guard cannot read failed, or
        /// found state it cannot undo (a `PREPARE`d statement).
        Cleanup = "cleanup",
        /// A standby was promoted under the connection (`in_hot_standby`
        /// turned off): the host's role changed, not the session.
        RoleChange = "role_change",
    }
}

labels! {
    /// What a server-side pooler said.
    PoolerError {
        /// PgBouncer lost the server under the query (`server conn
        /// crashed?`): it may have run.
        ServerConnCrashed = "server_conn_crashed",
        /// PgBouncer found no server within `query_wait_timeout`.
        QueryWaitTimeout = "query_wait_timeout",
        /// PgBouncer cannot log in to the server, or has no room.
        NoServer = "no_server",
    }
}

impl PoolerError {
    pub(super) fn of(error: &Error) -> Option<PoolerError> {
        let db = error.as_db_error()?;
        if db.message().starts_with("server conn crashed") {
            Some(PoolerError::ServerConnCrashed)
        } else if db.message().starts_with("query_wait_timeout") {
            Some(PoolerError::QueryWaitTimeout)
        } else if crate::error::pooler_found_no_server(db) {
            Some(PoolerError::NoServer)
        } else {
            None
        }
    }
}

/// The `pool` label of one lane's series. Every pgpipe series has the
/// same label names whatever the pool (a registry refuses one name with
/// two sets), so a lane other than a one-host pool's write lane is told
/// apart in the value: `orders` (the write lane), `orders/read` (its read
/// lane), and with several hosts `orders@db1:5432`, `orders@db1:5432/read`.
#[derive(Debug, Clone)]
pub(crate) struct Labels {
    pub(crate) pool: String,
    pub(crate) host: Option<String>,
    pub(crate) lane: Option<&'static str>,
}

impl Labels {
    /// Just the `pool` label.
    pub(crate) fn pool(pool: &str) -> Labels {
        Labels {
            pool: pool.to_owned(),
            host: None,
            lane: None,
        }
    }

    pub(super) fn value(&self) -> String {
        let mut value = self.pool.clone();
        if let Some(host) = &self.host {
            value.push('@');
            value.push_str(host);
        }
        if let Some(lane) = self.lane.filter(|&lane| lane != "write") {
            value.push('/');
            value.push_str(lane);
        }
        value
    }
}

impl std::fmt::Display for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.value())
    }
}
