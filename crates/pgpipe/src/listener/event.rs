//! What a [`Listener`](super::Listener) hands out: a notification, or word
//! that some may have been missed.

use tokio_postgres::Notification;

/// One thing [`Listener::recv`](super::Listener::recv) returns.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub enum Event {
    /// A `NOTIFY` on a channel the listener listens to.
    Notification(Notification),
    /// Notifications may have been missed here: everything before it
    /// arrived in order, everything after it arrived after the gap. Catch
    /// up from the tables themselves (PostgreSQL keeps no notifications for
    /// a session that is gone, nor resends any).
    Gap(Gap),
}

/// Why notifications may have been missed; see [`Event::Gap`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Gap {
    /// The listener's connection was lost; a new one listens to every
    /// channel again. Whatever was sent on them between the loss and the
    /// new `LISTEN`s is gone.
    Reconnected,
    /// The consumer was slow: more notifications waited than the listener
    /// keeps (1024), and the oldest `dropped` of them were thrown away
    /// unread.
    Overflow {
        /// How many were thrown away.
        dropped: u64,
    },
}
