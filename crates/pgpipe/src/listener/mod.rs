//! [`Listener`]: `LISTEN` that survives a lost connection, from
//! [`Pool::listener`](crate::Pool::listener).
//!
//! The listener holds one exclusive checkout (as
//! [`Pool::get`](crate::Pool::get) would give, but not timed as a user's
//! hold): while it is connected it is one of `max_size` and of
//! `max_exclusive`, and shows in [`Status::exclusive`](crate::Status).
//! Its notifications wait in that connection's queue
//! (`conn/notifications.rs`, bounded, oldest dropped); the listener reads
//! the queue's drop count with each notification it takes, so a
//! [`Gap::Overflow`] sits exactly where the drops were. On a lost
//! connection it reads what the old connection still holds, checks out
//! another, sends every `LISTEN` again in one query and only then reports
//! [`Gap::Reconnected`]. Channel names are quoted in [`channel`]; the
//! waits (a notification or the pool's closing, the retry delay) are in
//! [`wait`].

mod channel;
mod event;
mod wait;

use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::sync::Arc;

use tokio_postgres::Notification;

pub use event::{Event, Gap};

use crate::error::{Error, ErrorKind};
use crate::exclusive::{Connection, Holder};
use crate::hosts::{Hosts, dispatch};
use wait::{Retry, Woke, next_or_closed};

/// `LISTEN` on a connection of its own that comes back after the
/// connection is lost, and says when notifications may have been missed.
///
/// From [`Pool::listener`](crate::Pool::listener):
///
/// ```no_run
/// use pgpipe::{Event, Gap};
///
/// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
/// let mut listener = pool.listener();
/// listener.listen("orders").await?;
/// loop {
///     match listener.recv().await? {
///         Event::Notification(n) => println!("{}: {}", n.channel(), n.payload()),
///         // Some may be gone: read what changed from the table itself.
///         Event::Gap(Gap::Reconnected | Gap::Overflow { .. }) => println!("resync"),
///         _ => {}
///     }
/// }
/// # }
/// ```
///
/// **Its connection.** The listener checks out one exclusive connection
/// from the pool (on the primary, where [`Pool::get`](crate::Pool::get)
/// would) at its first [`listen`](Listener::listen) or
/// [`recv`](Listener::recv), and holds it until it is dropped or the pool
/// closes: it counts as one of `max_size` and of `max_exclusive`, and in
/// [`Status::exclusive`](crate::Status). It is not timed in
/// `exclusive_hold_seconds`. When the listener is dropped the connection
/// goes back to the pool, which resets its session (`UNLISTEN *`) before
/// anyone else uses it.
///
/// **A lost connection.** When the connection breaks (the backend was
/// terminated, the server restarted, a failover), `recv` first returns what
/// had already arrived on it, then checks out another connection, sends
/// every `LISTEN` again, and returns [`Gap::Reconnected`] before any
/// notification from the new connection. An attempt that fails is
/// returned as `recv`'s error; calling `recv` again tries again, waiting
/// from 100 ms (doubling, up to 5 s) after each failure.
///
/// **A slow consumer.** Up to 1024 notifications wait to be read; past
/// that the oldest are dropped, counted in [`dropped`](Listener::dropped),
/// and reported where they were as a [`Gap::Overflow`].
///
/// **Channel names** are taken exactly as given (case kept) and quoted as
/// PostgreSQL quotes identifiers, so a name holding quotes, spaces or SQL
/// is still one channel, the one `pg_notify(name, …)` notifies. `NOTIFY
/// orders` written without quotes notifies the lower-case name.
pub struct Listener {
    hosts: Arc<Hosts>,
    channels: BTreeSet<String>,
    conn: Option<Connection>,
    /// Events owed before anything newer: a gap, then the notification
    /// taken with it; what an old connection still held.
    pending: VecDeque<Event>,
    /// The connection's drop count already reported.
    seen_dropped: u64,
    dropped: u64,
    /// A connection was lost while it listened: the next one owes a
    /// [`Gap::Reconnected`].
    lost: bool,
    reconnects: u64,
    retry: Retry,
}

impl Listener {
    pub(crate) fn new(hosts: Arc<Hosts>) -> Listener {
        Listener {
            hosts,
            channels: BTreeSet::new(),
            conn: None,
            pending: VecDeque::new(),
            seen_dropped: 0,
            dropped: 0,
            lost: false,
            reconnects: 0,
            retry: Retry::default(),
        }
    }

    /// Starts listening to `channel`, checking out the listener's
    /// connection first if it has none. Returns once the server has
    /// confirmed the `LISTEN`; listening twice to one channel is one
    /// `LISTEN`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Params`] for a name PostgreSQL would refuse or cut (empty,
    /// a NUL byte, over 63 bytes): nothing is sent. As
    /// [`Pool::get`](crate::Pool::get) when no connection can be had
    /// (`Timeout`, `Connect`, `Closed` …). A connection lost during the
    /// `LISTEN` is replaced once, as `recv` would. On an error the listener
    /// does not listen to `channel` (a `listen` cancelled before it
    /// finished may or may not).
    pub async fn listen(&mut self, channel: &str) -> Result<(), Error> {
        let sql = channel::listen(channel)?;
        let fresh = self.channels.insert(channel.to_owned());
        if !fresh && self.conn.is_some() {
            return Ok(());
        }
        let result = self.run(&sql).await;
        if result.is_err() && fresh {
            self.channels.remove(channel);
        }
        result
    }

    /// Stops listening to `channel`. From now on `recv` returns none of
    /// its notifications, including those already waiting.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Params`] for a name no channel can have. A connection
    /// lost meanwhile is no error: the next one will not listen to it.
    pub async fn unlisten(&mut self, channel: &str) -> Result<(), Error> {
        let sql = channel::unlisten(channel)?;
        if self.channels.remove(channel) {
            self.send_unlisten(&sql).await?;
        }
        Ok(())
    }

    /// Stops listening to every channel, as [`unlisten`](Listener::unlisten)
    /// does to one. The connection stays checked out.
    ///
    /// # Errors
    ///
    /// As [`unlisten`](Listener::unlisten), when the server refuses it.
    pub async fn unlisten_all(&mut self) -> Result<(), Error> {
        self.channels.clear();
        self.send_unlisten("UNLISTEN *").await
    }

    /// The channels listened to, in byte order of their names.
    pub fn channels(&self) -> impl Iterator<Item = &str> {
        self.channels.iter().map(String::as_str)
    }

    /// The next notification on a channel listened to, or a [`Gap`],
    /// waiting for one. Cancel-safe: dropped before it finishes (in a
    /// `select!`), it loses nothing and the next call carries on.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Closed`] once the pool is closed (the listener gives
    /// its connection back at once, so that
    /// [`close_and_wait`](crate::Pool::close_and_wait) need not wait for
    /// it); as [`Pool::get`](crate::Pool::get) when the connection is lost
    /// and no other can be had, or the server refuses the `LISTEN`s again.
    /// Neither kind of error is final but `Closed`: call `recv` again to
    /// try again.
    pub async fn recv(&mut self) -> Result<Event, Error> {
        loop {
            if let Some(event) = self.next_pending() {
                return Ok(event);
            }
            if self.hosts.is_closed() {
                self.conn = None;
                return Err(Error::closed());
            }
            self.connect().await?;
            if !self.pending.is_empty() {
                continue;
            }
            let Some(conn) = &self.conn else { continue };
            match next_or_closed(conn, &self.hosts).await {
                Woke::Notification(notification, dropped) => self.take(notification, dropped),
                Woke::Lost => self.lose(),
                Woke::Closed => {}
            }
        }
    }

    /// Notifications dropped because more waited than the listener keeps,
    /// since it was made (reported or not yet).
    pub fn dropped(&self) -> u64 {
        let unreported = self.conn.as_ref().map_or(0, |conn| {
            conn.notifications()
                .dropped()
                .saturating_sub(self.seen_dropped)
        });
        self.dropped + unreported
    }

    /// How many times a lost connection was replaced (each one a
    /// [`Gap::Reconnected`]).
    pub fn reconnects(&self) -> u64 {
        self.reconnects
    }

    /// What was owed, skipping notifications of channels no longer
    /// listened to.
    fn next_pending(&mut self) -> Option<Event> {
        while let Some(event) = self.pending.pop_front() {
            match &event {
                Event::Notification(n) if !self.channels.contains(n.channel()) => {}
                _ => return Some(event),
            }
        }
        None
    }

    /// Queues a notification taken from the connection, behind the
    /// overflow it reveals, if any.
    fn take(&mut self, notification: Notification, dropped: u64) {
        if dropped > self.seen_dropped {
            let newly = dropped - self.seen_dropped;
            self.seen_dropped = dropped;
            self.dropped += newly;
            self.pending
                .push_back(Event::Gap(Gap::Overflow { dropped: newly }));
        }
        self.pending.push_back(Event::Notification(notification));
    }

    /// The connection broke: keeps what it still held, gives it back (the
    /// pool closes it), and owes a gap if it listened to anything.
    fn lose(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        while let Some((notification, dropped)) = conn.notifications().try_next_counted() {
            self.take(notification, dropped);
        }
        let unreported = conn
            .notifications()
            .dropped()
            .saturating_sub(self.seen_dropped);
        self.dropped += unreported;
        self.seen_dropped = 0;
        self.lost |= !self.channels.is_empty();
    }

    /// Checks out a connection and listens to every channel on it, if the
    /// listener has none; owes [`Gap::Reconnected`] if it replaces a lost
    /// one. Changes nothing until it has succeeded, so a cancelled attempt
    /// leaves the listener as it was.
    async fn connect(&mut self) -> Result<(), Error> {
        if self.conn.is_some() {
            return Ok(());
        }
        if let Some(at) = self.retry.next {
            tokio::time::sleep_until(at).await;
        }
        let target = self.hosts.settings.default_target;
        let attempt = async {
            let conn = dispatch::on_target(&self.hosts, target, |lane| {
                lane.checkout_counted(Holder::Listener)
            })
            .await?;
            let sql = channel::listen_all(self.channels());
            if !sql.is_empty() {
                conn.batch_execute(&sql)
                    .await
                    .map_err(|e| Error::from_query(e, conn.is_closed()))?;
            }
            Ok::<_, Error>(conn)
        };
        match attempt.await {
            Ok(conn) => {
                self.conn = Some(conn);
                self.seen_dropped = 0;
                self.retry = Retry::default();
                if std::mem::take(&mut self.lost) {
                    self.reconnects += 1;
                    self.pending.push_back(Event::Gap(Gap::Reconnected));
                }
                Ok(())
            }
            Err(error) => {
                self.retry.failed();
                Err(error)
            }
        }
    }

    /// Runs a `LISTEN` on the connection, connecting first if there is
    /// none (which listens to every channel, this one included); a
    /// connection lost meanwhile is replaced once.
    async fn run(&mut self, sql: &str) -> Result<(), Error> {
        if self.conn.is_none() {
            return self.connect().await;
        }
        let Some(conn) = &self.conn else {
            return Ok(());
        };
        let Err(e) = conn.batch_execute(sql).await else {
            return Ok(());
        };
        let error = Error::from_query(e, conn.is_closed());
        if error.kind() != ErrorKind::ConnectionLost {
            return Err(error);
        }
        self.lose();
        self.connect().await
    }

    /// Sends an `UNLISTEN` if connected; a lost connection is no error
    /// (the next one listens only to what is left).
    async fn send_unlisten(&mut self, sql: &str) -> Result<(), Error> {
        let Some(conn) = &self.conn else {
            return Ok(());
        };
        let Err(e) = conn.batch_execute(sql).await else {
            return Ok(());
        };
        let error = Error::from_query(e, conn.is_closed());
        if error.kind() == ErrorKind::ConnectionLost {
            self.lose();
            return Ok(());
        }
        Err(error)
    }
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("channels", &self.channels)
            .field("connected", &self.conn.is_some())
            .field("dropped", &self.dropped())
            .field("reconnects", &self.reconnects)
            .finish_non_exhaustive()
    }
}
