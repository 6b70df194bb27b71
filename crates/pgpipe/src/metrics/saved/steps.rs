//! The callers' steps (see the parent module): which pipelined queries
//! start a step of their own, and the time a task spends between two of
//! its steps. Per query: a swap and a compare-exchange on the last task to
//! start a query, a load at a step's start and a store at its end in a
//! fixed table; no lock, no allocation, and no clock read of its own (the
//! query's counting hands it the times it read).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Where each task's last query step ended: a task's slot by the low bits
/// of its id, tagged by the next 24; stamps in µs, 40 bits.
const SLOTS: usize = 256;
const STAMP_BITS: u32 = 40;
const STAMP_MASK: u64 = (1 << STAMP_BITS) - 1;
/// Longer between two steps of one task, it counts as a new caller.
const LONGEST_GAP_MICROS: u64 = 1_000_000;

/// The steps counted, and where tasks' last ones ended.
#[derive(Debug)]
pub(crate) struct Steps {
    epoch: Instant,
    /// The task of the last pipelined query to start, while it runs (0:
    /// none), and the query steps (see the module doc).
    last_task: AtomicU64,
    steps: AtomicU64,
    /// Where tasks' last steps ended (see [`SLOTS`]), and the time callers
    /// spent between two steps of the same task, in µs.
    ends: Box<[AtomicU64]>,
    between_micros: AtomicU64,
}

impl Default for Steps {
    fn default() -> Steps {
        Steps {
            epoch: Instant::now(),
            last_task: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            ends: (0..SLOTS).map(|_| AtomicU64::new(u64::MAX)).collect(),
            between_micros: AtomicU64::new(0),
        }
    }
}

impl Steps {
    /// A pipelined query of the current task starts at `now`: a new step
    /// unless the last query to start, still running, is its own task's.
    /// Returns the task, for [`end`](Steps::end) (0 outside a task).
    pub(crate) fn start(&self, now: Instant) -> u64 {
        let task = current_task();
        if task == 0 || self.last_task.swap(task, Ordering::Relaxed) != task {
            self.steps.fetch_add(1, Ordering::Relaxed);
            self.arrive(task, now);
        }
        task
    }

    /// The query [`start`](Steps::start) returned `task` for ended at
    /// `now`: its step ends with it.
    pub(crate) fn end(&self, task: u64, now: Instant) {
        self.leave(task, now);
        if task != 0 {
            // Only if no other task's query started since.
            let _ = self
                .last_task
                .compare_exchange(task, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// A step of `task` begins at `now`: the time since its last step
    /// ended, if its slot still holds it, was spent between the two.
    pub(super) fn arrive(&self, task: u64, now: Instant) {
        if task == 0 {
            return;
        }
        let (slot, tag) = Self::slot(task);
        let end = self.ends[slot].load(Ordering::Relaxed);
        if end >> STAMP_BITS == tag {
            let gap = self.micros(now).wrapping_sub(end) & STAMP_MASK;
            if gap < LONGEST_GAP_MICROS {
                self.between_micros.fetch_add(gap, Ordering::Relaxed);
            }
        }
    }

    /// A step of `task` ends at `now`.
    pub(super) fn leave(&self, task: u64, now: Instant) {
        if task != 0 {
            let (slot, tag) = Self::slot(task);
            let end = (tag << STAMP_BITS) | (self.micros(now) & STAMP_MASK);
            self.ends[slot].store(end, Ordering::Relaxed);
        }
    }

    fn slot(task: u64) -> (usize, u64) {
        ((task % SLOTS as u64) as usize, (task >> 8) & 0xFF_FFFF)
    }

    fn micros(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.epoch);
        since.as_secs() * 1_000_000 + u64::from(since.subsec_micros())
    }

    /// Query steps so far.
    pub(super) fn count(&self) -> u64 {
        self.steps.load(Ordering::Relaxed)
    }

    /// Seconds spent between two steps of one task, so far.
    pub(super) fn between(&self) -> f64 {
        self.between_micros.load(Ordering::Relaxed) as f64 * 1e-6
    }
}

/// The current task's id as a number, 0 outside a task.
pub(super) fn current_task() -> u64 {
    tokio::task::try_id().map_or(0, task_key)
}

/// A task's id as a number (tokio's `Id` hashes as its `u64`).
fn task_key(id: tokio::task::Id) -> u64 {
    struct Key(u64);
    impl std::hash::Hasher for Key {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(b);
            }
        }
        fn write_u64(&mut self, n: u64) {
            self.0 = n;
        }
    }
    let mut key = Key(0);
    std::hash::Hash::hash(&id, &mut key);
    key.0
}
