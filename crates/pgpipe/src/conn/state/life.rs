//! [`Lifecycle`]: where the connection is in its life, as the pool sees it.
//!
//! Why it closes is decided once, by whoever decides first (recycling, the
//! watchdog, a failed reset, the tap seeing what no reset undoes); it is
//! counted as closed once, by whoever notices first (a kill, or the drop).
//! The exclusive flag is set by the exclusive side around a checkout; the
//! return tick by whoever hands the connection back to deadpool's idle set.
//! Read by recycling, the stall watchdog and `idle_timeout`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use tokio::task::AbortHandle;

use crate::metrics::{CloseReason, Metrics};

/// Close reason, the I/O task, and the times it was handed around.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle {
    /// Why the pool closes it, once decided ([`CloseReason`] + 1).
    close_reason: AtomicU8,
    /// Ends the connection's I/O task.
    io: OnceLock<AbortHandle>,
    /// Whether `connections_closed_total` counted it already.
    close_counted: AtomicBool,
    /// The pool clock (ticks) when it last went back to deadpool's idle set.
    returned_tick: AtomicU64,
    /// Checked out with `get()`: its user's business, whatever it waits for.
    exclusive: AtomicBool,
}

impl Lifecycle {
    /// The handle that ends the connection's I/O task.
    pub(in crate::conn) fn set_io(&self, io: AbortHandle) {
        let _ = self.io.set(io);
    }

    /// Ends the I/O task, if it was started.
    pub(super) fn abort_io(&self) {
        if let Some(io) = self.io.get() {
            io.abort();
        }
    }

    /// Notes why the pool is about to close it, unless that was decided
    /// already.
    pub(crate) fn closing(&self, reason: CloseReason) {
        let _ = self.close_reason.compare_exchange(
            0,
            reason as u8 + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Why the pool closes it, once decided.
    pub(crate) fn close_reason(&self) -> Option<CloseReason> {
        CloseReason::from_u8(self.close_reason.load(Ordering::Acquire).checked_sub(1)?)
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

    /// It went back to deadpool's idle set at `tick`.
    #[inline]
    pub(crate) fn returned(&self, tick: u64) {
        self.returned_tick.store(tick, Ordering::Relaxed);
    }

    /// The pool clock (ticks) when it last went back to the idle set.
    #[inline]
    pub(crate) fn returned_tick(&self) -> u64 {
        self.returned_tick.load(Ordering::Relaxed)
    }

    /// Checked out with `get()` (or back from it): the stall watchdog
    /// leaves an exclusive connection to its user.
    #[inline]
    pub(crate) fn set_exclusive(&self, exclusive: bool) {
        self.exclusive.store(exclusive, Ordering::Release);
    }

    /// Whether it is checked out with `get()`.
    #[inline]
    pub(crate) fn is_exclusive(&self) -> bool {
        self.exclusive.load(Ordering::Acquire)
    }
}
