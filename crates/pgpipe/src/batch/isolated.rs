//! Isolated batches: the items go out in order on one connection in one
//! pipeline (several, past `max_pipeline_depth`), and each fails alone.

use std::sync::Arc;

use super::{Batch, BatchResults};
use crate::answer::{Answer, Reply};
use crate::conn::budget::{UnderBudget, stopped_by_budget};
use crate::conn::params;
use crate::conn::run::{self, Late, Limits, Prepare, Target};
use crate::error::{Error, ErrorKind};
use crate::exclusive::Holder;
use crate::lane::Lane;
use crate::lane::retry::Retries;
use crate::lane::{housekeeping, settings};
use crate::ordered::{each_in_order, join_in_order};
use crate::shared::costs::Costs;

impl Batch<'_> {
    pub(super) async fn run_isolated(&self, inner: &Arc<Lane>) -> Result<BatchResults, Error> {
        let mut clean = false;
        let mut results: Vec<Option<Result<Answer, Error>>> = self
            .items
            .iter()
            .map(|item| {
                let checked =
                    params::check_sql_size(item.sql).and_then(|()| inner.wire().check(item.sql));
                match checked {
                    Ok(code) => {
                        clean |= settings::needs_cleanup(inner, code);
                        None
                    }
                    Err(e) => Some(Err(e)),
                }
            })
            .collect();
        let pending: Vec<usize> = (0..self.items.len())
            .filter(|&i| results[i].is_none())
            .collect();
        if !pending.is_empty() {
            if inner.is_closed() {
                return Err(Error::closed());
            }
            housekeeping::start(inner);
            // An item the server once stopped at the head-of-line budget
            // takes the batch to a connection of its own.
            if inner.config().pipelining && !self.blocked_before(inner) {
                self.run_shared(inner, &pending, clean, &mut results)
                    .await?;
            } else {
                let conn = inner.checkout(Holder::Pool).await?;
                let target = conn.pg_conn().target();
                let mut out = unanswered(pending.len());
                let round = self.round(
                    target,
                    Prepare::Inline,
                    (&pending, inner.run_settings().limits),
                    clean,
                    &mut out,
                );
                let deadline = inner.run_settings().query_timeout;
                let timed = run::within_deadline(deadline, target, || round, || Late::Cancel);
                if timed.await.is_err() {
                    time_out(&mut out);
                }
                for (i, result) in pending.iter().zip(out) {
                    results[*i] = result;
                }
            }
        }
        Ok(results
            .into_iter()
            .map(|result| result.expect("every item is answered"))
            .collect())
    }

    /// Runs the `pending` items on shared connections, as many per round as
    /// one connection takes.
    async fn run_shared(
        &self,
        inner: &Arc<Lane>,
        pending: &[usize],
        clean: bool,
        results: &mut [Option<Result<Answer, Error>>],
    ) -> Result<(), Error> {
        let router = inner.router();
        let depth = inner.config().max_pipeline_depth;
        let deadline = inner.run_settings().query_timeout;
        let mut pending = pending.to_vec();
        let mut retries = Retries::default();
        loop {
            // Items the server skipped in a read group (a neighbour failed):
            // they never ran, and run again after the others.
            let mut again = Vec::new();
            let mut next = 0;
            retries.new_round();
            while next < pending.len() {
                let mut place = match router.reserve(false).await {
                    Ok(place) => place,
                    Err(e) if next == 0 && retries.none_skipped() => return Err(e),
                    Err(e) => {
                        for &i in &pending[next..] {
                            results[i] = Some(Err(e.echo(e.kind(), "the batch could not go on")));
                        }
                        return Ok(());
                    }
                };
                // As many as fit within the connection's depth (at least one):
                // the items of a round go out together, and never past the
                // limit. The room is claimed as it is now, not as it was at
                // admission: queries admitted since count.
                let wanted = (pending.len() - next).min(depth) as u64;
                let take = 1 + place.extend_within(wanted - 1) as usize;
                let indices = &pending[next..next + take];
                let mut out = unanswered(take);
                let conn = Arc::clone(&place.conn);
                let target = conn.conn().target();
                let round = self.round(
                    target,
                    Prepare::Spawned(&conn),
                    (indices, inner.run_settings().limits),
                    clean,
                    &mut out,
                );
                let under = UnderBudget::now(target.state.session.budget());
                if run::within_deadline(deadline, target, || round, || router.late(&conn))
                    .await
                    .is_err()
                {
                    time_out(&mut out);
                }
                self.block_stopped(inner, indices, &mut out, under);
                let lost = |r: &Option<Result<Answer, Error>>| matches!(r, Some(Err(e)) if e.kind() == ErrorKind::ConnectionLost);
                if out.iter().any(lost) {
                    router.retire(&conn);
                }
                // Items that never left the client, after every item that did,
                // may run on another connection without reordering anything.
                let unsent = |r: &Option<Result<Answer, Error>>| matches!(r, Some(Err(e)) if e.is_unsent() && !e.is_skipped());
                let sent = out.len() - out.iter().rev().take_while(|r| unsent(r)).count();
                let quarantined = matches!(out.get(sent), Some(Some(Err(e))) if e.is_quarantined());
                let done = if sent < take && retries.take_unsent(quarantined) {
                    sent
                } else {
                    take
                };
                for (i, result) in indices.iter().zip(out).take(done) {
                    match result {
                        Some(Err(e)) if e.is_skipped() && retries.may_skip() => {
                            if let Some(metrics) = inner.metrics() {
                                metrics.wire.resent.inc();
                            }
                            again.push(*i);
                        }
                        result => results[*i] = result,
                    }
                }
                next += done;
            }
            if again.is_empty() {
                return Ok(());
            }
            retries.note_skipped_round();
            pending = again;
        }
    }

    /// Remembers the items of a round that the server stopped at the
    /// head-of-line budget. Each fails with its `57014` (nothing it did
    /// committed), marked stopped: the items behind it ran, so running it
    /// again here would reorder the batch; the next batch with it runs on a
    /// connection of its own.
    fn block_stopped(
        &self,
        inner: &Lane,
        indices: &[usize],
        out: &mut [Option<Result<Answer, Error>>],
        sent: Option<UnderBudget>,
    ) {
        for (i, result) in indices.iter().zip(out) {
            if let Some(Err(e)) = result {
                if stopped_by_budget(e, sent) {
                    e.mark_stopped();
                    inner.router().costs().block(Costs::key(self.items[*i].sql));
                    if let Some(metrics) = inner.metrics() {
                        metrics.wire.evicted.inc();
                    }
                }
            }
        }
    }

    /// Runs `indices` on one connection: prepares what is not cached (all
    /// at once), checks every item's parameters, then sends the items in
    /// order, each answer going to `out`.
    async fn round(
        &self,
        target: Target<'_>,
        prepare: Prepare<'_>,
        (indices, limits): (&[usize], Limits),
        clean: bool,
        out: &mut [Option<Result<Answer, Error>>],
    ) -> Result<(), Error> {
        let preparing = indices
            .iter()
            .map(|&i| run::prepared(target, prepare, self.items[i].sql))
            .collect();
        let statements = join_in_order(preparing).await;
        let mut ready: Vec<(usize, run::Prepared)> = Vec::with_capacity(indices.len());
        for (k, found) in statements.into_iter().enumerate() {
            let item = &self.items[indices[k]];
            let checked = found.and_then(|found| {
                params::check_params(found.param_types(), self.item_params(item), false)
                    .map(|()| found)
            });
            match checked {
                Ok(statement) => ready.push((k, statement)),
                Err(e) => out[k] = Some(Err(e)),
            }
        }
        target.state.wire_idle().await;
        let sending = ready
            .iter()
            .map(|(k, statement)| {
                let item = &self.items[indices[*k]];
                run::send(
                    target,
                    item.sql,
                    statement,
                    self.item_params(item),
                    (item.op, run::Usable::Check),
                    limits,
                )
            })
            .collect();
        let sent = each_in_order(sending, |j, result| {
            let (k, statement) = &ready[j];
            if let Err(e) = &result {
                if run::is_stale_statement(e) {
                    // As pgx does in a batch: forget the plan and report
                    // the error; retrying this item alone would reorder it.
                    statement.invalidate(target, self.items[indices[*k]].sql);
                }
            }
            out[*k] = Some(result.map(Reply::into_answer));
        });
        let turns = &target.state.turns;
        if clean {
            // Before the first item and behind the last: see
            // `send_then_clean` in conn/run/cleanup.rs.
            let cleaned = run::both_in_order(sent, run::clean_session(target));
            turns
                .send(run::both_in_order(run::forget_sequences(target), cleaned))
                .await;
        } else {
            turns.send(sent).await;
        }
        Ok(()) // each item's error is in `out`; this fits `within_deadline`
    }
}

/// A slot per item, none answered yet.
fn unanswered<T>(n: usize) -> Vec<Option<T>> {
    (0..n).map(|_| None).collect()
}

/// Answers every unanswered item with a timeout.
fn time_out(out: &mut [Option<Result<Answer, Error>>]) {
    for result in out.iter_mut().filter(|r| r.is_none()) {
        *result = Some(Err(Error::query_timeout("the batch ran past it")));
    }
}
