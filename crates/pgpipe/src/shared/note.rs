//! [`DispatchNote`]: one dispatcher at a time, and no call to dispatch
//! lost.
//!
//! A caller that finds another dispatcher at work leaves it a note to go
//! round once more, and returns; the dispatcher, before it stops, looks
//! for a note. Each side writes one flag and then reads the other's: the
//! store-buffering pattern, in which, with release stores and acquire
//! loads alone, *both* may miss the other's write (on x86 too: a store
//! waits in the store buffer while the load runs), and a waiter whose room
//! was freed sits until the next release or the 100 ms tick. So every step
//! that hands the turn over is a read-modify-write: an RMW reads the latest
//! value in its flag's order, so the dispatcher's last swap of
//! `dispatching` reads the caller's, and synchronizes with it; the
//! caller's note is then visible to the dispatcher's last look, and the
//! swap that clears the note reads any note left before it, with the work
//! behind it. Model-checked with loom in `crates/pgpipe-loom` (which
//! compiles this file under `--cfg loom`), where today's protocol passes and
//! the one with plain stores (the one before issue #45) fails.

#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, Ordering};

/// Who dispatches, and whether to go round once more.
#[derive(Debug, Default)]
pub(crate) struct DispatchNote {
    dispatching: AtomicBool,
    again: AtomicBool,
}

impl DispatchNote {
    /// Runs `dispatch` now, and again while a note was left meanwhile;
    /// or, when another caller is dispatching, leaves it the note and
    /// returns. Whatever the caller made visible before the call is seen by
    /// a `dispatch` that starts after it.
    pub(crate) fn run(&self, mut dispatch: impl FnMut()) {
        self.again.store(true, Ordering::Release);
        while self.again.load(Ordering::Acquire) {
            if self.dispatching.swap(true, Ordering::AcqRel) {
                return; // the dispatcher at work will see the note
            }
            // A swap, not a store: it reads (and synchronizes with) a note
            // left before it, so this round sees the work behind the note.
            self.again.swap(false, Ordering::AcqRel);
            dispatch();
            // A swap, not a store: it reads the `true` of any caller that
            // found this dispatcher at work, so the look above sees that
            // caller's note.
            self.dispatching.swap(false, Ordering::AcqRel);
        }
    }
}
