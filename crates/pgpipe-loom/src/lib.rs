//! Loom models of pgpipe's lock-free handshakes (issue #45): pgpipe's own
//! source files, compiled here with loom's atomics, so that the model is
//! the code that runs.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p pgpipe-loom --release
//! ```
//!
//! Without `--cfg loom` this crate is empty.

#![cfg(loom)]

#[allow(dead_code, unreachable_pub)]
#[path = "../../pgpipe/src/shared/note.rs"]
mod note;

#[cfg(test)]
mod tests {
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::sync::{Arc, Mutex};

    use super::note::DispatchNote;

    /// Two callers each queue a waiter and ask for a dispatch: whatever the
    /// interleaving, and whatever stale value a load may read, no waiter is
    /// left in the queue with no dispatch to come.
    fn no_waiter_is_left(run: fn(&Shared, &mut dyn FnMut())) {
        loom::model(move || {
            let shared = Arc::new(Shared::default());
            let callers: Vec<_> = (0..2)
                .map(|_| {
                    let shared = Arc::clone(&shared);
                    loom::thread::spawn(move || {
                        *shared.queue.lock().unwrap() += 1;
                        let queue = &shared.queue;
                        run(&shared, &mut || *queue.lock().unwrap() = 0);
                    })
                })
                .collect();
            for caller in callers {
                caller.join().unwrap();
            }
            assert_eq!(
                *shared.queue.lock().unwrap(),
                0,
                "a waiter was left with no dispatch to come"
            );
        });
    }

    #[derive(Default)]
    struct Shared {
        note: DispatchNote,
        old: OldNote,
        queue: Mutex<usize>,
    }

    #[test]
    fn no_dispatch_is_lost() {
        no_waiter_is_left(|shared, dispatch| shared.note.run(dispatch));
    }

    /// The handshake before issue #45: plain release stores where the turn
    /// is handed over. Kept to show that the model finds its lost dispatch.
    #[derive(Default)]
    struct OldNote {
        dispatching: AtomicBool,
        again: AtomicBool,
    }

    impl OldNote {
        fn run(&self, dispatch: &mut dyn FnMut()) {
            self.again.store(true, Ordering::Release);
            while self.again.load(Ordering::Acquire) {
                if self.dispatching.swap(true, Ordering::AcqRel) {
                    return;
                }
                self.again.store(false, Ordering::Release);
                dispatch();
                self.dispatching.store(false, Ordering::Release);
            }
        }
    }

    #[test]
    #[should_panic(expected = "a waiter was left")]
    fn the_old_handshake_loses_a_dispatch() {
        no_waiter_is_left(|shared, dispatch| shared.old.run(dispatch));
    }
}
