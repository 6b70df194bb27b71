//! A statement the server stopped at the head-of-line budget on a shared
//! connection: evicted with its connection, and run again there, alone.
//!
//! The connection is taken out of routing when the statement is stopped
//! (the router opens another for new work), so nothing is admitted behind
//! it; what was already pipelined there runs first, each within the
//! budget. The statement then runs again with the session's own
//! `statement_timeout` back (or, with a `query_timeout`, what is left of it,
//! enforced by the server), and its connection goes back to deadpool, reset,
//! when it is done. No second connection is needed: it works with
//! `max_size(1)`, a role's connection limit reached, and a pool closing.

use std::time::{Duration, Instant};

use tokio_postgres::types::ToSql;

use super::Lane;
use super::alone::BACKSTOP;
use crate::answer::{Op, Reply};
use crate::conn::PgConn;
use crate::conn::budget::{budget_ms, past_deadline};
use crate::conn::run::{self, Around, Late, Prepare, both_in_order};
use crate::error::Error;
use crate::shared::Place;
use crate::shared::costs::CostKey;

/// Runs the stopped query again on its place's connection (already
/// retired), within what is left of its `query_timeout` (the pool's, or
/// the caller's own), and remembers it:
/// its next runs go to a connection of their own from the start. The caller
/// sees latency, not an error.
pub(super) async fn evicted(
    pool: &Lane,
    place: Place<'_>,
    (sql, params, op): (&str, &[&(dyn ToSql + Sync)], Op),
    (clean, internal, query_timeout): (bool, bool, Option<Duration>),
    key: Option<CostKey>,
    ran_for: Duration,
) -> Result<Reply, Error> {
    if let Some(key) = key {
        pool.router().costs().block(key);
    }
    // The pool's own (its catalog read) is not a caller's statement.
    if let Some(metrics) = pool.metrics().filter(|_| !internal) {
        metrics.wire.evicted.inc();
    }
    let limits = super::settings::run_settings(pool, internal).limits;
    let left = query_timeout.map(|t| t.saturating_sub(ran_for));
    if left.is_some_and(|left| left.is_zero()) {
        return Err(Error::query_timeout_stopped(
            "the server stopped it at the head-of-line budget, and its deadline passed",
        ));
    }
    let conn = &place.conn;
    let pg = conn.conn();
    let target = pg.target();
    // Behind a transaction pooler, where it ran in a block of its own: again
    // in one, under what is left of its deadline, or with no limit of the
    // pool's (no session setting, which would reach other clients).
    let in_block = super::settings::block_budget(pool, sql).is_some();
    let rerun = || async {
        let started = Instant::now();
        if in_block {
            let around = left.map_or(Around::Nothing, |left| Around::Block(budget_ms(left)));
            let prepare = Prepare::Spawned(conn);
            let result = run::run(target, prepare, sql, params, op, limits, around).await;
            return past_deadline(result, Ok(left), started);
        }
        let around = Around::cleanup(clean);
        let query = run::run(
            target,
            Prepare::Spawned(conn),
            sql,
            params,
            op,
            limits,
            around,
        );
        let (set, result) = both_in_order(limit(pg, left), query).await;
        past_deadline(result, set, started)
    };
    // Others may still be in flight ahead of it: never a cancel request.
    let backstop = left.map(|left| left.saturating_add(BACKSTOP));
    run::within_deadline(backstop, target, rerun, || Late::Abandon).await
}

/// The session's own `statement_timeout` back, or `left` if that is
/// shorter.
async fn limit(pg: &PgConn, left: Option<Duration>) -> Result<Option<Duration>, Error> {
    match left {
        Some(left) => pg.apply_budget(left).await,
        None => pg.lift_budget().await.map(|()| None),
    }
}
