//! The deadpool manager: how connections are opened, checked and recycled.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use deadpool::managed::{self, RecycleError, RecycleResult};
use tokio_postgres::Client;

use crate::connect::{self, Peer};
use crate::error::Error;
use crate::metrics::CloseReason;
use crate::statement_cache::StatementCache;
use crate::tls::Tls;
use crate::wire::{CLOSED, ConnState, DEAD, LOAD_MASK, PoolWire};

/// A pooled connection: the client, what the tap sees of its wire, and its
/// statement cache. Shared and exclusive use both borrow it from deadpool.
#[derive(Debug)]
pub(crate) struct PgConn {
    pub(crate) client: Client,
    pub(crate) state: Arc<ConnState>,
    pub(crate) cache: Arc<StatementCache>,
    /// Where the socket went, for cancel requests.
    pub(crate) peer: Peer,
    /// When it was opened, and how long it may live (jittered).
    created: Instant,
    lifetime: Option<Duration>,
    wire: Arc<PoolWire>,
}

impl PgConn {
    /// True once the connection's I/O task has ended.
    pub(crate) fn is_dead(&self) -> bool {
        self.client.is_closed() || self.state.load.load(Ordering::Acquire) & DEAD != 0
    }

    /// Whether it has outlived `max_lifetime`.
    pub(crate) fn is_expired(&self) -> bool {
        self.lifetime
            .is_some_and(|max| self.created.elapsed() >= max)
    }

    /// Clears the session an exclusive user may have left behind, so the
    /// connection can be shared. Prepared statements survive (no
    /// `DEALLOCATE`), so the statement cache stays valid.
    pub(crate) async fn reset_session(&self) -> Result<(), Error> {
        let mut sql = String::new();
        if self.state.tx_status.load(Ordering::Acquire) != b'I' {
            sql.push_str("ROLLBACK; ");
        }
        sql.push_str(
            "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; \
             SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES;",
        );
        self.client
            .batch_execute(&sql)
            .await
            .map_err(|e| Error::from_query(e, self.client.is_closed()))?;
        self.state.needs_reset.store(false, Ordering::Release);
        self.state.quarantined.store(0, Ordering::Release);
        Ok(())
    }

    /// Notes why the pool is about to drop this connection.
    pub(crate) fn closing(&self, reason: CloseReason) {
        self.state.closing(reason);
    }

    /// Notes that it went back to the idle set now (for `idle_timeout`).
    pub(crate) fn returned(&self) {
        let now = self.wire.clock.load(Ordering::Relaxed);
        self.state.idle_since.store(now, Ordering::Relaxed);
    }

    /// Asks the server to cancel what this connection's backend runs now.
    pub(crate) fn cancel(&self) {
        cancel(&self.peer, &self.client);
    }
}

/// Asks the server behind `peer` to cancel what `client`'s backend runs now,
/// without waiting for the answer.
pub(crate) fn cancel(peer: &Peer, client: &Client) {
    let (peer, token) = (peer.clone(), client.cancel_token());
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move { connect::cancel(&peer, &token).await });
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        let reason = match self.state.close_reason() {
            Some(reason) => reason,
            None if self.is_dead() => CloseReason::Broken,
            None => CloseReason::Shutdown,
        };
        self.state.count_close(self.wire.metrics.as_deref(), reason);
    }
}

/// Drives a connection's I/O, stepping aside once each time it is woken.
///
/// A query wakes its connection's task as it enqueues its request, and tokio
/// runs a task woken that way next. The connection would then write that one
/// request alone, while the tasks woken by the same burst of answers are
/// still queued behind it, about to send theirs. Going to the back of the
/// run queue once lets them enqueue first, so one write carries them all.
/// This is the zero-length batch window: no timer, and on an idle runtime
/// the task runs again at once. It only steps aside while the connection is
/// shared by more than one query in flight; alone (or exclusive) there is
/// nobody to wait for.
struct StepAside<F> {
    inner: Pin<Box<F>>,
    state: Arc<ConnState>,
    stepped: bool,
}

impl<F: Future> StepAside<F> {
    fn new(inner: F, state: Arc<ConnState>) -> StepAside<F> {
        StepAside {
            inner: Box::pin(inner),
            state,
            stepped: true,
        }
    }
}

impl<F: Future> Future for StepAside<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if !self.stepped && self.state.load.load(Ordering::Relaxed) & LOAD_MASK > 1 {
            self.stepped = true;
            // Waking itself while running sends the task to the back of the
            // run queue (tokio treats it as a yield).
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let poll = self.inner.as_mut().poll(cx);
        self.stepped = false;
        poll
    }
}

/// Opens and recycles [`PgConn`]s for deadpool.
#[derive(Debug)]
pub(crate) struct Manager {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) statement_cache_capacity: usize,
    pub(crate) max_lifetime: Option<Duration>,
    pub(crate) wire: Arc<PoolWire>,
    pub(crate) tls: Tls,
}

/// How long a checkout waits for a returned connection to finish what its
/// last user left behind before giving up on it.
const RECYCLE_PATIENCE: Duration = Duration::from_secs(1);

/// A lifetime shortened by up to a tenth, at random, so that connections
/// opened together do not all expire together.
fn jitter(lifetime: Duration) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    let random = RandomState::new().hash_one(Instant::now());
    let tenth = lifetime.as_nanos() as u64 / 10;
    lifetime.saturating_sub(Duration::from_nanos(random % tenth.max(1)))
}

impl managed::Manager for Manager {
    type Type = PgConn;
    type Error = Error;

    async fn create(&self) -> Result<PgConn, Error> {
        let state = Arc::new(ConnState::default());
        let ((client, connection), peer) =
            connect::connect(&self.config, Arc::clone(&state), &self.wire, &self.tls).await?;
        let io_state = Arc::clone(&state);
        let io = tokio::spawn(async move {
            // The error, if any, reaches every request in flight through its
            // response channel; here only the fact that the link is gone
            // matters.
            let _ = StepAside::new(connection, Arc::clone(&io_state)).await;
            io_state.load.fetch_or(DEAD | CLOSED, Ordering::AcqRel);
        });
        state.set_io(io.abort_handle());
        self.wire.register(&state);
        let now = self.wire.clock.load(Ordering::Relaxed);
        state.last_read.store(now, Ordering::Relaxed);
        state.idle_since.store(now, Ordering::Relaxed);
        connect::check_session_attrs(&self.config, &client).await?;
        if let Some(metrics) = &self.wire.metrics {
            metrics.created.inc();
        }
        Ok(PgConn {
            client,
            state,
            cache: StatementCache::new(self.statement_cache_capacity),
            peer,
            created: Instant::now(),
            lifetime: self.max_lifetime.map(jitter),
            wire: Arc::clone(&self.wire),
        })
    }

    async fn recycle(&self, conn: &mut PgConn, _: &managed::Metrics) -> RecycleResult<Error> {
        if conn.is_dead() {
            return Err(RecycleError::message("connection is closed"));
        }
        if conn.is_expired() {
            conn.closing(CloseReason::MaxLifetime);
            return Err(RecycleError::message("connection reached max_lifetime"));
        }
        // An exclusive user may have left a transaction open (a `BEGIN`
        // through the raw client, a dropped `Transaction` whose rollback is
        // still on its way). The next user must never inherit it. With
        // answers still outstanding the last status is stale, so roll back
        // then too: requests run in order, so after this one the session is
        // idle whatever came before.
        //
        // Answers still owed may also belong to a query abandoned at its
        // deadline: give them a moment, and rather than keep the next user
        // waiting on them, close the connection.
        if conn.state.tx_status.load(Ordering::Acquire) != b'I' || conn.state.wire_depth() > 0 {
            let rollback = conn.client.batch_execute("ROLLBACK");
            match tokio::time::timeout(RECYCLE_PATIENCE, rollback).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(RecycleError::Backend(Error::from_query(e, true))),
                Err(_) => {
                    conn.closing(CloseReason::Broken);
                    return Err(RecycleError::message(
                        "connection still busy after its user left",
                    ));
                }
            }
        }
        Ok(())
    }
}
