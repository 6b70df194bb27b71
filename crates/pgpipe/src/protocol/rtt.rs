//! The round-trip estimate, from solitary round trips the tap times.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The round-trip estimate from solitary round trips (a write to an idle
/// connection until its first answer): it drops at once to a smaller sample
/// and rises by an eighth of the difference (an EWMA) on a larger one, and
/// ignores samples over 1.5 times the smallest of the last 5 to 10 s, so
/// that a slow query sent alone, or an answer read late by a busy client,
/// does not count as a slow network.
#[derive(Debug)]
pub(crate) struct RttFilter {
    /// Windowed minimum: the current window and the one before.
    current: AtomicU64,
    previous: AtomicU64,
    /// The smoothed estimate, in nanoseconds.
    smoothed: AtomicU64,
}

const NO_SAMPLE: u64 = u64::MAX;

impl Default for RttFilter {
    fn default() -> RttFilter {
        RttFilter {
            current: AtomicU64::new(NO_SAMPLE),
            previous: AtomicU64::new(NO_SAMPLE),
            smoothed: AtomicU64::new(NO_SAMPLE),
        }
    }
}

impl RttFilter {
    pub(crate) fn sample(&self, rtt: Duration) {
        let nanos = u64::try_from(rtt.as_nanos()).unwrap_or(NO_SAMPLE - 1);
        self.current.fetch_min(nanos, Ordering::AcqRel);
        let floor = self.floor_nanos();
        if nanos > floor.saturating_add(floor / 2) {
            return; // a slow query or a busy client, not a slow network
        }
        let _ = self
            .smoothed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                Some(if old == NO_SAMPLE || nanos <= old {
                    nanos
                } else {
                    old + (nanos - old) / 8
                })
            });
    }

    /// Starts a new window of the minimum. With no sample in the last one,
    /// it stays what it was.
    pub(crate) fn rotate(&self) {
        let last = self.current.swap(NO_SAMPLE, Ordering::AcqRel);
        if last != NO_SAMPLE {
            self.previous.store(last, Ordering::Release);
        }
    }

    fn floor_nanos(&self) -> u64 {
        self.current
            .load(Ordering::Acquire)
            .min(self.previous.load(Ordering::Acquire))
    }

    /// The smoothed estimate, once there is a sample.
    pub(crate) fn estimate(&self) -> Option<Duration> {
        let nanos = self.smoothed.load(Ordering::Acquire);
        (nanos != NO_SAMPLE).then(|| Duration::from_nanos(nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_filter_smooths_and_ignores_slow_queries() {
        let filter = RttFilter::default();
        assert_eq!(filter.estimate(), None);
        filter.sample(Duration::from_micros(1000));
        assert_eq!(filter.estimate(), Some(Duration::from_micros(1000)));
        filter.sample(Duration::from_micros(1400));
        assert_eq!(filter.estimate(), Some(Duration::from_micros(1050)));
        filter.sample(Duration::from_micros(1800));
        assert_eq!(
            filter.estimate(),
            Some(Duration::from_micros(1050)),
            "too slow to count"
        );
        filter.sample(Duration::from_micros(1010));
        assert_eq!(
            filter.estimate(),
            Some(Duration::from_micros(1010)),
            "drops at once"
        );
        filter.sample(Duration::from_micros(1050));
        assert_eq!(filter.estimate(), Some(Duration::from_micros(1015)));
        // A 20 ms query sent alone is not a 20 ms network.
        filter.sample(Duration::from_millis(20));
        assert_eq!(filter.estimate(), Some(Duration::from_micros(1015)));
        // When the network really slows down, the old minimum ages out
        // (two windows later) and the estimate follows.
        for _ in 0..2 {
            filter.rotate();
            filter.sample(Duration::from_millis(5));
        }
        for _ in 0..40 {
            filter.sample(Duration::from_millis(5));
        }
        let estimate = filter.estimate().unwrap();
        assert!(estimate > Duration::from_millis(4), "{estimate:?}");
    }
}
