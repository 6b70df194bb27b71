//! [`SharedConn`]: a connection on loan to the shared path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use deadpool::managed::Object;

use super::batch_window::Gate;
use crate::conn::run::SpawnPrepare;
use crate::conn::state::{ConnState, Load};
use crate::conn::statement_cache::Ticket;
use crate::conn::{Manager, PgConn};

/// A connection on loan to the shared path. It goes back to deadpool when
/// the last query using it finishes after it was retired.
pub(crate) struct SharedConn {
    object: Object<Manager>,
    /// The batch window's gate (used only with `batch_window` set).
    pub(super) gate: Gate,
    /// The pool's coarse clock when the last query on it finished.
    last_done_tick: AtomicU64,
    /// Slow queries in flight (see [`costs`](super::costs)).
    slow: AtomicU64,
}

impl SharedConn {
    pub(super) fn new(object: Object<Manager>, now_tick: u64) -> SharedConn {
        object.state.load.share();
        SharedConn {
            object,
            gate: Gate::default(),
            last_done_tick: AtomicU64::new(now_tick),
            slow: AtomicU64::new(0),
        }
    }

    #[inline]
    pub(crate) fn conn(&self) -> &PgConn {
        &self.object
    }

    pub(crate) fn state(&self) -> &ConnState {
        &self.object.state
    }

    pub(super) fn load(&self) -> Load {
        self.state().load.get()
    }

    /// Queries admitted and not finished.
    pub(crate) fn in_flight(&self) -> u64 {
        self.state().load.in_flight()
    }

    /// Slow queries in flight.
    pub(super) fn slow_in_flight(&self) -> u64 {
        self.slow.load(Ordering::Acquire)
    }

    /// Counts one more slow query in flight, or one fewer.
    pub(super) fn count_slow(&self, more: bool) {
        if more {
            self.slow.fetch_add(1, Ordering::AcqRel);
        } else {
            self.slow.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Frees one place, noting the tick when it falls idle. A place given
    /// back twice is a defect: it fails debug builds, and in release builds
    /// it is logged and ignored (the word is left as it was).
    pub(super) fn give_back(&self, now_tick: u64) {
        match self.state().load.release() {
            Some(1) => self.last_done_tick.store(now_tick, Ordering::Relaxed),
            Some(_) => {}
            None => {
                debug_assert!(false, "a shared connection's place was given back twice");
                crate::trace::pool_warn!(
                    "a shared connection's place was given back twice; ignored"
                );
            }
        }
    }

    /// Idle (nothing in flight) for at least `ticks` ticks as of `now_tick`.
    pub(super) fn idle_for(&self, now_tick: u64, ticks: u64) -> bool {
        self.in_flight() == 0
            && now_tick.saturating_sub(self.last_done_tick.load(Ordering::Relaxed)) >= ticks
    }
}

/// A shared connection's cache misses are prepared in a task that holds the
/// connection until the prepare is done.
impl SpawnPrepare for Arc<SharedConn> {
    fn spawn_prepare(&self, ticket: Ticket) {
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            shared.conn().prepare_for_cache(ticket).await;
        });
    }
}

impl Drop for SharedConn {
    fn drop(&mut self) {
        // Shared queries may leave what no cleanup can see from outside
        // (a sequence's `lastval`): reset before the next user, whoever it is.
        self.state().session.mark_needs_reset();
        self.object.returned();
        self.state().load.unshare();
    }
}

impl std::fmt::Debug for SharedConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let load = self.load();
        f.debug_struct("SharedConn")
            .field("in_flight", &load.in_flight())
            .field("closed", &load.is_closed())
            .finish_non_exhaustive()
    }
}
