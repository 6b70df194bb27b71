//! The batch window: a per-connection gate that holds queries for a busy
//! connection and lets them go all at once.
//!
//! tokio-postgres already writes everything that is queued when its writer
//! runs in one flush. The gate acts *before* the client: queries that find
//! their connection busy wait here, and are released together when the
//! window ends or `max_batch` of them are waiting, so that their requests
//! enter the client's queue back to back. The first query to arrive leads:
//! it sleeps out the window and opens the gate, also when it is cancelled.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use crate::sync::lock;

/// A batch window for one connection.
#[derive(Debug, Default)]
pub(super) struct Gate {
    state: Mutex<GateState>,
    /// Wakes every waiting follower when the leader opens the gate.
    opened: Notify,
    /// Wakes the leader early when the batch is full.
    full: Notify,
}

#[derive(Debug, Default)]
struct GateState {
    leader: bool,
    waiting: usize,
}

impl Gate {
    /// Waits until this query's batch is released.
    pub(super) async fn pass(&self, window: Duration, max_batch: usize) {
        let opened = self.opened.notified();
        let filled = self.full.notified();
        tokio::pin!(opened, filled);
        // Decide under the lock, wait outside it.
        let role = {
            let mut state = lock(&self.state);
            if state.leader {
                state.waiting += 1;
                // Registered before the lock is released, so the leader's
                // wake-up cannot slip past.
                opened.as_mut().enable();
                Role::Follower {
                    full: state.waiting >= max_batch,
                }
            } else {
                state.leader = true;
                state.waiting = 1;
                // Registered under the lock too: a follower that fills the
                // batch wakes exactly this leader, and leaves no permit
                // behind for the next one (whose window would end at once).
                filled.as_mut().enable();
                Role::Leader
            }
        };
        match role {
            Role::Leader => {
                let _open_on_drop = OpenOnDrop(self);
                let _ = tokio::time::timeout(window, filled).await;
            }
            Role::Follower { full } => {
                if full {
                    self.full.notify_waiters();
                }
                // The leader always opens the gate (its guard runs even when
                // it is cancelled); the timeout is a second line of defence.
                let _ = tokio::time::timeout(window * 2 + Duration::from_millis(1), opened).await;
            }
        }
    }

    fn open(&self) {
        let mut state = lock(&self.state);
        state.leader = false;
        state.waiting = 0;
        self.opened.notify_waiters();
    }
}

enum Role {
    Leader,
    Follower { full: bool },
}

struct OpenOnDrop<'a>(&'a Gate);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn releases_the_batch_together_after_the_window() {
        let gate = Arc::new(Gate::default());
        let passed = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let (gate, passed) = (Arc::clone(&gate), Arc::clone(&passed));
            tasks.push(tokio::spawn(async move {
                gate.pass(Duration::from_millis(10), 100).await;
                passed.fetch_add(1, Ordering::SeqCst);
            }));
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(9)).await;
        assert_eq!(passed.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_millis(2)).await;
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(passed.load(Ordering::SeqCst), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_opens_early() {
        let gate = Arc::new(Gate::default());
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let gate = Arc::clone(&gate);
            tasks.push(tokio::spawn(async move {
                gate.pass(Duration::from_secs(1), 3).await;
            }));
            tokio::task::yield_now().await;
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert!(start.elapsed() < Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_leader_still_opens_the_gate() {
        let gate = Arc::new(Gate::default());
        let leader = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.pass(Duration::from_secs(1), 100).await })
        };
        tokio::task::yield_now().await;
        let follower = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.pass(Duration::from_secs(1), 100).await })
        };
        tokio::task::yield_now().await;
        leader.abort();
        let start = tokio::time::Instant::now();
        follower.await.unwrap();
        assert!(start.elapsed() < Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_leaves_no_early_opening_for_the_next_one() {
        let gate = Arc::new(Gate::default());
        // A batch of two fills up (max 2) and opens early.
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let gate = Arc::clone(&gate);
            tasks.push(tokio::spawn(async move {
                gate.pass(Duration::from_secs(1), 2).await;
            }));
            tokio::task::yield_now().await;
        }
        for task in tasks {
            task.await.unwrap();
        }
        // The next leader, alone, waits out its whole window.
        let start = tokio::time::Instant::now();
        gate.pass(Duration::from_millis(500), 2).await;
        assert!(
            start.elapsed() >= Duration::from_millis(500),
            "{:?}",
            start.elapsed()
        );
    }
}
