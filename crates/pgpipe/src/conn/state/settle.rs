//! [`Waiters`]: the tasks waiting for a connection's wire to settle, and
//! how the tap wakes them without a wake-up on every `ReadyForQuery`.
//!
//! A task registers before it looks at the counts, the tap counts before it
//! looks for waiters: the handshake is [`Settlers`]'s.

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use super::settlers::{Registered, Settlers};

/// Who waits for answers, and the signal they wait on.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    /// Woken at every ReadyForQuery and when the connection dies, when
    /// `one_at_a_time` or while a task waits in `settled`.
    ready: Notify,
    /// Tasks waiting in `settled`.
    settling: Settlers,
}

impl Waiters {
    /// Registers a task that is about to wait for answers: either the tap
    /// sees this waiter, or this waiter sees the tap's count.
    pub(super) fn settling(&self) -> Registered<'_> {
        self.settling.register()
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
        if always || self.settling.any() {
            self.ready.notify_waiters();
        }
    }
}
