//! The budget both sides of a lane draw from: `max_size` connections,
//! shared (pipelined) or claimed by exclusive checkouts. [`Claims`] counts
//! the claimed ones and the tasks holding them; the exclusive side writes
//! it, the router reads it to know how many connections it may keep. It
//! lives here, below both, so that neither imports the other for it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::sync::{Waiting, lock};

/// Connections claimed by exclusive checkouts, and the tasks holding them.
#[derive(Debug)]
pub(crate) struct Claims {
    owners: Mutex<Vec<Owner>>,
    count: AtomicUsize,
    /// Tasks waiting in `get()` for one of the `max_exclusive` places.
    queued: AtomicUsize,
    max_exclusive: usize,
}

impl Claims {
    pub(crate) fn new(max_exclusive: usize) -> Claims {
        Claims {
            owners: Mutex::default(),
            count: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            max_exclusive,
        }
    }

    /// How many connections exclusive users hold (or are about to).
    pub(crate) fn claimed(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// How many connections the shared path must leave to exclusive users:
    /// those they hold and, up to `max_exclusive`, one for each task waiting
    /// in `get()`. A connection given back while others wait then goes
    /// straight to the next of them: were the shared path's limit to rise
    /// for that instant, an open started then could take the connection
    /// (if the waiter is slow to run), and the waiter would make a shared
    /// connection drain instead (a test catches that about one run in six
    /// on a busy machine without this).
    pub(crate) fn reserved(&self) -> usize {
        let waiting = self.queued.load(Ordering::Acquire);
        let claimed = self.claimed();
        (claimed + waiting).min(self.max_exclusive.max(claimed))
    }

    /// Counts the current task as waiting in `get()` for one of the
    /// `max_exclusive` places, until the guard drops.
    pub(crate) fn waiting(&self) -> Waiting<'_> {
        Waiting::new(&self.queued)
    }

    /// True when the current task holds every claim there is: waiting for
    /// another connection would wait for itself.
    pub(crate) fn all_mine(&self) -> bool {
        let me = Owner::current();
        let owners = lock(&self.owners);
        !owners.is_empty() && owners.iter().all(|o| *o == me)
    }

    pub(crate) fn add(&self, owner: Owner) {
        lock(&self.owners).push(owner);
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn remove(&self, owner: Owner) {
        {
            let mut owners = lock(&self.owners);
            if let Some(i) = owners.iter().position(|o| *o == owner) {
                owners.swap_remove(i);
            }
        }
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Who took a claim: the task, or, for code outside any task (a
/// `block_on`, `#[tokio::test]`'s body), the thread that runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Owner {
    pub(crate) fn current() -> Owner {
        match tokio::task::try_id() {
            Some(id) => Owner::Task(id),
            None => Owner::Thread(std::thread::current().id()),
        }
    }
}
