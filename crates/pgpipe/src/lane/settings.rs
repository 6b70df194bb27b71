//! How one call runs, beyond its SQL: what the caller asked for ([`How`]:
//! slow, a deadline of its own), the pool's caps and deadline
//! ([`run_settings`]), and what goes out around it on the shared path (a
//! cleanup behind it, or behind a transaction pooler a block carrying the
//! head-of-line budget).

use std::time::Duration;

use super::Lane;
use crate::config::SessionCleanup;
use crate::conn::run::{Limits, RunSettings};
use crate::protocol::sql_guard::{self, Code};

/// How a caller asks for one query to run: marked slow (it runs on a
/// connection of its own), and under a deadline of its own instead of the
/// pool's `query_timeout` ([`Pool::within`](crate::Pool::within)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct How {
    pub(crate) slow: bool,
    pub(crate) timeout: Option<Duration>,
}

impl How {
    /// A plain query: not slow, under the pool's `query_timeout`.
    pub(crate) const PLAIN: How = How {
        slow: false,
        timeout: None,
    };
}

/// How one call runs: [`run_settings`], under the caller's own deadline
/// where it gave one.
#[inline]
pub(super) fn call_settings(pool: &Lane, internal: bool, timeout: Option<Duration>) -> RunSettings {
    let settings = run_settings(pool, internal);
    match timeout {
        None => settings,
        timeout => RunSettings {
            query_timeout: timeout,
            ..settings
        },
    }
}

/// How a query runs: the pool's caps on answers, but not on the pool's own
/// (the catalog's answer is thousands of names, whatever a caller's
/// `max_result_rows`).
#[inline]
pub(super) fn run_settings(pool: &Lane, internal: bool) -> RunSettings {
    let settings = pool.run_settings();
    if internal {
        RunSettings {
            limits: Limits::default(),
            ..settings
        }
    } else {
        settings
    }
}

/// The head-of-line budget `sql` carries in a transaction block of its own
/// behind a transaction pooler (see `conn::run`'s `block`): none elsewhere
/// (the session carries it there), and none for a statement that cannot
/// run in a block.
pub(super) fn block_budget(pool: &Lane, sql: &str) -> Option<Duration> {
    let config = pool.config();
    let budget = config.head_of_line_budget?;
    (config.pooler.is_transaction() && sql_guard::fits_a_block(sql)).then_some(budget)
}

/// Whether the session is cleaned right behind this query (see
/// [`SessionCleanup`]).
pub(crate) fn needs_cleanup(pool: &Lane, code: Code) -> bool {
    let config = pool.config();
    // Behind a transaction pooler there is no session of the connection's
    // own to clean (and a cleanup pipelined behind a query would be a
    // second Sync in flight).
    !config.pooler.is_transaction()
        && (code == Code::Unknown || config.session_cleanup == SessionCleanup::EveryQuery)
}
