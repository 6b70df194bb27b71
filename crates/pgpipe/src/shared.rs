//! The shared path: connections that carry queries from many tasks at once,
//! and the router that admits each query onto one of them.
//!
//! Each shared connection keeps its own writer (tokio-postgres' connection
//! task); there is no pool-wide write loop. Admission is lock-free: a query
//! reads the current list of shared connections (one atomic load), picks one
//! by [`Routing`] and by what holds each up (see [`hol`](crate::hol)), and
//! claims a place on it with one compare-and-swap on that connection's load
//! word. Only when nothing has room does a query touch the wait queue.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use deadpool::managed::{Object, Timeouts};
use tokio::time::Instant;

use crate::config::Routing;
use crate::error::{Error, ErrorKind};
use crate::gate::Gate;
use crate::manager::{Manager, PgConn};
use crate::metrics::CloseReason;
use crate::pool::PoolInner;
use crate::queue::{Handoff, WaitQueue};
use crate::wire::{CLOSED, ConnState, DEAD, LOAD_MASK, PoolWire, SHARED};

/// A connection on loan to the shared path. It goes back to deadpool when
/// the last query using it finishes after it was retired.
pub(crate) struct SharedConn {
    object: Object<Manager>,
    pub(crate) gate: Gate,
    /// The pool's coarse clock when the last query finished.
    idle_since: AtomicU64,
    /// Slow queries in flight (see [`hol`](crate::hol)).
    slow: AtomicU64,
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

    /// Counts one more slow query in flight, or one fewer.
    pub(crate) fn count_slow(&self, more: bool) {
        if more {
            self.slow.fetch_add(1, Ordering::AcqRel);
        } else {
            self.slow.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Queries admitted and not finished.
    pub(crate) fn in_flight(&self) -> u64 {
        self.load() & LOAD_MASK
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
        self.object.returned();
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
    pub(crate) queue: WaitQueue,
    /// Whether a dispatch is running, and whether another was asked for
    /// meanwhile.
    dispatching: AtomicBool,
    dispatch_again: AtomicBool,
    /// The last failed open, while its back-off lasts.
    failure: Mutex<Option<OpenFailure>>,
}

/// A failed open: no new open starts until `retry_at`, and queries that
/// find no shared connection fail at once with this error instead of
/// hammering a server that is down.
#[derive(Debug)]
struct OpenFailure {
    retry_at: Instant,
    backoff: Duration,
    kind: ErrorKind,
    message: String,
}

/// Back-off after failed opens: doubling from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(25);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// A query's place on a shared connection (or a batch's places); frees
/// them (or hands them to the longest-waiting queries) when dropped.
pub(crate) struct Slot<'a> {
    pub(crate) conn: Arc<SharedConn>,
    /// Queries in flight on the connection when this one was admitted.
    pub(crate) ahead: u64,
    /// Counted in the connection's slow queries.
    slow: bool,
    places: u64,
    pool: &'a Arc<PoolInner>,
}

impl Slot<'_> {
    /// Takes `extra` more places on the same connection, past its depth
    /// limit if need be: the items of one batch go out together. Others
    /// wait until the connection is back under its limit.
    pub(crate) fn extend(&mut self, extra: u64) {
        self.conn.state().load.fetch_add(extra, Ordering::AcqRel);
        self.places += extra;
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.slow {
            self.conn.count_slow(false);
        }
        for _ in 0..self.places {
            self.pool.release(&self.conn);
        }
    }
}

/// What the router decided for one query. `Go` variants carry a place
/// already claimed on the connection, how many queries were ahead on it, and
/// how many were in flight on all shared connections.
enum Route {
    /// Run on this connection.
    Go(Arc<SharedConn>, u64, u64),
    /// Run on this connection, and open another for the queries to come.
    GoAndOpen(Arc<SharedConn>, u64, u64),
    /// Nothing has room, but a new connection may be opened.
    Open,
    /// Nothing has room: wait.
    Wait,
}

/// How a connection ranks for one query, lower first: for a fast query,
/// whether it is held up, then how many slow queries it carries; for a slow
/// query, how many slow queries it carries, then whether it is overdue.
/// Then its load (with [`Routing::Spread`]); or, between held-up
/// connections, when each last made progress: the one stuck longest is
/// likely the first to be free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    first: u64,
    second: u64,
    load: u64,
    /// The chosen connection is held up: another should be opened.
    held: bool,
}

impl Rank {
    fn held_up(self) -> bool {
        self.held
    }
}

/// Ranks connections for one routing decision; with `None`, head-of-line
/// awareness is off and only the load counts.
struct HeldUp<'a>(Option<Overdue<'a>>);

/// Whether a connection owes answers and has read none for `after`
/// nanoseconds (the clock is read once per decision, and only if needed).
struct Overdue<'a> {
    after: u64,
    now: Option<u64>,
    wire: &'a PoolWire,
}

impl HeldUp<'_> {
    fn rank(&mut self, conn: &SharedConn, slow: bool, load: u64) -> Rank {
        let Some(overdue) = &mut self.0 else {
            return Rank {
                first: 0,
                second: 0,
                load,
                held: false,
            };
        };
        let slows = conn.slow.load(Ordering::Acquire);
        let late = overdue.is(conn.state());
        if slow {
            Rank {
                first: slows,
                second: u64::from(late),
                load,
                held: slows > 0,
            }
        } else {
            let held = slows > 0 || late;
            Rank {
                first: u64::from(held),
                second: slows,
                load: if held {
                    conn.state().progress.load(Ordering::Relaxed)
                } else {
                    load
                },
                held,
            }
        }
    }
}

impl Overdue<'_> {
    fn is(&mut self, state: &ConnState) -> bool {
        if state.wire_depth() == 0 {
            return false;
        }
        let progress = state.progress.load(Ordering::Relaxed);
        let now = *self.now.get_or_insert_with(|| self.wire.now_nanos());
        now.saturating_sub(progress) > self.after
    }
}

impl PoolInner {
    /// Admits one query onto a shared connection, waiting (bounded in count
    /// and time, first come first served) when every connection is full.
    /// `slow` queries are routed as [`hol`](crate::hol) describes.
    pub(crate) async fn reserve(self: &Arc<Self>, slow: bool) -> Result<Slot<'_>, Error> {
        if self.shared.queue.len() == 0 {
            match self.route(slow) {
                Route::Go(conn, ahead, in_flight) => {
                    self.note_depth(in_flight + 1);
                    if slow {
                        conn.count_slow(true);
                    }
                    return Ok(self.slot(conn, ahead, slow));
                }
                Route::GoAndOpen(conn, ahead, in_flight) => {
                    self.note_depth(in_flight + 1);
                    self.spawn_open();
                    if slow {
                        conn.count_slow(true);
                    }
                    return Ok(self.slot(conn, ahead, slow));
                }
                Route::Open => self.spawn_open(),
                Route::Wait => {}
            }
        }
        self.reserve_slow(slow).await
    }

    /// Raises the high-water mark of pipelined queries in flight (for the
    /// metrics); written only when it rises.
    fn note_depth(&self, in_flight: u64) {
        if in_flight > self.depth_high.load(Ordering::Relaxed) {
            self.depth_high.fetch_max(in_flight, Ordering::Relaxed);
        }
    }

    /// A slot for a place already claimed (and, for a `slow` query,
    /// already counted among the connection's slow queries).
    fn slot(self: &Arc<Self>, conn: Arc<SharedConn>, ahead: u64, slow: bool) -> Slot<'_> {
        Slot {
            conn,
            ahead,
            slow,
            places: 1,
            pool: self,
        }
    }

    async fn reserve_slow(self: &Arc<Self>, slow: bool) -> Result<Slot<'_>, Error> {
        if self.is_closed() {
            return Err(Error::closed());
        }
        if self.shared_limit() == 0 && self.claims_all_mine() {
            return Err(Error::new(
                ErrorKind::Deadlock,
                "this task holds every connection the query could use (checked out \
                 with pool.get()); run the query on that connection, or raise max_size",
            ));
        }
        if self.shared.conns.load().is_empty() {
            if let Some(error) = self.open_backoff() {
                return Err(error);
            }
        }
        let deadline = Instant::now() + self.config.wait_timeout;
        let capacity = self.config.queue_capacity;
        let Some((admission, _waiting)) = self.shared.queue.join(capacity, slow) else {
            return Err(Error::queue_full(capacity));
        };
        // Room may have appeared since the fast path looked, and a new
        // connection may be needed: dispatch, possibly to this very waiter.
        self.dispatch();
        match tokio::time::timeout_at(deadline, admission).await {
            Ok(Ok(Ok(handoff))) => {
                let conn = handoff.take();
                let ahead = (conn.load() & LOAD_MASK).saturating_sub(1);
                self.note_depth(self.shared_counts().1 as u64);
                Ok(self.slot(conn, ahead, slow))
            }
            Ok(Ok(Err(error))) => Err(error),
            Ok(Err(_)) => Err(Error::closed()),
            Err(_) => Err(Error::timeout("room on a shared connection")),
        }
    }

    /// Frees a query's place on `conn`, or hands it straight to the oldest
    /// waiting query.
    pub(crate) fn release(self: &Arc<Self>, conn: &Arc<SharedConn>) {
        if self.shared.queue.len() > 0 && conn.load() & CLOSED == 0 {
            let handoff = Handoff::new(Arc::clone(conn), Arc::clone(self));
            match self.shared.queue.admit_oldest(Ok(handoff)) {
                Ok(()) => return,
                Err(Ok(handoff)) => drop(handoff.take()), // nobody waits after all
                Err(Err(_)) => unreachable!("an admission is sent as it came"),
            }
        }
        self.give_back(conn);
        if self.shared.queue.len() > 0 {
            // The place could not be handed on (its connection is closing):
            // route the waiters elsewhere.
            self.dispatch();
        }
    }

    /// Admits waiting queries, oldest first, while any connection has room;
    /// opens another connection when none has.
    ///
    /// One dispatcher at a time (two would both claim a place for the same
    /// waiter): a caller that finds another at work leaves it a note to go
    /// round once more, and returns.
    pub(crate) fn dispatch(self: &Arc<Self>) {
        if self.is_closed() {
            self.shared.queue.fail_all(Error::closed);
            return;
        }
        self.shared.dispatch_again.store(true, Ordering::Release);
        while self.shared.dispatch_again.load(Ordering::Acquire) {
            if self.shared.dispatching.swap(true, Ordering::AcqRel) {
                return; // the dispatcher at work will see the note
            }
            self.shared.dispatch_again.store(false, Ordering::Release);
            self.dispatch_once();
            self.shared.dispatching.store(false, Ordering::Release);
        }
    }

    fn dispatch_once(self: &Arc<Self>) {
        // Waiters already answered stay counted until they wake; only the
        // unanswered ones need a place.
        while self.shared.queue.has_unanswered() {
            let slow = self.shared.queue.oldest_is_slow();
            let (conn, _ahead) = match self.route(slow) {
                Route::Go(conn, ahead, _) => (conn, ahead),
                Route::GoAndOpen(conn, ahead, _) => {
                    self.spawn_open();
                    (conn, ahead)
                }
                Route::Open => return self.spawn_open(),
                Route::Wait => return,
            };
            let handoff = Handoff::new(conn, Arc::clone(self));
            if let Err(Ok(handoff)) = self.shared.queue.admit_oldest(Ok(handoff)) {
                // Everyone gave up meanwhile: give the place back.
                self.give_back(&handoff.take());
                return;
            }
        }
    }

    /// Frees one place on `conn`, noting when it falls idle.
    fn give_back(&self, conn: &SharedConn) {
        let before = conn.state().load.fetch_sub(1, Ordering::AcqRel);
        if before & LOAD_MASK == 1 {
            let now = self.wire.clock.load(Ordering::Relaxed);
            conn.idle_since.store(now, Ordering::Relaxed);
        }
    }

    /// Picks a connection for one query; see [`Routing`] and
    /// [`hol`](crate::hol).
    fn route(&self, slow: bool) -> Route {
        let max_depth = self.config.max_pipeline_depth as u64;
        let fill = self.config.routing == Routing::Fill;
        let mut held_up = self.held_up();
        for _ in 0..4 {
            let conns = self.shared.conns.load();
            // Fill: the first (oldest) connection with room, so that later
            // ones drain and go back to idle; Spread: the least loaded. Fast
            // queries first avoid connections held up by slow work; slow
            // queries go where there is the least of it (with Fill, the
            // newest such connection, keeping the oldest clear).
            let mut best: Option<(&Arc<SharedConn>, Rank)> = None;
            let mut with_room = 0;
            let mut live = 0;
            let mut stale = false;
            let mut in_flight = 0;
            for conn in conns.iter() {
                let load = conn.load();
                in_flight += load & LOAD_MASK;
                if load & CLOSED != 0 {
                    stale = true;
                    continue;
                }
                live += 1;
                let n = load & LOAD_MASK;
                if n >= max_depth {
                    continue;
                }
                with_room += 1;
                let rank = held_up.rank(conn, slow, if fill { 0 } else { n });
                let better = match best {
                    None => true,
                    Some((_, best)) if slow && fill => rank <= best,
                    Some((_, best)) => rank < best,
                };
                if better {
                    best = Some((conn, rank));
                }
            }
            if stale {
                self.prune();
            }
            let room_to_open =
                live + self.shared.opening.load(Ordering::Acquire) < self.shared_limit();
            let Some((conn, rank)) = best else {
                return if room_to_open {
                    Route::Open
                } else {
                    Route::Wait
                };
            };
            if rank.held_up() && room_to_open {
                // Better to wait for a new connection (a few round trips)
                // than behind a slow query of unknown length.
                return Route::Open;
            }
            let Some(ahead) = conn.admit(max_depth) else {
                continue; // lost a race for its last place; look again
            };
            let busy = if fill {
                with_room == 1 && ahead + 1 >= max_depth
            } else {
                ahead > 0
            };
            let conn = Arc::clone(conn);
            return if busy && room_to_open {
                Route::GoAndOpen(conn, ahead, in_flight)
            } else {
                Route::Go(conn, ahead, in_flight)
            };
        }
        Route::Wait
    }

    /// What makes a connection held up, for one routing decision; `None`
    /// when head-of-line awareness is off.
    fn held_up(&self) -> HeldUp<'_> {
        let Some(threshold) = self.config.slow_query_threshold else {
            return HeldUp(None);
        };
        // A healthy pipelined connection answers at least once a round trip
        // (which the floor includes); one that does not for the threshold
        // on top is stuck behind something slow.
        let floor = self.costs.floor().unwrap_or(threshold);
        HeldUp(Some(Overdue {
            after: (threshold + floor).as_nanos() as u64,
            now: None,
            wire: &self.wire,
        }))
    }

    /// How many connections the shared path may hold now: what exclusive
    /// users have not claimed.
    pub(crate) fn shared_limit(&self) -> usize {
        self.config
            .max_size
            .saturating_sub(self.exclusive_claims.load(Ordering::Acquire))
    }

    /// The error of the last failed open, while its back-off lasts.
    fn open_backoff(&self) -> Option<Error> {
        let failure = self
            .shared
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let failure = failure.as_ref()?;
        (Instant::now() < failure.retry_at).then(|| {
            Error::new(
                failure.kind,
                format!("no shared connection could be opened: {}", failure.message),
            )
        })
    }

    fn record_open(&self, result: Result<(), &Error>) {
        let mut failure = self
            .shared
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *failure = match result {
            Ok(()) => None,
            Err(error) => {
                let backoff = failure
                    .as_ref()
                    .map_or(BACKOFF_FIRST, |f| (f.backoff * 2).min(BACKOFF_MAX));
                Some(OpenFailure {
                    retry_at: Instant::now() + backoff,
                    backoff,
                    kind: error.kind(),
                    message: error.detail(),
                })
            }
        };
    }

    /// Starts opening one more shared connection, unless that would exceed
    /// the limit or a recent open failed.
    fn spawn_open(self: &Arc<Self>) {
        if self.open_backoff().is_some() {
            return;
        }
        let live = self.shared.conns.load().len();
        let limit = self.shared_limit();
        // Connections already being opened will take `max_pipeline_depth`
        // queries each: open another only if the waiters need more.
        let wanted = self.shared.queue.len() + 1;
        let depth = self.config.max_pipeline_depth;
        let claimed =
            self.shared
                .opening
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |opening| {
                    (live + opening < limit && opening * depth < wanted).then_some(opening + 1)
                });
        if claimed.is_err() {
            return;
        }
        // Dropping a checkout or a slot may land here outside any runtime;
        // then the next query opens the connection instead.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let pool = Arc::clone(self);
                runtime.spawn(async move { pool.open_shared().await });
            }
            Err(_) => {
                self.shared.opening.fetch_sub(1, Ordering::AcqRel);
            }
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
                self.record_open(Ok(()));
                {
                    let _edit = self.shared.edit.lock().unwrap_or_else(|e| e.into_inner());
                    let mut conns = Vec::clone(&self.shared.conns.load());
                    conns.push(conn);
                    self.shared.conns.store(Arc::new(conns));
                }
                self.shared.opening.fetch_sub(1, Ordering::AcqRel);
            }
            Ok(None) => {
                self.shared.opening.fetch_sub(1, Ordering::AcqRel);
            }
            Err(error) => {
                self.record_open(Err(&error));
                self.shared.opening.fetch_sub(1, Ordering::AcqRel);
                // With no connection to wait for, waiting queries learn now
                // why, instead of at their timeout.
                if self.shared.conns.load().is_empty() {
                    let (kind, message) = (error.kind(), error.detail());
                    self.shared.queue.fail_all(|| {
                        Error::new(
                            kind,
                            format!("no shared connection could be opened: {message}"),
                        )
                    });
                }
            }
        }
        if self.is_closed() {
            self.retire_all();
        }
        self.dispatch();
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
                // Never share a session that could not be cleaned.
                let conn = Object::take(object);
                conn.closing(CloseReason::ResetFailed);
                return Err(e);
            }
        }
        object.state.load.store(SHARED, Ordering::Release);
        Ok(Some(Arc::new(SharedConn {
            object,
            gate: Gate::default(),
            idle_since: AtomicU64::new(self.wire.clock.load(Ordering::Relaxed)),
            slow: AtomicU64::new(0),
        })))
    }

    /// Takes `conn` out of routing; it returns to deadpool when its last
    /// query finishes.
    pub(crate) fn retire(&self, conn: &Arc<SharedConn>) {
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
        let now = self.wire.clock.load(Ordering::Relaxed);
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

    /// Queries written to shared connections and not yet answered.
    pub(crate) fn shared_wire_depth(&self) -> u64 {
        self.shared
            .conns
            .load()
            .iter()
            .map(|c| c.state().wire_depth())
            .sum()
    }

    /// The no-progress watchdog: kills shared connections that owe answers
    /// and have received nothing for `stall_timeout` (a stalled network, a
    /// stopped backend). Their queries fail with `ConnectionLost` at once
    /// instead of hanging, and the connection is never handed out again.
    pub(crate) fn watch_stalls(&self, tick: Duration) {
        let Some(stall) = self.config.stall_timeout else {
            return;
        };
        let limit = stall.as_nanos().div_ceil(tick.as_nanos().max(1)) as u64;
        let now = self.wire.clock.load(Ordering::Relaxed);
        // Shared connections, and retired or returned ones still owing
        // answers; never one checked out with `get()`.
        for state in self.wire.states() {
            let silent = now.saturating_sub(state.last_read.load(Ordering::Relaxed));
            let exclusive = state.exclusive.load(Ordering::Acquire);
            if !exclusive && state.wire_depth() > 0 && silent >= limit && !state.is_dead() {
                state.kill(CloseReason::Stalled, self.metrics.as_deref());
            }
        }
        self.prune();
    }

    /// Retires shared connections past `max_lifetime` (they drain, then
    /// close), and closes idle ones past it or past `idle_timeout`.
    pub(crate) fn expire(&self, tick: Duration) {
        let conns = self.shared.conns.load();
        for conn in conns.iter().filter(|c| c.conn().is_expired()) {
            self.retire(conn);
        }
        let idle_limit = self
            .config
            .idle_timeout
            .map(|idle| idle.as_nanos().div_ceil(tick.as_nanos().max(1)) as u64);
        let now = self.wire.clock.load(Ordering::Relaxed);
        let idle_too_long = |conn: &PgConn| {
            idle_limit.is_some_and(|limit| {
                now.saturating_sub(conn.state.idle_since.load(Ordering::Relaxed)) >= limit
            })
        };
        let removed = self
            .pg
            .retain(|conn, _| !(conn.is_expired() || idle_too_long(conn)));
        for conn in removed.removed {
            conn.closing(if conn.is_expired() {
                CloseReason::MaxLifetime
            } else {
                CloseReason::Idle
            });
        }
    }

    /// Shared connections, and queries in flight on them.
    pub(crate) fn shared_counts(&self) -> (usize, usize) {
        let conns = self.shared.conns.load();
        let in_flight = conns.iter().map(|c| (c.load() & LOAD_MASK) as usize).sum();
        (conns.len(), in_flight)
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
            .field("waiting", &self.queue.len())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Slot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("ahead", &self.ahead).finish()
    }
}
