//! Read groups: one `Sync` for the reads that go out in one write on a read
//! lane's shared connection.
//!
//! tokio-postgres ends every query with its own `Sync`, and the server ends
//! a transaction, sends `ReadyForQuery` and flushes at each one. On a read
//! lane (sessions opened `default_transaction_read_only=on`) the queries of
//! one socket write may share one: this rewriter drops the inner `Sync`s of
//! a write and, reading the answers, gives tokio-postgres the
//! `ReadyForQuery` each of its requests expects.
//!
//! Why it cannot misroute an answer:
//!
//! - It never changes, drops or reorders a message from the server; it only
//!   inserts `ReadyForQuery` (and, for skipped queries, an `ErrorResponse`)
//!   *between* them, at the end of a request's answer.
//! - A `Sync` is dropped only behind a request that is exactly
//!   `Bind`+`Execute` (one statement, no row limit: its answer ends with
//!   `CommandComplete`, `EmptyQueryResponse` or `ErrorResponse`, and nothing
//!   else), and only when another `Bind` follows in the same write. Every
//!   other request keeps its `Sync` and is passed through untouched.
//! - Answers are matched to requests in the order the requests were
//!   written, as the server answers them. Anything but the expected
//!   messages (a `ReadyForQuery` where the server owes none, a message while
//!   it skips) is a [`Confused`] error: the connection is closed and every
//!   query on it fails with `ConnectionLost`. It never guesses.
//! - After an error inside a group the server skips every message up to the
//!   group's `Sync`: those queries never ran. Each gets an `ErrorResponse`
//!   with SQLSTATE `PP001` (`error::SKIPPED`), which the pool turns into "never sent" and
//!   runs again; their caller never sees it. What ran before the error was
//!   read-only, so the implicit transaction that the error rolls back held
//!   no write to lose.
//!
//! Both directions are framed by [`Framer`], with each message's place in
//! the stream: the writes keeping what [`Writes`] says (the start of
//! `Bind`, `Execute` and `Close`, whole `Parse` bodies, and for the tap,
//! which reads the writes from this walk, simple queries), the answers
//! only their types ([`Answers`]). The writes are rewritten here; the answers
//! in [`answers`].

mod answers;
mod head;
mod learn;
mod requests;

use std::collections::VecDeque;
use std::sync::Arc;

use super::catalog::Catalog;
use super::framer::{Answers, Framer, Phase, Writes};
use crate::error::{SKIP_FILE, SKIP_ROUTINE, SKIPPED};
use learn::Groupable;

/// Most queries under one Sync: one failure skips the rest of its group,
/// and skipped queries run again, so a group stays small enough that a
/// failure costs little.
const MAX_GROUP: u64 = 32;

/// Failed heads after which a connection forms no more groups: one that
/// fails because its statement is gone is prepared again, but a head the
/// server keeps refusing is not tried forever.
const MAX_HEAD_FAILURES: u8 = 3;

/// What the request being written holds so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Building {
    /// Nothing yet.
    #[default]
    Empty,
    /// One `Bind` of the unnamed portal to a groupable statement.
    Bound,
    /// … then one `Execute` of the unnamed portal with no row limit: the
    /// only shape whose `Sync` may be dropped.
    Plain,
    /// Anything else.
    Other,
}

/// The NUL-terminated string at the start of `bytes`, and the rest.
fn cstring(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = bytes.iter().position(|&b| b == 0)?;
    Some((&bytes[..nul], &bytes[nul + 1..]))
}

/// Whether a connection's reads share `Sync`s, and how their groups are
/// kept read-only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Grouping {
    /// Every request keeps its `Sync`.
    #[default]
    Off,
    /// A read lane's: the session is read-only of itself.
    ReadOnlySession,
    /// The primary's write lane: each group starts with a read-only head,
    /// and only plain reads join one.
    ReadOnlyHead,
}

/// A request written and not yet answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Req {
    /// Answered by a `ReadyForQuery` of its own.
    Own,
    /// Its `Sync` was dropped: it shares the next one. With the key of
    /// the statement it binds ([`key`]).
    Grouped(u64),
    /// The last request of a group: it keeps the group's `Sync`, and is
    /// answered by that `ReadyForQuery`. With its statement's key.
    Closing(u64),
    /// The rewriter's own read-only head of a group (see
    /// [`Grouping::ReadOnlyHead`]): its answer is taken, not passed on.
    Head,
    /// The rewriter's own `Parse` of the head, with a `Sync` of its own:
    /// its answer is taken too.
    Prepare,
}

/// The server sent what the requests written cannot explain.
#[derive(Debug)]
pub(crate) struct Confused(pub(crate) &'static str);

impl std::fmt::Display for Confused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "read group out of step ({}); closing the connection",
            self.0
        )
    }
}

impl std::error::Error for Confused {}

/// The rewriter of one connection; see the module docs.
#[derive(Debug)]
pub(crate) struct Coalescer {
    /// From the first `ReadyForQuery` (start-up done, nothing in flight).
    armed: bool,
    outbound: Framer<Writes>,
    inbound: Framer<Answers>,
    /// What the request being written holds so far.
    building: Building,
    /// The [`key`] of the statement it binds, once [`Building::Bound`].
    bound: u64,
    /// The next request's `Bind`, already found to bind a groupable
    /// statement when the request before it looked ahead (`plain_read`):
    /// where it starts in the stream, and its statement's key. So that one
    /// lookup serves both (issue #25: ~80 instructions per grouped query).
    vetted: Option<(u64, u64)>,
    /// Requests written and not yet answered.
    requests: VecDeque<Req>,
    /// How many of them are not [`Req::Own`].
    grouped: usize,
    /// Whether each group starts with the rewriter's read-only head: on a
    /// session that is not read-only of itself (the primary's write lane).
    /// Then only statements that plainly only read may share a group.
    read_only_head: bool,
    /// The head is prepared on this connection (or its `Parse` written).
    head_prepared: bool,
    /// Heads (or their `Parse`) that failed: at [`MAX_HEAD_FAILURES`] this
    /// connection forms no more groups.
    head_failures: u8,
    /// Where the request being written began, in the stream.
    request_start: u64,
    /// The server is skipping to the end of a failed group.
    skipping: bool,
    /// Requests in the group being written.
    group: u64,
    /// Named statements prepared on this connection whose SQL may share a
    /// group ([`groupable`](super::sql_guard::groupable)), learned from
    /// their `Parse` and forgotten at their `Close`.
    groupable: Groupable,
    /// What the database's catalog says reaches user code, and its
    /// generation: when it changes, what was learned from it is forgotten
    /// (those statements keep a `Sync` of their own from then on).
    catalog: (Arc<Catalog>, u64),
    /// Server bytes not yet passed on (a message not yet whole), from
    /// stream offset `emitted`.
    carry: Vec<u8>,
    emitted: u64,
    /// `Sync`s dropped, and the sizes of groups written, since last taken.
    pub(crate) saved: u64,
    pub(crate) groups: Vec<u64>,
}

impl Default for Coalescer {
    fn default() -> Coalescer {
        // A `Parse` longer than the framer keeps whole keeps its own Sync.
        let mut outbound = Framer::keeping(Phase::Typed);
        outbound.capture_sql(true);
        Coalescer {
            armed: false,
            outbound,
            inbound: Framer::keeping(Phase::Typed),
            building: Building::default(),
            bound: 0,
            vetted: None,
            requests: VecDeque::new(),
            grouped: 0,
            read_only_head: false,
            head_prepared: false,
            head_failures: 0,
            request_start: 0,
            skipping: false,
            group: 0,
            groupable: Groupable::default(),
            catalog: Default::default(),
            carry: Vec::new(),
            emitted: 0,
            saved: 0,
            groups: Vec::new(),
        }
    }
}

/// Notes a request written.
fn push(requests: &mut VecDeque<Req>, grouped: &mut usize, req: Req) {
    *grouped += usize::from(req != Req::Own);
    requests.push_back(req);
}

/// Notes the oldest request answered.
fn pop(requests: &mut VecDeque<Req>, grouped: &mut usize) -> Option<Req> {
    let req = requests.pop_front()?;
    *grouped -= usize::from(req != Req::Own);
    Some(req)
}

impl Coalescer {
    /// A rewriter; with [`Grouping::ReadOnlyHead`], for a session that is
    /// not read-only of itself: each group starts with a head that makes its
    /// transaction read-only (enforced by the server: a write in it fails
    /// with 25006 and writes nothing), and only statements that plainly only
    /// read may share one, the last member too.
    pub(crate) fn new(grouping: Grouping) -> Coalescer {
        Coalescer {
            read_only_head: grouping == Grouping::ReadOnlyHead,
            ..Coalescer::default()
        }
    }

    /// Starts rewriting: call at the first `ReadyForQuery`, with nothing
    /// written since.
    pub(crate) fn arm(&mut self) {
        self.armed = true;
    }

    pub(crate) fn is_armed(&self) -> bool {
        self.armed
    }

    /// The catalog's `generation`, and a way to read it if that is new:
    /// statements learned groupable under an older one are forgotten.
    pub(crate) fn use_catalog(&mut self, generation: u64, catalog: impl FnOnce() -> Arc<Catalog>) {
        if self.catalog.1 != generation {
            self.groupable.clear();
            self.catalog = (catalog(), generation);
        }
    }
}

/// Buffers past this size are given back once they empty.
pub(crate) const SHRINK_ABOVE: usize = 64 * 1024;

#[cfg(test)]
mod tests;
