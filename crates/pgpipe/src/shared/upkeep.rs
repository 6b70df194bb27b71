//! The router's part of the pool's housekeeping tick, and what it does with
//! a query that ran out of time on a shared connection.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Router, SharedConn};
use crate::conn::run::Late;
use crate::conn::{ConnState, PgConn};
use crate::metrics::CloseReason;

/// A shared connection with nothing in flight for this many ticks goes back
/// to the idle pool.
const SHARED_IDLE_TICKS: u64 = 10;

/// A duration in ticks of `tick`, rounded up; saturating.
fn ticks(duration: Duration, tick: Duration) -> u64 {
    u64::try_from(duration.as_nanos().div_ceil(tick.as_nanos().max(1))).unwrap_or(u64::MAX)
}

impl Router {
    /// One housekeeping tick of the shared path: starts a new window for the
    /// learned costs every `rotate` ticks, kills stalled connections, retires
    /// expired and idle ones, fits the shared path to its limit, and
    /// dispatches waiters as a safety net (they are normally admitted the
    /// moment room appears).
    pub(crate) fn tick(self: &Arc<Self>, tick: Duration, rotate: bool) {
        if rotate {
            self.costs.rotate();
        }
        self.watch_stalls(tick);
        self.expire(tick);
        self.prune();
        self.rebalance();
        self.retire_idle(SHARED_IDLE_TICKS);
        self.top_up();
        self.dispatch();
        // Waiters' deadlines have a timer of their own (`deadlines`); this
        // is its safety net, should its task have ended with a runtime.
        self.expire_waiters();
        if self.queue.len() > 0 {
            self.watch_deadlines(false);
        }
    }

    /// Opens connections until `min_idle` are open, one at a time.
    pub(crate) fn top_up(self: &Arc<Self>) {
        let wanted = self.config.min_idle;
        if wanted == 0
            || self.is_closed()
            || self.pg.status().size >= wanted
            || self.topping_up.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let router = Arc::clone(self);
        tokio::spawn(async move {
            // Held until there are enough (a connection given back at once
            // would only be taken again), then all given back to the idle set.
            let mut held = Vec::new();
            while !router.is_closed() && router.pg.status().size < wanted {
                match router.pg.get().await {
                    Ok(conn) => held.push(conn),
                    Err(_) => break, // the server refuses: the next tick tries again
                }
            }
            drop(held);
            router.topping_up.store(false, Ordering::Release);
        });
    }

    /// A query ran out of time on a shared connection. Whatever holds it up
    /// would hold up new queries too: route no more work there. A cancel
    /// request hits whatever the backend runs, so cancel only if this query
    /// is the only one in flight there; else let it finish, its answer
    /// discarded (tokio-postgres reads past it).
    pub(crate) fn late(&self, conn: &SharedConn) -> Late {
        let alone = conn.in_flight() <= 1 && conn.state().counts.depth() <= 1;
        self.retire(conn);
        if alone { Late::Cancel } else { Late::Abandon }
    }

    /// The no-progress watchdog: kills shared connections that owe answers
    /// and have received nothing for `stall_timeout` (a stalled network, a
    /// stopped backend). Their queries fail with `ConnectionLost` at once
    /// instead of hanging, and the connection is never handed out again.
    fn watch_stalls(&self, tick: Duration) {
        let Some(stall) = self.config.stall_timeout else {
            return;
        };
        let limit = ticks(stall, tick);
        let now = self.wire.ticks();
        let conns = self.conns.load();
        let running_slow = |state: &ConnState| {
            conns
                .iter()
                .any(|c| std::ptr::eq(c.state(), state) && c.slow_in_flight() > 0)
        };
        // How long a connection may stay silent: the server answers every
        // statement under the head-of-line budget by the budget (an error
        // if it must stop it), so a session under one that says nothing
        // for the budget and `stall_timeout` on top has stopped answering,
        // whatever runs there. Only a session under no budget of the pool's
        // may be running a long statement on a live backend: one the costs
        // call slow (learned, a guess) is then left to `query_timeout`.
        let silence = |state: &ConnState| match state.session.budget() {
            Some(budget) => Some(limit.saturating_add(ticks(budget, tick))),
            None => (!running_slow(state)).then_some(limit),
        };
        // Shared connections, and retired or returned ones still owing
        // answers; never one checked out with `get()`.
        for state in self.wire.states() {
            let silent = now.saturating_sub(state.counts.last_progress_tick());
            let exclusive = state.life.is_exclusive();
            let owes = !exclusive && state.counts.depth() > 0 && !state.load.is_dead();
            if owes && silence(&state).is_some_and(|limit| silent >= limit) {
                crate::trace::pool_warn!(
                    "a shared connection owed answers and received nothing for stall_timeout: \
                     killed, its queries fail with ConnectionLost"
                );
                state.kill(CloseReason::Stalled);
            }
        }
        self.prune();
    }

    /// Retires shared connections past `max_lifetime` (they drain, then
    /// close), and closes idle ones past it or past `idle_timeout`.
    fn expire(&self, tick: Duration) {
        let conns = self.conns.load();
        for conn in conns.iter().filter(|c| c.conn().is_expired()) {
            self.retire(conn);
        }
        let idle_limit = self.config.idle_timeout.map(|idle| ticks(idle, tick));
        let now = self.wire.ticks();
        let idle_too_long = |conn: &PgConn| {
            idle_limit
                .is_some_and(|limit| now.saturating_sub(conn.state.life.returned_tick()) >= limit)
        };
        // Idle ones past `idle_timeout` close only down to `min_idle`;
        // expired ones close anyway (the top-up opens fresh ones).
        let mut spare = self.pg.status().size.saturating_sub(self.config.min_idle);
        let removed = self.pg.retain(|conn, _| {
            let remove = conn.is_expired() || (spare > 0 && idle_too_long(conn));
            if remove {
                spare = spare.saturating_sub(1);
            }
            !remove
        });
        for conn in removed.removed {
            conn.closing(if conn.is_expired() {
                CloseReason::MaxLifetime
            } else {
                CloseReason::Idle
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_become_whole_ticks_without_overflow() {
        let tick = Duration::from_millis(100);
        assert_eq!(ticks(Duration::from_millis(250), tick), 3);
        assert_eq!(ticks(Duration::from_millis(100), tick), 1);
        assert_eq!(
            ticks(Duration::MAX, tick),
            u64::MAX,
            "saturates, never wraps to 0"
        );
    }
}
