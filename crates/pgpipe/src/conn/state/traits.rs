//! [`Traits`]: what a connection is, fixed when it opens (what stands
//! between it and the server, whether it groups reads, its set-up SQL).
//! Written once, by the manager that opens it; read by everyone.

use crate::protocol::coalesce::Grouping;
use std::sync::Arc;

/// What stands between a connection and the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Behind {
    /// The server itself, or a pooler that keeps one session per connection.
    Nothing,
    /// A transaction pooler that keeps the server until every message it
    /// forwarded is answered.
    TransactionPooler,
    /// A transaction pooler that may give the server away between two
    /// pipelined queries: one query on the wire at a time.
    TransactionPoolerWithoutPipelines,
}

/// What a connection is; never changes.
#[derive(Debug, Default)]
pub(crate) struct Traits {
    /// The pool's `after_connect` SQL, run again after every reset and
    /// cleanup.
    after_connect: Option<Arc<str>>,
    /// Behind a transaction pooler (see `behind_transaction_pooler`).
    transaction_pooler: bool,
    /// Behind a pooler that cannot track a pipeline (see `one_at_a_time`).
    one_at_a_time: bool,
    /// Whether, while shared, the reads of one write share one Sync (see
    /// `protocol::coalesce`), and how their group is kept read-only.
    read_groups: Grouping,
}

impl Traits {
    pub(crate) fn new(
        after_connect: Option<Arc<str>>,
        pooler: Behind,
        read_groups: Grouping,
    ) -> Traits {
        Traits {
            after_connect,
            transaction_pooler: pooler != Behind::Nothing,
            one_at_a_time: pooler == Behind::TransactionPoolerWithoutPipelines,
            read_groups,
        }
    }

    /// Whether it stands behind a pooler that cannot track a pipeline: then
    /// [`wire_idle`](super::ConnState::wire_idle) waits until every
    /// query written on the connection has its ReadyForQuery, so that the
    /// next one is the only thing in flight. The pooler hands its server to
    /// someone else at the last awaited ReadyForQuery; a query written
    /// before that, and reaching the pooler in pieces, would go partly to
    /// this server and partly to the next (tested: another client's
    /// parameters, `invalid frontend message type`). A query's own future
    /// ends at its CommandComplete, before its ReadyForQuery, so waiting for
    /// the query is not enough.
    #[inline]
    pub(crate) fn one_at_a_time(&self) -> bool {
        self.one_at_a_time
    }

    /// Whether a transaction pooler stands between it and the server: a
    /// `ParameterStatus` then comes from whichever server is linked, not
    /// from anything a query did to a session of this connection's own.
    #[inline]
    pub(crate) fn behind_transaction_pooler(&self) -> bool {
        self.transaction_pooler
    }

    /// The SQL that sets a session up after connecting, and after every
    /// reset and cleanup.
    #[inline]
    pub(crate) fn after_connect(&self) -> Option<&str> {
        self.after_connect.as_deref()
    }

    /// Whether its tap groups the reads of one write while it is shared
    /// (a read lane's connection, or the primary's write lane's).
    #[inline]
    pub(crate) fn read_groups(&self) -> Grouping {
        self.read_groups
    }
}
