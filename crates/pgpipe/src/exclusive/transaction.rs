//! [`Transaction`]: a transaction on an exclusive connection, with the
//! connection's statement cache.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use tokio_postgres::Statement;

use crate::conn::connect::Peer;
use crate::conn::describe::Descriptions;
use crate::conn::run::{self, RunSettings, Target};
use crate::conn::statement_cache::StatementCache;
use crate::conn::{ConnState, PoolWire};
use crate::error::Error;

/// A transaction, from [`Connection::transaction`](crate::Connection::transaction).
///
/// It dereferences to a [`tokio_postgres::Transaction`], so everything
/// tokio-postgres offers works inside it. Through [`Executor`](crate::Executor)
/// its queries use the connection's statement cache (one round trip per
/// query instead of two) and return pgpipe's [`Error`].
///
/// Dropped without [`commit`](Transaction::commit), it rolls back, as in
/// tokio-postgres.
///
/// ```no_run
/// use pgpipe::Executor;
///
/// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
/// let mut conn = pool.get().await?;
/// let tx = conn.transaction().await?;
/// tx.execute("UPDATE accounts SET balance = balance - 5 WHERE id = $1", &[&1i64])
///     .await?;
/// tx.execute("UPDATE accounts SET balance = balance + 5 WHERE id = $1", &[&2i64])
///     .await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
pub struct Transaction<'a> {
    inner: tokio_postgres::Transaction<'a>,
    parts: Parts<'a>,
}

/// What a transaction runs its queries with, besides tokio-postgres' own
/// transaction: its connection's statement cache and state, and the pool's
/// settings.
#[derive(Clone, Copy)]
pub(crate) struct Parts<'a> {
    pub(crate) cache: &'a Arc<StatementCache>,
    pub(crate) descriptions: Option<&'a Arc<Descriptions>>,
    pub(crate) state: &'a ConnState,
    pub(crate) peer: &'a Peer,
    pub(crate) wire: &'a PoolWire,
    pub(crate) run: RunSettings,
}

impl<'a> Transaction<'a> {
    pub(crate) fn new(inner: tokio_postgres::Transaction<'a>, parts: Parts<'a>) -> Transaction<'a> {
        Transaction { inner, parts }
    }

    /// Commits the transaction.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Db`](crate::ErrorKind::Db) when the server refuses the
    /// commit (a serialization failure, a deferred constraint): nothing was
    /// committed. [`ErrorKind::ConnectionLost`](crate::ErrorKind::ConnectionLost)
    /// when the connection broke: whether it committed is unknown.
    ///
    /// A transaction (or savepoint) that an earlier statement's error
    /// aborted cannot commit: the server would answer `COMMIT` with a
    /// rollback and no error. Then this rolls it back and says so, with
    /// [`ErrorKind::Db`](crate::ErrorKind::Db).
    pub async fn commit(self) -> Result<(), Error> {
        if self.parts.state.transaction_failed().await {
            self.inner.rollback().await?;
            return Err(Error::aborted_commit());
        }
        self.inner.commit().await.map_err(Error::from)
    }

    /// Rolls the transaction back.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::ConnectionLost`](crate::ErrorKind::ConnectionLost) when
    /// the connection broke (the server rolls back by itself then).
    pub async fn rollback(self) -> Result<(), Error> {
        self.inner.rollback().await.map_err(Error::from)
    }

    /// Starts a nested transaction (a savepoint).
    ///
    /// # Errors
    ///
    /// As [`Connection::transaction`](crate::Connection::transaction).
    pub async fn transaction(&mut self) -> Result<Transaction<'_>, Error> {
        let parts = self.parts;
        Ok(Transaction::new(self.inner.transaction().await?, parts))
    }

    /// Starts a nested transaction with a savepoint of the given name.
    ///
    /// # Errors
    ///
    /// As [`Connection::transaction`](crate::Connection::transaction).
    pub async fn savepoint(&mut self, name: impl Into<String>) -> Result<Transaction<'_>, Error> {
        let parts = self.parts;
        Ok(Transaction::new(self.inner.savepoint(name).await?, parts))
    }

    /// Prepares `sql` through the connection's statement cache, as
    /// [`Connection::prepare_cached`](crate::Connection::prepare_cached).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Db`](crate::ErrorKind::Db) when the server rejects the
    /// SQL (which also aborts the transaction).
    pub async fn prepare_cached(&self, sql: &str) -> Result<Statement, Error> {
        run::named_statement(self.target(), sql).await
    }

    fn target(&self) -> Target<'_> {
        Target {
            client: self.inner.client(),
            cache: self.parts.cache,
            descriptions: self.parts.descriptions,
            state: self.parts.state,
            peer: self.parts.peer,
            wire: self.parts.wire,
            // A refused plan aborted the transaction: a retry would only
            // fail again, with a less useful error.
            heal: false,
        }
    }
}

impl super::OnConnection for Transaction<'_> {
    fn place(&self) -> (Target<'_>, RunSettings) {
        (self.target(), self.parts.run)
    }
}

impl<'a> Deref for Transaction<'a> {
    type Target = tokio_postgres::Transaction<'a>;

    fn deref(&self) -> &tokio_postgres::Transaction<'a> {
        &self.inner
    }
}

impl<'a> DerefMut for Transaction<'a> {
    fn deref_mut(&mut self) -> &mut tokio_postgres::Transaction<'a> {
        &mut self.inner
    }
}

impl fmt::Debug for Transaction<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transaction").finish_non_exhaustive()
    }
}
