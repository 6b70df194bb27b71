//! Atomic batches: `BEGIN`, the items, `COMMIT`, pipelined back to back,
//! and an honest account of what happened.
//!
//! tokio-postgres ends every request with its own `Sync`, so the three parts
//! are separate requests, and nothing may come between them. Here: on an
//! exclusive connection, for batches with session SQL or code the guard
//! cannot read (at most half the pool's connections at once); the others
//! go out as one unit of a shared pipeline ([`unit`](super::unit)).
//!
//! After a failed item the server skips the rest (`25P02`) and answers
//! `COMMIT` with a `ROLLBACK` tag and no error, so the outcome is read from
//! the items' errors, never from `COMMIT` alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;

use super::{Batch, BatchResults};
use crate::answer::Answer;
use crate::config::deadline_after;
use crate::conn::params;
use crate::conn::run::{self, Late, Limits, Prepare, Prepared, Target, Usable};
use crate::error::{Error, ErrorKind};
use crate::exclusive::Holder;
use crate::lane::Lane;
use crate::lane::housekeeping;
use crate::ordered::join_in_order;
use crate::protocol::sql_guard;

/// One request of the pipeline.
#[derive(Debug, Clone, Copy)]
pub(super) enum Step {
    Begin,
    Item(usize),
    Commit,
}

impl Batch<'_> {
    pub(super) async fn run_atomic(&self, inner: &Arc<Lane>) -> Result<BatchResults, Error> {
        // Refused before anything is sent, or a connection taken.
        for (i, item) in self.items.iter().enumerate() {
            let refused = params::check_sql_size(item.sql)
                .and_then(|()| sql_guard::check_in_atomic_batch(item.sql));
            if let Err(e) = refused {
                return Ok(self.abort(i, e, false));
            }
        }
        if inner.is_closed() {
            return Err(Error::closed());
        }
        housekeeping::start(inner);
        if self.shares_a_pipeline(inner) && !self.blocked_before(inner) {
            if let Some(results) = self.run_unit(inner).await? {
                return Ok(results);
            }
            // Stopped at the head-of-line budget: rolled back, so it runs
            // again on a connection of its own, below.
        }
        // Session SQL is allowed here (a `SET`, a temp table …), and so is
        // code the guard cannot read: the session is cleaned behind COMMIT,
        // in the same write, so the next user of the connection finds none.
        let clean = self.needs_cleanup(inner);
        // One wait_timeout for the place and the connection together; the
        // place is held until the batch is done (and its connection back).
        let deadline = deadline_after(inner.config().wait_timeout);
        let _place = inner.atomic_batch_place(deadline).await?;
        let conn = inner.checkout_until(Holder::Pool, deadline).await?;
        let target = Target {
            heal: false,
            ..conn.pg_conn().target()
        };
        let statements = match self.prepare_all(target, Prepare::Inline).await {
            Ok(statements) => statements,
            Err((i, e)) => return Ok(self.abort(i, e, false)),
        };
        // An answer past the result caps is read to its end (see
        // `conn::run::collect`), so that an error hidden behind it still shows.
        let limits = inner.run_settings().limits;
        let steps = steps(self.items.len());
        // Behind a pooler without pipelines, the batch starts on an idle
        // wire; from its BEGIN on, the open transaction keeps the pooler's
        // server.
        target.state.wire_idle().await;
        let left_behind = LeftBehind::default();
        let sending = steps
            .iter()
            .map(|step| self.send(target, (&statements, &left_behind), *step, limits))
            .collect();
        let turns = &target.state.turns;
        let pipeline = async {
            let sent = join_in_order(sending);
            if clean {
                let cleaned = run::both_in_order(sent, run::clean_session(target));
                Ok(turns.send(cleaned).await.0)
            } else {
                Ok(turns.send(sent).await)
            }
        };
        let deadline = inner.run_settings().query_timeout;
        let timed = run::within_deadline(deadline, target, || pipeline, || Late::Cancel);
        let Ok(answers) = timed.await else {
            return Err(Error::new(
                ErrorKind::QueryTimeout,
                "the atomic batch ran past query_timeout and was cancelled; whether it \
                 committed is unknown",
            ));
        };
        self.settle(target, (&statements, left_behind.get()), answers)
    }

    /// What the answers of `BEGIN`, the items and `COMMIT` say happened;
    /// `left_behind`: the item whose request never left (then `ROLLBACK`
    /// went out instead of `COMMIT`).
    pub(super) fn settle(
        &self,
        target: Target<'_>,
        (statements, left_behind): (&[Prepared], Option<usize>),
        answers: Vec<Result<Option<Answer>, Error>>,
    ) -> Result<BatchResults, Error> {
        let mut answers = answers.into_iter();
        let begin = answers.next().expect("a BEGIN step");
        let commit = answers.next_back().expect("a COMMIT step");
        let mut items: Vec<Result<Option<Answer>, Error>> = answers.collect();
        for ((item, result), statement) in self.items.iter().zip(&items).zip(statements) {
            if matches!(result, Err(e) if run::is_stale_statement(e)) {
                // The plan went stale (a table changed under `SELECT *`):
                // forget it, so the next run prepares it again. Not retried
                // here: the refusal aborted the transaction.
                statement.invalidate(target, item.sql);
            }
        }
        let failed_on_server = items
            .iter()
            .any(|r| matches!(r, Err(e) if e.kind() == ErrorKind::Db));
        if let (Some(f), false) = (left_behind, failed_on_server) {
            // No COMMIT went out: nothing can have been committed.
            let Err(cause) = std::mem::replace(&mut items[f], Ok(None)) else {
                unreachable!("an item left behind holds its error")
            };
            let mut results: BatchResults = (0..items.len())
                .map(|i| {
                    Err(cause.echo(
                        ErrorKind::BatchAborted,
                        format!(
                            "item {i} was rolled back: item {f} of the atomic batch could not \
                             be sent, so the batch was rolled back"
                        ),
                    ))
                })
                .collect();
            results[f] = Err(cause);
            return Ok(results);
        }
        self.outcome(begin, items, commit)
    }

    /// Every item's statement, prepared (pipelined, on a miss) and checked
    /// against its parameters; or the first item that cannot run.
    pub(super) async fn prepare_all(
        &self,
        target: Target<'_>,
        prepare: Prepare<'_>,
    ) -> Result<Vec<Prepared>, (usize, Error)> {
        let preparing = self
            .items
            .iter()
            .map(|item| run::prepared(target, prepare, item.sql))
            .collect();
        let found = join_in_order(preparing).await;
        let mut statements = Vec::with_capacity(self.items.len());
        for (i, (item, statement)) in self.items.iter().zip(found).enumerate() {
            // Every value is encoded here, fixed-size ones too: an encoding
            // failure at send time would leave this item out of a
            // transaction that then commits.
            let checked = statement.and_then(|found| {
                params::check_params(found.param_types(), self.item_params(item), true)
                    .map(|()| found)
            });
            statements.push(checked.map_err(|e| (i, e))?);
        }
        Ok(statements)
    }

    /// One step's request and answer. Polled first in step order, in one
    /// turn: an item whose request could not leave (its future ends on its
    /// first poll, before anything was written) is noted in `left_behind`,
    /// and the `COMMIT` polled after it goes out as `ROLLBACK`, so that
    /// the batch never commits without it.
    pub(super) async fn send(
        &self,
        target: Target<'_>,
        (statements, left_behind): (&[Prepared], &LeftBehind),
        step: Step,
        limits: Limits,
    ) -> Result<Option<Answer>, Error> {
        let simple = |sql| async move {
            let result = target.client.batch_execute(sql).await;
            result.map_err(|e| Error::from_query(e, target.client.is_closed()))
        };
        match step {
            Step::Begin => simple("BEGIN").await.map(|()| None),
            Step::Commit if left_behind.get().is_some() => simple("ROLLBACK").await.map(|()| None),
            Step::Commit => simple("COMMIT").await.map(|()| None),
            Step::Item(i) => {
                let item = &self.items[i];
                let params = self.item_params(item);
                let op = (item.op, Usable::Checked);
                let sent = run::send(target, item.sql, &statements[i], params, op, limits);
                let mut sent = std::pin::pin!(sent);
                let mut first = true;
                std::future::poll_fn(|cx| {
                    let polled = sent.as_mut().poll(cx);
                    if std::mem::take(&mut first) && matches!(polled, Poll::Ready(Err(_))) {
                        left_behind.note(i);
                    }
                    polled
                })
                .await
                .map(|reply| Some(reply.into_answer()))
            }
        }
    }

    /// What the answers say happened.
    fn outcome(
        &self,
        begin: Result<Option<Answer>, Error>,
        items: Vec<Result<Option<Answer>, Error>>,
        commit: Result<Option<Answer>, Error>,
    ) -> Result<BatchResults, Error> {
        // A server error in an item aborted the transaction: nothing was
        // committed, whatever happened after.
        let failed = items
            .iter()
            .position(|r| matches!(r, Err(e) if e.kind() == ErrorKind::Db));
        if let Some(f) = failed {
            let mut items = items;
            let Err(cause) = std::mem::replace(&mut items[f], Ok(None)) else {
                unreachable!("the failed item holds an error")
            };
            return Ok(self.abort(f, cause, true));
        }
        if let Err(e) = begin {
            return Err(unknown(&e, "BEGIN"));
        }
        match commit {
            Ok(_) => Ok(items
                .into_iter()
                .map(|result| match result {
                    Ok(answer) => Ok(answer.expect("items answer")),
                    // Over the result caps, but the statement succeeded.
                    Err(e) if e.kind() == ErrorKind::TooLarge => Err(Error::new(
                        ErrorKind::TooLarge,
                        format!(
                            "{}; the statement ran and the batch committed, only its \
                             answer was dropped",
                            e.detail()
                        ),
                    )),
                    Err(e) => Err(e),
                })
                .collect()),
            // Refused at commit: a serialization failure, a deferred
            // constraint. Every item was rolled back.
            Err(e) if e.kind() == ErrorKind::Db => Ok((0..items.len())
                .map(|i| {
                    Err(e.echo(
                        ErrorKind::BatchAborted,
                        format!("item {i} was rolled back: the atomic batch's COMMIT failed"),
                    ))
                })
                .collect()),
            Err(e) => Err(unknown(&e, "COMMIT")),
        }
    }

    /// Item `f` failed: it reports its error, every other item that it was
    /// rolled back, skipped, or (when nothing was `sent`) not run because
    /// of it.
    pub(super) fn abort(&self, f: usize, cause: Error, sent: bool) -> BatchResults {
        let mut results: BatchResults = (0..self.items.len())
            .map(|i| {
                let what = match (sent, i < f) {
                    (false, _) => "not run",
                    (true, true) => "rolled back",
                    (true, false) => "skipped",
                };
                let when = if sent {
                    ""
                } else {
                    " before anything was sent"
                };
                Err(cause.echo(
                    ErrorKind::BatchAborted,
                    format!("item {i} was {what}: item {f} of the atomic batch failed{when}"),
                ))
            })
            .collect();
        results[f] = Err(cause);
        results
    }
}

/// The first item of a batch whose request could not leave, if any (its
/// future ended on its first poll, before anything was written).
#[derive(Debug)]
pub(super) struct LeftBehind(AtomicUsize);

impl Default for LeftBehind {
    fn default() -> Self {
        LeftBehind(AtomicUsize::new(usize::MAX))
    }
}

impl LeftBehind {
    pub(super) fn get(&self) -> Option<usize> {
        Some(self.0.load(Ordering::Acquire)).filter(|&i| i != usize::MAX)
    }

    fn note(&self, item: usize) {
        let _ = self
            .0
            .compare_exchange(usize::MAX, item, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// `BEGIN`, the items, `COMMIT`.
pub(super) fn steps(items: usize) -> Vec<Step> {
    std::iter::once(Step::Begin)
        .chain((0..items).map(Step::Item))
        .chain(std::iter::once(Step::Commit))
        .collect()
}

/// The connection failed before the batch's outcome was known.
fn unknown(e: &Error, step: &str) -> Error {
    e.echo(
        e.kind(),
        format!("the atomic batch's {step} was not answered; whether it committed is unknown"),
    )
}
