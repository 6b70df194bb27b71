//! The exclusive side: checking out a whole connection with
//! [`Pool::get`](crate::Pool::get), for transactions and session state, or
//! with [`Pool::begin`](crate::Pool::begin) for one transaction
//! ([`OwnedTransaction`], whose session resets ride along with its `BEGIN`
//! and `COMMIT`).
//!
//! [`Exclusive`] owns the `max_exclusive` permits, the
//! [`Claims`](crate::budget::Claims) (how many connections exclusive users
//! hold, and which tasks; in [`budget`](crate::budget), which the router
//! reads too), and the deadlock check. Exclusive checkouts and shared connections draw from one
//! `max_size`: the router reads the claims to know how many connections it
//! may keep, and a checkout that finds every connection shared asks the
//! router to make one drain ([`Router::rebalance`]); giving a claim back
//! lets the router use the connection again ([`Router::dispatch`]).

mod connection;
mod options;
mod owned;
mod transaction;

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use deadpool::managed::Timeouts;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::Instant;

pub use connection::Connection;
pub use options::{TransactionBuilder, TransactionOptions};
pub(crate) use owned::NotBegun;
pub use owned::OwnedTransaction;
pub use transaction::Transaction;

use crate::budget::{Claims, Owner};
use crate::config::deadline_after;
use crate::conn::Manager;
use crate::conn::manager::CALLER_RESETS;
use crate::conn::run::RunSettings;
use crate::error::{Error, ErrorKind};
use crate::metrics::Metrics;
use crate::shared::Router;
use crate::sync::Waiting;

/// One of the `max_exclusive` places for exclusive checkouts, and the task
/// that took it (to recognise a task that would wait for itself).
struct Claim {
    router: Arc<Router>,
    claims: Arc<Claims>,
    owner: Owner,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.claims.remove(self.owner);
        // The shared path may use one more connection now.
        self.router.dispatch();
    }
}

/// Where a checkout's queries run: its connection (inside a transaction or
/// not), and how (caps, `query_timeout`). For the checkout's
/// [`Executor`](crate::Executor).
pub(crate) trait OnConnection {
    fn place(&self) -> (crate::conn::run::Target<'_>, RunSettings);
}

/// Who will use a checked-out connection, and so whether its session must
/// be reset before anyone else uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// The caller, with the raw client ([`Pool::get`](crate::Pool::get), an
    /// atomic batch): it may leave any session state; reset it after.
    Caller,
    /// The caller, through [`Pool::begin`](crate::Pool::begin): as
    /// `Caller`, but the last user's session is reset in the same write as
    /// the `BEGIN`, not a round trip before it.
    Begin,
    /// A [`Listener`](crate::Listener): its `LISTEN`s are reset after, as
    /// `Caller`'s session, but its hold (as long as the listener lives) is
    /// not timed in `exclusive_hold_seconds`, where it would drown the
    /// checkouts that histogram is for.
    Listener,
    /// The pool, for queries the guard has checked (with pipelining off):
    /// whatever their code may leave is cleaned behind them.
    Pool,
}

/// The exclusive side; see the module docs.
#[derive(Debug)]
pub(crate) struct Exclusive {
    pg: deadpool::managed::Pool<Manager>,
    permits: Arc<Semaphore>,
    claims: Arc<Claims>,
    /// Tasks waiting in `get()` for a permit (not yet claimed).
    waiting_permit: AtomicUsize,
    /// Tasks that hold a claim and wait for the connection itself.
    waiting_connection: AtomicUsize,
    wait_timeout: Duration,
    /// Whether the pool also has a shared path to make room on.
    pipelining: bool,
    /// How queries on a checked-out connection run.
    run: RunSettings,
    metrics: Option<Arc<Metrics>>,
    /// Notified when the lane's host stops being the primary: a checkout
    /// still waiting then goes to the new one (issue #47).
    moved: Notify,
}

impl Exclusive {
    pub(crate) fn new(
        pg: deadpool::managed::Pool<Manager>,
        max_exclusive: usize,
        wait_timeout: Duration,
        pipelining: bool,
        run: RunSettings,
        metrics: Option<Arc<Metrics>>,
    ) -> Exclusive {
        Exclusive {
            pg,
            permits: Arc::new(Semaphore::new(max_exclusive)),
            claims: Arc::new(Claims::new(max_exclusive)),
            moved: Notify::new(),
            waiting_permit: AtomicUsize::new(0),
            waiting_connection: AtomicUsize::new(0),
            wait_timeout,
            pipelining,
            run,
            metrics,
        }
    }

    /// The claims, for the router.
    pub(crate) fn claims(&self) -> &Arc<Claims> {
        &self.claims
    }

    /// Tasks waiting in `get()`.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting_permit.load(Ordering::Acquire)
            + self.waiting_connection.load(Ordering::Acquire)
    }

    /// Connections held by exclusive users: claims whose connection came.
    pub(crate) fn held(&self) -> usize {
        let waiting = self.waiting_connection.load(Ordering::Acquire);
        self.claims.claimed().saturating_sub(waiting)
    }

    /// Fails every checkout from now on, and every one waiting.
    pub(crate) fn close(&self) {
        self.permits.close();
    }

    /// Checks out an exclusive connection; see [`Pool::get`](crate::Pool::get).
    pub(crate) async fn checkout(
        &self,
        router: &Arc<Router>,
        holder: Holder,
    ) -> Result<Connection, Error> {
        self.checkout_until(router, holder, deadline_after(self.wait_timeout))
            .await
    }

    /// `Deadlock` if this task already holds every exclusive place there is
    /// and none is free: waiting for another would wait for itself.
    pub(crate) fn would_wait_for_itself(&self) -> Result<(), Error> {
        if self.permits.available_permits() == 0 && self.claims.all_mine() {
            return Err(Error::new(
                ErrorKind::Deadlock,
                "this task already holds every exclusive connection it may \
                 (max_exclusive); waiting for another would wait for itself",
            ));
        }
        Ok(())
    }

    /// Counts a task waiting for an exclusive place of another kind (an
    /// atomic batch's), in [`waiting`](Exclusive::waiting).
    pub(crate) fn waiting_for_place(&self) -> Waiting<'_> {
        Waiting::new(&self.waiting_permit)
    }

    /// Fails every checkout still waiting (for a place or for its
    /// connection: a frozen host answers neither) with
    /// [`Error::primary_moved`]: another host was elected primary, and the
    /// dispatcher sends them there. Nothing was sent for them.
    pub(crate) fn fail_waiting(&self) {
        self.moved.notify_waiters();
    }

    /// As [`checkout`](Exclusive::checkout), waiting until `deadline`, or
    /// until [`fail_waiting`](Exclusive::fail_waiting).
    pub(crate) async fn checkout_until(
        &self,
        router: &Arc<Router>,
        holder: Holder,
        deadline: tokio::time::Instant,
    ) -> Result<Connection, Error> {
        let mut moved = pin!(self.moved.notified());
        moved.as_mut().enable();
        let mut checkout = pin!(self.wait_and_connect(router, holder, deadline));
        std::future::poll_fn(|cx| {
            if let Poll::Ready(conn) = checkout.as_mut().poll(cx) {
                return Poll::Ready(conn);
            }
            // Dropping the checkout gives back whatever it held: a place,
            // a connection being opened.
            moved
                .as_mut()
                .poll(cx)
                .map(|()| Err(Error::primary_moved()))
        })
        .await
    }

    async fn wait_and_connect(
        &self,
        router: &Arc<Router>,
        holder: Holder,
        deadline: tokio::time::Instant,
    ) -> Result<Connection, Error> {
        // A counted holder's step begins here, its wait included (the
        // clock is read only for those: the pool's own checkouts, one per
        // query with pipelining off, are counted where they start).
        let counted = self.metrics.is_some() && matches!(holder, Holder::Caller | Holder::Begin);
        let asked = counted.then(std::time::Instant::now);
        if self.permits.is_closed() {
            return Err(Error::closed());
        }
        let permit = match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => return Err(Error::closed()),
            Err(TryAcquireError::NoPermits) => {
                self.would_wait_for_itself()?;
                let waiting = Waiting::new(&self.waiting_permit);
                let queued = self.claims.waiting();
                let permits = Arc::clone(&self.permits);
                let acquired = tokio::time::timeout_at(deadline, permits.acquire_owned()).await;
                drop(waiting);
                match acquired {
                    Ok(Ok(permit)) => {
                        // Claimed before it stops counting as queued: the
                        // reservation never dips in between.
                        let claim = self.claim(router, permit);
                        drop(queued);
                        return self.connect(router, holder, deadline, claim, asked).await;
                    }
                    Ok(Err(_)) => return Err(Error::closed()),
                    Err(_) => return Err(Error::timeout("an exclusive connection")),
                }
            }
        };
        let claim = self.claim(router, permit);
        self.connect(router, holder, deadline, claim, asked).await
    }

    /// Takes one of the exclusive places.
    fn claim(&self, router: &Arc<Router>, permit: OwnedSemaphorePermit) -> Claim {
        let owner = Owner::current();
        self.claims.add(owner);
        Claim {
            router: Arc::clone(router),
            claims: Arc::clone(&self.claims),
            owner,
            _permit: permit,
        }
    }

    /// Finds the connection for a place taken, asked for at `asked` (for a
    /// holder whose hold is counted).
    async fn connect(
        &self,
        router: &Arc<Router>,
        holder: Holder,
        deadline: tokio::time::Instant,
        claim: Claim,
        asked: Option<std::time::Instant>,
    ) -> Result<Connection, Error> {
        if self.pipelining {
            // Make room: shared connections beyond the new limit drain and
            // come back to deadpool, where this checkout picks one up.
            router.rebalance();
        }
        let timeouts = Timeouts {
            wait: Some(deadline.saturating_duration_since(Instant::now())),
            create: None,
            recycle: Some(self.wait_timeout),
        };
        let waiting = Waiting::new(&self.waiting_connection);
        let object = match holder {
            Holder::Begin => {
                let get = self.pg.timeout_get(&timeouts);
                CALLER_RESETS.scope((), get).await
            }
            Holder::Caller | Holder::Listener | Holder::Pool => {
                self.pg.timeout_get(&timeouts).await
            }
        };
        drop(waiting);
        let object = object.map_err(|e| Error::from_pool(e, "an exclusive connection"))?;
        if holder != Holder::Pool {
            object.state.session.mark_needs_reset();
        }
        object.state.life.set_exclusive(true);
        let held = asked.and_then(|asked| Some((self.metrics.clone()?, asked)));
        Ok(Connection::new(object, claim, self.run, held))
    }
}
