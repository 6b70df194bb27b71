//! The wait queue of the shared path: bounded, first in first out, with
//! direct hand-off.
//!
//! When a query finishes while others wait, its place on the connection goes
//! straight to the longest-waiting query: the connection's load does not
//! change hands through a counter that a newcomer could grab first. Without
//! that, a woken waiter can lose its place to a newcomer again and again and
//! wait far longer than its neighbours.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::error::Error;
use crate::pool::PoolInner;
use crate::shared::SharedConn;

/// What a waiting query receives: a place on a connection, or why there
/// will be none.
pub(crate) type Admission = Result<Handoff, Error>;

/// A place on a shared connection, in transit to a waiting query. If the
/// query gave up before taking it, dropping it frees the place again.
pub(crate) struct Handoff {
    conn: Option<Arc<SharedConn>>,
    pool: Arc<PoolInner>,
}

impl Handoff {
    pub(crate) fn new(conn: Arc<SharedConn>, pool: Arc<PoolInner>) -> Handoff {
        Handoff {
            conn: Some(conn),
            pool,
        }
    }

    /// Takes the place; from here on the caller's `Slot` owns it.
    pub(crate) fn take(mut self) -> Arc<SharedConn> {
        self.conn.take().expect("a hand-off is taken once")
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.release(&conn);
        }
    }
}

/// Queries waiting for a place, oldest first.
#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    waiters: Mutex<VecDeque<oneshot::Sender<Admission>>>,
    /// Waiters still waiting (the deque may also hold some that gave up).
    live: AtomicUsize,
}

/// Counts a waiter as live until it stops waiting, however it stops.
pub(crate) struct Waiting<'a>(&'a WaitQueue);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

impl WaitQueue {
    /// Queries waiting now.
    pub(crate) fn len(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Whether any waiter has not been answered yet (some may have given up).
    pub(crate) fn has_unanswered(&self) -> bool {
        !self
            .waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Joins the queue, unless `capacity` queries already wait.
    pub(crate) fn join(
        &self,
        capacity: usize,
    ) -> Option<(oneshot::Receiver<Admission>, Waiting<'_>)> {
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        if self.live.load(Ordering::Acquire) >= capacity {
            return None;
        }
        // Waiters that gave up stay until someone passes them; keep them
        // from piling up when nobody does.
        if waiters.len() > 2 * capacity.max(32) {
            waiters.retain(|w| !w.is_closed());
        }
        let (sender, receiver) = oneshot::channel();
        waiters.push_back(sender);
        self.live.fetch_add(1, Ordering::AcqRel);
        Some((receiver, Waiting(self)))
    }

    /// Gives `admission` to the oldest waiter still waiting; hands it back
    /// if there is none.
    pub(crate) fn admit_oldest(&self, mut admission: Admission) -> Result<(), Admission> {
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(waiter) = waiters.pop_front() {
            match waiter.send(admission) {
                Ok(()) => return Ok(()),
                Err(returned) => admission = returned, // it gave up; next
            }
        }
        Err(admission)
    }

    /// Answers every waiter with an error made by `error`.
    pub(crate) fn fail_all(&self, error: impl Fn() -> Error) {
        let waiters = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|e| e.into_inner()));
        for waiter in waiters {
            let _ = waiter.send(Err(error()));
        }
    }
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff").finish_non_exhaustive()
    }
}
