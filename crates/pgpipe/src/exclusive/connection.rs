//! [`Connection`]: an exclusive checkout, for transactions and session state.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use deadpool::managed::Object;
use tokio_postgres::{Client, Notification, Statement};

use super::options::{TransactionBuilder, TransactionOptions};
use super::transaction::Parts;
use super::{Claim, Transaction};
use crate::conn::notifications::Notifications;
use crate::conn::run::{self, RunSettings};
use crate::conn::{Manager, PgConn};
use crate::error::{Error, ErrorKind};
use crate::metrics::Metrics;

/// A connection checked out with [`Pool::get`](crate::Pool::get): yours alone
/// until dropped, never shared meanwhile.
///
/// It dereferences to a [`tokio_postgres::Client`], so everything
/// tokio-postgres offers works here. Its [`transaction`](Connection::transaction)
/// and its [`Executor`](crate::Executor) methods go through the
/// connection's statement cache:
///
/// ```no_run
/// use pgpipe::Executor;
///
/// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
/// let mut conn = pool.get().await?;
/// conn.execute("SET statement_timeout = '5s'", &[]).await?;
/// let tx = conn.transaction().await?;
/// tx.execute("UPDATE accounts SET balance = balance - 1 WHERE id = $1", &[&1i64])
///     .await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
///
/// When it is dropped, the connection goes back to the pool. An open
/// transaction is rolled back before anyone else uses it, and before it is
/// shared again its session is reset (`SET`s, temp tables, advisory locks,
/// `LISTEN`s, cursors); its prepared statements stay cached.
pub struct Connection {
    // Field order matters: the connection goes back to deadpool before the
    // claim is released, so a shared-path opener woken by the release finds
    // it there.
    object: Object<Manager>,
    _claim: Claim,
    run: RunSettings,
    /// Since when its user holds it, for `exclusive_hold_seconds` (only
    /// `get()`'s and `begin()`'s connections, whose statements the tap
    /// counts: the pool's own one-query checkouts are counted where they
    /// start).
    held: Option<(std::time::Instant, Arc<Metrics>)>,
}

impl Connection {
    pub(super) fn new(
        object: Object<Manager>,
        claim: Claim,
        run: RunSettings,
        held: Option<(Arc<Metrics>, std::time::Instant)>,
    ) -> Connection {
        // `asked`: when its holder asked for it.
        let held = held.map(|(metrics, asked)| {
            // From here the tap counts what its holder sends, however sent.
            object.state.held.begin();
            let since = std::time::Instant::now();
            metrics.saved.held(asked, since);
            (since, metrics)
        });
        Connection {
            object,
            _claim: claim,
            run,
            held,
        }
    }

    /// Starts a transaction. Its queries use this connection's statement
    /// cache; dropped without a commit, it rolls back.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::ConnectionLost`] when the connection broke.
    pub async fn transaction(&mut self) -> Result<Transaction<'_>, Error> {
        self.transaction_with(TransactionOptions::new()).await
    }

    /// A transaction with an isolation level, read-only or deferrable, as
    /// tokio-postgres' builder of the same name, started with
    /// [`start`](TransactionBuilder::start): pgpipe's [`Transaction`], with
    /// this connection's statement cache and the pool's metrics.
    ///
    /// ```no_run
    /// use pgpipe::{Executor, IsolationLevel};
    ///
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// let mut conn = pool.get().await?;
    /// let tx = conn
    ///     .build_transaction()
    ///     .isolation_level(IsolationLevel::RepeatableRead)
    ///     .start()
    ///     .await?;
    /// let total: i64 = tx.query_one("SELECT count(*) FROM orders", &[]).await?.get(0);
    /// tx.commit().await?;
    /// # let _ = total;
    /// # Ok(())
    /// # }
    /// ```
    pub fn build_transaction(&mut self) -> TransactionBuilder<'_> {
        TransactionBuilder::new(self)
    }

    /// Starts a transaction with `options`.
    pub(super) async fn transaction_with(
        &mut self,
        options: TransactionOptions,
    ) -> Result<Transaction<'_>, Error> {
        // `client.transaction()` needs the client mutably while the cache,
        // the state and the peer stay borrowed: split the borrow.
        let PgConn {
            client,
            cache,
            descriptions,
            state,
            peer,
            wire,
            ..
        } = &mut *self.object;
        let inner = options.apply(client.build_transaction()).start().await?;
        let parts = Parts {
            cache,
            descriptions: descriptions.as_ref(),
            state,
            peer,
            wire,
            run: self.run,
        };
        Ok(Transaction::new(inner, parts))
    }

    /// The next notification from a `LISTEN` on this connection, waiting
    /// for one to arrive.
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// let conn = pool.get().await?;
    /// conn.batch_execute("LISTEN orders").await?;
    /// let notification = conn.notification().await?;
    /// println!("{}: {}", notification.channel(), notification.payload());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Notifications wait on the connection until read, up to 1024; past
    /// that the oldest are dropped. What this user does not read is gone
    /// when the connection goes back to the pool (its session is reset,
    /// `UNLISTEN *` included). A lost connection loses its `LISTEN`s: after
    /// [`ErrorKind::ConnectionLost`], check out another connection, `LISTEN`
    /// again, and catch up on anything that happened meanwhile from the
    /// tables themselves; [`Pool::listener`](crate::Pool::listener) does
    /// that for you.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::ConnectionLost`] when the connection closed and nothing
    /// is left to read.
    pub async fn notification(&self) -> Result<Notification, Error> {
        self.object.notifications.next().await.ok_or_else(|| {
            Error::new(
                ErrorKind::ConnectionLost,
                "the connection closed; its LISTENs ended with it",
            )
        })
    }

    /// A notification that has already arrived, without waiting; see
    /// [`notification`](Connection::notification).
    pub fn try_notification(&self) -> Option<Notification> {
        self.object.notifications.try_next()
    }

    /// Notifications dropped on this connection because more than 1024 were
    /// waiting to be read.
    pub fn notifications_dropped(&self) -> u64 {
        self.object.notifications.dropped()
    }

    /// The tokio-postgres client, for its own methods where a pgpipe trait
    /// in scope has one of the same name.
    pub fn client(&self) -> &Client {
        &self.object.client
    }

    /// The connection as a place to run queries inside a transaction its
    /// caller began: a cached plan the server refused is not retried.
    pub(crate) fn transaction_target(&self) -> run::Target<'_> {
        run::Target {
            heal: false,
            ..self.object.target()
        }
    }

    /// Prepares `sql` through the connection's statement cache: the first
    /// call prepares, later calls (also after the connection has served the
    /// shared path) reuse the statement.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Db`] when the server rejects the SQL,
    /// [`ErrorKind::ConnectionLost`] when the connection broke.
    pub async fn prepare_cached(&self, sql: &str) -> Result<Statement, Error> {
        run::named_statement(self.object.target(), sql).await
    }

    /// What `LISTEN` brought in on it, for a [`Listener`](crate::Listener).
    pub(crate) fn notifications(&self) -> &Notifications {
        &self.object.notifications
    }

    /// How its queries run.
    pub(crate) fn run_settings(&self) -> RunSettings {
        self.run
    }

    /// The pooled connection underneath.
    pub(crate) fn pg_conn(&self) -> &PgConn {
        &self.object
    }

    /// Whether the last user's session is still to be reset (a checkout
    /// for [`Pool::begin`](crate::Pool::begin)); asking clears it, since
    /// the caller resets it now.
    pub(crate) fn take_reset_owed(&mut self) -> bool {
        std::mem::take(&mut self.object.reset_owed)
    }
}

impl super::OnConnection for Connection {
    fn place(&self) -> (run::Target<'_>, RunSettings) {
        (self.object.target(), self.run)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some((since, metrics)) = &self.held {
            metrics
                .exclusive_hold
                .observe(since.elapsed().as_secs_f64());
            metrics.saved.released(*since);
        }
        self.object.state.held.end();
        self.object.state.life.set_exclusive(false);
        self.object.returned();
    }
}

impl Deref for Connection {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.object.client
    }
}

impl DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.object.client
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("closed", &self.object.client.is_closed())
            .finish_non_exhaustive()
    }
}
