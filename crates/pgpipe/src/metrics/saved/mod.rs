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
//!   and holds, and `B`.
//! - `H`, the connection-seconds the checkouts hold, each of their
//!   statements (counted at the connection) taking `S` rather than the
//!   time it took: a pipelining pool's checkouts wait longer for their
//!   answers than the same checkouts would beside a fraction of the work.
//! - `h`, how long a woken task waits for a thread: on the queries sent
//!   alone, from their answer's read to their task running again. Without
//!   pipelining a connection passes from one user to the next through such
//!   a wake-up, so each use of it holds it `h` longer.
//!
//! Without pipelining, a closed loop of `N` callers on `c = max_size`
//! connections keeps every connection busy once it needs more than `c`:
//! they do `c` connection-seconds of work per second (`S` a query, a
//! checkout its hold), every step waits the same `W` (first come, first
//! served, as deadpool's queue), and each caller's round stretches by the
//! ratio of the work to `c`. Per interval, with `Q` queries in `Q/k` steps
//! and `K` checkouts:
//!
//! ```text
//! A = S + (k − 1)/2 · h
//! W = max(0, (N · (Q·A + H + (Q+K)·h) / c − (Q/k · A + H + B)) / (Q/k + K))
//! ```
//!
//! where `A` is a query alone among its step's `k`: their answers, on as
//! many connections, arrive together and are read one after another, a
//! hand-off each. A query would have taken `A + W`: `A` while the connections
//! outnumber what the callers need, growing with the queue beyond. With
//! only queries and no time between them, `S · max(1, L/c)` for `L`
//! queries in the pool.
//!
//! What this assumes: the callers' time between steps stays what it was
//! (time the pool cannot see, such as a request in a task of its own per
//! connection, is not counted, and the estimate runs low); queries like
//! the ones sent alone (`S`), and a pipelined query's own client work
//! (in `S`) no more than an exclusive one's: true of a release build (a
//! few µs), not of an unoptimized one, where it is ~0.2 ms more and the
//! estimate runs high by that; the same server time and round trip with one
//! connection busy as with `max_size`. A connection held for long (a
//! `LISTEN`) counts as one more caller, not one connection fewer. Two
//! tasks starting queries at the same moment on two threads may split a
//! burst in two: only a mix of queries and checkouts feels it.

mod steps;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus::{Counter, Gauge};

use super::{Buckets, Labels, opts};
use crate::sync::lock;
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

/// One fold's interval, as the model reads it.
#[derive(Debug, Clone, Copy)]
struct Interval {
    seconds: f64,
    queries: f64,
    /// The queries' time in the pool, waits included.
    query_seconds: f64,
    /// Query steps.
    steps: f64,
    /// Time callers spent between two steps of the same task.
    between: f64,
    checkouts: f64,
    checkout_waits: f64,
    /// Connection-seconds held by exclusive checkouts, their statements'
    /// own time counted as `S` each (see [`held_alone`]).
    held_seconds: f64,
    /// `S`: a query with a connection to itself.
    alone: f64,
    /// A woken task's wait for a thread: the gap between one user of a
    /// connection and the next, without pipelining.
    woke: f64,
    max_size: f64,
}

impl Interval {
    /// What a query would have taken without pipelining.
    fn without_pipelining(&self) -> f64 {
        let steps = self.steps.clamp(1.0, self.queries.max(1.0));
        let per_step = self.queries / steps;
        // A step's queries on as many connections: their answers come in
        // at about the same time and are read one after another, each a
        // hand-off `h`; on average a query waits for half the others'.
        let alone = self.alone + (per_step - 1.0) / 2.0 * self.woke;
        let callers = (self.query_seconds / per_step
            + self.checkout_waits
            + self.held_seconds
            + self.between)
            / self.seconds;
        let acquisitions = self.queries + self.checkouts;
        let work = self.queries * alone + self.held_seconds + acquisitions * self.woke;
        let callers_work = steps * alone + self.held_seconds + self.between;
        let wait = (callers * work / self.max_size - callers_work) / (steps + self.checkouts);
        alone + wait.max(0.0)
    }
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

    /// A connection is held exclusively from `since`.
    pub(crate) fn held(&self, since: Instant) {
        self.steps.arrive(current_task(), since);
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
                    held_seconds: held_alone(&totals, &last, alone),
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

    /// `callers` queries always in the pool, each alone taking 2 ms.
    fn closed_loop(callers: f64, max_size: f64) -> Interval {
        let (alone, seconds) = (0.002, 1.0);
        let per_query = alone * (callers / max_size).max(1.0);
        let queries = callers * seconds / per_query;
        Interval {
            seconds,
            queries,
            query_seconds: callers * seconds,
            steps: queries,
            between: 0.0,
            checkouts: 0.0,
            checkout_waits: 0.0,
            held_seconds: 0.0,
            alone,
            woke: 0.0,
            max_size,
        }
    }

    #[test]
    fn without_pipelining_a_query_waits_only_for_want_of_connections() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // One caller with three queries at once: three connections of
        // eight, no wait.
        assert!(close(closed_loop(3.0, 8.0).without_pipelining(), 0.002));
        assert!(close(closed_loop(8.0, 8.0).without_pipelining(), 0.002));
        // 192 queries at once on 8 connections: 24 turns of 2 ms.
        assert!(close(closed_loop(192.0, 8.0).without_pipelining(), 0.048));
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

    #[test]
    fn queries_sent_at_once_wait_for_each_others_reads() {
        // One caller with three queries at once, each 2 ms alone, and a
        // hand-off of 0.3 ms: on three connections the second answer is
        // read after the first, the third after both, 0.3 ms more on
        // average.
        let mut interval = closed_loop(3.0, 8.0);
        interval.steps = interval.queries / 3.0;
        interval.woke = 0.0003;
        let without = interval.without_pipelining();
        assert!((without - 0.0023).abs() < 1e-9, "{without}");
        // One at a time: nothing to wait for.
        interval.steps = interval.queries;
        let without = interval.without_pipelining();
        assert!((without - 0.002).abs() < 1e-9, "{without}");
    }

    #[test]
    fn queries_sent_at_once_wait_as_one_step() {
        // Each caller sends three queries at once: 64 callers on 8
        // connections, 24 turns of 2 ms, whether or not they are told
        // apart as steps.
        let mut interval = closed_loop(192.0, 8.0);
        for steps in [interval.queries, interval.queries / 3.0] {
            interval.steps = steps;
            let without = interval.without_pipelining();
            assert!((without - 0.048).abs() < 1e-9, "{without}");
        }
    }

    #[test]
    fn time_between_queries_keeps_callers_out_of_the_queue() {
        // 16 callers, each 2 ms between queries that take 2 ms alone, on 4
        // connections: 2000 queries/s at most, a caller's round 16/2000 s
        // = 8 ms, so a query takes 6 ms. With pipelining they took 2.5 ms.
        let rate = 16.0 / 0.0045;
        let interval = Interval {
            seconds: 1.0,
            queries: rate,
            query_seconds: rate * 0.0025,
            steps: rate,
            between: rate * 0.002,
            checkouts: 0.0,
            checkout_waits: 0.0,
            held_seconds: 0.0,
            alone: 0.002,
            woke: 0.0,
            max_size: 4.0,
        };
        let without = interval.without_pipelining();
        assert!((without - 0.006).abs() < 1e-9, "{without}");
    }

    #[test]
    fn checkouts_hold_connections_for_their_own_time() {
        // 2 callers each cycle through four 2 ms queries and one 8 ms
        // transaction (16 ms a cycle, if alone), on 1 connection: two
        // cycles' work per cycle, so every step waits one step's mean
        // hold (16/5 ms).
        let cycles = 1.0 / (2.0 * 0.016);
        let interval = Interval {
            seconds: 1.0,
            queries: 2.0 * 4.0 * cycles,
            query_seconds: 2.0 * 4.0 * cycles * (0.002 + 0.0032),
            steps: 2.0 * 4.0 * cycles,
            between: 0.0,
            checkouts: 2.0 * cycles,
            checkout_waits: 2.0 * cycles * 0.0032,
            held_seconds: 2.0 * cycles * 0.008,
            alone: 0.002,
            woke: 0.0,
            max_size: 1.0,
        };
        let without = interval.without_pipelining();
        assert!((without - 0.0052).abs() < 1e-9, "{without}");
    }

    #[test]
    fn a_burst_of_queries_beside_transactions_is_one_caller() {
        // 2 callers each cycle through two bursts of three 2 ms queries
        // and one 6 ms transaction (18 ms of work, 10 ms if alone with a
        // connection per query) on 2 connections: 36 ms of work a cycle
        // for both, 18 ms each; the three steps wait W each:
        // 2·(2 + W) + 6 + W = 18, W = 8/3 ms.
        let w = 0.008 / 3.0;
        let cycles = 1.0 / 0.018;
        let interval = Interval {
            seconds: 1.0,
            queries: 2.0 * 6.0 * cycles,
            query_seconds: 2.0 * 6.0 * cycles * (0.002 + w),
            steps: 2.0 * 2.0 * cycles,
            between: 0.0,
            checkouts: 2.0 * cycles,
            checkout_waits: 2.0 * cycles * w,
            held_seconds: 2.0 * cycles * 0.006,
            alone: 0.002,
            woke: 0.0,
            max_size: 2.0,
        };
        let without = interval.without_pipelining();
        assert!((without - (0.002 + w)).abs() < 1e-9, "{without}");
    }
}
