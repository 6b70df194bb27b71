//! [`Settlers`]: how many tasks wait for a connection's wire to settle, in
//! a handshake with the tap that counts answers, so that the tap wakes
//! nobody on a `ReadyForQuery` unless somebody waits, and never misses one
//! who does.
//!
//! Both sides read-modify-write the one counter: the waiter adds itself
//! ([`register`](Settlers::register)) and then reads the answer counts; the
//! tap counts an answer and then adds nothing ([`any`](Settlers::any)).
//! The counter's modification order puts one of the two first. If the
//! waiter's comes first, the tap reads it and wakes; if the tap's does, the
//! waiter's read-modify-write reads what the tap's wrote (acquiring what
//! the tap released: its answer count) and sees the answer itself. Plain
//! acquire/release on one location, no fence: model-checked with loom in
//! `crates/pgpipe-loom` (which compiles this file under `--cfg loom`).

#[cfg(loom)]
use loom::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicUsize, Ordering};

/// Tasks waiting for answers; see the module.
#[derive(Debug, Default)]
pub(crate) struct Settlers(AtomicUsize);

/// Counts a task as waiting while it lives.
#[derive(Debug)]
pub(crate) struct Registered<'a>(&'a AtomicUsize);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl Settlers {
    /// Registers a task that is about to read the answer counts and wait;
    /// call it before that read.
    pub(crate) fn register(&self) -> Registered<'_> {
        self.0.fetch_add(1, Ordering::AcqRel);
        Registered(&self.0)
    }

    /// Whether a task waits: call it after counting an answer. A
    /// read-modify-write, not a load (see the module): the waiter that
    /// registers after it sees the answer counted before it.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.0.fetch_add(0, Ordering::AcqRel) > 0
    }
}
