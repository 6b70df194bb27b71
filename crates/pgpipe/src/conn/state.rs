//! What is known about one connection, shared by its socket tap, the router
//! and the pool: the load word that admission works on, and what the tap
//! has seen on the wire.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::task::AbortHandle;

use crate::metrics::{CloseReason, Metrics, QuarantineReason};

/// A connection's in-flight count and flags in one word, so that "admit a
/// query if the connection is open and below its depth limit" is a single
/// compare-and-swap. The bit layout is private to this type.
#[derive(Debug, Default)]
pub(crate) struct LoadWord(AtomicU64);

/// The low 32 bits count queries admitted on a shared connection and not
/// yet finished.
const IN_FLIGHT: u64 = 0xffff_ffff;
/// The connection is used by the shared (pipelined) path.
const SHARED: u64 = 1 << 61;
/// The connection takes no new work (retiring, quarantined or dead).
const CLOSED: u64 = 1 << 62;
/// The connection's I/O task has ended.
const DEAD: u64 = 1 << 63;

/// One reading of a [`LoadWord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load(u64);

impl Load {
    /// Queries admitted and not finished.
    pub(crate) fn in_flight(self) -> u64 {
        self.0 & IN_FLIGHT
    }

    /// Takes no new work.
    pub(crate) fn is_closed(self) -> bool {
        self.0 & CLOSED != 0
    }

    /// Its I/O task has ended.
    pub(crate) fn is_dead(self) -> bool {
        self.0 & DEAD != 0
    }

    fn is_shared(self) -> bool {
        self.0 & SHARED != 0
    }
}

impl LoadWord {
    /// The word now.
    pub(crate) fn get(&self) -> Load {
        Load(self.0.load(Ordering::Acquire))
    }

    /// Queries admitted and not finished.
    pub(crate) fn in_flight(&self) -> u64 {
        self.get().in_flight()
    }

    /// Claims a place for one more query, returning how many were in flight
    /// before, or `None` if the connection is closed to new work or has
    /// `max_depth` in flight.
    pub(crate) fn admit(&self, max_depth: u64) -> Option<u64> {
        let mut current = self.0.load(Ordering::Acquire);
        loop {
            if current & (CLOSED | DEAD) != 0 || current & IN_FLIGHT >= max_depth {
                return None;
            }
            match self.0.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(current & IN_FLIGHT),
                Err(actual) => current = actual,
            }
        }
    }

    /// Claims `n` more places, past the depth limit if need be (the items
    /// of one batch).
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::AcqRel);
    }

    /// Frees one place; returns how many were in flight before.
    pub(crate) fn release(&self) -> u64 {
        self.0.fetch_sub(1, Ordering::AcqRel) & IN_FLIGHT
    }

    /// Takes no new work from now on.
    pub(crate) fn close(&self) {
        self.0.fetch_or(CLOSED, Ordering::AcqRel);
    }

    /// The I/O task ended: closed, and dead.
    pub(crate) fn mark_dead(&self) {
        self.0.fetch_or(DEAD | CLOSED, Ordering::AcqRel);
    }

    /// Lent to the shared path. A flag, OR-ed in: a connection that died
    /// meanwhile stays dead.
    pub(crate) fn share(&self) {
        self.0.fetch_or(SHARED, Ordering::AcqRel);
    }

    /// Back from the shared path: no longer shared, open to whoever takes it
    /// next, nothing in flight. A dead connection stays dead.
    pub(crate) fn unshare(&self) {
        self.0.fetch_and(DEAD, Ordering::AcqRel);
    }
}

/// Per-connection state shared by the tap, the router and the pool.
#[derive(Debug, Default)]
pub(crate) struct ConnState {
    /// In-flight count and flags.
    pub(crate) load: LoadWord,
    /// Transaction status from the last ReadyForQuery.
    pub(crate) tx_status: AtomicU8,
    /// The session may carry state from an exclusive user or a quarantine;
    /// reset it before the connection is shared again.
    pub(crate) needs_reset: AtomicBool,
    /// Requests written, each answered by one ReadyForQuery: Syncs, simple
    /// Queries, FunctionCalls and the start-up packet.
    pub(crate) requests: AtomicU64,
    /// ReadyForQuery messages read.
    pub(crate) readies: AtomicU64,
    /// Why the connection was quarantined ([`QuarantineReason`] + 1), if it was.
    quarantined: AtomicU8,
    /// The pool clock (ticks) at the last sign of progress: a read, or a
    /// write to an idle connection. The stall watchdog's clock.
    pub(crate) last_progress_tick: AtomicU64,
    /// The pool clock (ticks) when it last went back to deadpool's idle set.
    pub(crate) returned_tick: AtomicU64,
    /// [`PoolWire::now_nanos`](super::PoolWire::now_nanos) at the last
    /// ReadyForQuery read, or at a write to an idle connection: a connection
    /// that owes answers and has not moved for long is held up by something
    /// slow at its head.
    pub(crate) last_ready_nanos: AtomicU64,
    /// Why the pool closes it, once decided ([`CloseReason`] + 1).
    close_reason: AtomicU8,
    /// Ends the connection's I/O task.
    io: OnceLock<AbortHandle>,
    /// Checked out with `get()`: its user's business, whatever it waits for.
    pub(crate) exclusive: AtomicBool,
    /// Whether `connections_closed_total` counted it already.
    close_counted: AtomicBool,
    /// Where quarantines and closes are counted.
    metrics: Option<Arc<Metrics>>,
    /// Answers over the result caps being read and dropped.
    draining: AtomicU64,
    /// The pool's `after_connect` SQL, run again after every reset and
    /// cleanup.
    after_connect: Option<Arc<str>>,
    /// Behind a transaction pooler (see `behind_transaction_pooler`).
    transaction_pooler: bool,
    /// A read lane's connection: while shared, the reads of one write share
    /// one Sync (see `protocol::coalesce`).
    pub(crate) read_groups: bool,
    /// Behind a pooler that cannot track a pipeline (see `wire_idle`).
    one_at_a_time: bool,
    /// Woken at every ReadyForQuery and when the connection dies, when
    /// `one_at_a_time` or while a task waits in `settled`.
    ready: tokio::sync::Notify,
    /// Tasks waiting in `settled`.
    settling: AtomicUsize,
    /// The order in which requests join its pipeline (see `conn::turn`).
    pub(crate) turns: super::turn::Turns,
}

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

/// Counts an answer as draining while it lives.
pub(crate) struct Draining<'a>(&'a AtomicU64);

impl Drop for Draining<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ConnState {
    pub(crate) fn new(
        metrics: Option<Arc<Metrics>>,
        after_connect: Option<Arc<str>>,
        pooler: Behind,
        read_groups: bool,
    ) -> ConnState {
        ConnState {
            metrics,
            after_connect,
            read_groups,
            transaction_pooler: pooler != Behind::Nothing,
            one_at_a_time: pooler == Behind::TransactionPoolerWithoutPipelines,
            ..ConnState::default()
        }
    }

    /// Whether it stands behind a pooler that cannot track a pipeline: then
    /// [`wire_idle`](ConnState::wire_idle) waits until every
    /// query written on the connection has its ReadyForQuery, so that the
    /// next one is the only thing in flight. The pooler hands its server to
    /// someone else at the last awaited ReadyForQuery; a query written
    /// before that, and reaching the pooler in pieces, would go partly to
    /// this server and partly to the next (tested: another client's
    /// parameters, `invalid frontend message type`). A query's own future
    /// ends at its CommandComplete, before its ReadyForQuery, so waiting for
    /// the query is not enough.
    pub(crate) fn one_at_a_time(&self) -> bool {
        self.one_at_a_time
    }

    /// Waits until the wire is idle, when [`one_at_a_time`](ConnState::one_at_a_time);
    /// else returns at once.
    pub(crate) async fn wire_idle(&self) {
        if self.one_at_a_time {
            self.until_answered().await;
        }
    }

    /// Waits until every request written has its answer (or the connection
    /// died), so that what the last answer showed (`tx_status`) is current.
    /// tokio-postgres hands a query its error as soon as it reads it, which
    /// may be before the ReadyForQuery behind it.
    pub(crate) async fn settled(&self) {
        // Nothing owed: what the last answer showed is current.
        if self.wire_depth() == 0 {
            return;
        }
        struct Settling<'a>(&'a AtomicUsize);
        impl Drop for Settling<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.settling.fetch_add(1, Ordering::SeqCst);
        let _settling = Settling(&self.settling);
        // Paired with the fence in `wake`: either the tap sees this waiter,
        // or this waiter sees the tap's count.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.until_answered().await;
    }

    async fn until_answered(&self) {
        loop {
            let notified = self.ready.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.wire_depth() == 0 || self.is_dead() {
                return;
            }
            notified.await;
        }
    }

    /// Wakes what waits in [`wire_idle`](ConnState::wire_idle) and
    /// [`settled`](ConnState::settled): a ReadyForQuery arrived, or the
    /// connection died.
    pub(crate) fn wake(&self) {
        if self.one_at_a_time {
            self.ready.notify_waiters();
            return;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.settling.load(Ordering::SeqCst) > 0 {
            self.ready.notify_waiters();
        }
    }

    /// Whether a transaction pooler stands between it and the server: a
    /// `ParameterStatus` then comes from whichever server is linked, not
    /// from anything a query did to a session of this connection's own.
    pub(crate) fn behind_transaction_pooler(&self) -> bool {
        self.transaction_pooler
    }

    /// The SQL that sets a session up after connecting, and after every
    /// reset and cleanup.
    pub(crate) fn after_connect(&self) -> Option<&str> {
        self.after_connect.as_deref()
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.load.get().is_dead()
    }

    pub(crate) fn set_io(&self, io: AbortHandle) {
        let _ = self.io.set(io);
    }

    /// Ends the connection now: its I/O task stops, the socket closes, and
    /// every query in flight fails with `ConnectionLost`.
    pub(crate) fn kill(&self, reason: CloseReason) {
        self.closing(reason);
        self.load.mark_dead();
        if let Some(io) = self.io.get() {
            io.abort();
        }
        self.count_close(self.metrics.as_deref(), reason);
    }

    /// Counts the connection as closed, once, whoever notices first (the
    /// watchdog that kills it, or the drop that ends it).
    pub(crate) fn count_close(&self, metrics: Option<&Metrics>, reason: CloseReason) {
        if let Some(metrics) = metrics {
            if !self.close_counted.swap(true, Ordering::AcqRel) {
                metrics.closed(reason);
            }
        }
    }

    pub(crate) fn closing(&self, reason: CloseReason) {
        let _ = self.close_reason.compare_exchange(
            0,
            reason as u8 + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    pub(crate) fn close_reason(&self) -> Option<CloseReason> {
        CloseReason::from_u8(self.close_reason.load(Ordering::Acquire).checked_sub(1)?)
    }

    /// Whether the session is in a transaction an error aborted, once every
    /// answer owed is in (see [`settled`](ConnState::settled)). `COMMIT`
    /// there rolls back, and the server says so only with its tag.
    pub(crate) async fn transaction_failed(&self) -> bool {
        self.settled().await;
        self.tx_status.load(Ordering::Acquire) == b'E'
    }

    /// Queries written and not yet answered (requests minus ReadyForQuery).
    pub(crate) fn wire_depth(&self) -> u64 {
        let readies = self.readies.load(Ordering::Acquire);
        self.requests
            .load(Ordering::Acquire)
            .saturating_sub(readies)
    }

    /// Whether the connection is lent to the shared path.
    pub(crate) fn is_shared(&self) -> bool {
        self.load.get().is_shared()
    }

    /// Stops routing to this shared connection, and marks it for a reset
    /// before anyone uses it again: it shows session state (the tap saw a
    /// transaction or a changed setting, or a cleanup found what it cannot
    /// undo). Counted once. An exclusive connection may hold any state its
    /// user likes; it is reset when it comes back anyway.
    pub(crate) fn quarantine(&self, reason: QuarantineReason) {
        if !self.is_shared() {
            return;
        }
        self.needs_reset.store(true, Ordering::Release);
        self.load.close();
        let first = self
            .quarantined
            .compare_exchange(0, reason as u8 + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if first {
            crate::trace::pool_warn!(
                reason = reason.label(),
                "a shared connection showed session state and was quarantined; it is reset \
                 before anyone uses it again"
            );
            if let Some(metrics) = &self.metrics {
                metrics.wire.quarantined(reason);
            }
        }
    }

    /// The session may carry state that could not be cleaned: quarantined if
    /// shared, reset before its next use either way.
    pub(crate) fn left_dirty(&self, reason: QuarantineReason) {
        self.needs_reset.store(true, Ordering::Release);
        self.quarantine(reason);
    }

    /// Notes an answer over the result caps being read and dropped, until
    /// the guard is dropped: the connection is held up meanwhile.
    pub(crate) fn draining(&self) -> Draining<'_> {
        self.draining.fetch_add(1, Ordering::AcqRel);
        Draining(&self.draining)
    }

    /// Counts a statement-cache lookup: a hit, or a miss (a prepare was
    /// needed, by this query or one it waited for).
    pub(crate) fn statement_looked_up(&self, hit: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.statement_lookup(hit);
        }
    }

    /// Counts statements evicted from the connection's cache.
    pub(crate) fn statements_evicted(&self, evicted: u64) {
        if let (Some(metrics), true) = (&self.metrics, evicted > 0) {
            metrics.statements_evicted.inc_by(evicted);
        }
    }

    /// Whether an answer over the caps is being drained.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire) > 0
    }

    /// Why it was quarantined, if it was.
    #[cfg(test)]
    pub(crate) fn quarantine_reason(&self) -> Option<QuarantineReason> {
        match self.quarantined.load(Ordering::Acquire) {
            0 => None,
            n => QuarantineReason::ALL.get(usize::from(n) - 1).copied(),
        }
    }

    /// Whether it was quarantined: a query not yet sent must not go out on it.
    pub(crate) fn is_quarantined(&self) -> bool {
        self.quarantined.load(Ordering::Acquire) != 0
    }

    /// The session was reset: clean again.
    pub(crate) fn cleaned(&self) {
        self.needs_reset.store(false, Ordering::Release);
        self.quarantined.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_stops_at_the_depth_limit_and_at_close() {
        let word = LoadWord::default();
        assert_eq!(word.admit(2), Some(0));
        assert_eq!(word.admit(2), Some(1));
        assert_eq!(word.admit(2), None, "full");
        assert_eq!(word.release(), 2);
        word.close();
        assert_eq!(word.admit(2), None, "closed");
        assert_eq!(word.in_flight(), 1);
    }

    #[test]
    fn sharing_keeps_a_dead_connection_dead() {
        let word = LoadWord::default();
        word.mark_dead();
        word.share();
        word.unshare();
        assert!(word.get().is_dead() && !word.get().is_shared());
        assert_eq!(word.admit(8), None);
    }
}
