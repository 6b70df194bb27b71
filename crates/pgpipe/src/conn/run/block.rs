//! The head-of-line budget behind a transaction pooler: each shared
//! statement in a transaction block of its own, under a
//! `SET LOCAL`-style `statement_timeout`.
//!
//! Behind a transaction pooler the pool's connection has no session of its
//! own: a session `statement_timeout` (how the budget is set on a direct
//! connection, [`budget`](crate::conn::budget)) would reach whichever
//! client the server goes to next. So the budget is set where it cannot
//! outlive the statement: `BEGIN` and a transaction-local `set_config`, the
//! statement, and `COMMIT`, first-polled in one exclusive turn (nothing of
//! another task's between them). The server stops the statement past the
//! budget (`57014`); the block rolls back, so nothing it did commits; its
//! neighbours, each with its own `Sync`, go on. The transaction ends with
//! the block, and the setting with it, in the pooler's one server
//! transaction: no other client sees either. A pooler that cannot track a
//! pipeline releases the server only at `ReadyForQuery` idle, which the
//! block's `COMMIT` is the first to send.
//!
//! Only statements that can run in a transaction block go this way (the
//! guard's proven kinds); a `COMMIT` that fails (a deferred constraint, a
//! serialization failure) is the statement's error: nothing committed.

use tokio_postgres::SimpleQueryMessage;

use super::{Limits, Prepared, Target, Usable, both_in_order, send};
use crate::answer::{Op, Reply};
use crate::conn::budget::take_budget_sql;
use crate::conn::params::Params;
use crate::error::{Error, ErrorKind};
use crate::protocol::watch::{BLOCK_BEGIN, BLOCK_COMMIT};

/// `BEGIN`, then `statement_timeout` = `ms` for this transaction only,
/// unless the session's own is already shorter (then that stays, as on a
/// direct connection): a row comes back only when the budget was taken.
fn head_sql(ms: u32) -> String {
    format!("{BLOCK_BEGIN}{}", take_budget_sql(ms, true))
}

/// Sends `statement` in a block of its own under `ms` of
/// `statement_timeout` (see the module docs); the statement's answer, or
/// the error that ended its block.
pub(super) async fn send_in_block(
    target: Target<'_>,
    sql: &str,
    statement: &Prepared,
    params: Params<'_, '_>,
    op: Op,
    limits: Limits,
    ms: u32,
) -> Result<Reply, Error> {
    let head = head_sql(ms);
    let make = || {
        let head = target.client.simple_query(&head);
        let query = send(
            target,
            sql,
            statement,
            params,
            (op, Usable::Checked),
            limits,
        );
        let commit = target.client.simple_query(BLOCK_COMMIT);
        both_in_order(head, both_in_order(query, commit))
    };
    // All three go out, or none: on a connection that is quarantined or
    // gone, none (it runs elsewhere).
    let usable = || !target.is_dead() && !target.state.session.is_quarantined();
    let Some((head, (answer, commit))) = target.state.turns.send_together(make, usable).await
    else {
        return Err(match target.state.session.quarantine_reason() {
            Some(reason) if !target.is_dead() => Error::quarantined(reason.label()),
            _ => Error::new(
                ErrorKind::ConnectionLost,
                "the shared connection closed before this query was sent; nothing ran",
            )
            .unsent(),
        });
    };
    let closed = target.client.is_closed();
    match (head, answer, commit) {
        // The block never began under the budget: the statement's own
        // error would only say the block was aborted.
        (Err(e), _, _) => Err(Error::from_query(e, closed)),
        (Ok(_), Err(e), _) => Err(e),
        // Its answer came, but its transaction did not commit.
        (Ok(_), Ok(_), Err(e)) => Err(Error::from_query(e, closed)),
        (Ok(_), Ok(answer), Ok(tail)) => {
            debug_assert!(
                tail.iter()
                    .any(|m| matches!(m, SimpleQueryMessage::CommandComplete(_)))
            );
            Ok(answer)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::state::held::POOL_OWN;

    #[test]
    fn the_head_is_the_pools_own_and_local_to_its_transaction() {
        let sql = head_sql(100);
        assert!(sql.starts_with(POOL_OWN));
        assert!(sql.contains("'statement_timeout', '100', true"));
        assert!(BLOCK_COMMIT.starts_with(POOL_OWN));
    }
}
