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

#[allow(dead_code, unreachable_pub)]
#[path = "../../pgpipe/src/conn/state/load.rs"]
mod load;

#[allow(dead_code, unreachable_pub)]
#[path = "../../pgpipe/src/conn/state/settlers.rs"]
mod settlers;

#[cfg(test)]
mod settle {
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use super::settlers::Settlers;

    /// A waiter for a connection's last answer, and the tap that counts it
    /// (`readies`, as `WireCounts::answered` does): either the tap sees the
    /// waiter and wakes it, or the waiter sees the answer. Else it would
    /// sleep with its answer in (until some later answer, or for ever).
    #[test]
    fn a_waiter_sees_its_answer_or_is_woken() {
        loom::model(|| {
            let settlers = Arc::new(Settlers::default());
            let readies = Arc::new(AtomicU64::new(0));
            let tap = {
                let (settlers, readies) = (Arc::clone(&settlers), Arc::clone(&readies));
                loom::thread::spawn(move || {
                    readies.fetch_add(1, Ordering::AcqRel);
                    settlers.any()
                })
            };
            let registered = settlers.register();
            let saw = readies.load(Ordering::Acquire) == 1;
            let woke = tap.join().unwrap();
            drop(registered);
            assert!(saw || woke, "a waiter missed its answer and was not woken");
        });
    }

    /// The same with the tap's read a plain load, not a read-modify-write
    /// (and no fence): both sides can miss each other. Kept to show that
    /// the model finds the lost wake-up the handshake prevents.
    #[test]
    #[should_panic(expected = "not woken")]
    fn a_plain_load_loses_the_wake_up() {
        loom::model(|| {
            let settling = Arc::new(AtomicUsize::new(0));
            let readies = Arc::new(AtomicU64::new(0));
            let tap = {
                let (settling, readies) = (Arc::clone(&settling), Arc::clone(&readies));
                loom::thread::spawn(move || {
                    readies.fetch_add(1, Ordering::AcqRel);
                    settling.load(Ordering::Acquire) > 0
                })
            };
            settling.fetch_add(1, Ordering::AcqRel);
            let saw = readies.load(Ordering::Acquire) == 1;
            let woke = tap.join().unwrap();
            assert!(saw || woke, "a waiter missed its answer and was not woken");
        });
    }
}

#[cfg(test)]
mod load_word {
    use loom::sync::Arc;

    use super::load::LoadWord;

    fn shared_word() -> Arc<LoadWord> {
        let word = Arc::new(LoadWord::default());
        word.share();
        word
    }

    /// Two tasks admit at a depth of one and give back what they were
    /// given: never more than one in flight, never a place given twice,
    /// and at the end nothing in flight and the flags as they were. (Two
    /// tasks, not three: loom explores every interleaving of the CAS loops,
    /// and three take minutes.)
    #[test]
    fn admissions_stop_at_the_depth_and_releases_balance() {
        loom::model(|| {
            let word = shared_word();
            let tasks: Vec<_> = (0..2)
                .map(|_| {
                    let word = Arc::clone(&word);
                    loom::thread::spawn(move || {
                        if let Some(before) = word.admit(1) {
                            assert_eq!(before, 0, "admitted past the depth");
                            assert!(word.release().is_some(), "its own place was gone");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.join().unwrap();
            }
            let load = word.get();
            assert_eq!(load.in_flight(), 0);
            assert!(load.is_shared() && !load.is_closed() && !load.is_dead());
        });
    }

    /// One place given back twice at once: one release takes it, the other
    /// is refused, and the flags are untouched.
    #[test]
    fn a_place_given_back_twice_at_once_is_refused_once() {
        loom::model(|| {
            let word = shared_word();
            assert_eq!(word.admit(4), Some(0));
            let twice: Vec<_> = (0..2)
                .map(|_| {
                    let word = Arc::clone(&word);
                    loom::thread::spawn(move || word.release().is_some())
                })
                .collect();
            let taken = twice
                .into_iter()
                .map(|t| t.join().unwrap())
                .filter(|taken| *taken)
                .count();
            assert_eq!(taken, 1);
            let load = word.get();
            assert!(load.in_flight() == 0 && load.is_shared() && !load.is_closed());
        });
    }

    /// Two isolated batches of four admit at a depth of four, then claim
    /// the rest of their round within the depth: together never more than
    /// four in flight, each at least its first place.
    #[test]
    fn batches_claim_their_rounds_within_the_depth() {
        loom::model(|| batches(|word, _| word.add_within(3, 4)));
    }

    /// The claim before: room read from the count at admission, then taken
    /// past the depth. Two batches each take the room the other already
    /// took (7 in flight at depth 4, seen in CI). Kept to show that the
    /// model finds what the bounded claim refuses.
    #[test]
    #[should_panic(expected = "past the depth")]
    fn the_old_claim_takes_the_same_room_twice() {
        loom::model(|| {
            batches(|word, before| {
                let room = 4u64.saturating_sub(before).max(1);
                let extra = 3u64.min(room - 1);
                word.add(extra);
                extra
            })
        });
    }

    /// Two batch rounds: each admitted once, then `claim(word, in flight
    /// before it)` takes more places; the model checks the depth after
    /// both claimed, and that everything given back balances.
    fn batches(claim: fn(&LoadWord, u64) -> u64) {
        let word = shared_word();
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let word = Arc::clone(&word);
                loom::thread::spawn(move || match word.admit(4) {
                    Some(before) => 1 + claim(&word, before),
                    None => 0,
                })
            })
            .collect();
        let held: Vec<u64> = tasks.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(
            word.in_flight() <= 4,
            "past the depth: {}",
            word.in_flight()
        );
        assert_eq!(word.in_flight(), held.iter().sum::<u64>());
        for _ in 0..held.iter().sum::<u64>() {
            assert!(word.release().is_some());
        }
        assert!(word.get().is_shared() && word.in_flight() == 0);
    }

    /// The release before issue #45, an unchecked `fetch_sub`: one place
    /// given back twice at once borrows through the count into the flags.
    /// Kept to show that the model finds what the checked release refuses.
    #[test]
    #[should_panic(expected = "borrowed from the flags")]
    fn the_old_release_borrows_from_the_flags() {
        use loom::sync::atomic::{AtomicU64, Ordering};
        const SHARED: u64 = 1 << 61; // as in load.rs
        loom::model(|| {
            let word = Arc::new(AtomicU64::new(SHARED | 1));
            let twice: Vec<_> = (0..2)
                .map(|_| {
                    let word = Arc::clone(&word);
                    loom::thread::spawn(move || word.fetch_sub(1, Ordering::AcqRel))
                })
                .collect();
            for release in twice {
                release.join().unwrap();
            }
            let load = word.load(Ordering::Acquire);
            assert!(
                load & SHARED != 0 && load & 0xffff_ffff == 0,
                "borrowed from the flags"
            );
        });
    }

    /// A close racing an admission and its release: the flag is not lost,
    /// nothing is admitted once the close is done, and what was admitted
    /// is given back (a death after it keeps both flags).
    #[test]
    fn a_close_or_a_death_is_never_lost_under_admissions() {
        loom::model(|| {
            let word = shared_word();
            let admitting = {
                let word = Arc::clone(&word);
                loom::thread::spawn(move || {
                    if word.admit(8).is_some() {
                        word.release().unwrap();
                    }
                })
            };
            let closing = {
                let word = Arc::clone(&word);
                loom::thread::spawn(move || {
                    word.close();
                    assert_eq!(word.admit(8), None, "admitted after its close");
                })
            };
            for task in [admitting, closing] {
                task.join().unwrap();
            }
            word.mark_dead();
            let load = word.get();
            assert!(load.is_closed() && load.is_dead() && load.is_shared());
            assert_eq!(load.in_flight(), 0);
        });
    }
}

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
