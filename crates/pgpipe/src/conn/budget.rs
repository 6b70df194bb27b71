//! The head-of-line budget: a `statement_timeout` that the server enforces
//! in a shared connection's session, so that no statement holds the
//! queries pipelined behind it for longer (see
//! [`PoolConfig::head_of_line_budget`](crate::PoolConfig::head_of_line_budget)).
//!
//! The server is the one that stops the statement: its implicit transaction
//! rolls back, so nothing it did commits, and the statements behind it (each
//! with a `Sync` of its own) run on. No cancel request is sent, so none can
//! land on the next statement.

use std::time::{Duration, Instant};

use tokio_postgres::SimpleQueryMessage;
use tokio_postgres::error::SqlState;

use super::PgConn;
use super::state::held::POOL_OWN;
use crate::error::Error;

/// Sets the session's `statement_timeout` to `ms`, unless the session's
/// own (what `RESET` leaves: the role's, the database's, the start-up
/// packet's) is already shorter, which then stays: the server decides, and
/// answers a row only when it took the budget. Read with
/// `current_setting` (a `pg_settings` scan builds every setting, about
/// 0.6 ms of server time, and a session cleanup runs this).
pub(crate) fn budget_sql(ms: u32) -> String {
    format!(
        "{POOL_OWN}RESET statement_timeout; {}",
        take_budget_sql(ms, false)
    )
}

/// `statement_timeout` = `ms`, for the session or (`local`) for the
/// transaction, unless the one in force is already shorter; a row named
/// `pgpipe_budget` comes back only when the budget was taken.
pub(crate) fn take_budget_sql(ms: u32, local: bool) -> String {
    format!(
        "SELECT pg_catalog.set_config('statement_timeout', '{ms}', {local}) AS pgpipe_budget \
         WHERE (SELECT v = 0 OR v > {ms} FROM (SELECT pg_catalog.date_part('epoch', \
         pg_catalog.current_setting('statement_timeout')::pg_catalog.interval) * 1000 AS v) x)"
    )
}

/// Turns off, for a shared session, the server's limits that end the
/// *session* rather than a statement (where the server has them and the
/// role or database set one): `transaction_timeout` (PostgreSQL 17+, FATAL
/// `25P04`: on a shared connection it would fail every neighbour in
/// flight) and `idle_session_timeout` (14+: it would close a shared
/// connection between two queries, racing the next one). Statements stay
/// bounded by the budget and `statement_timeout`.
pub(crate) const SHARED_GUARDS_SQL: &str = "/* pgpipe */ SELECT \
     pg_catalog.set_config(n, '0', false) AS pgpipe_guard FROM pg_catalog.unnest(\
     '{transaction_timeout,idle_session_timeout}'::pg_catalog.text[]) n \
     WHERE pg_catalog.current_setting(n, true) <> '0'";

/// The budget in whole milliseconds, as PostgreSQL keeps it (validated to
/// fit an `int`).
pub(crate) fn budget_ms(budget: Duration) -> u32 {
    u32::try_from(budget.as_millis().max(1)).unwrap_or(i32::MAX as u32)
}

impl PgConn {
    /// Readies the session for sharing: the limits that end a session off
    /// ([`SHARED_GUARDS_SQL`]), and the head-of-line `budget` if there is
    /// one, in one round trip.
    pub(crate) async fn share_session(&self, budget: Option<Duration>) -> Result<(), Error> {
        let ms = budget.map(budget_ms);
        let mut sql = String::from(SHARED_GUARDS_SQL);
        if let Some(ms) = ms {
            sql.push_str("; ");
            sql.push_str(&budget_sql(ms));
        }
        let answers = self
            .client
            .simple_query(&sql)
            .await
            .map_err(|e| Error::from_query(e, self.client.is_closed()))?;
        // The session may carry the settings: reset before an exclusive user.
        self.state.session.mark_needs_reset();
        self.state.session.set_guarded();
        self.state.session.set_budget(if took_budget(&answers) {
            ms.unwrap_or(0)
        } else {
            0
        });
        Ok(())
    }

    /// Makes the server enforce `budget` on this session's statements, and
    /// notes whether it does (a shorter `statement_timeout` of the session's
    /// own wins, and is then the caller's own limit, not the pool's). The
    /// budget in force after it, for the statements sent right behind it.
    pub(crate) async fn apply_budget(&self, budget: Duration) -> Result<Option<Duration>, Error> {
        let ms = budget_ms(budget);
        let answers = self
            .client
            .simple_query(&budget_sql(ms))
            .await
            .map_err(|e| Error::from_query(e, self.client.is_closed()))?;
        let took = took_budget(&answers);
        // The session may carry the setting: reset before an exclusive user.
        self.state.session.mark_needs_reset();
        self.state.session.set_budget(if took { ms } else { 0 });
        Ok(took.then_some(Duration::from_millis(u64::from(ms))))
    }
}

impl PgConn {
    /// Gives the session its own `statement_timeout` back (the pool's
    /// budget off), for a statement that must run to its end on it.
    pub(crate) async fn lift_budget(&self) -> Result<(), Error> {
        self.client
            .simple_query(&format!("{POOL_OWN}RESET statement_timeout"))
            .await
            .map_err(|e| Error::from_query(e, self.client.is_closed()))?;
        self.state.session.set_budget(0);
        Ok(())
    }
}

/// Whether the server took the budget: [`budget_sql`]'s row came back.
fn took_budget(answers: &[SimpleQueryMessage]) -> bool {
    answers.iter().any(|m| {
        matches!(m, SimpleQueryMessage::Row(row)
            if row.columns().first().map(|c| c.name()) == Some("pgpipe_budget"))
    })
}

/// A statement sent under a head-of-line budget: the budget in force when
/// it was sent, in wire order (taken then, not read from the session's
/// record when its answer comes: a later statement's may already have
/// changed it), and when it was sent, where the clock was read anyway.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UnderBudget {
    pub(crate) budget: Duration,
    pub(crate) at: Option<Instant>,
}

impl UnderBudget {
    /// Sent now under `budget`, if there is one.
    pub(crate) fn now(budget: Option<Duration>) -> Option<UnderBudget> {
        budget.map(|budget| UnderBudget {
            budget,
            at: Some(Instant::now()),
        })
    }

    /// How long it ran: since it was sent, or at least the budget.
    pub(crate) fn ran_for(self) -> Duration {
        self.at.map_or(self.budget, |at| at.elapsed())
    }
}

/// The answer of a statement sent at `started` right behind `set`, the
/// [`PgConn::apply_budget`] that made its deadline the server's: the
/// server's stop at it is the caller's `QueryTimeout`, and it did not run.
pub(crate) fn past_deadline<T>(
    result: Result<T, Error>,
    set: Result<Option<Duration>, Error>,
    started: Instant,
) -> Result<T, Error> {
    let sent = set.ok().flatten().map(|budget| UnderBudget {
        budget,
        at: Some(started),
    });
    match result {
        Err(e) if stopped_by_budget(&e, sent) => Err(Error::query_timeout_stopped(
            "the server stopped it at its deadline",
        )),
        result => result,
    }
}

/// Whether `error` is the server stopping a statement at the budget it was
/// `sent` under: `57014`, and, where the send was timed, at least the budget
/// after it (the server's clock starts when it reads the statement, after
/// the send), so that a cancel from elsewhere landing before the budget
/// stays the caller's own error. Untimed (no clock read on the hot path
/// for it), the server's code is taken as it is.
pub(crate) fn stopped_by_budget(error: &Error, sent: Option<UnderBudget>) -> bool {
    error.code() == Some(&SqlState::QUERY_CANCELED)
        && sent.is_some_and(|sent| sent.at.is_none_or(|at| at.elapsed() >= sent.budget))
}
