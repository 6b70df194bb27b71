//! Head-of-line awareness: knowing which queries are slow, so that the
//! router keeps them from holding up the fast ones.
//!
//! On a shared connection the server answers in order: a 20 ms query holds
//! every query pipelined behind it for 20 ms. The router (see
//! [`route`](super::route)) avoids that with three signals:
//!
//! - **Learned slowness.** [`Costs`] keeps, per SQL text, the fastest
//!   pipelined run of the last 5 to 10 s, and the fastest run of any
//!   statement (the floor: one round trip plus whatever a pipeline queues).
//!   Of the runs it times: a statement's first run in a window, then one in
//!   [`SAMPLE`] (see [`Costs::times`]).
//!   A statement whose fastest run is `slow_query_threshold` above the floor
//!   is habitually slow. The minimum, not a mean, because a fast query stuck
//!   behind a slow one looks slow once, while a slow query never looks fast.
//! - **The caller's word.** [`Pool::slow`](crate::Pool::slow) marks queries slow before they
//!   were ever seen.
//! - **Overdue connections.** A connection that owes answers and has read
//!   none for the floor plus the threshold is stuck behind something slow
//!   that was not known to be (see `WireCounts::last_ready_nanos`).
//!
//! Slow queries go to the connection with the fewest slow queries in
//! flight; fast ones to connections with none and not overdue, opening
//! another connection (up to `max_size`) when every open one is held up.
//! Nothing is reordered or held back: when every connection is held up, a
//! query still goes to the one with the least slow work, so slow queries
//! keep their throughput.
//!
//! - **Blocked once.** A statement the server stopped at the head-of-line
//!   budget (conn/budget.rs) is remembered for as long as its entry holds
//!   it ([`Costs::block`]): its next runs go to a connection of their own.
//!
//! The table is lossy: 4096 entries by (Fx)hash of the SQL text, no locks,
//! no allocation. Two statements in one entry share the faster one's minimum,
//! so a collision can hide a slow statement (the overdue signal remains),
//! never make a fast one look slow. A blocked entry keeps the whole hash: a
//! collision forgets the statement blocked before (it is stopped once
//! more), never sends another one away.

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Entries in the table (a power of two: the hash is taken modulo it).
const ENTRIES: usize = 4096;
/// No run seen in the window.
const NONE: u32 = u32::MAX;
/// One run in this many, on average, is timed once a statement has a time
/// in the window.
pub(crate) const SAMPLE: u32 = 8;

/// Fastest recent runs, per SQL text (by hash slot) and overall.
pub(crate) struct Costs {
    current: Box<[AtomicU32]>,
    previous: Box<[AtomicU32]>,
    floor: [AtomicU32; 2],
    /// The whole hash of the statement last blocked in each entry (0:
    /// none).
    blocked: Box<[AtomicU64]>,
}

/// Where a statement's runs are kept in [`Costs`]: its SQL text's hash.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CostKey(u64);

impl CostKey {
    #[inline]
    fn slot(self) -> usize {
        (self.0 % ENTRIES as u64) as usize
    }
}

impl Default for Costs {
    fn default() -> Costs {
        let none = || (0..ENTRIES).map(|_| AtomicU32::new(NONE)).collect();
        Costs {
            current: none(),
            previous: none(),
            floor: [AtomicU32::new(NONE), AtomicU32::new(NONE)],
            blocked: (0..ENTRIES).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Costs {
    #[inline]
    pub(crate) fn key(sql: &str) -> CostKey {
        let mut hasher = rustc_hash::FxHasher::default();
        sql.hash(&mut hasher);
        // Never 0, which marks an empty blocked entry.
        CostKey(hasher.finish().max(1))
    }

    /// Remembers that the server stopped the statement of `key` at the
    /// head-of-line budget: its next runs never share a pipeline.
    pub(crate) fn block(&self, key: CostKey) {
        self.blocked[key.slot()].store(key.0, Ordering::Relaxed);
    }

    /// Whether the statement of `key` was stopped at the budget before.
    #[inline]
    pub(crate) fn is_blocked(&self, key: CostKey) -> bool {
        self.blocked[key.slot()].load(Ordering::Relaxed) == key.0
    }

    /// Whether the statement's fastest recent run is `threshold` above the
    /// fastest run of any statement.
    #[inline]
    pub(crate) fn is_slow(&self, key: CostKey, threshold: Duration) -> bool {
        let fastest = min_of(&self.current[key.slot()], &self.previous[key.slot()]);
        if fastest == NONE {
            return false;
        }
        let floor = u64::from(min_of(&self.floor[0], &self.floor[1]));
        let threshold = u64::try_from(threshold.as_micros()).unwrap_or(u64::MAX);
        u64::from(fastest) >= floor.saturating_add(threshold)
    }

    /// The fastest run of any statement, in the last 5 to 10 s.
    pub(crate) fn floor(&self) -> Option<Duration> {
        let floor = min_of(&self.floor[0], &self.floor[1]);
        (floor != NONE).then(|| Duration::from_micros(u64::from(floor)))
    }

    /// Whether to time this run of the statement of `key`: always while it
    /// has no time in the current window (so a slow statement is known from
    /// its first run, and again after each rotation), then one run in
    /// [`SAMPLE`] on average. Timing costs two clock reads a query, and the
    /// minimum kept needs a few runs a window, not every one (issue #25).
    ///
    /// Drawn at random (a per-thread xorshift), not every eighth run: a
    /// task that runs eight statements in turn would otherwise time one of
    /// them always and the others never.
    #[inline]
    pub(crate) fn times(&self, key: CostKey) -> bool {
        thread_local!(static DRAW: Cell<u32> = const { Cell::new(0x9E37_79B9) });
        self.current[key.slot()].load(Ordering::Relaxed) == NONE
            || DRAW.with(|draw| {
                let mut x = draw.get();
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                draw.set(x);
                x % SAMPLE == 0
            })
    }

    /// Records one run, from admission onto a connection to its answer.
    /// Writes only when the run is a new minimum: the hot path reads.
    #[inline]
    pub(crate) fn observe(&self, key: CostKey, took: Duration) {
        let micros = took.as_micros().min(u128::from(NONE - 1)) as u32;
        lower(&self.current[key.slot()], micros);
        lower(&self.floor[0], micros);
    }

    /// Starts a new window; the previous one is kept, the one before it
    /// forgotten. Called by the pool's housekeeping every 5 s.
    pub(crate) fn rotate(&self) {
        for (current, previous) in self.current.iter().zip(self.previous.iter()) {
            previous.store(current.swap(NONE, Ordering::Relaxed), Ordering::Relaxed);
        }
        let floor = self.floor[0].swap(NONE, Ordering::Relaxed);
        self.floor[1].store(floor, Ordering::Relaxed);
    }
}

fn min_of(a: &AtomicU32, b: &AtomicU32) -> u32 {
    a.load(Ordering::Relaxed).min(b.load(Ordering::Relaxed))
}

fn lower(slot: &AtomicU32, micros: u32) {
    if micros < slot.load(Ordering::Relaxed) {
        slot.fetch_min(micros, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Costs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Costs")
            .field("floor", &self.floor())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_statement_is_slow_when_its_fastest_run_is_far_above_the_floor() {
        let costs = Costs::default();
        let (fast, slow) = (Costs::key("SELECT 1"), Costs::key("SELECT pg_sleep(0.02)"));
        assert!(!costs.is_slow(slow, 5 * MS), "unseen statements are fast");
        costs.observe(fast, MS);
        costs.observe(fast, 21 * MS); // stuck behind the slow one once
        costs.observe(slow, 21 * MS);
        costs.observe(slow, 40 * MS);
        assert!(!costs.is_slow(fast, 5 * MS));
        assert!(costs.is_slow(slow, 5 * MS));
        assert!(!costs.is_slow(slow, 30 * MS));
        assert_eq!(costs.floor(), Some(MS));
    }

    #[test]
    fn a_statement_is_timed_at_its_first_run_in_a_window_then_one_run_in_eight() {
        let costs = Costs::default();
        let slow = Costs::key("SELECT pg_sleep(0.02)");
        // Whatever this thread drew before: every run is timed until the
        // statement has a time.
        assert!((0..3 * SAMPLE).all(|_| costs.times(slow)));
        costs.observe(slow, 20 * MS);
        let timed = (0..8000).filter(|_| costs.times(slow)).count();
        assert!((800..1200).contains(&timed), "one run in {SAMPLE}: {timed}");
        costs.rotate();
        assert!(costs.times(slow), "a new window times its first run");
    }

    #[test]
    fn statements_run_in_turn_are_each_timed() {
        // Eight statements in turn on one thread: a counter would time the
        // same one of them every time.
        let costs = Costs::default();
        let keys: Vec<CostKey> = (0..SAMPLE)
            .map(|i| Costs::key(&format!("SELECT {i}")))
            .collect();
        for &key in &keys {
            costs.observe(key, MS);
        }
        let mut timed = vec![0; keys.len()];
        for _ in 0..1000 {
            for (i, &key) in keys.iter().enumerate() {
                timed[i] += usize::from(costs.times(key));
            }
        }
        assert!(timed.iter().all(|&n| (60..200).contains(&n)), "{timed:?}");
    }

    #[test]
    fn a_blocked_statement_is_remembered_across_windows_and_only_it() {
        let costs = Costs::default();
        let (update, echo) = (Costs::key("UPDATE t SET v = 1"), Costs::key("SELECT 1"));
        assert!(!costs.is_blocked(update));
        costs.block(update);
        for _ in 0..3 {
            costs.rotate();
        }
        assert!(costs.is_blocked(update));
        assert!(!costs.is_blocked(echo));
        // Another statement in the same entry takes it over, and is the
        // only one sent away.
        let same_slot = CostKey(update.0.wrapping_add(ENTRIES as u64));
        costs.block(same_slot);
        assert!(costs.is_blocked(same_slot) && !costs.is_blocked(update));
    }

    #[test]
    fn what_is_learned_is_forgotten_after_two_windows() {
        let costs = Costs::default();
        let (fast, slow) = (Costs::key("SELECT 1"), Costs::key("SELECT pg_sleep(0.02)"));
        costs.observe(fast, MS);
        costs.observe(slow, 20 * MS);
        costs.rotate();
        assert!(
            costs.is_slow(slow, 5 * MS),
            "the previous window still counts"
        );
        costs.rotate();
        assert!(!costs.is_slow(slow, 5 * MS));
        assert_eq!(costs.floor(), None);
    }
}
