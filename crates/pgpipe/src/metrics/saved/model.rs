//! The counterfactual: what a query would have taken on the same pool
//! with pipelining off, from one fold's interval.
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
//! where `H` is the checkouts' hold without pipelining (their statements
//! at `S` each), while `N` counts them by the hold they had, and `A` is a query alone among its step's `k`: their answers, on as
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

/// One fold's interval, as the model reads it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Interval {
    pub(super) seconds: f64,
    pub(super) queries: f64,
    /// The queries' time in the pool, waits included.
    pub(super) query_seconds: f64,
    /// Query steps.
    pub(super) steps: f64,
    /// Time callers spent between two steps of the same task.
    pub(super) between: f64,
    pub(super) checkouts: f64,
    pub(super) checkout_waits: f64,
    /// Connection-seconds held by exclusive checkouts, as measured: the
    /// callers' time, for `N`.
    pub(super) held_seconds: f64,
    /// The same checkouts' hold without pipelining, their statements' own
    /// time counted as `S` each: the connections' work, for `W`.
    pub(super) held_alone: f64,
    /// `S`: a query with a connection to itself.
    pub(super) alone: f64,
    /// A woken task's wait for a thread: the gap between one user of a
    /// connection and the next, without pipelining.
    pub(super) woke: f64,
    pub(super) max_size: f64,
}

impl Interval {
    /// What a query would have taken without pipelining.
    pub(super) fn without_pipelining(&self) -> f64 {
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
        let work = self.queries * alone + self.held_alone + acquisitions * self.woke;
        let callers_work = steps * alone + self.held_alone + self.between;
        let wait = (callers * work / self.max_size - callers_work) / (steps + self.checkouts);
        alone + wait.max(0.0)
    }
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
            held_alone: 0.0,
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
            held_alone: 0.0,
            alone: 0.002,
            woke: 0.0,
            max_size: 4.0,
        };
        let without = interval.without_pipelining();
        assert!((without - 0.006).abs() < 1e-9, "{without}");
    }

    /// Two callers on one connection, `cycles` a second between them, each
    /// cycle four 2 ms queries that waited `wait` each, and one transaction
    /// that waited `wait` and held its connection `held` (8 ms without
    /// pipelining).
    fn transactions(cycles: f64, wait: f64, held: f64) -> Interval {
        Interval {
            seconds: 1.0,
            queries: 4.0 * cycles,
            query_seconds: 4.0 * cycles * (0.002 + wait),
            steps: 4.0 * cycles,
            between: 0.0,
            checkouts: cycles,
            checkout_waits: cycles * wait,
            held_seconds: cycles * held,
            held_alone: cycles * 0.008,
            alone: 0.002,
            woke: 0.0,
            max_size: 1.0,
        }
    }

    #[test]
    fn checkouts_hold_connections_for_their_own_time() {
        // Each caller's cycle takes 16 ms alone: two cycles' work per
        // cycle, so every step waits one step's mean hold (16/5 ms), 62.5
        // cycles a second in all.
        let without = transactions(1.0 / 0.016, 0.0032, 0.008).without_pipelining();
        assert!((without - 0.0052).abs() < 1e-9, "{without}");
    }

    #[test]
    fn callers_are_counted_by_the_hold_they_had() {
        // With pipelining nothing waited, but each transaction held its
        // connection 12 ms (its statements waited longer for their
        // answers): 50 cycles a second each. Still two callers, who would
        // each wait one step's mean hold, 16/5 ms, without pipelining.
        let without = transactions(2.0 * 50.0, 0.0, 0.012).without_pipelining();
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
            held_alone: 2.0 * cycles * 0.006,
            alone: 0.002,
            woke: 0.0,
            max_size: 2.0,
        };
        let without = interval.without_pipelining();
        assert!((without - (0.002 + w)).abs() < 1e-9, "{without}");
    }
}
