//! [`Counting`]: one query being counted, from its start to how it ended
//! (or its drop, as `cancelled`).

use std::time::Instant;

use super::{Metrics, Mode};
use crate::error::Error;

/// One query being counted: [`finish`](Counting::finish) records how it
/// ended; dropped before that (its caller dropped the future), it counts as
/// `cancelled`, so that every query ends under some outcome.
pub(crate) struct Counting<'a> {
    metrics: &'a Metrics,
    mode: Mode,
    start: Instant,
    done: bool,
    /// Its task, as latency saved's steps know it (`saved::steps`), which
    /// see the query start and end at the times read here.
    task: u64,
}

impl<'a> Counting<'a> {
    pub(crate) fn start(metrics: &'a Metrics, mode: Mode) -> Counting<'a> {
        let start = Instant::now();
        Counting {
            metrics,
            mode,
            start,
            done: false,
            task: metrics.saved.steps.start(start),
        }
    }

    /// When the query started.
    pub(crate) fn started(&self) -> Instant {
        self.start
    }

    pub(crate) fn finish(mut self, result: Result<(), &Error>) {
        self.done = true;
        let now = Instant::now();
        self.metrics.query(self.mode, now - self.start, result);
        self.metrics.saved.steps.end(self.task, now);
    }
}

impl Drop for Counting<'_> {
    fn drop(&mut self) {
        if !self.done {
            let now = Instant::now();
            self.metrics.cancelled(self.mode, now - self.start);
            self.metrics.saved.steps.end(self.task, now);
        }
    }
}
