//! [`WireCounts`]: what a connection's wire owes, and when it last moved.
//!
//! Written by the connection's tap (`conn/tap`), from the bytes it sees:
//! requests as they are written, `ReadyForQuery` as it is read, and the two
//! clocks. The one exception is the stall clock's start, set when the
//! connection opens (see `Manager::open`), and `draining`, which the query
//! runner holds while it reads an answer past its caps. Read by the router
//! (depth, head-of-line), the stall watchdog and whoever waits for the wire
//! to settle.

use std::sync::atomic::{AtomicU64, Ordering};

/// Requests written and answered, and the clocks of the last progress.
#[derive(Debug, Default)]
pub(crate) struct WireCounts {
    /// Requests written, each answered by one ReadyForQuery: Syncs, simple
    /// Queries, FunctionCalls and the start-up packet.
    requests: AtomicU64,
    /// ReadyForQuery messages read.
    readies: AtomicU64,
    /// [`PoolWire::now_nanos`](crate::conn::PoolWire::now_nanos) at the last
    /// ReadyForQuery read, or at a write to an idle connection: a connection
    /// that owes answers and has not moved for long is held up by something
    /// slow at its head.
    last_ready_nanos: AtomicU64,
    /// The pool clock (ticks) at the last sign of progress: a read, or a
    /// write to an idle connection. The stall watchdog's clock.
    last_progress_tick: AtomicU64,
    /// Answers over the result caps being read and dropped.
    draining: AtomicU64,
}

/// Counts an answer as draining while it lives.
pub(crate) struct Draining<'a>(&'a AtomicU64);

impl Drop for Draining<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl WireCounts {
    /// Requests written so far.
    #[inline]
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Acquire)
    }

    /// ReadyForQuery messages read so far.
    #[inline]
    pub(crate) fn readies(&self) -> u64 {
        self.readies.load(Ordering::Acquire)
    }

    /// Queries written and not yet answered (requests minus ReadyForQuery).
    #[inline]
    pub(crate) fn depth(&self) -> u64 {
        let readies = self.readies.load(Ordering::Acquire);
        self.requests
            .load(Ordering::Acquire)
            .saturating_sub(readies)
    }

    /// Whether every request written has its ReadyForQuery.
    #[inline]
    pub(crate) fn is_idle(&self) -> bool {
        self.requests.load(Ordering::Acquire) == self.readies.load(Ordering::Acquire)
    }

    /// When the last ReadyForQuery was read (or an idle connection written
    /// to), in [`PoolWire::now_nanos`](crate::conn::PoolWire::now_nanos).
    #[inline]
    pub(crate) fn last_ready_nanos(&self) -> u64 {
        self.last_ready_nanos.load(Ordering::Relaxed)
    }

    /// The pool clock (ticks) at the last sign of progress.
    #[inline]
    pub(crate) fn last_progress_tick(&self) -> u64 {
        self.last_progress_tick.load(Ordering::Relaxed)
    }

    /// Whether an answer over the caps is being drained.
    #[inline]
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire) > 0
    }

    /// `n` requests were written; returns how many were written before.
    #[inline]
    pub(in crate::conn) fn wrote(&self, n: u64) -> u64 {
        self.requests.fetch_add(n, Ordering::AcqRel)
    }

    /// `n` requests written turned out to be answered by none of their own
    /// (a `COPY FROM STDIN`'s first Sync, ignored in copy-in mode).
    #[inline]
    pub(in crate::conn) fn unanswered(&self, n: u64) {
        self.requests.fetch_sub(n, Ordering::AcqRel);
    }

    /// `n` ReadyForQuery were read at `nanos`; returns how many were read in
    /// all.
    #[inline]
    pub(in crate::conn) fn answered(&self, n: u64, nanos: u64) -> u64 {
        self.last_ready_nanos.store(nanos, Ordering::Relaxed);
        self.readies.fetch_add(n, Ordering::AcqRel) + n
    }

    /// A write found nothing owed: both clocks start at `tick` and `nanos`.
    #[inline]
    pub(in crate::conn) fn woke(&self, tick: u64, nanos: u64) {
        self.last_progress_tick.store(tick, Ordering::Relaxed);
        self.last_ready_nanos.store(nanos, Ordering::Relaxed);
    }

    /// A sign of progress at `tick`.
    #[inline]
    pub(in crate::conn) fn progressed(&self, tick: u64) {
        self.last_progress_tick.store(tick, Ordering::Relaxed);
    }

    /// A sign of progress at `tick`, written only if the clock moved since
    /// the last one: every read lands here, and most in the same tick.
    #[inline]
    pub(in crate::conn) fn progressed_if_moved(&self, tick: u64) {
        if self.last_progress_tick.load(Ordering::Relaxed) != tick {
            self.last_progress_tick.store(tick, Ordering::Relaxed);
        }
    }

    /// Notes an answer over the result caps being read and dropped, until
    /// the guard is dropped: the connection is held up meanwhile.
    #[inline]
    pub(in crate::conn) fn draining(&self) -> Draining<'_> {
        self.draining.fetch_add(1, Ordering::AcqRel);
        Draining(&self.draining)
    }
}
