//! [`Batch`]: several queries from one task, sent as one pipeline, with a
//! result for each.

mod atomic;
mod isolated;
mod unit;

use std::fmt;
use std::ops::Range;
use std::time::Instant;

use tokio_postgres::types::ToSql;

use crate::answer::{Answer, Op};
use crate::error::Error;
use crate::error::ErrorKind;
use crate::hosts::Hosts;
use crate::hosts::dispatch::{self, Work};
use crate::lane::Lane;
use crate::metrics::Mode;
use crate::shared::costs::Costs;
use crate::target::Consistency;
use std::sync::Arc;

/// What each item of a batch produced.
pub type BatchResults = Vec<Result<Answer, Error>>;

/// Queries from one task, sent together and answered one by one; from
/// [`Pool::batch`](crate::Pool::batch) (isolated) or [`Pool::atomic_batch`](crate::Pool::atomic_batch).
///
/// | | isolated ([`Pool::batch`](crate::Pool::batch)) | atomic ([`Pool::atomic_batch`](crate::Pool::atomic_batch)) |
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
    hosts: &'a Arc<Hosts>,
    items: Vec<Item<'a>>,
    params: Vec<&'a (dyn ToSql + Sync)>,
    atomic: bool,
    /// Reads through [`Pool::read`](crate::Pool::read): where they may go.
    read: Option<Consistency>,
    /// An atomic batch: whether it goes out as a unit of a shared pipeline
    /// (decided once, when it runs; see `unit.rs`).
    unit: std::sync::OnceLock<bool>,
}

struct Item<'a> {
    sql: &'a str,
    params: Range<usize>,
    op: Op,
}

impl<'a> Batch<'a> {
    pub(crate) fn new(hosts: &'a Arc<Hosts>, atomic: bool) -> Batch<'a> {
        Batch {
            hosts,
            items: Vec::new(),
            params: Vec::new(),
            atomic,
            read: None,
            unit: std::sync::OnceLock::new(),
        }
    }

    /// Whether the server stopped one of its items at the head-of-line
    /// budget before: the batch then runs on a connection of its own.
    pub(crate) fn blocked_before(&self, inner: &Lane) -> bool {
        inner.config().head_of_line_budget.is_some() && {
            let costs = inner.router().costs();
            self.items
                .iter()
                .any(|item| costs.is_blocked(Costs::key(item.sql)))
        }
    }

    /// An isolated batch of reads; see [`Routed::batch`](crate::Routed::batch).
    pub(crate) fn read(hosts: &'a Arc<Hosts>, consistency: Consistency) -> Batch<'a> {
        Batch {
            read: Some(consistency),
            ..Batch::new(hosts, false)
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
    /// [`ErrorKind::ConnectionLost`] or [`ErrorKind::QueryTimeout`] when
    /// whether it committed is unknown. Each item's own failure is in its
    /// result (an isolated item past `query_timeout`: `QueryTimeout`).
    pub async fn run(self) -> Result<BatchResults, Error> {
        if self.items.is_empty() {
            return Ok(Vec::new());
        }
        let start = Instant::now();
        let hosts = self.hosts;
        let run = |lane| self.run_on(lane);
        let (results, lane) = match self.read {
            // On the primary; a batch that could not start there (no
            // connection: nothing ran) waits for the next primary within
            // `failover_wait`, as a single write does.
            None => dispatch::on_writer(hosts, Work::Batch, run).await,
            Some(consistency) => dispatch::on_reader(hosts, consistency, Work::Batch, run).await,
        };
        if hosts.single().is_none() {
            match &results {
                Ok(results) => dispatch::observe_batch(hosts, results),
                Err(e) if matches!(e.kind(), ErrorKind::ConnectionLost | ErrorKind::Connect) => {
                    hosts.recheck();
                }
                Err(_) => {}
            }
        }
        let Some(pool) = lane else { return results };
        if let Some(metrics) = pool.metrics() {
            let mode = if self.atomic && !self.shares_a_pipeline(pool) {
                Mode::Exclusive
            } else {
                pool.mode()
            };
            match &results {
                Ok(results) => {
                    for result in results {
                        metrics.query(mode, start.elapsed(), result.as_ref().map(drop));
                    }
                }
                // Refused as a whole: every item counts, as it would alone.
                Err(error) => {
                    for _ in &self.items {
                        metrics.query(mode, start.elapsed(), Err(error));
                    }
                }
            }
        }
        results
    }

    /// Runs the batch on one lane.
    async fn run_on(&self, lane: &Arc<Lane>) -> Result<BatchResults, Error> {
        // Items are judged by what the database's catalog holds.
        crate::lane::catalog::ready(lane).await;
        let run = async {
            if self.atomic {
                self.run_atomic(lane).await
            } else {
                self.run_isolated(lane).await
            }
        };
        #[cfg(feature = "tracing")]
        let run = tracing::Instrument::instrument(
            run,
            tracing::info_span!(
                target: "pgpipe",
                "pgpipe.batch",
                db.system.name = "postgresql",
                pgpipe.pool = %lane.name(),
                pgpipe.items = self.items.len(),
                pgpipe.atomic = self.atomic,
            ),
        );
        run.await
    }

    fn item_params(&self, item: &Item<'_>) -> &[&'a (dyn ToSql + Sync)] {
        &self.params[item.params.clone()]
    }
}

impl fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("items", &self.items.len())
            .field("atomic", &self.atomic)
            .finish_non_exhaustive()
    }
}
