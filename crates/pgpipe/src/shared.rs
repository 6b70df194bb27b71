//! The shared path: connections that carry queries from many tasks at once,
//! and the router that admits each query onto one of them.
//!
//! Each shared connection keeps its own writer (tokio-postgres' connection
//! task); there is no pool-wide write loop. Admission is lock-free: a query
//! reads the current list of shared connections (one atomic load), picks the
//! one with the fewest queries in flight and claims a place on it with one
//! compare-and-swap on that connection's load word. Only when nothing has
//! room does a query touch the wait queue.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use deadpool::managed::{Object, Timeouts};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::Routing;
use crate::error::{Error, ErrorKind};
use crate::gate::Gate;
use crate::manager::{Manager, PgConn};
use crate::pool::PoolInner;
use crate::wire::{CLOSED, ConnState, DEAD, LOAD_MASK, SHARED};

/// A connection on loan to the shared path. It goes back to deadpool when
/// the last query using it finishes after it was retired.
pub(crate) struct SharedConn {
    object: Object<Manager>,
    pub(crate) gate: Gate,
    /// The pool's coarse clock when the last query finished.
    idle_since: AtomicU64,
}

impl SharedConn {
    pub(crate) fn conn(&self) -> &PgConn {
        &self.object
    }

    pub(crate) fn state(&self) -> &ConnState {
        &self.object.state
    }

    fn load(&self) -> u64 {
        self.state().load.load(Ordering::Acquire)
    }

    /// Claims a place for one more query, returning how many were in flight
    /// before, or `None` if the connection is closed to new work or full.
    fn admit(&self, max_depth: u64) -> Option<u64> {
        let load = &self.state().load;
        let mut current = load.load(Ordering::Acquire);
        loop {
            if current & CLOSED != 0 || current & LOAD_MASK >= max_depth {
                return None;
            }
            match load.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(current & LOAD_MASK),
                Err(actual) => current = actual,
            }
        }
    }
}

impl Drop for SharedConn {
    fn drop(&mut self) {
        // Back to exclusive-or-idle: no longer shared, open to whoever takes
        // it next. A dead connection stays dead, and deadpool discards it.
        self.state().load.fetch_and(DEAD, Ordering::AcqRel);
    }
}

/// The shared connections and the queue of queries waiting for room.
#[derive(Default)]
pub(crate) struct SharedSet {
    conns: ArcSwap<Vec<Arc<SharedConn>>>,
    /// Serializes changes to `conns` (rare: opens, retirements).
    edit: Mutex<()>,
    /// Connections being opened for the shared path.
    opening: AtomicUsize,
    /// Queries waiting for room.
    pub(crate) waiting: AtomicUsize,
    /// Wakes waiting queries when room appears.
    pub(crate) room: Notify,
    /// Failed opens so far, and the last failure, for waiters to report.
    open_failures: AtomicU64,
    last_open_error: Mutex<Option<Error>>,
}

/// A query's place on a shared connection; frees it when dropped.
pub(crate) struct Slot<'a> {
    pub(crate) conn: Arc<SharedConn>,
    /// Queries in flight on the connection when this one was admitted.
    pub(crate) ahead: u64,
    pool: &'a PoolInner,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let before = self.conn.state().load.fetch_sub(1, Ordering::AcqRel);
        if before & LOAD_MASK == 1 {
            let now = self.pool.clock.load(Ordering::Relaxed);
            self.conn.idle_since.store(now, Ordering::Relaxed);
        }
        if self.pool.shared.waiting.load(Ordering::Acquire) > 0 {
            self.pool.shared.room.notify_one();
        }
    }
}

/// What the router decided for one query.
enum Route<'a> {
    /// Run on this slot.
    Go(Slot<'a>),
    /// Run on this slot, and open another connection for the queries to come.
    GoAndOpen(Slot<'a>),
    /// Nothing has room, but a new connection may be opened.
    Open,
    /// Nothing has room: wait.
    Wait,
}

impl PoolInner {
    /// Admits one query onto a shared connection, waiting (bounded in count
    /// and time) when every connection is full.
    pub(crate) async fn reserve(self: &Arc<Self>) -> Result<Slot<'_>, Error> {
        if self.shared.waiting.load(Ordering::Acquire) == 0 {
            match self.route() {
                Route::Go(slot) => return Ok(slot),
                Route::GoAndOpen(slot) => {
                    self.spawn_open();
                    return Ok(slot);
                }
                Route::Open => self.spawn_open(),
                Route::Wait => {}
            }
        }
        self.reserve_slow().await
    }

    async fn reserve_slow(self: &Arc<Self>) -> Result<Slot<'_>, Error> {
        let deadline = Instant::now() + self.config.wait_timeout;
        let capacity = self.config.queue_capacity;
        let queued = self.shared.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&self.shared.waiting);
        if queued >= capacity {
            return Err(Error::queue_full(capacity));
        }
        let failures_before = self.shared.open_failures.load(Ordering::Acquire);
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if self.is_closed() {
                return Err(Error::closed());
            }
            match self.route() {
                Route::Go(slot) => return Ok(slot),
                Route::GoAndOpen(slot) => {
                    self.spawn_open();
                    return Ok(slot);
                }
                Route::Open => self.spawn_open(),
                Route::Wait => {}
            }
            if self.shared_limit() == 0 && self.claims_all_mine() {
                return Err(Error::new(
                    ErrorKind::Deadlock,
                    "this task holds every connection the query could use (checked out \
                     with pool.get()); run the query on that connection, or raise max_size",
                ));
            }
            if let Some(error) = self.open_failed_since(failures_before) {
                return Err(error);
            }
            if tokio::time::timeout_at(deadline, room).await.is_err() {
                return Err(Error::timeout("room on a shared connection"));
            }
        }
    }

    /// Picks a connection for one query; see [`Routing`].
    fn route(&self) -> Route<'_> {
        let max_depth = self.config.max_pipeline_depth as u64;
        for _ in 0..4 {
            let conns = self.shared.conns.load();
            let mut best: Option<(&Arc<SharedConn>, u64)> = None;
            let mut live = 0;
            let mut stale = false;
            for conn in conns.iter() {
                let load = conn.load();
                if load & CLOSED != 0 {
                    stale = true;
                    continue;
                }
                live += 1;
                let n = load & LOAD_MASK;
                if n < max_depth && best.is_none_or(|(_, m)| n < m) {
                    best = Some((conn, n));
                }
            }
            if stale {
                self.prune();
            }
            let room_to_open =
                live + self.shared.opening.load(Ordering::Acquire) < self.shared_limit();
            let Some((conn, _)) = best else {
                return if room_to_open {
                    Route::Open
                } else {
                    Route::Wait
                };
            };
            let Some(ahead) = conn.admit(max_depth) else {
                continue; // lost a race for its last place; look again
            };
            let slot = Slot {
                conn: Arc::clone(conn),
                ahead,
                pool: self,
            };
            let busy = match self.config.routing {
                Routing::Spread => ahead > 0,
                Routing::Fill => ahead + 1 >= max_depth,
            };
            return if busy && room_to_open {
                Route::GoAndOpen(slot)
            } else {
                Route::Go(slot)
            };
        }
        Route::Wait
    }

    /// How many connections the shared path may hold now: what exclusive
    /// users have not claimed.
    pub(crate) fn shared_limit(&self) -> usize {
        self.config
            .max_size
            .saturating_sub(self.exclusive_claims.load(Ordering::Acquire))
    }

    /// Starts opening one more shared connection, unless that would exceed
    /// the limit.
    fn spawn_open(self: &Arc<Self>) {
        let live = self.shared.conns.load().len();
        let limit = self.shared_limit();
        let claimed =
            self.shared
                .opening
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |opening| {
                    (live + opening < limit).then_some(opening + 1)
                });
        if claimed.is_ok() {
            let pool = Arc::clone(self);
            tokio::spawn(async move { pool.open_shared().await });
        }
    }

    async fn open_shared(self: Arc<Self>) {
        let timeouts = Timeouts {
            wait: Some(self.config.wait_timeout),
            create: None, // the connect timeout lives in the connection config
            recycle: Some(self.config.wait_timeout),
        };
        let result = match self.pg.timeout_get(&timeouts).await {
            Ok(object) => self.make_shared(object).await,
            Err(e) => Err(Error::from_pool(e, "a connection for the shared path")),
        };
        match result {
            Ok(Some(conn)) => {
                let _edit = self.shared.edit.lock().unwrap_or_else(|e| e.into_inner());
                let mut conns = Vec::clone(&self.shared.conns.load());
                conns.push(conn);
                self.shared.conns.store(Arc::new(conns));
            }
            Ok(None) => {}
            Err(error) => {
                *self
                    .shared
                    .last_open_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(error);
                self.shared.open_failures.fetch_add(1, Ordering::AcqRel);
            }
        }
        self.shared.opening.fetch_sub(1, Ordering::AcqRel);
        self.shared.room.notify_waiters();
        if self.is_closed() {
            self.retire_all();
        }
    }

    /// Readies a connection from deadpool for sharing: cleans the session an
    /// exclusive user may have left, then marks it shared. `None` when it is
    /// no longer wanted (an exclusive user claimed the room meanwhile).
    async fn make_shared(&self, object: Object<Manager>) -> Result<Option<Arc<SharedConn>>, Error> {
        if self.shared.conns.load().len() >= self.shared_limit() {
            return Ok(None); // dropping it hands it to the waiting get()
        }
        if object.state.needs_reset.load(Ordering::Acquire) {
            if let Err(e) = object.reset_session().await {
                drop(Object::take(object)); // never share a session we could not clean
                return Err(e);
            }
        }
        object.state.load.store(SHARED, Ordering::Release);
        Ok(Some(Arc::new(SharedConn {
            object,
            gate: Gate::default(),
            idle_since: AtomicU64::new(self.clock.load(Ordering::Relaxed)),
        })))
    }

    /// The error to report if an open failed since `failures_before` and no
    /// shared connection is left to wait for.
    fn open_failed_since(&self, failures_before: u64) -> Option<Error> {
        let failed = self.shared.open_failures.load(Ordering::Acquire) != failures_before;
        let nothing_to_wait_for =
            self.shared.conns.load().is_empty() && self.shared.opening.load(Ordering::Acquire) == 0;
        if !(failed && nothing_to_wait_for) {
            return None;
        }
        let last = self
            .shared
            .last_open_error
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let message = last
            .as_ref()
            .map_or_else(|| "unknown error".to_string(), ToString::to_string);
        let kind = last.as_ref().map_or(ErrorKind::Connect, Error::kind);
        Some(Error::new(
            kind,
            format!("no shared connection could be opened: {message}"),
        ))
    }

    /// Takes `conn` out of routing; it returns to deadpool when its last
    /// query finishes.
    fn retire(&self, conn: &Arc<SharedConn>) {
        conn.state().load.fetch_or(CLOSED, Ordering::AcqRel);
        self.prune();
    }

    /// Drops closed connections from the routing list.
    pub(crate) fn prune(&self) {
        let _edit = self.shared.edit.lock().unwrap_or_else(|e| e.into_inner());
        let conns = self.shared.conns.load();
        if conns.iter().any(|c| c.load() & CLOSED != 0) {
            let open: Vec<_> = conns
                .iter()
                .filter(|c| c.load() & CLOSED == 0)
                .cloned()
                .collect();
            self.shared.conns.store(Arc::new(open));
        }
    }

    /// Retires the least loaded shared connections until the shared path
    /// fits its limit, so that a waiting `get()` is served.
    pub(crate) fn rebalance(&self) {
        loop {
            let conns = self.shared.conns.load();
            if conns.len() <= self.shared_limit() {
                return;
            }
            match conns.iter().min_by_key(|c| c.load() & LOAD_MASK) {
                Some(conn) => self.retire(conn),
                None => return,
            }
        }
    }

    /// Returns shared connections that have been idle for `idle_ticks` ticks
    /// of the pool clock to deadpool.
    pub(crate) fn retire_idle(&self, idle_ticks: u64) {
        let now = self.clock.load(Ordering::Relaxed);
        let conns = self.shared.conns.load();
        for conn in conns.iter() {
            let idle = conn.load() & LOAD_MASK == 0
                && now.saturating_sub(conn.idle_since.load(Ordering::Relaxed)) >= idle_ticks;
            if idle {
                self.retire(conn);
            }
        }
    }

    pub(crate) fn retire_all(&self) {
        let conns = self.shared.conns.load();
        for conn in conns.iter() {
            conn.state().load.fetch_or(CLOSED, Ordering::AcqRel);
        }
        self.prune();
    }

    /// Shared connections, and queries in flight on them.
    pub(crate) fn shared_counts(&self) -> (usize, usize) {
        let conns = self.shared.conns.load();
        let in_flight = conns.iter().map(|c| (c.load() & LOAD_MASK) as usize).sum();
        (conns.len(), in_flight)
    }
}

/// Counts a waiting query for as long as it waits.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for SharedConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedConn")
            .field("in_flight", &(self.load() & LOAD_MASK))
            .field("closed", &(self.load() & CLOSED != 0))
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for SharedSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedSet")
            .field("conns", &self.conns.load().len())
            .field("opening", &self.opening.load(Ordering::Relaxed))
            .field("waiting", &self.waiting.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Slot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("ahead", &self.ahead).finish()
    }
}
