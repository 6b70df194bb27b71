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
}

impl<'a> Counting<'a> {
    pub(crate) fn start(metrics: &'a Metrics, mode: Mode) -> Counting<'a> {
        Counting {
            metrics,
            mode,
            start: Instant::now(),
            done: false,
        }
    }

    /// When the query started.
    pub(crate) fn started(&self) -> Instant {
        self.start
    }

    pub(crate) fn finish(mut self, result: Result<(), &Error>) {
        self.done = true;
        self.metrics.query(self.mode, self.start.elapsed(), result);
    }
}

impl Drop for Counting<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.cancelled(self.mode, self.start.elapsed());
        }
    }
}
