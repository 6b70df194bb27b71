//! The listener's waits: for a notification or the pool's closing, and
//! before trying to connect again.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::Notification;

use crate::exclusive::Connection;
use crate::hosts::Hosts;

/// The first wait before trying to connect again after a failed attempt;
/// each failure doubles it, up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// What ended a wait on the connection.
pub(super) enum Woke {
    Notification(Notification, u64),
    /// The connection closed with nothing left to read.
    Lost,
    /// The pool closed.
    Closed,
}

/// The connection's next notification, or word that it or the pool
/// closed; notifications first.
pub(super) async fn next_or_closed(conn: &Connection, hosts: &Hosts) -> Woke {
    let mut next = pin!(conn.notifications().next_counted());
    let mut closed = pin!(hosts.closed());
    std::future::poll_fn(|cx| {
        if let Poll::Ready(next) = next.as_mut().poll(cx) {
            return Poll::Ready(match next {
                Some((notification, dropped)) => Woke::Notification(notification, dropped),
                None => Woke::Lost,
            });
        }
        closed.as_mut().poll(cx).map(|()| Woke::Closed)
    })
    .await
}

/// When the listener may try to connect again.
#[derive(Debug)]
pub(super) struct Retry {
    pub(super) next: Option<Instant>,
    delay: Duration,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry {
            next: None,
            delay: FIRST_RETRY_DELAY,
        }
    }
}

impl Retry {
    pub(super) fn failed(&mut self) {
        self.next = Some(Instant::now() + self.delay);
        self.delay = (self.delay * 2).min(MAX_RETRY_DELAY);
    }
}
