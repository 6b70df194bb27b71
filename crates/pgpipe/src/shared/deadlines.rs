//! One timer for every waiting query's deadline.
//!
//! A waiter used to race its hand-off against a timer of its own: one timer
//! entry registered and removed per wait, on the path where the pool is
//! saturated and every query waits. Deadlines in the queue grow from the
//! oldest waiter to the newest (see [`queue`](super::queue)), so one task
//! sleeping until the oldest deadline answers every waiter in time: it
//! wakes at that deadline (or when a waiter joins an empty queue), fails
//! what has expired with the same timeout error as before, and sleeps until
//! the next. It holds the router weakly and ends with it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tokio::time::Instant;

use super::Router;
use crate::error::Error;

impl Router {
    /// Fails the waiters whose deadline has passed, as a wait past
    /// `wait_timeout` always has; the oldest deadline still to come.
    pub(super) fn expire_waiters(&self) -> Option<Instant> {
        self.queue.expire(Instant::now(), || {
            Error::timeout("room on a shared connection")
        })
    }

    /// Makes sure the deadlines' timer runs (on the caller's runtime), and
    /// wakes it if `first`: a waiter joined a queue that had none, so the
    /// timer has a deadline to wait for again.
    pub(super) fn watch_deadlines(self: &Arc<Self>, first: bool) {
        if !self.sweeping.swap(true, Ordering::AcqRel) {
            let running = Running(Arc::downgrade(self));
            tokio::spawn(sweep(running));
        } else if first {
            self.deadlines.notify_one();
        }
    }
}

/// The timer's task: while the router lives, answers expired waiters and
/// sleeps until the next deadline or a new one.
async fn sweep(running: Running) {
    loop {
        let Some(router) = running.0.upgrade() else {
            return;
        };
        let deadlines = Arc::clone(&router.deadlines);
        let mut woken = std::pin::pin!(deadlines.notified());
        // Registered before looking, so that a waiter joining after the
        // look wakes it.
        woken.as_mut().enable();
        let next = router.expire_waiters();
        drop(router);
        match next {
            // Until the deadline, or a wake-up, whichever comes first.
            Some(at) => drop(tokio::time::timeout_at(at, &mut woken).await),
            None => woken.await,
        }
    }
}

/// Wakes the timer's task, should it wait for a waiter, so that it finds
/// the router gone and ends.
impl Drop for Router {
    fn drop(&mut self) {
        self.deadlines.notify_one();
    }
}

/// Notes that no timer runs once its task ends, however it ends (the
/// router dropped, or the runtime that ran it shut down): the next waiter
/// starts another.
struct Running(Weak<Router>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(router) = self.0.upgrade() {
            router.sweeping.store(false, Ordering::Release);
        }
    }
}
