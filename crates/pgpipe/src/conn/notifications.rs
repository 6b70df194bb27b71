//! [`Notifications`]: what `LISTEN` brings in on one connection, kept until
//! its user reads it.
//!
//! The connection's I/O task hands every `NOTIFY` that arrives to the queue;
//! [`Connection::notification`](crate::Connection::notification) reads it.
//! Bounded: past [`CAPACITY`] unread notifications the oldest is dropped and
//! counted. Cleared when the connection's session is reset, so the next user
//! of the connection never reads the last one's.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Notify;
use tokio_postgres::Notification;

use crate::sync::lock;

/// Unread notifications kept per connection.
pub(crate) const CAPACITY: usize = 1024;

/// One connection's notifications; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Notifications {
    queue: Mutex<VecDeque<Notification>>,
    arrived: Notify,
    /// The connection's I/O ended: no more will come.
    closed: AtomicBool,
    /// Dropped because the queue was full.
    dropped: AtomicU64,
}

impl Notifications {
    /// Called by the I/O task for each notification that arrives.
    pub(crate) fn push(&self, notification: Notification) {
        {
            let mut queue = lock(&self.queue);
            if queue.len() >= CAPACITY {
                queue.pop_front();
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            queue.push_back(notification);
        }
        self.arrived.notify_one();
    }

    /// Called when the connection's I/O ends: waiters learn at once.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.arrived.notify_waiters();
        self.arrived.notify_one();
    }

    /// The oldest unread notification, if any.
    pub(crate) fn try_next(&self) -> Option<Notification> {
        lock(&self.queue).pop_front()
    }

    /// The oldest unread notification, waiting for one; `None` once the
    /// connection closed with nothing left to read.
    pub(crate) async fn next(&self) -> Option<Notification> {
        self.next_counted()
            .await
            .map(|(notification, _)| notification)
    }

    /// As [`next`](Notifications::next), with how many had been dropped
    /// when it was taken: read under the same lock as the queue, so every
    /// drop it counts was of a notification older than this one (drops
    /// take the oldest).
    pub(crate) async fn next_counted(&self) -> Option<(Notification, u64)> {
        loop {
            let arrived = self.arrived.notified();
            if let Some(counted) = self.try_next_counted() {
                return Some(counted);
            }
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            arrived.await;
        }
    }

    /// As [`try_next`](Notifications::try_next), counted as
    /// [`next_counted`](Notifications::next_counted) counts.
    pub(crate) fn try_next_counted(&self) -> Option<(Notification, u64)> {
        let mut queue = lock(&self.queue);
        let notification = queue.pop_front()?;
        Some((notification, self.dropped.load(Ordering::Relaxed)))
    }

    /// Forgets what was not read (the session is being reset).
    pub(crate) fn clear(&self) {
        lock(&self.queue).clear();
    }

    /// How many were dropped because nobody read them in time.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
