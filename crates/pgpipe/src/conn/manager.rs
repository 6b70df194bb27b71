//! The deadpool manager: how connections are opened, checked and recycled.

use crate::protocol::coalesce::Grouping;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool::managed::{self, RecycleError, RecycleResult};

use super::describe::Descriptions;
use super::hooks::{self, Hooks};
use super::notifications::Notifications;
use super::state::{Behind, Traits};
use super::statement_cache::StatementCache;
use super::step_aside::StepAside;
use super::tls::Tls;
use super::{ConnState, PgConn, PoolWire, connect};
use crate::error::{Error, ErrorKind};
use crate::metrics::CloseReason;

/// Opens and recycles [`PgConn`]s for deadpool.
#[derive(Debug, Clone)]
pub(crate) struct Manager {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) statement_cache_capacity: usize,
    pub(crate) max_lifetime: Option<Duration>,
    pub(crate) wire: Arc<PoolWire>,
    pub(crate) tls: Tls,
    /// The application's hooks (`post_create`, `pre_recycle`,
    /// `post_recycle`).
    pub(crate) hooks: Hooks,
    /// SQL run on every new connection (and after every reset).
    pub(crate) after_connect: Option<Arc<str>>,
    /// What stands between its connections and the server.
    pub(crate) behind: Behind,
    /// With unnamed statements, where their parameter types are learned.
    pub(crate) descriptions: Option<Arc<Descriptions>>,
    /// A read lane: shared connections group the reads of one write under
    /// one Sync.
    pub(crate) read_groups: Grouping,
}

tokio::task_local! {
    /// Set around a checkout whose caller resets the last user's session
    /// itself, in the same write as its own first request
    /// ([`Pool::begin`](crate::Pool::begin)): recycling leaves the reset to
    /// it and marks the connection [`reset_owed`](PgConn::reset_owed).
    pub(crate) static CALLER_RESETS: ();
}

/// How long a checkout waits for a returned connection to finish what its
/// last user left behind before giving up on it.
pub(crate) const RECYCLE_PATIENCE: Duration = Duration::from_secs(1);

/// A lifetime shortened by up to a tenth, at random, so that connections
/// opened together do not all expire together.
fn jitter(lifetime: Duration) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    let random = RandomState::new().hash_one(Instant::now());
    let tenth = u64::try_from(lifetime.as_nanos()).unwrap_or(u64::MAX) / 10;
    lifetime.saturating_sub(Duration::from_nanos(random % tenth.max(1)))
}

impl Manager {
    /// Opens one connection: socket, TLS, start-up, the session checks and
    /// `after_connect`.
    pub(crate) async fn open(&self) -> Result<PgConn, Error> {
        let started = Instant::now();
        // No local for the traits: its drop flag would live in this future.
        let state = Arc::new(ConnState::new(
            self.wire.metrics.clone(),
            Traits::new(self.after_connect.clone(), self.behind, self.read_groups),
        ));
        let notifications = Arc::new(Notifications::default());
        let ((client, connection), peer) = connect::connect(
            &self.config,
            Arc::clone(&state),
            &self.wire,
            &self.tls,
            &notifications,
        )
        .await?;
        let (io_state, io_notifications) = (Arc::clone(&state), Arc::clone(&notifications));
        let io_wire = Arc::clone(&self.wire);
        let io = tokio::spawn(async move {
            // The error, if any, reaches every request in flight through its
            // response channel; here only the fact that the link is gone,
            // and whether the pool ended it (an end the pool chose is `Ok`,
            // or an abort that never gets here), matters.
            let ended = StepAside::new(connection, Arc::clone(&io_state)).await;
            if ended.is_err() {
                io_wire.lost();
            }
            io_state.load.mark_dead();
            io_state.wake();
            io_notifications.close();
        });
        state.life.set_io(io.abort_handle());
        self.wire.register(&state);
        let now = self.wire.ticks();
        state.counts.progressed(now);
        state.life.returned(now);
        connect::check_session_attrs(&self.config, &client).await?;
        if self.read_groups == Grouping::ReadOnlyHead {
            // The tap prepares the read groups' head before a connection's
            // first request: make that part of opening it (an empty query
            // carries it), not of the first query, so a connection is ready
            // in full before anyone uses it.
            client
                .batch_execute("")
                .await
                .map_err(|e| Error::connect(e).at("preparing the read groups' head"))?;
        }
        if let Some(sql) = &self.after_connect {
            client
                .batch_execute(sql)
                .await
                .map_err(|e| Error::connect(e).at("after_connect"))?;
        }
        hooks::run(&self.hooks.post_create, &client)
            .await
            .map_err(|e| Error::new(ErrorKind::Connect, format!("post_create refused: {e}")))?;
        if let Some(metrics) = &self.wire.metrics {
            metrics.created.inc();
            metrics
                .connection_open
                .observe(started.elapsed().as_secs_f64());
        }
        Ok(PgConn {
            client,
            state,
            cache: StatementCache::new(self.statement_cache_capacity),
            descriptions: self.descriptions.clone(),
            notifications,
            peer,
            created: Instant::now(),
            lifetime: self.max_lifetime.map(jitter),
            wire: Arc::clone(&self.wire),
            reset_owed: false,
        })
    }
}

impl managed::Manager for Manager {
    type Type = PgConn;
    type Error = Error;

    async fn create(&self) -> Result<PgConn, Error> {
        let opened = self.open().await;
        if let (Err(_), Some(metrics)) = (&opened, &self.wire.metrics) {
            metrics.connection_errors.inc();
        }
        opened
    }

    async fn recycle(&self, conn: &mut PgConn, _: &managed::Metrics) -> RecycleResult<Error> {
        if conn.is_dead() {
            return Err(RecycleError::message("connection is closed"));
        }
        if conn.state.life.close_reason().is_some() {
            return Err(RecycleError::message("connection marked to close"));
        }
        if conn.is_expired() {
            conn.closing(CloseReason::MaxLifetime);
            return Err(RecycleError::message("connection reached max_lifetime"));
        }
        if let Err(e) = hooks::run(&self.hooks.pre_recycle, &conn.client).await {
            conn.closing(CloseReason::Broken);
            return Err(RecycleError::message(format!("pre_recycle refused: {e}")));
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
        if conn.state.session.tx_status() != b'I' || conn.state.counts.depth() > 0 {
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
        // Its last user had it to themselves (or it was quarantined, or it
        // served the shared path): no state of theirs reaches the next user.
        // Behind a transaction pooler there is no session of its own to
        // reset: the next statement may run on any server.
        let needs_reset = conn.state.session.needs_reset() && self.behind == Behind::Nothing;
        // A post_recycle hook sees the session reset: the reset is not left
        // to ride with a `BEGIN` then.
        conn.reset_owed = needs_reset
            && self.hooks.post_recycle.is_none()
            && CALLER_RESETS.try_with(|()| ()).is_ok();
        if needs_reset && !conn.reset_owed {
            let reset = conn.reset_session();
            match tokio::time::timeout(RECYCLE_PATIENCE, reset).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    conn.closing(CloseReason::ResetFailed);
                    return Err(RecycleError::Backend(e));
                }
                Err(_) => {
                    conn.closing(CloseReason::ResetFailed);
                    return Err(RecycleError::message("the session reset did not finish"));
                }
            }
        }
        if let Err(e) = hooks::run(&self.hooks.post_recycle, &conn.client).await {
            conn.closing(CloseReason::Broken);
            return Err(RecycleError::message(format!("post_recycle refused: {e}")));
        }
        Ok(())
    }
}
