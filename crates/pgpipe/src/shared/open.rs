//! Opening connections for the shared path, and taking them out of it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use deadpool::managed::{Object, Timeouts};
use tokio::time::Instant;

use super::{Router, SharedConn};
use crate::conn::Manager;
use crate::error::{Error, ErrorKind};
use crate::metrics::CloseReason;
use crate::sync::lock;

/// A failed open: no new open starts until `retry_at`; once opens failed
/// [`REFUSE_AFTER`] times in a row, queries that find no shared connection
/// fail at once with this error instead of waiting on a server that is
/// down.
#[derive(Debug)]
pub(super) struct OpenFailure {
    retry_at: Instant,
    backoff: Duration,
    /// Opens failed in a row.
    failures: u32,
    kind: ErrorKind,
    message: String,
}

/// Opens failed in a row before queries without a connection are refused.
/// One failure is not enough: a backend ended while it was being opened
/// (terminated with its neighbours, say) says nothing of the next one, and
/// the queries waiting for it would all fail for one unlucky open.
const REFUSE_AFTER: u32 = 2;

impl OpenFailure {
    /// The kind the queries refused for a failed open get: whatever ended
    /// the attempt (a server's FATAL refusal reads as a lost connection),
    /// they never reached a server.
    fn kind_of(error: &Error) -> ErrorKind {
        match error.kind() {
            ErrorKind::ConnectionLost => ErrorKind::Connect,
            kind => kind,
        }
    }

    /// The error a query gets while the back-off lasts.
    fn error(kind: ErrorKind, message: &str) -> Error {
        Error::new(
            kind,
            format!("no shared connection could be opened: {message}"),
        )
    }
}

/// Back-off after failed opens: doubling from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(25);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

impl Router {
    /// The error a query without a shared connection gets at once: the last
    /// failed open's, while its back-off lasts, once opens failed
    /// [`REFUSE_AFTER`] times in a row.
    pub(super) fn open_refusal(&self) -> Option<Error> {
        let failure = lock(&self.failure);
        let failure = failure.as_ref()?;
        (failure.failures >= REFUSE_AFTER && Instant::now() < failure.retry_at)
            .then(|| OpenFailure::error(failure.kind, &failure.message))
    }

    /// When the back-off after the last failed open ends, while it lasts:
    /// until then a query that finds no shared connection fails at once
    /// without trying, so one that waits to try again waits this long too.
    pub(crate) fn reopens_at(&self) -> Option<Instant> {
        let failure = lock(&self.failure);
        let retry_at = failure.as_ref()?.retry_at;
        (Instant::now() < retry_at).then_some(retry_at)
    }

    /// Whether a recent open failed and its back-off lasts; lock-free.
    pub(super) fn backing_off(&self) -> bool {
        let until = self.backoff_until.load(Ordering::Acquire);
        until != 0 && self.wire.now_nanos() < until
    }

    /// Records an open's outcome; how many opens failed in a row.
    fn record_open(&self, result: Result<(), &Error>) -> u32 {
        let mut failure = lock(&self.failure);
        *failure = match result {
            Ok(()) => {
                self.backoff_until.store(0, Ordering::Release);
                None
            }
            Err(error) => {
                crate::trace::pool_warn!(error = %error, "a connection could not be opened");
                let backoff = failure
                    .as_ref()
                    .map_or(BACKOFF_FIRST, |f| (f.backoff * 2).min(BACKOFF_MAX));
                let failures = failure.as_ref().map_or(1, |f| f.failures + 1);
                let until = self.wire.now_nanos() + backoff.as_nanos() as u64;
                self.backoff_until.store(until, Ordering::Release);
                Some(OpenFailure {
                    retry_at: Instant::now() + backoff,
                    backoff,
                    failures,
                    kind: OpenFailure::kind_of(error),
                    message: error.detail(),
                })
            }
        };
        failure.as_ref().map_or(0, |f| f.failures)
    }

    /// Starts opening one more shared connection, unless that would exceed
    /// the limit or a recent open failed.
    pub(super) fn spawn_open(self: &Arc<Self>) {
        if self.backing_off() {
            return;
        }
        let live = self.conns.load().len();
        let limit = self.shared_limit();
        // Connections already being opened will take `max_pipeline_depth`
        // queries each: open another only if the waiters need more.
        let wanted = self.queue.len() + 1;
        let depth = self.config.max_pipeline_depth;
        let claimed = self
            .opening
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |opening| {
                (live + opening < limit && opening * depth < wanted).then_some(opening + 1)
            });
        if claimed.is_err() {
            return;
        }
        // Dropping a checkout or a place may land here outside any runtime;
        // then the next query opens the connection instead.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let router = Arc::clone(self);
                runtime.spawn(async move { router.open_shared().await });
            }
            Err(_) => {
                self.opening.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    async fn open_shared(self: Arc<Self>) {
        let timeouts = Timeouts {
            wait: Some(self.config.wait_timeout),
            create: None, // the connect timeout lives in the connection config
            recycle: Some(self.config.wait_timeout),
        };
        let result = loop {
            let object = match self.pg.timeout_get(&timeouts).await {
                Ok(object) => object,
                Err(e) => break Err(Error::from_pool(e, "a connection for the shared path")),
            };
            let reused = Object::metrics(&object).recycled.is_some();
            match self.make_shared(object).await {
                // A connection given back earlier that the server ended
                // since (its backend terminated while it sat idle, or
                // before its socket was seen closed) is no failed open:
                // it is closed, and another taken. Each fails once, so
                // this ends with the idle ones.
                Err(error) if reused && error.kind() == ErrorKind::ConnectionLost => {}
                result => break result,
            }
        };
        match result {
            Ok(Some(conn)) => {
                let _ = self.record_open(Ok(()));
                {
                    let _edit = lock(&self.edit);
                    let mut conns = Vec::clone(&self.conns.load());
                    conns.push(conn);
                    self.conns.store(Arc::new(conns));
                }
                self.opening.fetch_sub(1, Ordering::AcqRel);
            }
            Ok(None) => {
                self.opening.fetch_sub(1, Ordering::AcqRel);
            }
            Err(error) => {
                let failures = self.record_open(Err(&error));
                self.opening.fetch_sub(1, Ordering::AcqRel);
                // With no connection to wait for, and opens failing in a
                // row, waiting queries learn now why, instead of at their
                // timeout. After one failure they wait for the next try,
                // which the tick starts once the back-off ends.
                if failures >= REFUSE_AFTER && self.conns.load().is_empty() {
                    let (kind, message) = (OpenFailure::kind_of(&error), error.detail());
                    self.queue.fail_all(|| OpenFailure::error(kind, &message));
                }
            }
        }
        if self.is_closed() {
            self.retire_all();
        }
        self.dispatch();
    }

    /// Readies a connection from deadpool for sharing (deadpool's recycle
    /// already reset whatever session its last user left), under the
    /// head-of-line budget. `None` when it is
    /// no longer wanted (an exclusive user claimed the room meanwhile).
    async fn make_shared(&self, object: Object<Manager>) -> Result<Option<Arc<SharedConn>>, Error> {
        if self.conns.load().len() >= self.shared_limit() {
            return Ok(None); // dropping it hands it to the waiting get()
        }
        // Before any query shares it: the server bounds how long one
        // statement holds the others, and no limit of the role's ends the
        // session under them (conn/budget.rs). Not behind a transaction
        // pooler, where a session setting would reach other clients.
        if !self.config.pooler.is_transaction() {
            let shared = object.share_session(self.config.head_of_line_budget).await;
            if let Err(error) = shared {
                if error.kind() == ErrorKind::ConnectionLost {
                    object.closing(CloseReason::Broken);
                }
                return Err(error);
            }
        }
        Ok(Some(Arc::new(SharedConn::new(object, self.wire.ticks()))))
    }

    /// Takes `conn` out of routing; it returns to deadpool when its last
    /// query finishes.
    pub(crate) fn retire(&self, conn: &SharedConn) {
        conn.state().load.close();
        self.prune();
    }

    /// Drops closed connections from the routing list.
    pub(crate) fn prune(&self) {
        let _edit = lock(&self.edit);
        let conns = self.conns.load();
        if conns.iter().any(|c| c.load().is_closed()) {
            let open: Vec<_> = conns
                .iter()
                .filter(|c| !c.load().is_closed())
                .cloned()
                .collect();
            self.conns.store(Arc::new(open));
        }
    }

    /// Retires the least loaded shared connections until the shared path
    /// fits its limit, so that a waiting `get()` is served.
    pub(crate) fn rebalance(&self) {
        loop {
            let conns = self.conns.load();
            if conns.len() <= self.shared_limit() {
                return;
            }
            match conns.iter().min_by_key(|c| c.in_flight()) {
                Some(conn) => self.retire(conn),
                None => return,
            }
        }
    }

    /// Returns shared connections that have been idle for `idle_ticks` ticks
    /// of the pool clock to deadpool.
    pub(super) fn retire_idle(&self, idle_ticks: u64) {
        let now = self.wire.ticks();
        let conns = self.conns.load();
        for conn in conns.iter().filter(|c| c.idle_for(now, idle_ticks)) {
            self.retire(conn);
        }
    }

    pub(super) fn retire_all(&self) {
        let conns = self.conns.load();
        for conn in conns.iter() {
            conn.state().load.close();
        }
        self.prune();
    }
}
