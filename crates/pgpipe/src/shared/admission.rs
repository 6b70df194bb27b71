//! Admission: a query claims a [`Place`] on a shared connection, or waits
//! for one in the queue, and frees it (or hands it on) when it finishes.
//!
//! **Who dispatches, and why inline.** Waiting queries are admitted by
//! [`Router::dispatch`], run inline by whoever frees room: a finishing
//! query whose place could not be handed on, a new connection coming up, an
//! exclusive checkout giving back its claim, a new waiter (room may have
//! appeared since it looked), and the housekeeping tick as a safety net.
//! Inline rather than in a task of its own, because a dispatcher task
//! would add a wake-up and a scheduling delay to every hand-off, on the
//! path where the pool is already saturated. One dispatcher runs at a time
//! (two would both claim a place for the same waiter): a caller that finds
//! another at work leaves it a note to go round once more, and returns.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::queue;
use super::route::{self, Candidate, Decision};
use super::{Router, SharedConn};
use crate::error::{Error, ErrorKind};

/// A query's place on a shared connection (or a batch's places); frees
/// them, or hands them to the longest-waiting queries, when dropped.
pub(crate) struct Place<'a> {
    pub(crate) conn: Arc<SharedConn>,
    /// Queries in flight on the connection when this one was admitted.
    pub(crate) ahead: u64,
    /// Queries in flight on all the lane's connections then, its own not
    /// counted.
    pub(crate) crowd: u64,
    /// Counted in the connection's slow queries.
    slow: bool,
    places: u64,
    router: &'a Arc<Router>,
}

impl Place<'_> {
    /// Takes `extra` more places on the same connection, past its depth
    /// limit if need be: the items of one batch go out together. Others
    /// wait until the connection is back under its limit.
    pub(crate) fn extend(&mut self, extra: u64) {
        self.conn.state().load.add(extra);
        self.places += extra;
    }

    /// Takes up to `extra` more places on the same connection, as many as
    /// its depth limit leaves room for at this moment (counting every
    /// query admitted since this one); returns how many it took.
    pub(crate) fn extend_within(&mut self, extra: u64) -> u64 {
        let max_depth = self.router.max_depth();
        let taken = self.conn.state().load.add_within(extra, max_depth);
        self.places += taken;
        taken
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.slow {
            self.conn.count_slow(false);
        }
        for _ in 0..self.places {
            self.router.release(&self.conn);
        }
    }
}

/// A place on a shared connection, in transit to a waiting query. If the
/// query gave up before taking it, dropping it frees the place again.
///
/// A place for a slow query is counted in its connection's slow queries
/// from before it is sent, so that the router never sees the connection
/// without it.
pub(crate) struct Handoff {
    conn: Option<Arc<SharedConn>>,
    router: Arc<Router>,
    slow: bool,
}

impl Handoff {
    fn new(conn: Arc<SharedConn>, router: Arc<Router>) -> Handoff {
        Handoff {
            conn: Some(conn),
            router,
            slow: false,
        }
    }

    /// Takes the place; from here on the caller's [`Place`] owns it (and its
    /// count among the slow queries, if it is one).
    fn take(mut self) -> Arc<SharedConn> {
        self.conn.take().expect("a hand-off is taken once")
    }
}

impl queue::Place for Handoff {
    fn route_as_slow(&mut self, slow: bool) {
        if let Some(conn) = &self.conn {
            if slow != self.slow {
                conn.count_slow(slow);
                self.slow = slow;
            }
        }
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        queue::Place::route_as_slow(self, false);
        if let Some(conn) = self.conn.take() {
            self.router.release(&conn);
        }
    }
}

/// What the router decided for one query. `Go` carries a place already
/// claimed on the connection, how many queries were ahead on it, how many
/// were in flight on all shared connections, and whether to open another
/// connection for the queries to come.
enum Route {
    Go {
        conn: Arc<SharedConn>,
        ahead: u64,
        in_flight: u64,
        open_another: bool,
    },
    /// Nothing has room, but a new connection may be opened.
    Open,
    /// Nothing has room: wait.
    Wait,
}

/// How many times a lost race for a connection's last place is retried
/// before the query waits in the queue: another query just took it, and
/// looking again a few times is cheaper than queueing; past that the
/// connections are contended enough that first come, first served is fairer.
const RACES: usize = 4;

impl Router {
    /// Admits one query onto a shared connection, waiting (bounded in count
    /// and time, first come first served) when every connection is full.
    /// `slow` queries are routed as [`costs`](super::costs) describes.
    pub(crate) async fn reserve(self: &Arc<Self>, slow: bool) -> Result<Place<'_>, Error> {
        if self.queue.len() == 0 {
            match self.route(slow) {
                Route::Go {
                    conn,
                    ahead,
                    in_flight,
                    open_another,
                } => {
                    self.note_depth(in_flight + 1);
                    if open_another {
                        self.spawn_open();
                    }
                    if slow {
                        conn.count_slow(true);
                    }
                    return Ok(self.place(conn, ahead, in_flight, slow));
                }
                Route::Open => self.spawn_open(),
                Route::Wait => {}
            }
        }
        self.reserve_waiting(slow).await
    }

    /// A place already claimed (and, for a `slow` query, already counted
    /// among the connection's slow queries).
    fn place(
        self: &Arc<Self>,
        conn: Arc<SharedConn>,
        ahead: u64,
        crowd: u64,
        slow: bool,
    ) -> Place<'_> {
        Place {
            conn,
            ahead,
            crowd,
            slow,
            places: 1,
            router: self,
        }
    }

    /// Waits in the queue for a place.
    async fn reserve_waiting(self: &Arc<Self>, slow: bool) -> Result<Place<'_>, Error> {
        if self.is_closed() {
            return Err(Error::closed());
        }
        if self.shared_limit() == 0 && self.claims.all_mine() {
            return Err(Error::new(
                ErrorKind::Deadlock,
                "this task holds every connection the query could use (checked out \
                 with pool.get()); run the query on that connection, or raise max_size",
            ));
        }
        if self.conns.load().is_empty() {
            if let Some(error) = self.open_refusal() {
                return Err(error);
            }
        }
        let capacity = self.config.queue_capacity;
        let timeout = self.config.wait_timeout;
        let Some((admission, _waiting, first)) = self.queue.join(capacity, slow, timeout) else {
            return Err(Error::queue_full(capacity));
        };
        // Its deadline is the timer's (`deadlines`), shared by all waiters.
        self.watch_deadlines(first);
        // Room may have appeared since the fast path looked, and a new
        // connection may be needed: dispatch, possibly to this very waiter.
        self.dispatch();
        match admission.await {
            Ok(Ok(handoff)) => {
                let conn = handoff.take();
                let ahead = conn.in_flight().saturating_sub(1);
                // Its own place is already counted in its connection's load.
                let in_flight = self.counts().in_flight as u64;
                self.note_depth(in_flight);
                Ok(self.place(conn, ahead, in_flight.saturating_sub(1), slow))
            }
            Ok(Err(error)) => Err(error),
            Err(_) => Err(Error::closed()),
        }
    }

    /// Frees a query's place on `conn`, or hands it straight to the oldest
    /// waiting query.
    #[inline]
    pub(crate) fn release(self: &Arc<Self>, conn: &Arc<SharedConn>) {
        // A place is handed on only while the connection is within its
        // depth (a batch may have taken it past), so the count never ratchets.
        if self.queue.len() > 0 && conn.in_flight() <= self.max_depth() && !conn.load().is_closed()
        {
            let handoff = Handoff::new(Arc::clone(conn), Arc::clone(self));
            match self.queue.admit_oldest(handoff) {
                Ok(()) => return,
                Err(handoff) => drop(handoff.take()), // nobody waits after all
            }
        }
        conn.give_back(self.wire.ticks());
        if self.queue.len() > 0 {
            // The place could not be handed on (its connection is closing):
            // route the waiters elsewhere.
            self.dispatch();
        }
    }

    /// Admits waiting queries, oldest first, while any connection has room;
    /// opens another connection when none has. See the module docs for who
    /// calls it and why only one runs at a time.
    pub(crate) fn dispatch(self: &Arc<Self>) {
        if self.is_closed() {
            self.queue.fail_all(Error::closed);
            return;
        }
        self.note.run(|| self.dispatch_once());
    }

    fn dispatch_once(self: &Arc<Self>) {
        // Waiters already answered stay counted until they wake; only the
        // unanswered ones need a place.
        while self.queue.has_unanswered() {
            let slow = self.queue.oldest_is_slow();
            let conn = match self.route(slow) {
                Route::Go {
                    conn, open_another, ..
                } => {
                    if open_another {
                        self.spawn_open();
                    }
                    conn
                }
                Route::Open => return self.spawn_open(),
                Route::Wait => return,
            };
            let handoff = Handoff::new(conn, Arc::clone(self));
            if let Err(handoff) = self.queue.admit_oldest(handoff) {
                // Everyone gave up meanwhile: give the place back.
                handoff.take().give_back(self.wire.ticks());
                return;
            }
        }
    }

    /// Picks a connection for one query and claims a place on it; see
    /// [`route`](super::route).
    fn route(&self, slow: bool) -> Route {
        let rules = self.rules();
        for _ in 0..RACES {
            let conns = self.conns.load();
            let mut overdue = self.overdue();
            let candidates = conns.iter().map(|conn| overdue.candidate(conn, rules.hol));
            let survey = route::survey(candidates, slow, rules);
            if survey.stale {
                self.prune();
            }
            // While opens fail (a server at its connection limit), there is
            // no room to open: queries use the connections there are.
            let room_to_open = survey.live + self.opening.load(Ordering::Acquire)
                < self.shared_limit()
                && !self.backing_off();
            let index = match route::decide(&survey, room_to_open) {
                Decision::Go(index) => index,
                Decision::Open => return Route::Open,
                Decision::Wait => return Route::Wait,
            };
            let conn = &conns[index];
            let Some(ahead) = conn.state().load.admit(rules.max_depth) else {
                continue; // lost a race for its last place; look again
            };
            return Route::Go {
                conn: Arc::clone(conn),
                ahead,
                in_flight: survey.in_flight,
                open_another: route::open_another(rules, &survey, ahead, room_to_open),
            };
        }
        Route::Wait
    }

    /// What makes a connection overdue, for one routing decision.
    fn overdue(&self) -> Overdue<'_> {
        Overdue {
            after: None,
            now: None,
            router: self,
        }
    }
}

/// Whether a connection owes answers and has read none for `after`
/// nanoseconds. The clock is read once per decision, and `after` worked
/// out once, both only if a connection owes answers.
struct Overdue<'a> {
    after: Option<Option<u64>>,
    now: Option<u64>,
    router: &'a Router,
}

impl Overdue<'_> {
    /// How long a connection that owes answers may read none; `None` with
    /// head-of-line awareness off. A healthy pipelined connection answers
    /// at least once a round trip (which the floor includes); one that does
    /// not for the threshold on top is stuck behind something slow.
    fn after(&mut self) -> Option<u64> {
        let router = self.router;
        *self.after.get_or_insert_with(|| {
            router.config.slow_query_threshold.map(|threshold| {
                let floor = router.costs.floor().unwrap_or(threshold);
                u64::try_from(threshold.saturating_add(floor).as_nanos()).unwrap_or(u64::MAX)
            })
        })
    }
}

impl Overdue<'_> {
    /// A snapshot of `conn` for [`route`](super::route); the head-of-line
    /// fields only when `hol` is on.
    #[inline]
    fn candidate(&mut self, conn: &SharedConn, hol: bool) -> Candidate {
        let load = conn.load();
        let mut candidate = Candidate {
            in_flight: load.in_flight(),
            closed: load.is_closed(),
            draining: conn.state().counts.is_draining(),
            ..Candidate::default()
        };
        if hol && !candidate.closed {
            let state = conn.state();
            // A query whose caller dropped it gives its place back while it
            // is still on the wire: the wire's count keeps it in the load.
            let wire_depth = state.counts.depth();
            candidate.in_flight = candidate.in_flight.max(wire_depth);
            candidate.slow = conn.slow_in_flight();
            candidate.last_ready = state.counts.last_ready_nanos();
            candidate.overdue = wire_depth > 0
                && self.after().is_some_and(|after| {
                    let now = *self.now.get_or_insert_with(|| self.router.wire.now_nanos());
                    now.saturating_sub(candidate.last_ready) > after
                });
        }
        candidate
    }
}
