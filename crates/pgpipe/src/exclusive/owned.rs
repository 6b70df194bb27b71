//! [`OwnedTransaction`]: a transaction that owns its connection, from
//! [`Pool::begin`](crate::Pool::begin).
//!
//! It costs the round trips of the transaction and no more. The pool resets
//! a connection's session between users; with [`Pool::get`](crate::Pool::get)
//! that reset is a round trip of its own before the caller gets the
//! connection, because the raw client it hands out could send anything
//! before the reset's answer is in. Here the caller gets nothing until the
//! transaction has begun, so the reset rides along:
//!
//! - **Begin:** the reset owed to the last user's session is written before
//!   the `BEGIN`, in one write ([`join_in_order`]), and `begin()` returns once
//!   both answers are in. A reset that failed closes the connection (its
//!   `BEGIN` did nothing) and the checkout is tried again.
//! - **End:** this user's own reset is written behind the `COMMIT` or
//!   `ROLLBACK`, so it runs after everything this user sent; `commit` and
//!   `rollback` consume the transaction, so nothing can follow. The
//!   connection counts as clean only when that reset succeeded; otherwise
//!   the next checkout resets it as usual.
//!
//! Behind a transaction pooler there is no session to reset (the pool
//! never resets there): `begin()` sends `BEGIN`, `commit()` just `COMMIT`.
//!
//! A transaction dropped unfinished rolls back, as in tokio-postgres.

use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Waker};

use tokio_postgres::{Client, Statement};

use super::Connection;
use super::options::TransactionOptions;
use crate::conn::manager::RECYCLE_PATIENCE;
use crate::conn::run;
use crate::error::{Error, ErrorKind};
use crate::metrics::CloseReason;
use crate::ordered::join_in_order;

/// A transaction that owns its connection, from [`Pool::begin`](crate::Pool::begin).
///
/// Its queries run through [`Executor`](crate::Executor) with the
/// connection's statement cache. Dropped without [`commit`](OwnedTransaction::commit)
/// or [`rollback`](OwnedTransaction::rollback), it rolls back and its
/// connection goes back to the pool.
///
/// ```no_run
/// use pgpipe::Executor;
///
/// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
/// let tx = pool.begin().await?;
/// tx.execute("UPDATE accounts SET balance = balance - 5 WHERE id = $1", &[&1i64])
///     .await?;
/// tx.execute("UPDATE accounts SET balance = balance + 5 WHERE id = $1", &[&2i64])
///     .await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
pub struct OwnedTransaction {
    conn: Connection,
    /// `COMMIT` or `ROLLBACK` has been sent: nothing to roll back on drop.
    ended: bool,
}

/// Why [`OwnedTransaction::begin`] did not begin.
pub(crate) enum NotBegun {
    /// The last user's session could not be reset: the connection was
    /// closed; take another.
    ResetFailed(Error),
    /// `BEGIN` failed.
    Failed(Error),
}

impl OwnedTransaction {
    /// Begins a transaction on `conn`, resetting the last user's session in
    /// the same write if that is still owed.
    pub(crate) async fn begin(
        mut conn: Connection,
        options: TransactionOptions,
    ) -> Result<OwnedTransaction, NotBegun> {
        let begin = options.begin_sql();
        let owed = conn.take_reset_owed();
        let pg = conn.pg_conn();
        // Nothing of the caller's has been sent: whatever fails here may be
        // tried again on another connection.
        let failed = |e| Error::from_query(e, pg.client.is_closed()).unsent();
        let begun = if owed {
            let both = in_order(pg.reset_session(), async {
                pg.client.batch_execute(&begin).await.map_err(failed)
            });
            // As patient as a checkout's own reset (`recycle`).
            match tokio::time::timeout(RECYCLE_PATIENCE, both).await {
                Ok([Ok(()), begun]) => {
                    // The reset marked the session clean; from here it is
                    // this user's, and is reset again after them.
                    pg.state.session.mark_needs_reset();
                    begun
                }
                failed_reset => {
                    let error = match failed_reset {
                        Ok([Err(error), _]) => error.echo(
                            error.kind(),
                            "the session reset before BEGIN failed (the connection was closed)",
                        ),
                        _ => Error::new(
                            ErrorKind::ConnectionLost,
                            "the session reset before BEGIN did not finish (the connection was \
                             closed)",
                        ),
                    };
                    // Its `BEGIN` may have run on a session that still holds
                    // the last user's state: nobody may have it.
                    pg.state.kill(CloseReason::ResetFailed);
                    return Err(NotBegun::ResetFailed(error.unsent()));
                }
            }
        } else {
            pg.client.batch_execute(&begin).await.map_err(failed)
        };
        begun.map_err(NotBegun::Failed)?;
        Ok(OwnedTransaction { conn, ended: false })
    }

    /// Commits the transaction; its connection goes back to the pool.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Db`](crate::ErrorKind::Db) when the server refuses the
    /// commit (a serialization failure, a deferred constraint): nothing was
    /// committed. [`ErrorKind::ConnectionLost`](crate::ErrorKind::ConnectionLost)
    /// when the connection broke: whether it committed is unknown.
    ///
    /// A transaction that an earlier statement's error aborted cannot
    /// commit: the server would answer `COMMIT` with a rollback and no
    /// error. Then this rolls back and says so, with
    /// [`ErrorKind::Db`](crate::ErrorKind::Db).
    pub async fn commit(mut self) -> Result<(), Error> {
        if self.conn.pg_conn().state.transaction_failed().await {
            // Nothing was committed whatever becomes of the ROLLBACK: the
            // server would roll back a lost connection's transaction too.
            let _ = self.end("ROLLBACK").await;
            return Err(Error::aborted_commit());
        }
        self.end("COMMIT").await
    }

    /// Rolls the transaction back; its connection goes back to the pool.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::ConnectionLost`](crate::ErrorKind::ConnectionLost) when
    /// the connection broke (the server rolls back by itself then).
    pub async fn rollback(mut self) -> Result<(), Error> {
        self.end("ROLLBACK").await
    }

    /// Sends `end` and, behind it, this user's session reset.
    async fn end(&mut self, end: &str) -> Result<(), Error> {
        self.ended = true;
        let pg = self.conn.pg_conn();
        let failed = |e| Error::from_query(e, pg.client.is_closed());
        if pg.state.traits.behind_transaction_pooler() {
            // No session of its own to reset: after the transaction, the
            // next statement may run on any server (and some poolers take
            // one request at a time).
            return pg.client.batch_execute(end).await.map_err(failed);
        }
        let [ended, reset] = in_order(
            async { pg.client.batch_execute(end).await.map_err(failed) },
            pg.reset_session_after_end(),
        )
        .await;
        ended?;
        // A reset that failed leaves the connection marked for one: the
        // next checkout tries again, and closes it if that fails too.
        drop(reset);
        Ok(())
    }

    /// Prepares `sql` through the connection's statement cache, as
    /// [`Connection::prepare_cached`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Db`](crate::ErrorKind::Db) when the server rejects the
    /// SQL (which also aborts the transaction).
    pub async fn prepare_cached(&self, sql: &str) -> Result<Statement, Error> {
        run::named_statement(self.conn.transaction_target(), sql).await
    }

    /// The tokio-postgres client, inside this transaction: for its own
    /// methods (a prepared `Statement`, `query_raw`). Leave the transaction
    /// to [`commit`](OwnedTransaction::commit) and
    /// [`rollback`](OwnedTransaction::rollback), and finish whatever you
    /// start on it before them (`COPY` belongs on [`Pool::get`](crate::Pool::get)).
    pub fn client(&self) -> &Client {
        self.conn.client()
    }
}

/// Runs two requests in one write, `first` written first; see
/// [`join_in_order`].
async fn in_order<'a>(
    first: impl Future<Output = Result<(), Error>> + Send + 'a,
    second: impl Future<Output = Result<(), Error>> + Send + 'a,
) -> [Result<(), Error>; 2] {
    type Request<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>>;
    let requests: Vec<Request<'a>> = vec![Box::pin(first), Box::pin(second)];
    let answers: Result<[_; 2], _> = join_in_order(requests).await.try_into();
    answers.unwrap_or_else(|_| unreachable!("join_in_order answers every future"))
}

impl super::OnConnection for OwnedTransaction {
    fn place(&self) -> (crate::conn::run::Target<'_>, crate::conn::run::RunSettings) {
        (self.conn.transaction_target(), self.conn.run_settings())
    }
}

impl Drop for OwnedTransaction {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // As tokio-postgres' own transaction does: the `ROLLBACK` goes out
        // now, on the request's first poll, and releases the locks at once;
        // nobody waits for its answer (the next checkout sees it).
        let rollback = pin!(self.conn.pg_conn().client.batch_execute("ROLLBACK"));
        let _ = rollback.poll(&mut Context::from_waker(Waker::noop()));
    }
}

impl fmt::Debug for OwnedTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedTransaction")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}
