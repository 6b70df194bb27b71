//! The session cleanup that goes out right behind code the guard cannot
//! read, in the same write, and is settled before the query's answer goes
//! back to its caller.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;

use tokio_postgres::SimpleQueryMessage;

use super::{Limits, Prepared, Target, Usable, send};
use crate::answer::{Op, Reply};
use crate::conn::budget::{SHARED_GUARDS_SQL, budget_ms, budget_sql};
use crate::conn::params::Params;
use crate::conn::{POOL_OWN, SESSION_CLEANUP, settings_counted};
use crate::error::Error;
use crate::metrics::QuarantineReason;

/// Sends a query and, pipelined right behind it (its request is queued on
/// the connection in the same poll), the session cleanup; waits for both.
///
/// The query's code may have changed the session in ways the guard cannot
/// see. The cleanup undoes what can be undone ([`SESSION_CLEANUP`]) and
/// counts SQL-level prepared statements, which it cannot; if it fails or
/// finds any, the connection is left dirty: quarantined if shared, reset
/// before its next use. Either way that is settled before the query's
/// answer goes back to its caller, so no query admitted after that answer
/// sees the session as the query left it. Queries already pipelined between
/// the two see what it left: they were admitted while it ran.
pub(super) async fn send_then_clean(
    target: Target<'_>,
    sql: &str,
    statement: &Prepared,
    params: Params<'_, '_>,
    op: Op,
    limits: Limits,
) -> Result<Reply, Error> {
    let query = send(target, sql, statement, params, (op, Usable::Check), limits);
    let cleaned = both_in_order(query, clean_session(target));
    let ((), (answer, ())) = both_in_order(forget_sequences(target), cleaned).await;
    answer
}

/// `DISCARD SEQUENCES`, pipelined right before code the guard cannot
/// read: `lastval()` and `currval()` there see no sequence state another
/// task left in the shared session (spelled out, they are refused; reached
/// through user code, this is what stops them).
pub(crate) async fn forget_sequences(target: Target<'_>) {
    if target
        .client
        .simple_query("DISCARD SEQUENCES")
        .await
        .is_err()
    {
        target.state.left_dirty(QuarantineReason::Cleanup);
    }
}

/// Polls `first` and then `second` on every wake until both are done. A
/// query future hands its request to the connection on its first poll, so
/// `second`'s requests are queued right behind `first`'s.
pub(crate) async fn both_in_order<A: Future, B: Future>(
    first: A,
    second: B,
) -> (A::Output, B::Output) {
    let (mut first, mut second) = (pin!(first), pin!(second));
    let (mut a, mut b) = (None, None);
    std::future::poll_fn(|cx| {
        if a.is_none() {
            if let Poll::Ready(output) = first.as_mut().poll(cx) {
                a = Some(output);
            }
        }
        if b.is_none() {
            if let Poll::Ready(output) = second.as_mut().poll(cx) {
                b = Some(output);
            }
        }
        match (a.take(), b.take()) {
            (Some(a), Some(b)) => Poll::Ready((a, b)),
            (taken_a, taken_b) => {
                (a, b) = (taken_a, taken_b);
                Poll::Pending
            }
        }
    })
    .await
}

/// Runs the session cleanup; see [`send_then_clean`].
pub(crate) async fn clean_session(target: Target<'_>) {
    let session = &target.state.session;
    let catalog = target.wire.catalog_full();
    let mut cleanup = format!("{POOL_OWN}{SESSION_CLEANUP}; ");
    // The installed extensions' undo, then the pool's own set-up, a shared
    // session's guards and the head-of-line budget (`RESET ALL` undid
    // them), again, before the count.
    for part in [catalog.undo(), target.state.traits.after_connect()]
        .into_iter()
        .flatten()
    {
        cleanup.push_str(part);
        cleanup.push_str("; ");
    }
    if session.guarded() {
        cleanup.push_str(SHARED_GUARDS_SQL);
        cleanup.push_str("; ");
    }
    if let Some(ms) = session.budget().map(budget_ms) {
        cleanup.push_str(&budget_sql(ms));
        cleanup.push_str("; ");
    }
    cleanup.push_str("SELECT count(*) FROM pg_catalog.pg_prepared_statements WHERE from_sql");
    let clean = match target.client.simple_query(&cleanup).await {
        Ok(messages) => {
            let prepared = messages.iter().rev().find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).map(|count| count == "0"),
                _ => None,
            });
            let library =
                settings_counted(&messages).is_none_or(|n| target.wire.loaded_a_library(n));
            prepared == Some(true) && !library
        }
        Err(_) => false,
    };
    if !clean {
        target.state.left_dirty(QuarantineReason::Cleanup);
    }
}
