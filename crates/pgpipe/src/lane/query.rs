//! One query, end to end.
//!
//! ```text
//! guard ─► closed? ─► pipelining off: check out ─► conn::run (deadline, cancel)
//!                 └─► pipelining on:  costs say slow? ─► router.reserve (route or wait)
//!                                      ─► batch window ─► conn::run (deadline: router.late)
//!                                      ─► learn cost ─► retry if never sent ─► free the place
//! ```
//!
//! Every public way to run one query ([`Pool::query`](crate::Pool::query)
//! and its siblings, [`Slow`](crate::Slow), [`Executor`](crate::Executor)
//! for the pool) lands in [`run`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::types::ToSql;

use super::Lane;
use super::alone;
use super::cost::Cost;
use super::evict;
use super::housekeeping;
use super::retry::Retries;
use super::settings::{How, block_budget, call_settings, needs_cleanup};
use crate::answer::{Op, Reply};
use crate::conn::budget::{UnderBudget, budget_ms, stopped_by_budget};
use crate::conn::run::{self, Around, Prepare};
use crate::error::{Error, ErrorKind};
use crate::metrics::{CloseReason, Counting};
use crate::protocol::sql_guard::{self, Code};
use crate::shared::{Place, SharedConn};
use crate::trace::Trace;

/// The span of one query, with the `tracing` feature; see
/// [`trace`](crate::trace) for its fields.
#[cfg(feature = "tracing")]
fn span(pool: &Lane, sql: &str, slow: bool) -> tracing::Span {
    tracing::info_span!(
        target: "pgpipe",
        "pgpipe.query",
        db.system.name = "postgresql",
        db.operation.name = crate::trace::operation(sql),
        pgpipe.pool = %pool.name(),
        pgpipe.route = if pool.config().pipelining { "shared" } else { "exclusive" },
        pgpipe.slow = slow,
        pgpipe.ahead = tracing::field::Empty,
        pgpipe.queued_us = tracing::field::Empty,
        error.type = tracing::field::Empty,
        db.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// Runs one query, in its span with the `tracing` feature and counted in
/// the metrics when there are metrics, as `how` asks.
///
/// Not an `async fn`: it hands back [`one`]'s future itself. Every poll of
/// a query passes through each `async fn` between the caller and the wire,
/// and each layer costs its state's save and restore, and moving the answer
/// up (issue #25 item 3: about 60 instructions per query a layer).
#[inline]
pub(crate) fn run(
    pool: &Arc<Lane>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    op: Op,
    how: How,
) -> impl Future<Output = Result<Reply, Error>> {
    let who = if how.slow { Who::Slow } else { Who::Caller };
    one(pool, sql, params, op, (who, how.timeout))
}

/// Runs SQL of the pool's own that reads only the catalog with built-in
/// functions: no guard, no cleanup, no wait for the catalog (it is the
/// query that learns it), no span and not counted.
pub(crate) fn run_internal<'a>(
    pool: &'a Arc<Lane>,
    sql: &'a str,
    params: &'a [&'a (dyn ToSql + Sync)],
) -> impl Future<Output = Result<Reply, Error>> + 'a {
    one(pool, sql, params, Op::Query, (Who::Pool, None))
}

/// Who runs a query.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    /// A caller, with nothing said of its cost.
    Caller,
    /// A caller who says it is slow.
    Slow,
    /// The pool itself: [`run_internal`].
    Pool,
}

/// [`run`] and [`run_internal`]: one layer for every concern (admission,
/// the shared path and its retries, metrics, tracing), the rare paths
/// boxed. `timeout`: the caller's own deadline, instead of the pool's.
async fn one(
    pool: &Arc<Lane>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    op: Op,
    (who, timeout): (Who, Option<Duration>),
) -> Result<Reply, Error> {
    let (slow, internal) = (who == Who::Slow, who == Who::Pool);
    // The span is not entered around the future (`Instrument` would move
    // the whole query future into its wrapper: two copies of a few KiB per
    // query); it lives while the query runs, and its fields are recorded on
    // it directly.
    #[cfg(feature = "tracing")]
    let span = if internal {
        tracing::Span::none()
    } else {
        span(pool, sql, slow)
    };
    #[cfg(feature = "tracing")]
    let trace = Trace::new(&span);
    #[cfg(not(feature = "tracing"))]
    let trace = Trace::new();
    #[cfg(feature = "tracing")]
    let started = (!internal)
        .then_some(pool.config().log_slow_statements)
        .flatten()
        .map(|at| (at, Instant::now()));
    let counting = (!internal)
        .then(|| pool.metrics())
        .flatten()
        .map(|metrics| Counting::start(metrics, pool.mode()));
    let waiting = counting.as_ref().map(Counting::started);
    let code = match admit(pool, sql, internal) {
        Ok(Some(code)) => Ok(code),
        // A lane's first queries wait until it has tried to learn its
        // catalog, then are judged again (the verdict may change).
        Ok(None) => {
            crate::lane::catalog::ready(pool).await;
            pool.wire().check(sql)
        }
        Err(error) => Err(error),
    };
    // Before a catalog is read (a server or pooler not answering yet),
    // every statement counts as unproven: then they stay on the shared
    // path, cleaned behind, with its retries, rather than all running
    // alone; what runs alone is code a catalog in hand does not prove.
    let unproven = matches!(code, Ok(Code::Unknown)) && pool.wire().catalog_full().is_loaded();
    let clean = code.map(|code| !internal && needs_cleanup(pool, code));
    let cost = pool.config().pipelining.then(|| Cost::of(pool, sql, slow));
    let result = match (clean, cost) {
        // The shared path, inline: see `run`. Not for code the guard cannot
        // prove: whatever it leaves in the session is there until its
        // cleanup, and another task's query pipelined in between (from
        // another thread, between the two) would see it; and its code may
        // run when it is prepared (a literal's input runs a domain's check
        // at parse time), which on the shared path goes out on its own.
        (Ok(clean), Some(cost)) if !cost.alone && !unproven => {
            let router = pool.router();
            let settings = call_settings(pool, internal, timeout);
            let mut retries = Retries::default();
            // Behind a transaction pooler the budget goes with the
            // statement, in a transaction block of its own.
            let block = if clean { None } else { block_budget(pool, sql) };
            let around = block.map_or(Around::cleanup(clean), |b| Around::Block(budget_ms(b)));
            let shared = loop {
                let place = router.reserve(cost.is_slow()).await;
                // One clock read ends the wait and starts the run's cost.
                let admitted = (waiting.is_some() || cost.learns()).then(Instant::now);
                if retries.none_unsent() {
                    // Failed waits too: they are the longest.
                    pool.waited_until(waiting, admitted);
                }
                let place = match place {
                    Ok(place) => place,
                    Err(error) => break Shared::Done(Err(error)),
                };
                trace.admitted(place.ahead, waiting);
                router.batch_window(&place).await;
                let alone = Alone::sent(pool, &place, waiting.is_some() && retries.none_unsent());
                let conn = &place.conn;
                // The head-of-line budget it is sent under, and when, if the
                // clock was read anyway or a deadline needs it.
                let sent = match block {
                    // Timed always: a shorter `statement_timeout` of the
                    // role's stays, and stops it sooner, as its own.
                    Some(budget) => UnderBudget::now(Some(budget)),
                    None => conn.state().session.budget().map(|budget| UnderBudget {
                        budget,
                        at: admitted.or_else(|| settings.query_timeout.map(|_| Instant::now())),
                    }),
                };
                let prepare = Prepare::Spawned(conn);
                let target = conn.conn().target();
                let query = || run::run(target, prepare, sql, params, op, settings.limits, around);
                let result = match settings.query_timeout {
                    // Without a deadline, the query's future is awaited here
                    // rather than inside `within_deadline`'s: one layer less
                    // for every poll.
                    None => query().await,
                    deadline => {
                        run::within_deadline(deadline, target, query, || router.late(conn)).await
                    }
                };
                if result.is_ok() {
                    cost.learn(router.costs(), admitted);
                    alone.answered(pool, conn);
                }
                if let Err(e) = &result {
                    if e.kind() == ErrorKind::ConnectionLost {
                        // The connection is going (a FATAL error arrives
                        // before the socket closes): hand no freed place on
                        // it to a waiting query, which would be lost with it.
                        trace.lost(e);
                        router.retire(conn);
                        // Nor, back in the pool, to its next user. (One
                        // quarantined before this query went out is
                        // reset instead.)
                        if !e.is_unsent() {
                            conn.conn().closing(CloseReason::Broken);
                        }
                    }
                }
                match result {
                    // Skipped by the server behind a neighbour's failure in
                    // its read group: it never ran, and it is not the
                    // caller's failure.
                    Err(e) if e.is_skipped() && retries.take_skipped() => {
                        if let Some(metrics) = pool.metrics() {
                            metrics.wire.resent.inc();
                        }
                    }
                    // Never sent: run it on another connection. Once sent,
                    // never again.
                    Err(e) if e.is_unsent() && retries.take_unsent(e.is_quarantined()) => {}
                    // Stopped by the server at the head-of-line budget:
                    // nothing it did committed.
                    Err(e) if stopped_by_budget(&e, sent) => {
                        let ran_for = sent.map_or(Duration::ZERO, UnderBudget::ran_for);
                        // Evicted with its connection: nothing new is
                        // admitted behind it there.
                        router.retire(conn);
                        break Shared::Stopped(ran_for, place);
                    }
                    result => break Shared::Done(result),
                }
            };
            match shared {
                Shared::Done(result) => result,
                Shared::Stopped(ran_for, place) => {
                    let query = (sql, params, op);
                    let run = (clean, internal, settings.query_timeout);
                    Box::pin(evict::evicted(pool, place, query, run, cost.key, ran_for)).await
                }
            }
        }
        // On a connection of its own: without pipelining, and what must not
        // share a pipeline. Boxed: a pool takes the path without pipelining
        // always or never, and the rest rarely; carried inline, its state
        // would size every pipelined query's future.
        (Ok(clean), _) => {
            let settings = call_settings(pool, internal, timeout);
            Box::pin(alone::run_alone(
                pool, sql, params, op, clean, waiting, settings,
            ))
            .await
        }
        (Err(error), _) => Err(error),
    };
    if unproven && sql_guard::changes_catalog(sql) {
        // Its answer came: read the catalog again even if a read raced the
        // commit (see the lane's `catalog` module).
        pool.wire().catalog_changed();
    }
    if let Some(counting) = counting {
        counting.finish(result.as_ref().map(drop));
    }
    #[cfg(feature = "tracing")]
    {
        if let Err(error) = &result {
            trace.failed(error);
        }
        if let Some((at, started)) = started {
            let took = started.elapsed();
            if took >= at {
                trace.slow(sql, took, result.is_ok());
            }
        }
    }
    result
}

/// How a query on the shared path ended.
enum Shared<'a> {
    /// With its answer or its error.
    Done(Result<Reply, Error>),
    /// Stopped by the server at the head-of-line budget, after running this
    /// long: it runs again alone on its connection, retired (see
    /// [`evict`](super::evict)), whose place it still holds.
    Stopped(Duration, Place<'a>),
}

/// Admits `sql` to the lane: the guard's verdict, the pool open, the
/// lane's housekeeping started. The verdict, or `None` while the lane has
/// not tried to learn its catalog (it may change once it has). The pool's
/// own SQL (`internal`) is let through as proven, never cleaned behind.
#[inline]
fn admit(pool: &Arc<Lane>, sql: &str, internal: bool) -> Result<Option<Code>, Error> {
    if internal {
        return Ok(Some(Code::Known));
    }
    let code = pool.wire().check(sql)?;
    if pool.is_closed() {
        return Err(Error::closed());
    }
    housekeeping::start(pool);
    if !pool.wire().catalog_tried() {
        return Ok(None);
    }
    Ok(Some(code))
}

/// A query sent alone (nothing in flight on its connection), for latency
/// saved: when it was sent, and the lane's statement-cache misses then. Its
/// time from there to its answer is what it would take with pipelining off
/// and a connection free, unless a statement was prepared meanwhile (a
/// round trip more: not counted). Only its first try, and only with
/// metrics.
///
/// Only while the pool holds no more queries than it has connections: a
/// pool without pipelining never runs more at once, so its client never
/// does more work at once. Past that, the pipelined pool's own work (its
/// answers to read, its callers to wake) keeps this query's task and
/// connection waiting for a thread: under load, 2-3 times the quiet time,
/// which the pool without pipelining, at a fraction of the throughput,
/// would not wait.
struct Alone(Option<(Instant, u64)>);

impl Alone {
    #[inline]
    fn sent(pool: &Lane, place: &Place<'_>, counted: bool) -> Alone {
        let misses = || pool.metrics().map_or(0, |m| m.statement_misses());
        let quiet = place.crowd < pool.config().max_size as u64;
        Alone((counted && place.ahead == 0 && quiet).then(|| (Instant::now(), misses())))
    }

    /// Also how long after its answer was read this task ran again: what
    /// a task woken by another waits for a thread now.
    #[inline]
    fn answered(&self, pool: &Lane, conn: &SharedConn) {
        if let (Some((sent, misses)), Some(metrics)) = (self.0, pool.metrics()) {
            if metrics.statement_misses() != misses {
                return;
            }
            let read = conn.state().counts.last_ready_nanos();
            let woke = pool.wire().now_nanos().saturating_sub(read);
            metrics
                .saved
                .alone(sent.elapsed(), Duration::from_nanos(woke));
        }
    }
}
