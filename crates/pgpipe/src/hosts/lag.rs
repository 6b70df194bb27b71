//! How far behind a standby is, in bytes and in seconds, from what the
//! checks saw: correct when the primary is idle, which `now() -
//! pg_last_xact_replay_timestamp()` is not (it grows while nothing is
//! written).

use std::collections::VecDeque;
use std::time::Instant;

/// Most primary positions kept: at the default 2 s re-check, about two
/// minutes of history.
const SAMPLES: usize = 64;

/// The primary's WAL position at each check, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    seen: VecDeque<(Instant, u64)>,
}

/// A standby's distance from the primary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Lag {
    pub(crate) bytes: u64,
    pub(crate) seconds: f64,
    /// Whether `seconds` is the lag, rather than only a lower bound: a
    /// standby behind every primary position kept (a new pool's first
    /// check, the first after a failover) may be any amount behind.
    pub(crate) known: bool,
}

impl Samples {
    /// Records the primary's position; a new timeline starts over.
    pub(crate) fn push(&mut self, at: Instant, lsn: u64) {
        if self.seen.back().is_some_and(|&(_, last)| lsn < last) {
            self.seen.clear();
        }
        if self.seen.len() == SAMPLES {
            self.seen.pop_front();
        }
        self.seen.push_back((at, lsn));
    }

    pub(crate) fn clear(&mut self) {
        self.seen.clear();
    }

    /// The lag of a standby that has replayed up to `replay`, at `now`:
    /// bytes behind the newest primary position, and in seconds how long
    /// ago the primary was where the standby is, assuming the primary's
    /// WAL grew evenly between two checks (the oldest sample's age, a lower
    /// bound, when the standby is behind every sample kept). `None` before
    /// the primary was seen.
    pub(crate) fn lag(&self, replay: u64, now: Instant) -> Option<Lag> {
        let &(_, newest) = self.seen.back()?;
        if replay >= newest {
            return Some(Lag {
                bytes: 0,
                seconds: 0.0,
                known: true,
            });
        }
        // The first position the standby has not reached, and the one
        // before it, which it has.
        let next = self.seen.iter().position(|&(_, lsn)| lsn > replay)?;
        let (next_at, next_lsn) = self.seen[next];
        let known = next > 0;
        let was_there = match next.checked_sub(1).map(|i| self.seen[i]) {
            None => next_at,
            Some((at, lsn)) => {
                let span = next_lsn - lsn;
                let part = (replay - lsn) as f64 / span.max(1) as f64;
                at + next_at
                    .saturating_duration_since(at)
                    .mul_f64(part.clamp(0.0, 1.0))
            }
        };
        Some(Lag {
            bytes: newest - replay,
            seconds: now.saturating_duration_since(was_there).as_secs_f64(),
            known,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_caught_up_standby_has_no_lag_however_long_the_primary_idles() {
        let start = Instant::now();
        let mut samples = Samples::default();
        for i in 0..10 {
            samples.push(start + Duration::from_secs(i * 2), 1000);
        }
        let lag = samples.lag(1000, start + Duration::from_secs(60)).unwrap();
        assert_eq!(lag.bytes, 0);
        assert_eq!(lag.seconds, 0.0);
    }

    #[test]
    fn a_standby_lags_by_how_long_ago_the_primary_was_where_it_is() {
        let start = Instant::now();
        let mut samples = Samples::default();
        samples.push(start, 100);
        samples.push(start + Duration::from_secs(2), 200);
        samples.push(start + Duration::from_secs(4), 300);
        // Halfway from 100 (at 0 s) to 200 (at 2 s): there at 1 s.
        let lag = samples.lag(150, start + Duration::from_secs(5)).unwrap();
        assert_eq!(lag.bytes, 150);
        assert!((lag.seconds - 4.0).abs() < 1e-6, "{}", lag.seconds);
        assert!(lag.known);
        // Behind every sample kept: at least as old as the oldest, and no
        // more is known.
        let lag = samples.lag(50, start + Duration::from_secs(5)).unwrap();
        assert_eq!(lag.seconds, 5.0);
        assert!(!lag.known);
        assert_eq!(Samples::default().lag(0, start), None);
    }

    #[test]
    fn with_one_sample_a_standby_behind_it_has_an_unknown_lag() {
        let start = Instant::now();
        let mut samples = Samples::default();
        samples.push(start, 1000);
        let lag = samples.lag(400, start).unwrap();
        assert_eq!((lag.bytes, lag.known), (600, false));
        assert!(
            samples.lag(1000, start).unwrap().known,
            "caught up is known"
        );
    }

    #[test]
    fn a_new_timeline_starts_the_history_over() {
        let start = Instant::now();
        let mut samples = Samples::default();
        samples.push(start, 500);
        samples.push(start + Duration::from_secs(1), 100);
        let lag = samples.lag(50, start + Duration::from_secs(2)).unwrap();
        assert_eq!(lag.seconds, 1.0, "only the new timeline's sample is kept");
    }
}
