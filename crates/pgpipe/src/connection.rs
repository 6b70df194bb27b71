//! [`Connection`]: an exclusive checkout, for transactions and session state.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use deadpool::managed::{Object, Timeouts};
use tokio::sync::{OwnedSemaphorePermit, TryAcquireError};
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use crate::error::{Error, ErrorKind};
use crate::exec::{self, Answer, Op, Prepare};
use crate::manager::{Manager, PgConn};
use crate::pool::PoolInner;
use crate::transaction::Transaction;

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
    claim: Claim,
}

impl Connection {
    /// Starts a transaction. Its queries use this connection's statement
    /// cache; dropped without a commit, it rolls back.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::ConnectionLost`] when the connection broke.
    pub async fn transaction(&mut self) -> Result<Transaction<'_>, Error> {
        let pool = &self.claim.pool;
        let PgConn {
            client,
            cache,
            state,
            peer,
            ..
        } = &mut *self.object;
        let inner = client.transaction().await?;
        Ok(Transaction::new(inner, cache, state, peer, pool))
    }

    /// The tokio-postgres client, for its own methods where a pgpipe trait
    /// in scope has one of the same name.
    pub fn client(&self) -> &Client {
        &self.object.client
    }

    pub(crate) async fn run(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        op: Op,
    ) -> Result<Answer, Error> {
        let conn = self.pg_conn();
        let cancel = || conn.cancel();
        let pool = &self.claim.pool;
        pool.run_alone(conn.target(), cancel, sql, params, op).await
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
        exec::statement(self.object.target(), &Prepare::Inline, sql)
            .await
            .map(|(statement, _)| statement)
    }

    pub(crate) fn pg_conn(&self) -> &PgConn {
        &self.object
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.object.state.exclusive.store(false, Ordering::Release);
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

/// One of the `max_exclusive` places for exclusive checkouts, and the task
/// that took it (to recognise a task that would wait for itself).
struct Claim {
    pool: Arc<PoolInner>,
    owner: Owner,
    _permit: OwnedSemaphorePermit,
}

/// Who took a claim: the task, or, for code outside any task (a
/// `block_on`, `#[tokio::test]`'s body), the thread that runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Owner {
    fn current() -> Owner {
        match tokio::task::try_id() {
            Some(id) => Owner::Task(id),
            None => Owner::Thread(std::thread::current().id()),
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        {
            let mut claims = self.pool.claims.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = claims.iter().position(|o| *o == self.owner) {
                claims.swap_remove(i);
            }
        }
        self.pool.exclusive_claims.fetch_sub(1, Ordering::AcqRel);
        // The shared path may use one more connection now.
        self.pool.dispatch();
    }
}

impl PoolInner {
    /// Checks out an exclusive connection; see [`Pool::get`](crate::Pool::get).
    pub(crate) async fn checkout(self: &Arc<Self>) -> Result<Connection, Error> {
        if self.is_closed() {
            return Err(Error::closed());
        }
        let deadline = Instant::now() + self.config.wait_timeout;
        let permit = match Arc::clone(&self.exclusive).try_acquire_owned() {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => return Err(Error::closed()),
            Err(TryAcquireError::NoPermits) => {
                if self.claims_all_mine() {
                    return Err(Error::new(
                        ErrorKind::Deadlock,
                        "this task already holds every exclusive connection it may \
                         (max_exclusive); waiting for another would wait for itself",
                    ));
                }
                self.exclusive_waiting.fetch_add(1, Ordering::AcqRel);
                let acquired =
                    tokio::time::timeout_at(deadline, Arc::clone(&self.exclusive).acquire_owned())
                        .await;
                self.exclusive_waiting.fetch_sub(1, Ordering::AcqRel);
                match acquired {
                    Ok(Ok(permit)) => permit,
                    Ok(Err(_)) => return Err(Error::closed()),
                    Err(_) => return Err(Error::timeout("an exclusive connection")),
                }
            }
        };
        let claim = self.claim(permit);
        if self.config.pipelining {
            // Make room: shared connections beyond the new limit drain and
            // come back to deadpool, where this checkout picks one up.
            self.rebalance();
        }
        let timeouts = Timeouts {
            wait: Some(deadline.saturating_duration_since(Instant::now())),
            create: None,
            recycle: Some(self.config.wait_timeout),
        };
        self.exclusive_waiting.fetch_add(1, Ordering::AcqRel);
        let object = self.pg.timeout_get(&timeouts).await;
        self.exclusive_waiting.fetch_sub(1, Ordering::AcqRel);
        let object = object.map_err(|e| Error::from_pool(e, "an exclusive connection"))?;
        object.state.needs_reset.store(true, Ordering::Release);
        object.state.exclusive.store(true, Ordering::Release);
        Ok(Connection { object, claim })
    }

    fn claim(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Claim {
        let owner = Owner::current();
        self.claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(owner);
        self.exclusive_claims.fetch_add(1, Ordering::AcqRel);
        Claim {
            pool: Arc::clone(self),
            owner,
            _permit: permit,
        }
    }

    /// True when the current task holds every exclusive claim there is.
    pub(crate) fn claims_all_mine(&self) -> bool {
        let me = Owner::current();
        let claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        !claims.is_empty() && claims.iter().all(|o| *o == me)
    }
}
