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
///
/// A place for a slow query is counted in its connection's slow queries
/// from before it is sent, so that the router never sees the connection
/// without it.
pub(crate) struct Handoff {
    conn: Option<Arc<SharedConn>>,
    pool: Arc<PoolInner>,
    slow: bool,
}

impl Handoff {
    pub(crate) fn new(conn: Arc<SharedConn>, pool: Arc<PoolInner>) -> Handoff {
        Handoff {
            conn: Some(conn),
            pool,
            slow: false,
        }
    }

    fn for_slow(&mut self, slow: bool) {
        if let Some(conn) = &self.conn {
            if slow != self.slow {
                conn.count_slow(slow);
                self.slow = slow;
            }
        }
    }

    /// Takes the place; from here on the caller's `Slot` owns it (and its
    /// count among the slow queries, if it is one).
    pub(crate) fn take(mut self) -> Arc<SharedConn> {
        self.conn.take().expect("a hand-off is taken once")
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        self.for_slow(false);
        if let Some(conn) = self.conn.take() {
            self.pool.release(&conn);
        }
    }
}

/// One waiting query.
#[derive(Debug)]
struct Waiter {
    sender: oneshot::Sender<Admission>,
    /// Routed as a slow query (see [`hol`](crate::hol)).
    slow: bool,
}

/// Queries waiting for a place, oldest first.
#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    waiters: Mutex<VecDeque<Waiter>>,
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

    /// Whether the oldest waiter still waiting is a slow query.
    pub(crate) fn oldest_is_slow(&self) -> bool {
        let waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        waiters
            .iter()
            .find(|w| !w.sender.is_closed())
            .is_some_and(|w| w.slow)
    }

    /// Joins the queue, unless `capacity` queries already wait.
    pub(crate) fn join(
        &self,
        capacity: usize,
        slow: bool,
    ) -> Option<(oneshot::Receiver<Admission>, Waiting<'_>)> {
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        if self.live.load(Ordering::Acquire) >= capacity {
            return None;
        }
        // Waiters that gave up stay until someone passes them; keep them
        // from piling up when nobody does.
        if waiters.len() > 2 * capacity.max(32) {
            waiters.retain(|w| !w.sender.is_closed());
        }
        let (sender, receiver) = oneshot::channel();
        waiters.push_back(Waiter { sender, slow });
        self.live.fetch_add(1, Ordering::AcqRel);
        Some((receiver, Waiting(self)))
    }

    /// Gives `admission` to the oldest waiter still waiting; hands it back
    /// if there is none.
    pub(crate) fn admit_oldest(&self, mut admission: Admission) -> Result<(), Admission> {
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(waiter) = waiters.pop_front() {
            if let Ok(handoff) = &mut admission {
                handoff.for_slow(waiter.slow);
            }
            match waiter.sender.send(admission) {
                Ok(()) => return Ok(()),
                Err(returned) => admission = returned, // it gave up; next
            }
        }
        if let Ok(handoff) = &mut admission {
            handoff.for_slow(false);
        }
        Err(admission)
    }

    /// Answers every waiter with an error made by `error`.
    pub(crate) fn fail_all(&self, error: impl Fn() -> Error) {
        let waiters = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|e| e.into_inner()));
        for waiter in waiters {
            let _ = waiter.sender.send(Err(error()));
        }
    }
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff").finish_non_exhaustive()
    }
}
