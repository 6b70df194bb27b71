//! Atomic batches as units of a shared pipeline.
//!
//! With pipelining on, an atomic batch whose items the guard vouches for
//! (no session SQL, no code it cannot read) and that fits in one pipeline
//! goes out on a shared connection: `BEGIN`, the items and `COMMIT` are
//! handed to the connection in one turn (see
//! [`Turns`](crate::conn::turn::Turns)), so no neighbour's request can come
//! between them and run inside its transaction, and batches from many tasks
//! follow each other without a round trip each. The tap lets the batch's
//! own answers show its open transaction; any other answer that does still
//! quarantines the connection. What the answers mean is read as on an
//! exclusive connection ([`atomic`](super::atomic)).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::atomic::{LeftBehind, steps};
use super::{Batch, BatchResults};
use crate::conn::budget::{UnderBudget, stopped_by_budget};
use crate::conn::run::{self, Late, Prepare, Target};
use crate::conn::state::ConnState;
use crate::error::{Error, ErrorKind};
use crate::lane::Lane;
use crate::lane::retry::Retries;
use crate::lane::settings;
use crate::metrics::CloseReason;
use crate::ordered::join_in_order;
use crate::shared::SharedConn;
use crate::shared::costs::Costs;

/// How a unit's attempt ended, short of answers.
enum Stopped {
    /// An item cannot run (its statement, its parameters): nothing sent.
    Refused(usize, Error),
    /// The connection was gone or quarantined before the turn: nothing sent.
    Unusable,
}

impl Batch<'_> {
    /// Whether this atomic batch goes out as a unit of a shared
    /// connection's pipeline: with pipelining, not behind a transaction
    /// pooler (whose server may change at any ReadyForQuery; the exclusive
    /// path waits for an idle wire there), within one connection's pipeline
    /// depth, and every item one the guard vouches for on the shared path.
    pub(super) fn shares_a_pipeline(&self, inner: &Lane) -> bool {
        *self.unit.get_or_init(|| {
            let config = inner.config();
            config.pipelining
                && !config.pooler.is_transaction()
                && self.items.len() + 2 <= config.max_pipeline_depth
                && !self.needs_cleanup(inner)
        })
    }

    /// Whether an item may leave session state behind: session SQL, or code
    /// the guard cannot read.
    pub(super) fn needs_cleanup(&self, inner: &Lane) -> bool {
        self.items
            .iter()
            .any(|item| match inner.wire().check(item.sql) {
                Ok(code) => settings::needs_cleanup(inner, code),
                Err(_) => true,
            })
    }

    /// Whether an item is known to be slow (head-of-line routing's learned
    /// costs): the unit is then routed, and watched for stalls, as a slow
    /// query.
    fn learned_slow(&self, inner: &Lane) -> bool {
        let Some(threshold) = inner.config().slow_query_threshold else {
            return false;
        };
        let costs = inner.router().costs();
        self.items
            .iter()
            .any(|item| costs.is_slow(Costs::key(item.sql), threshold))
    }

    /// Runs the batch as one unit of a shared connection's pipeline; `None`
    /// when the server stopped an item at the head-of-line budget (the
    /// transaction rolled back: nothing of it committed), so that it runs
    /// again on a connection of its own.
    pub(super) async fn run_unit(&self, inner: &Arc<Lane>) -> Result<Option<BatchResults>, Error> {
        let router = inner.router();
        let settings = inner.run_settings();
        let steps = steps(self.items.len());
        let slow = self.learned_slow(inner);
        let mut retries = Retries::default();
        loop {
            let mut place = router.reserve(slow).await?;
            let sent = UnderBudget::now(place.conn.state().session.budget());
            place.extend(steps.len() as u64 - 1);
            let conn = Arc::clone(&place.conn);
            let target = Target {
                heal: false,
                ..conn.conn().target()
            };
            // Whether the batch's turn came (then its requests were sent).
            let turned = AtomicBool::new(false);
            let left_behind = LeftBehind::default();
            let unit = async {
                let statements = match self.prepare_all(target, Prepare::Spawned(&conn)).await {
                    Ok(statements) => statements,
                    Err((i, e)) => return Ok(Err(Stopped::Refused(i, e))),
                };
                // Every request, or none, joins the pipeline: on a
                // connection that is quarantined or gone, none.
                let usable = || {
                    let usable = !target.is_dead() && !target.state.session.is_quarantined();
                    turned.store(usable, Ordering::Release);
                    usable
                };
                let make = || {
                    let sending = steps
                        .iter()
                        .map(|step| {
                            self.send(target, (&statements, &left_behind), *step, settings.limits)
                        })
                        .collect();
                    join_in_order(sending)
                };
                let _broken = KillOnPanic(target.state);
                let answers = target.state.turns.send_together(make, usable).await;
                Ok(match answers {
                    Some(answers) => Ok((statements, answers)),
                    None => Err(Stopped::Unusable),
                })
            };
            let late = || {
                if turned.load(Ordering::Acquire) {
                    router.late(&conn)
                } else {
                    Late::Abandon // nothing of it is on the wire
                }
            };
            let (statements, answers) =
                match run::within_deadline(settings.query_timeout, target, || unit, late).await {
                    Ok(Ok(sent)) => sent,
                    Ok(Err(Stopped::Refused(_, e)))
                        if e.is_unsent() && retries.take_unsent(e.is_quarantined()) =>
                    {
                        continue; // its connection died first: nothing was sent
                    }
                    Ok(Err(Stopped::Refused(i, e))) => return Ok(Some(self.abort(i, e, false))),
                    Ok(Err(Stopped::Unusable)) if retries.take_unsent(quarantined(&conn)) => {
                        continue; // nothing was sent: another connection
                    }
                    Ok(Err(Stopped::Unusable)) => {
                        return Err(Error::new(
                            ErrorKind::ConnectionLost,
                            "no usable shared connection for the atomic batch; nothing was sent",
                        )
                        .unsent());
                    }
                    Err(_) if !turned.load(Ordering::Acquire) => {
                        return Err(Error::query_timeout(
                            "the atomic batch waited past it for its turn; nothing was sent",
                        )
                        .unsent());
                    }
                    Err(_) => {
                        return Err(Error::new(
                            ErrorKind::QueryTimeout,
                            "the atomic batch ran past query_timeout; it was pipelined with other \
                         queries, so it was not cancelled and runs to its end: whether it \
                         committed is unknown",
                        ));
                    }
                };
            let lost = answers
                .iter()
                .any(|r| matches!(r, Err(e) if e.kind() == ErrorKind::ConnectionLost));
            if lost {
                router.retire(&conn);
            }
            let stopped =
                |r: &Result<Option<_>, Error>| matches!(r, Err(e) if stopped_by_budget(e, sent));
            if answers.iter().any(stopped) {
                let costs = router.costs();
                for (item, _) in self
                    .items
                    .iter()
                    .zip(&answers[1..])
                    .filter(|(_, r)| stopped(r))
                {
                    costs.block(Costs::key(item.sql));
                }
                if let Some(metrics) = inner.metrics() {
                    metrics.wire.evicted.inc();
                }
                return Ok(None);
            }
            return self
                .settle(target, (&statements, left_behind.get()), answers)
                .map(Some);
        }
    }
}

/// Closes the connection if a panic unwinds through a unit's turn (a
/// parameter's `ToSql` panicking while the batch's requests are handed
/// over): `BEGIN` may have gone out without its `COMMIT`, and nothing may
/// run in the transaction it left open.
struct KillOnPanic<'a>(&'a ConnState);

impl Drop for KillOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.kill(CloseReason::Broken);
        }
    }
}

/// Whether a shared connection found unusable for a unit was quarantined
/// rather than lost (see `lane::retry`).
fn quarantined(conn: &SharedConn) -> bool {
    let state = conn.state();
    state.session.is_quarantined() && !state.load.is_dead()
}
