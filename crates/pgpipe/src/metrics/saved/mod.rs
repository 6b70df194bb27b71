//! Latency saved: the time the pipelined queries would have taken on the
//! same pool with pipelining off, less the time they took.
//!
//! With pipelining off, each query holds a whole connection, one of
//! `max_size`, for its round trip and the server's time; a query that
//! finds none free waits for one. The pool counts, without a lock or an
//! allocation per query, what that counterfactual needs, and the lane's
//! housekeeping tick folds it every 100 ms (never a scrape, so that two
//! Prometheus servers scraping one pool read the same counters):
//!
//! - `S`, what a query takes with a connection to itself: the mean time
//!   of the pipelined queries **sent alone** (nothing in flight on their
//!   connection, and no more in flight on the whole lane than it has
//!   connections, as without pipelining), from their write to their
//!   answer. The typical round trip
//!   (not the low-end one the RTT estimate keeps), the server's time and
//!   the client's own are all in it; one that waited for its statement's
//!   prepare is left out. Recent ones count most (a 2-second
//!   decay); with none lately (a pool that never goes idle), the last known
//!   mean stands; before any, the round-trip estimate.
//! - The callers' **steps**: a query, or the queries one task sends at once
//!   (a `join!`: a query that starts while the last query to start, from
//!   the same task, is still running), or an exclusive checkout (`get()`,
//!   `begin()`). `k`: queries per query step.
//! - `B`, the time callers spend between two steps of the same task (a
//!   web service's own work between queries, a client's between requests
//!   on a kept-alive connection; up to 1 s, past which a task counts as a
//!   new caller): the end of each task's last step sits in a small table.
//! - `N`, the callers, by Little's law from their time per second: the
//!   queries' (durations, waits included) over `k`, the checkouts' waits
//!   and holds (as measured), and `B`.
//! - `H`, the connection-seconds the checkouts hold, each of their
//!   statements (counted at the connection) taking `S` rather than the
//!   time it took: a pipelining pool's checkouts wait longer for their
//!   answers than the same checkouts would beside a fraction of the work.
//! - `h`, how long a woken task waits for a thread: on the queries sent
//!   alone, from their answer's read to their task running again. Without
//!   pipelining a connection passes from one user to the next through such
//!   a wake-up, so each use of it holds it `h` longer.
//!
//! The model that turns these into a query's time without pipelining is
//! in [`model`].

mod model;
mod steps;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus::{Counter, Gauge};

use super::{Buckets, Labels, opts};
use crate::sync::lock;
use model::Interval;
use steps::Steps;
use steps::current_task;

/// Recent alone queries count most: their weight falls by `e` every this.
const DECAY: Duration = Duration::from_secs(2);
/// Ticks between feedings of the clamped counter.
const CLAMP_TICKS: u32 = 10;
/// The connections held now, in one word: their count in the low 20 bits,
/// the sum of when each was taken (in 100 µs since the epoch) above: room
/// for 1,000 connections held 10 days each.
const HELD_COUNT_BITS: u32 = 20;
const HELD_UNIT_NANOS: u64 = 100_000;

/// What the pool counts for latency saved, and the two counters it feeds.
#[derive(Debug)]
pub(crate) struct Saved {
    /// Since when the nanosecond stamps below count.
    epoch: Instant,
    /// Pipelined queries sent alone, and their time (ns).
    alone: AtomicU64,
    alone_nanos: AtomicU64,
    /// Their tasks' wait for a thread once their answer was read (ns).
    alone_woke_nanos: AtomicU64,
    /// The callers' steps and the time between them.
    pub(crate) steps: Steps,
    /// Exclusive checkouts: begun, their waits (ns), the connections held
    /// now (one word: see [`HELD_COUNT_BITS`]), and the time of those
    /// released.
    checkouts: AtomicU64,
    checkout_wait_nanos: AtomicU64,
    held: AtomicU64,
    released_nanos: AtomicU64,
    /// The time the pipelined queries would have taken without pipelining.
    pub(super) without: Counter,
    /// That less the time they took, in intervals where it is positive.
    pub(super) saved: Counter,
    /// `S`, as the last fold found it.
    pub(super) alone_gauge: Gauge,
    fold: Mutex<Fold>,
}

/// The folding's own state, touched only by the housekeeping tick.
#[derive(Debug, Default)]
struct Fold {
    last: Option<(Instant, Totals)>,
    /// Decayed sums of the alone queries' time and count.
    alone_seconds: f64,
    alone: f64,
    alone_woke: f64,
    /// Seconds saved (or, negative, lost) since the counter was last fed.
    pending: f64,
    ticks: u32,
}

/// Running totals, read at each fold.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    queries: u64,
    query_seconds: f64,
    alone: u64,
    alone_seconds: f64,
    alone_woke: f64,
    steps: u64,
    between: f64,
    checkouts: u64,
    checkout_waits: f64,
    held_seconds: f64,
    /// The checkouts' statements, and their time from write to answer.
    held_statements: u64,
    held_statement_seconds: f64,
}

impl Saved {
    pub(super) fn new(pool: &Labels) -> Result<Saved, prometheus::Error> {
        Ok(Saved {
            epoch: Instant::now(),
            alone: AtomicU64::new(0),
            alone_nanos: AtomicU64::new(0),
            alone_woke_nanos: AtomicU64::new(0),
            steps: Steps::default(),
            checkouts: AtomicU64::new(0),
            checkout_wait_nanos: AtomicU64::new(0),
            held: AtomicU64::new(0),
            released_nanos: AtomicU64::new(0),
            without: Counter::with_opts(opts(
                "pipeline_latency_without_pipelining_seconds_total",
                "Estimate: the time the pipelined queries would have taken on the same pool \
                 with pipelining off (a connection per query, waiting for one when all are \
                 busy); see the guide's observability page for the model. Less \
                 pgpipe_query_duration_seconds_sum{mode=\"pipelined\"}: the latency saved, \
                 negative where pipelining cost time.",
                pool,
            ))?,
            saved: Counter::with_opts(opts(
                "pipeline_latency_saved_seconds_total",
                "Estimate: the time the pipelined queries would have taken with pipelining \
                 off, less the time they took, added each second in which it is positive (a \
                 second in which pipelining cost time adds nothing).",
                pool,
            ))?,
            alone_gauge: Gauge::with_opts(opts(
                "pipeline_alone_seconds",
                "The mean time from write to answer of the pipelined queries sent alone \
                 (nothing in flight on their connection), recent ones counting most: what \
                 the latency-saved estimate takes a query to need with a connection to itself.",
                pool,
            ))?,
            fold: Mutex::default(),
        })
    }

    fn stamp(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A pipelined query sent alone took `elapsed` to its answer.
    pub(crate) fn alone(&self, elapsed: Duration, woke: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.alone_nanos.fetch_add(nanos, Ordering::Relaxed);
        let woke = u64::try_from(woke.as_nanos()).unwrap_or(u64::MAX);
        self.alone_woke_nanos.fetch_add(woke, Ordering::Relaxed);
        self.alone.fetch_add(1, Ordering::Relaxed);
    }

    /// An exclusive checkout waited `waited` for its connection.
    pub(crate) fn checkout_waited(&self, waited: Duration) {
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.checkout_wait_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// A connection asked for at `asked` is held exclusively from `since`:
    /// its caller's step began when it asked (the wait between is counted
    /// as the checkout's, by [`checkout_waited`](Saved::checkout_waited)).
    pub(crate) fn held(&self, asked: Instant, since: Instant) {
        self.steps.arrive(current_task(), asked);
        self.checkouts.fetch_add(1, Ordering::Relaxed);
        self.held
            .fetch_add(self.held_word(since), Ordering::Relaxed);
    }

    /// One held connection taken at `since`, as [`HELD_COUNT_BITS`] says.
    fn held_word(&self, since: Instant) -> u64 {
        ((self.stamp(since) / HELD_UNIT_NANOS) << HELD_COUNT_BITS) | 1
    }

    /// The connection held from `since` is back.
    pub(crate) fn released(&self, since: Instant) {
        let now = Instant::now();
        self.steps.leave(current_task(), now);
        let (start, end) = (self.stamp(since), self.stamp(now));
        self.released_nanos
            .fetch_add(end.saturating_sub(start), Ordering::Relaxed);
        self.held
            .fetch_sub(self.held_word(since), Ordering::Relaxed);
    }

    fn totals(&self, durations: &Buckets, checkouts: &Buckets, now: Instant) -> Totals {
        let (queries, query_seconds) = durations.duration_totals();
        let (held_statements, held_statement_seconds) = checkouts.duration_totals();
        let seconds = |nanos: u64| nanos as f64 * 1e-9;
        // Held connection-seconds: those released, and those still held
        // up to now (now × held, less when each was taken; one load, so
        // the two agree).
        let held = self.held.load(Ordering::Relaxed);
        let (count, since) = (held & ((1 << HELD_COUNT_BITS) - 1), held >> HELD_COUNT_BITS);
        let now_units = self.stamp(now) / HELD_UNIT_NANOS;
        let open = (now_units.saturating_mul(count).saturating_sub(since) * HELD_UNIT_NANOS) as f64;
        Totals {
            queries,
            query_seconds,
            alone: self.alone.load(Ordering::Relaxed),
            alone_seconds: seconds(self.alone_nanos.load(Ordering::Relaxed)),
            alone_woke: seconds(self.alone_woke_nanos.load(Ordering::Relaxed)),
            steps: self.steps.count(),
            between: self.steps.between(),
            checkouts: self.checkouts.load(Ordering::Relaxed),
            checkout_waits: seconds(self.checkout_wait_nanos.load(Ordering::Relaxed)),
            held_seconds: seconds(self.released_nanos.load(Ordering::Relaxed)) + open * 1e-9,
            held_statements,
            held_statement_seconds,
        }
    }

    /// Folds what was counted since the last call into the counters:
    /// `durations` is the pipelined queries' histogram, `max_size` the
    /// pool's, `rtt` the round-trip estimate (`S` before any query ran
    /// alone).
    pub(crate) fn fold(
        &self,
        durations: &Buckets,
        checkouts: &Buckets,
        max_size: usize,
        rtt: Option<Duration>,
    ) {
        let now = Instant::now();
        let totals = self.totals(durations, checkouts, now);
        let mut fold = lock(&self.fold);
        let Some((at, last)) = fold.last.replace((now, totals)) else {
            return;
        };
        let seconds = now.saturating_duration_since(at).as_secs_f64();
        let new_alone = totals.alone.saturating_sub(last.alone);
        if new_alone > 0 {
            let keep = (-seconds / DECAY.as_secs_f64()).exp();
            fold.alone_seconds =
                fold.alone_seconds * keep + (totals.alone_seconds - last.alone_seconds);
            fold.alone = fold.alone * keep + new_alone as f64;
            fold.alone_woke = fold.alone_woke * keep + (totals.alone_woke - last.alone_woke);
            self.alone_gauge.set(fold.alone_seconds / fold.alone);
        }
        let queries = totals.queries.saturating_sub(last.queries);
        let taken = totals.query_seconds - last.query_seconds;
        fold.ticks += 1;
        if queries > 0 && seconds > 0.0 {
            let alone = if fold.alone > 0.0 {
                Some(fold.alone_seconds / fold.alone)
            } else {
                rtt.map(|rtt| rtt.as_secs_f64())
            };
            let without = alone.map_or(taken, |alone| {
                let interval = Interval {
                    seconds,
                    queries: queries as f64,
                    query_seconds: taken,
                    steps: totals.steps.saturating_sub(last.steps) as f64,
                    between: totals.between - last.between,
                    checkouts: totals.checkouts.saturating_sub(last.checkouts) as f64,
                    checkout_waits: totals.checkout_waits - last.checkout_waits,
                    held_seconds: totals.held_seconds - last.held_seconds,
                    held_alone: held_alone(&totals, &last, alone),
                    alone,
                    woke: if fold.alone > 0.0 {
                        fold.alone_woke / fold.alone
                    } else {
                        0.0
                    },
                    max_size: max_size.max(1) as f64,
                };
                queries as f64 * interval.without_pipelining()
            });
            self.without.inc_by(without.max(0.0));
            fold.pending += without - taken;
        }
        // Fed every second, and as soon as the pool falls idle.
        if fold.ticks >= CLAMP_TICKS || queries == 0 {
            self.saved.inc_by(fold.pending.max(0.0));
            fold.pending = 0.0;
            fold.ticks = 0;
        }
    }
}

/// The connection-seconds the checkouts of an interval would hold without
/// pipelining: what they held, with each statement's own time (write to
/// answer) counted as `alone`. A pipelining pool's checkouts wait longer
/// for their answers than the same checkouts would on a pool doing a
/// fraction of the work (on the example service at 64 workers, 4.2 ms a
/// statement against 2.4 ms without pipelining, where `S` was 2.5); the
/// time between their statements (the caller's own) stays as it was.
fn held_alone(totals: &Totals, last: &Totals, alone: f64) -> f64 {
    let held = totals.held_seconds - last.held_seconds;
    let statements = totals.held_statements.saturating_sub(last.held_statements) as f64;
    let own = totals.held_statement_seconds - last.held_statement_seconds;
    (held - own.min(held) + statements * alone).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_checkouts_wait_is_not_time_between_steps() {
        // A task's query ends; 2 ms later it asks for a connection, which
        // it gets 5 ms after that: 2 ms between its steps, and the 5 ms are
        // the checkout's wait (counted apart), not the caller's own time.
        // (In a task of its own: a test's body is not one.)
        let between = tokio::spawn(async {
            let saved = Saved::new(&super::super::Labels::pool("t")).unwrap();
            let t0 = Instant::now();
            let task = saved.steps.start(t0);
            saved.steps.end(task, t0 + Duration::from_millis(1));
            saved.held(t0 + Duration::from_millis(3), t0 + Duration::from_millis(8));
            saved.steps.between()
        })
        .await
        .unwrap();
        assert!((between - 0.002).abs() < 1e-5, "{between}");
    }

    #[test]
    fn a_checkouts_statements_count_as_sent_alone() {
        // Three statements that took 4 ms each from write to answer, in a
        // hold of 14 ms: 2 ms of the caller's own, and 3 × S without
        // pipelining.
        let last = Totals::default();
        let totals = Totals {
            held_seconds: 0.014,
            held_statements: 3,
            held_statement_seconds: 0.012,
            ..Totals::default()
        };
        assert!((held_alone(&totals, &last, 0.0025) - 0.0095).abs() < 1e-12);
        // Statements sent together overlap: never less than 3 × S.
        let overlapping = Totals {
            held_statement_seconds: 0.030,
            ..totals
        };
        assert!((held_alone(&overlapping, &last, 0.0025) - 0.0075).abs() < 1e-12);
    }
}
