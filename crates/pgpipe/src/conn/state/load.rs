//! [`LoadWord`]: a connection's in-flight count and flags in one word.
//!
//! Written by admission (`admit`, `add`, `release`), by whoever lends or
//! takes back a shared connection (`share`, `unshare`), by whoever closes
//! it (`close`, and [`ConnState::quarantine`](super::ConnState::quarantine))
//! and by its I/O task when that ends (`mark_dead`). Everyone reads it.
//! Every write is one read-modify-write of the whole word, so no flag and
//! no count is lost between writers: model-checked with loom in
//! `crates/pgpipe-loom` (which compiles this file under `--cfg loom`).

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

/// A connection's in-flight count and flags in one word, so that "admit a
/// query if the connection is open and below its depth limit" is a single
/// compare-and-swap. The bit layout is private to this type.
#[derive(Debug, Default)]
pub(crate) struct LoadWord(AtomicU64);

/// The low 32 bits count queries admitted on a shared connection and not
/// yet finished.
const IN_FLIGHT: u64 = 0xffff_ffff;
/// The connection is used by the shared (pipelined) path.
const SHARED: u64 = 1 << 61;
/// The connection takes no new work (retiring, quarantined or dead).
const CLOSED: u64 = 1 << 62;
/// The connection's I/O task has ended.
const DEAD: u64 = 1 << 63;

/// One reading of a [`LoadWord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load(u64);

impl Load {
    /// Queries admitted and not finished.
    pub(crate) fn in_flight(self) -> u64 {
        self.0 & IN_FLIGHT
    }

    /// Takes no new work.
    pub(crate) fn is_closed(self) -> bool {
        self.0 & CLOSED != 0
    }

    /// Its I/O task has ended.
    pub(crate) fn is_dead(self) -> bool {
        self.0 & DEAD != 0
    }

    /// Lent to the shared path.
    pub(crate) fn is_shared(self) -> bool {
        self.0 & SHARED != 0
    }
}

impl LoadWord {
    /// The word now.
    #[inline]
    pub(crate) fn get(&self) -> Load {
        Load(self.0.load(Ordering::Acquire))
    }

    /// Queries admitted and not finished.
    #[inline]
    pub(crate) fn in_flight(&self) -> u64 {
        self.get().in_flight()
    }

    /// Whether the connection's I/O task has ended.
    #[inline]
    pub(crate) fn is_dead(&self) -> bool {
        self.get().is_dead()
    }

    /// Whether the connection is lent to the shared path.
    #[inline]
    pub(crate) fn is_shared(&self) -> bool {
        self.get().is_shared()
    }

    /// Claims a place for one more query, returning how many were in flight
    /// before, or `None` if the connection is closed to new work or has
    /// `max_depth` in flight.
    pub(crate) fn admit(&self, max_depth: u64) -> Option<u64> {
        let mut current = self.0.load(Ordering::Acquire);
        loop {
            if current & (CLOSED | DEAD) != 0 || current & IN_FLIGHT >= max_depth {
                return None;
            }
            match self.0.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(current & IN_FLIGHT),
                Err(actual) => current = actual,
            }
        }
    }

    /// Claims `n` more places, past the depth limit if need be (the items
    /// of one batch).
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::AcqRel);
    }

    /// Claims up to `n` more places, as many as `max_depth` leaves room for
    /// now, in one read-modify-write; returns how many it took. (A count
    /// read earlier and claimed later could let two batches each take the
    /// room the other had already taken.)
    pub(crate) fn add_within(&self, n: u64, max_depth: u64) -> u64 {
        let mut taken = 0;
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                taken = n.min(max_depth.saturating_sub(word & IN_FLIGHT));
                Some(word + taken)
            });
        taken
    }

    /// Frees one place; returns how many were in flight before, or `None`
    /// when none was (a place given back twice). That never borrows from
    /// the flags: an unchecked subtraction would clear `SHARED` and count
    /// 2^32 queries in flight, and every later admission would fail without
    /// a word (issue #45). The caller reports it.
    #[inline]
    pub(crate) fn release(&self) -> Option<u64> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                (word & IN_FLIGHT != 0).then(|| word - 1)
            })
            .ok()
            .map(|word| word & IN_FLIGHT)
    }

    /// Takes no new work from now on.
    pub(crate) fn close(&self) {
        self.0.fetch_or(CLOSED, Ordering::AcqRel);
    }

    /// The I/O task ended: closed, and dead.
    pub(crate) fn mark_dead(&self) {
        self.0.fetch_or(DEAD | CLOSED, Ordering::AcqRel);
    }

    /// Lent to the shared path. A flag, OR-ed in: a connection that died
    /// meanwhile stays dead.
    pub(crate) fn share(&self) {
        self.0.fetch_or(SHARED, Ordering::AcqRel);
    }

    /// Back from the shared path: no longer shared, open to whoever takes it
    /// next, nothing in flight. A dead connection stays dead.
    pub(crate) fn unshare(&self) {
        self.0.fetch_and(DEAD, Ordering::AcqRel);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn admission_stops_at_the_depth_limit_and_at_close() {
        let word = LoadWord::default();
        assert_eq!(word.admit(2), Some(0));
        assert_eq!(word.admit(2), Some(1));
        assert_eq!(word.admit(2), None, "full");
        assert_eq!(word.release(), Some(2));
        word.close();
        assert_eq!(word.admit(2), None, "closed");
        assert_eq!(word.in_flight(), 1);
    }

    #[test]
    fn a_bounded_claim_takes_only_the_room_left() {
        let word = LoadWord::default();
        assert_eq!(word.admit(4), Some(0));
        assert_eq!(word.admit(4), Some(1));
        assert_eq!(word.add_within(3, 4), 2, "two places left of four");
        assert_eq!(word.add_within(3, 4), 0, "full");
        assert_eq!(word.in_flight(), 4);
    }

    #[test]
    fn a_place_given_back_twice_leaves_the_word_as_it_was() {
        let word = LoadWord::default();
        word.share();
        assert_eq!(word.admit(2), Some(0));
        assert_eq!(word.release(), Some(1));
        assert_eq!(word.release(), None, "nothing in flight");
        let load = word.get();
        assert!(load.is_shared() && !load.is_closed() && load.in_flight() == 0);
        assert_eq!(word.admit(2), Some(0), "admission goes on");
    }

    #[test]
    fn sharing_keeps_a_dead_connection_dead() {
        let word = LoadWord::default();
        word.mark_dead();
        word.share();
        word.unshare();
        assert!(word.get().is_dead() && !word.get().is_shared());
        assert_eq!(word.admit(8), None);
    }
}
