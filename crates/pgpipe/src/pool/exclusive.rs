//! The pool's exclusive side: [`Pool::get`] and [`Pool::begin`], and their
//! kinds of host.

use super::Pool;
use crate::error::{Error, ErrorKind};
use crate::exclusive::{Connection, Holder, NotBegun, OwnedTransaction, TransactionOptions};
use std::sync::Arc;

use crate::hosts::{Hosts, dispatch};
use crate::target::TargetSessionAttrs;

/// How many connections `begin()` tries when the last user's session
/// cannot be reset on one (each such connection is closed).
const BEGIN_ATTEMPTS: u32 = 3;

impl Pool {
    /// Checks out an exclusive connection: for transactions, session
    /// settings, `LISTEN`, `COPY`, cursors, temp tables, advisory locks.
    ///
    /// Exclusive checkouts and shared connections draw from one `max_size`;
    /// at most `max_exclusive` connections are checked out at once, and a
    /// checkout that finds every connection shared makes one drain and
    /// return.
    ///
    /// With several hosts it is a connection to the primary (or to the host
    /// the URL's `target_session_attrs` names), waiting for one within
    /// `failover_wait` while none is elected, as a write does.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) after `wait_timeout`,
    /// [`ErrorKind::Deadlock`](crate::ErrorKind::Deadlock) when this task
    /// already holds every place it could wait for,
    /// [`ErrorKind::Closed`](crate::ErrorKind::Closed),
    /// [`ErrorKind::Connect`](crate::ErrorKind::Connect).
    pub async fn get(&self) -> Result<Connection, Error> {
        self.get_with(self.hosts.settings.default_target).await
    }

    /// Checks out an exclusive connection to a host of the kind `target`
    /// names (libpq's `target_session_attrs`; see [`TargetSessionAttrs`]),
    /// as [`get`](Pool::get) does. Connections to a standby, or opened
    /// read-only on the primary, refuse writes with SQLSTATE 25006.
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// use pgpipe::TargetSessionAttrs;
    /// let standby = pool.get_with(TargetSessionAttrs::PreferStandby).await?;
    /// let rows = standby.query("SELECT count(*) FROM orders", &[]).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get`](Pool::get), and [`ErrorKind::NoPrimary`](crate::ErrorKind::NoPrimary)
    /// or [`ErrorKind::NoReplica`](crate::ErrorKind::NoReplica) when no host
    /// of that kind is up.
    pub async fn get_with(&self, target: TargetSessionAttrs) -> Result<Connection, Error> {
        self.get_as(target, Holder::Caller).await
    }

    async fn get_as(
        &self,
        target: TargetSessionAttrs,
        holder: Holder,
    ) -> Result<Connection, Error> {
        dispatch::on_target(&self.hosts, target, |lane| lane.checkout_counted(holder)).await
    }

    /// The pool's hosts.
    pub(crate) fn hosts(&self) -> &Arc<Hosts> {
        &self.hosts
    }
}

/// A connection for the pool's handles' own use (a statement's prepare, a
/// typed query), to the host [`get`](Pool::get) picks.
pub(crate) async fn checkout(hosts: &Arc<Hosts>, holder: Holder) -> Result<Connection, Error> {
    let target = hosts.settings.default_target;
    dispatch::on_target(hosts, target, |lane| lane.checkout_counted(holder)).await
}

impl Pool {
    /// Begins a transaction on a connection of its own, which goes back to
    /// the pool when the transaction ends. Cheaper than [`get`](Pool::get)
    /// and [`Connection::transaction`] by a round trip: the session reset
    /// between users rides along with the `BEGIN` and the `COMMIT` instead
    /// of costing a round trip before the `BEGIN`. See [`OwnedTransaction`].
    ///
    /// ```no_run
    /// use pgpipe::Executor;
    ///
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// let tx = pool.begin().await?;
    /// tx.execute("INSERT INTO audit (event) VALUES ($1)", &[&"login"]).await?;
    /// tx.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get`](Pool::get). A connection lost, or a session that could
    /// not be reset, before the transaction began is closed and another is
    /// tried, three in all; past that the error (`ConnectionLost` or the
    /// reset's own) says nothing ran (`may_have_run()` is false). The
    /// transaction runs where [`get`](Pool::get) would check out; see
    /// [`begin_with`](Pool::begin_with) for another kind of host.
    ///
    /// [`ErrorKind::ConnectionLost`]: crate::ErrorKind::ConnectionLost
    pub async fn begin(&self) -> Result<OwnedTransaction, Error> {
        self.begin_with(self.hosts.settings.default_target).await
    }

    /// Begins a transaction as [`begin`](Pool::begin) does, on a host of
    /// the kind `target` names, as [`get_with`](Pool::get_with) checks out.
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// use pgpipe::{Executor, TargetSessionAttrs};
    /// // A consistent snapshot for several reads, on a standby if one is up.
    /// let tx = pool.begin_with(TargetSessionAttrs::PreferStandby).await?;
    /// tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", &[]).await?;
    /// let orders = tx.query("SELECT * FROM orders", &[]).await?;
    /// let lines = tx.query("SELECT * FROM order_lines", &[]).await?;
    /// tx.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`begin`](Pool::begin) and [`get_with`](Pool::get_with).
    pub async fn begin_with(&self, target: TargetSessionAttrs) -> Result<OwnedTransaction, Error> {
        self.begin_as(target, TransactionOptions::new()).await
    }

    /// Begins a transaction as [`begin`](Pool::begin) does, with an
    /// isolation level, read-only or deferrable (see
    /// [`TransactionOptions`]); its `BEGIN` names them, so the transaction
    /// has them from its first statement.
    ///
    /// ```no_run
    /// use pgpipe::{Executor, IsolationLevel, TransactionOptions};
    ///
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// let options = TransactionOptions::new().isolation_level(IsolationLevel::Serializable);
    /// let tx = pool.begin_options(options).await?;
    /// tx.execute("UPDATE accounts SET balance = balance - 5 WHERE id = $1", &[&1i64])
    ///     .await?;
    /// tx.commit().await?; // a serialization failure is ErrorKind::Db, SQLSTATE 40001
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`begin`](Pool::begin).
    pub async fn begin_options(
        &self,
        options: TransactionOptions,
    ) -> Result<OwnedTransaction, Error> {
        self.begin_as(self.hosts.settings.default_target, options)
            .await
    }

    /// [`begin_with`](Pool::begin_with) with `options`.
    async fn begin_as(
        &self,
        target: TargetSessionAttrs,
        options: TransactionOptions,
    ) -> Result<OwnedTransaction, Error> {
        let mut attempts = 0;
        loop {
            let conn = self.get_as(target, Holder::Begin).await?;
            match OwnedTransaction::begin(conn, options).await {
                Ok(tx) => return Ok(tx),
                Err(NotBegun::Failed(error)) if error.kind() != ErrorKind::ConnectionLost => {
                    return Err(error);
                }
                // That connection is closed: another one, as a checkout
                // whose reset failed would take.
                Err(NotBegun::ResetFailed(error) | NotBegun::Failed(error)) => {
                    attempts += 1;
                    if attempts >= BEGIN_ATTEMPTS {
                        return Err(error);
                    }
                }
            }
        }
    }
}
