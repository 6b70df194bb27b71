//! [`Batch`]: several queries from one task, sent as one pipeline, with a
//! result for each.

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;

use crate::error::{Error, ErrorKind};
use crate::exec::{self, Answer, Op, Prepare, Target};
use crate::metrics::Mode;
use crate::pool::{Pool, PoolInner};
use crate::session;

mod atomic;

/// What each item of a batch produced.
pub type BatchResults = Vec<Result<Answer, Error>>;

/// Queries from one task, sent together and answered one by one; from
/// [`Pool::batch`] (isolated) or [`Pool::atomic_batch`].
///
/// | | isolated ([`Pool::batch`]) | atomic ([`Pool::atomic_batch`]) |
/// |---|---|---|
/// | runs on | a shared connection, pipelined with other tasks' queries (an exclusive one with pipelining off) | an exclusive connection, as `BEGIN`, the items, `COMMIT` |
/// | round trips | one (one per `max_pipeline_depth` items) | one, plus any statements not yet prepared |
/// | an item fails | only that item fails | that item reports its error; every other item reports [`ErrorKind::BatchAborted`]: rolled back, skipped, or never sent |
/// | session SQL | refused ([`ErrorKind::NotAllowedOnShared`]) | allowed, except transaction control ([`ErrorKind::NotAllowedInBatch`]) |
///
/// Items are sent in the order they were added, and the server runs them
/// in that order. [`run`](Batch::run) returns `Err` only when the batch as
/// a whole could not run (the pool is closed, no connection came in time)
/// or, for an atomic batch, when whether it committed is unknown (the
/// connection was lost, or `query_timeout` passed, before its `COMMIT` was
/// answered). Otherwise it returns one result per item.
///
/// ```no_run
/// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
/// let (user, order) = (7i64, 42i64);
/// let mut batch = pool.batch();
/// batch.query("SELECT name FROM users WHERE id = $1", &[&user]);
/// batch.execute("UPDATE orders SET seen = true WHERE id = $1", &[&order]);
/// let mut results = batch.run().await?.into_iter();
/// let names = results.next().unwrap()?.into_rows();
/// let updated = results.next().unwrap()?.rows_affected();
///
/// // All or nothing: a failing item rolls back the others.
/// let mut transfer = pool.atomic_batch();
/// transfer.execute("UPDATE accounts SET balance = balance - 5 WHERE id = $1", &[&1i64]);
/// transfer.execute("UPDATE accounts SET balance = balance + 5 WHERE id = $1", &[&2i64]);
/// for result in transfer.run().await? {
///     result?; // the first error names the item that failed
/// }
/// # Ok(())
/// # }
/// ```
pub struct Batch<'a> {
    pool: &'a Pool,
    items: Vec<Item<'a>>,
    params: Vec<&'a (dyn ToSql + Sync)>,
    atomic: bool,
}

struct Item<'a> {
    sql: &'a str,
    params: Range<usize>,
    op: Op,
}

impl Pool {
    /// Starts an isolated batch: each item succeeds or fails alone. See
    /// [`Batch`].
    pub fn batch(&self) -> Batch<'_> {
        Batch::new(self, false)
    }

    /// Starts an atomic batch: all items in one transaction, committed only
    /// if every one succeeds. See [`Batch`].
    pub fn atomic_batch(&self) -> Batch<'_> {
        Batch::new(self, true)
    }
}

impl<'a> Batch<'a> {
    fn new(pool: &'a Pool, atomic: bool) -> Batch<'a> {
        Batch {
            pool,
            items: Vec::new(),
            params: Vec::new(),
            atomic,
        }
    }

    /// Adds a query; its result is [`Answer::Rows`].
    pub fn query(&mut self, sql: &'a str, params: &[&'a (dyn ToSql + Sync)]) -> &mut Self {
        self.push(sql, params, Op::Query)
    }

    /// Adds a statement; its result is [`Answer::Count`], the rows affected.
    pub fn execute(&mut self, sql: &'a str, params: &[&'a (dyn ToSql + Sync)]) -> &mut Self {
        self.push(sql, params, Op::Execute)
    }

    fn push(&mut self, sql: &'a str, params: &[&'a (dyn ToSql + Sync)], op: Op) -> &mut Self {
        let start = self.params.len();
        self.params.extend_from_slice(params);
        self.items.push(Item {
            sql,
            params: start..self.params.len(),
            op,
        });
        self
    }

    /// How many items were added.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when no item was added.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Whether the batch is atomic.
    pub fn is_atomic(&self) -> bool {
        self.atomic
    }

    /// Sends every item and waits for all the answers.
    ///
    /// # Errors
    ///
    /// The batch as a whole: [`ErrorKind::Closed`], [`ErrorKind::Timeout`],
    /// [`ErrorKind::QueueFull`], [`ErrorKind::Deadlock`],
    /// [`ErrorKind::Connect`] when nothing ran; for an atomic batch,
    /// [`ErrorKind::ConnectionLost`] or [`ErrorKind::Timeout`] when whether it
    /// committed is unknown. Each item's own failure is in its result.
    pub async fn run(self) -> Result<BatchResults, Error> {
        if self.items.is_empty() {
            return Ok(Vec::new());
        }
        let start = Instant::now();
        let results = if self.atomic {
            self.run_atomic().await
        } else {
            self.run_isolated().await
        };
        if let (Some(metrics), Ok(results)) = (&self.pool.inner.metrics, &results) {
            let mode = if self.pool.inner.config.pipelining && !self.atomic {
                Mode::Pipelined
            } else {
                Mode::Exclusive
            };
            for result in results {
                metrics.query(mode, start.elapsed(), result.as_ref().map(drop));
            }
        }
        results
    }

    fn item_params(&self, item: &Item<'_>) -> &[&'a (dyn ToSql + Sync)] {
        &self.params[item.params.clone()]
    }

    async fn run_isolated(&self) -> Result<BatchResults, Error> {
        let inner = &self.pool.inner;
        let mut results: Vec<Option<Result<Answer, Error>>> = self
            .items
            .iter()
            .map(|item| {
                let refused = exec::check_sql(item.sql).and_then(|()| session::check(item.sql));
                refused.err().map(Err)
            })
            .collect();
        let pending: Vec<usize> = (0..self.items.len())
            .filter(|&i| results[i].is_none())
            .collect();
        if !pending.is_empty() {
            if inner.is_closed() {
                return Err(Error::closed());
            }
            inner.start_housekeeping();
            if inner.config.pipelining {
                self.run_shared(inner, &pending, &mut results).await?;
            } else {
                let conn = inner.checkout().await?;
                let pg = conn.pg_conn();
                let mut out = unanswered(pending.len());
                let round = self.round(pg.target(), &Prepare::Inline, &pending, &mut out);
                if inner.within_deadline(round, || pg.cancel()).await.is_err() {
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
        inner: &Arc<PoolInner>,
        pending: &[usize],
        results: &mut [Option<Result<Answer, Error>>],
    ) -> Result<(), Error> {
        let depth = inner.config.max_pipeline_depth;
        let (mut next, mut attempts) = (0, 0);
        while next < pending.len() {
            let mut slot = match inner.reserve(false).await {
                Ok(slot) => slot,
                Err(e) if next == 0 => return Err(e),
                Err(e) => {
                    for &i in &pending[next..] {
                        results[i] = Some(Err(e.echo(e.kind(), "the batch could not go on")));
                    }
                    return Ok(());
                }
            };
            let take = (pending.len() - next).min(depth);
            slot.extend(take as u64 - 1);
            let indices = &pending[next..next + take];
            let mut out = unanswered(take);
            let conn = Arc::clone(&slot.conn);
            let prepare = Prepare::Spawned(&conn);
            let round = self.round(conn.conn().target(), &prepare, indices, &mut out);
            if inner
                .within_deadline(round, || inner.late_on_shared(&conn))
                .await
                .is_err()
            {
                time_out(&mut out);
            }
            let lost = |r: &Option<Result<Answer, Error>>| matches!(r, Some(Err(e)) if e.kind() == ErrorKind::ConnectionLost);
            if out.iter().any(lost) {
                inner.retire(&conn);
            }
            // Items that never left the client, after every item that did,
            // may run on another connection without reordering anything.
            let unsent =
                |r: &Option<Result<Answer, Error>>| matches!(r, Some(Err(e)) if e.is_unsent());
            let sent = out.len() - out.iter().rev().take_while(|r| unsent(r)).count();
            let done = if sent < take && attempts < 2 {
                attempts += 1;
                sent
            } else {
                take
            };
            for (i, result) in indices.iter().zip(out).take(done) {
                results[*i] = result;
            }
            next += done;
        }
        Ok(())
    }

    /// Runs `indices` on one connection: prepares what is not cached (all
    /// at once), checks every item's parameters, then sends the items in
    /// order, each answer going to `out`.
    async fn round(
        &self,
        target: Target<'_>,
        prepare: &Prepare<'_>,
        indices: &[usize],
        out: &mut [Option<Result<Answer, Error>>],
    ) -> Result<(), Error> {
        let limits = self.pool.inner.limits();
        let mut statements = unanswered(indices.len());
        let preparing = indices
            .iter()
            .map(|&i| exec::prepared(target, prepare, self.items[i].sql))
            .collect();
        join_in_order(preparing, |k, found| statements[k] = Some(found)).await;
        let mut ready: Vec<(usize, Statement, u64)> = Vec::with_capacity(indices.len());
        for (k, found) in statements.into_iter().enumerate() {
            let item = &self.items[indices[k]];
            let checked = found
                .expect("every statement is looked up")
                .and_then(|found| {
                    exec::check(&found.0, self.item_params(item), false).map(|()| found)
                });
            match checked {
                Ok((statement, generation)) => ready.push((k, statement, generation)),
                Err(e) => out[k] = Some(Err(e)),
            }
        }
        let sending = ready
            .iter()
            .map(|(k, statement, _)| {
                let item = &self.items[indices[*k]];
                exec::send(target, statement, self.item_params(item), item.op, limits)
            })
            .collect();
        join_in_order(sending, |j, result| {
            let (k, _, generation) = &ready[j];
            if let Err(e) = &result {
                if exec::is_stale_statement(e) {
                    // As pgx does in a batch: forget the plan and report
                    // the error; retrying this item alone would reorder it.
                    target
                        .cache
                        .invalidate(self.items[indices[*k]].sql, *generation);
                }
            }
            out[*k] = Some(result);
        })
        .await;
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
        *result = Some(Err(Error::timeout("the batch to finish (query_timeout)")));
    }
}

/// Polls `futures` to completion, every one on every wake and always in
/// index order, handing each output to `done` with its index as it comes.
///
/// The order is the point: a query future hands its request to the
/// connection on its first poll, so the server receives (and runs) the
/// items in this order. `join_all` does not promise an order.
pub(crate) async fn join_in_order<F: Future>(
    futures: Vec<F>,
    mut done: impl FnMut(usize, F::Output),
) {
    let mut futures: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, slot) in futures.iter_mut().enumerate() {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    Poll::Ready(output) => {
                        *slot = None;
                        done(i, output);
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
}

impl fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("items", &self.items.len())
            .field("atomic", &self.atomic)
            .finish_non_exhaustive()
    }
}
