//! The wait queue of the shared path: bounded, first in first out, with
//! direct hand-off.
//!
//! When a query finishes while others wait, its place on the connection goes
//! straight to the longest-waiting query: the connection's load does not
//! change hands through a counter that a newcomer could grab first. Without
//! that, a woken waiter can lose its place to a newcomer again and again and
//! wait far longer than its neighbours.
//!
//! The queue knows nothing of connections: it hands on whatever place `P`
//! the router gives it (a [`Handoff`](super::admission::Handoff)), and a
//! place nobody takes comes back to the caller.
//!
//! **Deadlines without a timer each.** Every waiter waits at most the same
//! `wait_timeout`, and its deadline is taken as it joins, under the queue's
//! lock: deadlines grow from the oldest waiter to the newest. So one timer,
//! for the oldest waiter's deadline, is enough for all of them
//! ([`expire`](WaitQueue::expire), driven by
//! [`deadlines`](super::deadlines)); a waiter pays no timer of its own.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::config::deadline_after;
use crate::error::Error;
use crate::sync::lock;

/// A place in transit to a waiter.
pub(crate) trait Place {
    /// Counts the place among its connection's slow queries, or not: set
    /// before the waiter can see it, so the router never sees it uncounted.
    fn route_as_slow(&mut self, slow: bool);
}

/// What a waiting query receives: a place, or why there will be none.
pub(crate) type Admission<P> = Result<P, Error>;

/// One waiting query.
#[derive(Debug)]
struct Waiter<P> {
    sender: oneshot::Sender<Admission<P>>,
    /// Routed as a slow query (see [`costs`](super::costs)).
    slow: bool,
    /// When it stops waiting, with a timeout error.
    deadline: Instant,
}

/// Queries waiting for a place, oldest first.
#[derive(Debug)]
pub(crate) struct WaitQueue<P> {
    waiters: Mutex<VecDeque<Waiter<P>>>,
    /// Waiters still waiting (the deque may also hold some that gave up).
    live: AtomicUsize,
}

impl<P> Default for WaitQueue<P> {
    fn default() -> WaitQueue<P> {
        WaitQueue {
            waiters: Mutex::new(VecDeque::new()),
            live: AtomicUsize::new(0),
        }
    }
}

/// Counts a waiter as live until it stops waiting, however it stops.
pub(crate) struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<P: Place> WaitQueue<P> {
    /// Queries waiting now.
    pub(crate) fn len(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Whether any waiter still waits for an answer; waiters that gave up
    /// need none (and must not make the router open a connection for
    /// nobody).
    pub(crate) fn has_unanswered(&self) -> bool {
        oldest(&mut lock(&self.waiters)).is_some()
    }

    /// Whether the oldest waiter still waiting is a slow query.
    pub(crate) fn oldest_is_slow(&self) -> bool {
        oldest(&mut lock(&self.waiters)).is_some_and(|w| w.slow)
    }

    /// Answers the waiters whose deadline has passed at `now` with an error
    /// made by `error`; the oldest deadline still to come, if any waits.
    pub(crate) fn expire(&self, now: Instant, error: impl Fn() -> Error) -> Option<Instant> {
        let mut waiters = lock(&self.waiters);
        while let Some(waiter) = oldest(&mut waiters) {
            if waiter.deadline > now {
                return Some(waiter.deadline);
            }
            if let Some(waiter) = waiters.pop_front() {
                let _ = waiter.sender.send(Err(error()));
            }
        }
        None
    }

    /// Joins the queue, unless `capacity` queries already wait, to wait at
    /// most `timeout` (see [`expire`](Self::expire)); and whether it was
    /// the only waiter (then the timer of the deadlines has none to wait
    /// for yet).
    pub(crate) fn join(
        &self,
        capacity: usize,
        slow: bool,
        timeout: Duration,
    ) -> Option<(oneshot::Receiver<Admission<P>>, Waiting<'_>, bool)> {
        let mut waiters = lock(&self.waiters);
        if self.live.load(Ordering::Acquire) >= capacity {
            return None;
        }
        let first = oldest(&mut waiters).is_none();
        // Waiters that gave up stay until someone passes them; keep them
        // from piling up when nobody does.
        if waiters.len() > 2 * capacity.max(32) {
            waiters.retain(|w| !w.sender.is_closed());
        }
        let (sender, receiver) = oneshot::channel();
        let deadline = deadline_after(timeout);
        waiters.push_back(Waiter {
            sender,
            slow,
            deadline,
        });
        self.live.fetch_add(1, Ordering::AcqRel);
        Some((receiver, Waiting(&self.live), first))
    }

    /// Gives `place` to the oldest waiter still waiting; hands it back if
    /// there is none.
    pub(crate) fn admit_oldest(&self, mut place: P) -> Result<(), P> {
        let mut waiters = lock(&self.waiters);
        while let Some(waiter) = waiters.pop_front() {
            place.route_as_slow(waiter.slow);
            match waiter.sender.send(Ok(place)) {
                Ok(()) => return Ok(()),
                // It gave up; next.
                Err(returned) => {
                    place = returned.unwrap_or_else(|_| unreachable!("a place is sent as it came"))
                }
            }
        }
        place.route_as_slow(false);
        Err(place)
    }

    /// Answers every waiter with an error made by `error`.
    pub(crate) fn fail_all(&self, error: impl Fn() -> Error) {
        let waiters = std::mem::take(&mut *lock(&self.waiters));
        for waiter in waiters {
            let _ = waiter.sender.send(Err(error()));
        }
    }
}

/// The oldest waiter still waiting; those in front of it that gave up are
/// dropped on the way, so that each is looked at once, not at every call.
fn oldest<P>(waiters: &mut VecDeque<Waiter<P>>) -> Option<&Waiter<P>> {
    while waiters.front().is_some_and(|w| w.sender.is_closed()) {
        waiters.pop_front();
    }
    waiters.front()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A place that records whether it was counted as slow.
    #[derive(Debug, PartialEq)]
    struct Token {
        id: u32,
        slow: bool,
    }

    impl Place for Token {
        fn route_as_slow(&mut self, slow: bool) {
            self.slow = slow;
        }
    }

    fn token(id: u32) -> Token {
        Token { id, slow: false }
    }

    const LONG: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn one_timer_expires_waiters_oldest_first() {
        let queue = WaitQueue::<Token>::default();
        let (a, _wa, first) = queue.join(8, false, Duration::from_millis(10)).unwrap();
        assert!(first, "the only waiter");
        tokio::time::advance(Duration::from_millis(5)).await;
        let (b, _wb, first) = queue.join(8, false, Duration::from_millis(10)).unwrap();
        assert!(!first);
        let start = Instant::now();
        assert_eq!(
            queue.expire(start, Error::closed),
            Some(start + Duration::from_millis(5))
        );
        let later = start + Duration::from_millis(6);
        assert_eq!(
            queue.expire(later, Error::closed),
            Some(start + Duration::from_millis(10))
        );
        assert!(a.await.unwrap().unwrap_err().is_closed(), "expired");
        assert_eq!(
            queue.expire(start + Duration::from_millis(10), Error::closed),
            None
        );
        assert!(b.await.unwrap().unwrap_err().is_closed());
        // One that gave up is passed over, not answered.
        let (gave_up, waiting, _) = queue.join(8, false, Duration::from_millis(1)).unwrap();
        drop((gave_up, waiting));
        assert_eq!(queue.expire(Instant::now(), Error::closed), None);
    }

    #[tokio::test]
    async fn hands_places_to_the_oldest_waiter_first() {
        let queue = WaitQueue::<Token>::default();
        let (first, _a, _) = queue.join(8, false, LONG).unwrap();
        let (second, _b, _) = queue.join(8, true, LONG).unwrap();
        assert_eq!(queue.len(), 2);
        assert!(queue.admit_oldest(token(1)).is_ok());
        assert!(queue.admit_oldest(token(2)).is_ok());
        assert_eq!(first.await.unwrap().unwrap(), Token { id: 1, slow: false });
        assert_eq!(second.await.unwrap().unwrap(), Token { id: 2, slow: true });
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_is_passed_over() {
        let queue = WaitQueue::<Token>::default();
        let (gave_up, waiting, _) = queue.join(8, true, LONG).unwrap();
        drop((gave_up, waiting));
        assert_eq!(queue.len(), 0, "it no longer counts as waiting");
        assert!(!queue.oldest_is_slow());
        let (patient, _w, _) = queue.join(8, false, LONG).unwrap();
        assert!(queue.admit_oldest(token(7)).is_ok());
        assert_eq!(patient.await.unwrap().unwrap(), token(7));
    }

    #[tokio::test]
    async fn a_place_nobody_takes_comes_back_uncounted() {
        let queue = WaitQueue::<Token>::default();
        let (gave_up, waiting, _) = queue.join(8, true, LONG).unwrap();
        drop((gave_up, waiting));
        let refused = queue.admit_oldest(token(3)).unwrap_err();
        assert_eq!(refused, token(3), "not counted as slow");
        assert!(!queue.has_unanswered());
    }

    #[tokio::test]
    async fn the_queue_is_bounded_and_can_fail_everyone() {
        let queue = WaitQueue::<Token>::default();
        let (a, _wa, _) = queue.join(2, false, LONG).unwrap();
        let (b, _wb, _) = queue.join(2, false, LONG).unwrap();
        assert!(queue.join(2, false, LONG).is_none(), "full");
        queue.fail_all(Error::closed);
        assert!(a.await.unwrap().unwrap_err().is_closed());
        assert!(b.await.unwrap().unwrap_err().is_closed());
    }
}
