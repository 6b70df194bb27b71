//! [`Waiters`]: the tasks waiting for a connection's wire to settle, and
//! how the tap wakes them without a wake-up on every `ReadyForQuery`.
//!
//! A task registers before it looks at the counts (`settling`), the tap
//! counts before it looks for waiters (`wake`); a `SeqCst` fence on each
//! side makes sure that one of the two sees the other.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

/// Who waits for answers, and the signal they wait on.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    /// Woken at every ReadyForQuery and when the connection dies, when
    /// `one_at_a_time` or while a task waits in `settled`.
    ready: Notify,
    /// Tasks waiting in `settled`.
    settling: AtomicUsize,
}

/// Counts a task as waiting in `settled` while it lives.
pub(super) struct Settling<'a>(&'a AtomicUsize);

impl Drop for Settling<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Waiters {
    /// Registers a task that is about to wait for answers.
    pub(super) fn settling(&self) -> Settling<'_> {
        self.settling.fetch_add(1, Ordering::SeqCst);
        let settling = Settling(&self.settling);
        // Paired with the fence in `wake`: either the tap sees this waiter,
        // or this waiter sees the tap's count.
        std::sync::atomic::fence(Ordering::SeqCst);
        settling
    }

    /// The next wake-up.
    #[inline]
    pub(super) fn notified(&self) -> Notified<'_> {
        self.ready.notified()
    }

    /// Wakes every waiter: always when `always` (a pooler that cannot
    /// track a pipeline), else only if a task waits in `settled`.
    #[inline]
    pub(super) fn wake(&self, always: bool) {
        if always {
            self.ready.notify_waiters();
            return;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.settling.load(Ordering::SeqCst) > 0 {
            self.ready.notify_waiters();
        }
    }
}
