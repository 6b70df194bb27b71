//! A query on a connection of its own, taken from the lane's exclusive
//! side: always with pipelining off; with it on, for what must never have
//! another task's query pipelined behind it (a query run through
//! [`Pool::slow`](crate::Pool::slow), a statement the server once stopped
//! at the head-of-line budget, and that statement's run again).
//!
//! With pipelining on and a `query_timeout`, the deadline is the server's
//! too: the query's `statement_timeout` is set to what is left of it, in
//! the same write as the query, so that a query past its deadline is
//! stopped by the server (nothing it did commits, and it never runs later)
//! rather than raced by a cancel request. The client's own deadline stays,
//! a little later, for a server or network that does not answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::types::ToSql;

use super::Lane;
use crate::answer::{Op, Reply};
use crate::conn::budget::past_deadline;
use crate::conn::run::{self, RunSettings, both_in_order};
use crate::error::Error;
use crate::exclusive::Holder;

/// How much later than the server's deadline the client gives up on an
/// answer (a stalled network, a frozen server), and cancels.
pub(super) const BACKSTOP: Duration = Duration::from_millis(500);

/// Runs `sql` on a connection of its own, under `settings` (its answer's
/// caps, and as its deadline what is left of the caller's
/// `query_timeout`); `waiting` is when the caller started waiting, for the
/// metrics. With pipelining on, the server enforces the deadline (see the
/// module).
pub(super) async fn run_alone(
    pool: &Arc<Lane>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    op: Op,
    clean: bool,
    waiting: Option<Instant>,
    settings: RunSettings,
) -> Result<Reply, Error> {
    // What never reached the server (a connection that died idle: its end
    // not read yet when it was checked out) goes to another one, twice at
    // most, as on the shared path. Once sent, never again.
    let mut tries = 0;
    loop {
        let waiting = waiting.filter(|_| tries == 0);
        match once(pool, (sql, params, op), clean, waiting, settings).await {
            Err(e) if e.is_unsent() && tries < 2 => tries += 1,
            result => return result,
        }
    }
}

async fn once(
    pool: &Arc<Lane>,
    (sql, params, op): (&str, &[&(dyn ToSql + Sync)], Op),
    clean: bool,
    waiting: Option<Instant>,
    settings: RunSettings,
) -> Result<Reply, Error> {
    let conn = pool.checkout(Holder::Pool).await;
    pool.waited(waiting);
    let conn = conn?;
    let pg = conn.pg_conn();
    let target = pg.target();
    let deadline = settings.query_timeout;
    let Some(deadline) = deadline.filter(|_| pool.config().pipelining) else {
        return run::run_alone(target, sql, params, op, settings, clean).await;
    };
    let settings = RunSettings {
        query_timeout: Some(deadline.saturating_add(BACKSTOP)),
        ..settings
    };
    let started = Instant::now();
    let (set, result) = both_in_order(
        pg.apply_budget(deadline),
        run::run_alone(target, sql, params, op, settings, clean),
    )
    .await;
    past_deadline(result, set, started)
}
