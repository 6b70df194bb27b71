//! The one way this crate takes a `std::sync::Mutex`, and a count held
//! while a guard lives.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `mutex`, ignoring poison.
///
/// Why ignoring poison is safe here: no critical section in this crate
/// calls user code or awaits, and each leaves its data valid at every point
/// where it could panic (a push, a pop, a swap of one value). A panic in one
/// task, with the lock held, must not fail every later query of the pool.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Read-locks `lock`, ignoring poison, for the reasons given at [`lock`].
pub(crate) fn read_lock<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Write-locks `lock`, ignoring poison, for the reasons given at [`lock`].
pub(crate) fn write_lock<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counts a task as waiting (in `get()`, for a permit, for a connection)
/// until it stops, however it stops (also when its future is dropped).
pub(crate) struct Waiting<'a>(&'a AtomicUsize);

impl Waiting<'_> {
    pub(crate) fn new(count: &AtomicUsize) -> Waiting<'_> {
        count.fetch_add(1, Ordering::AcqRel);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
