//! The guard's verdicts, remembered per SQL text: a statement seen before
//! costs a hash lookup and a comparison, not a scan.
//!
//! - **Keyed on the whole text.** FxHash picks the slot, and a hit compares
//!   every byte, so a crafted collision costs a comparison, never a verdict
//!   meant for other SQL.
//! - **Tagged with the catalog's generation.** What runs user code is a fact
//!   of the database ([`catalog`](super::super::catalog)); a verdict reached
//!   with an older catalog is worked out again.
//! - **Bounded.** At most [`ENTRIES`] texts and [`BYTES`] bytes of them, no
//!   text over [`LONGEST`] bytes; when full it starts over (the statements
//!   that matter come back at once).
//!
//! Hits take a read lock; only misses write.

use std::sync::RwLock;

use rustc_hash::FxHashMap;

use super::Code;
use crate::sync::{read_lock, write_lock};

/// Most texts remembered.
const ENTRIES: usize = 4096;
/// Most bytes of text remembered.
const BYTES: usize = 1 << 20;
/// The longest text remembered: longer ones are scanned each time.
const LONGEST: usize = 4096;

/// A verdict: the code the guard reads, or the construct it refuses.
pub(super) type Verdict = Result<Code, &'static str>;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Verdicts {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Text → (catalog generation, verdict).
    entries: FxHashMap<Box<str>, (u64, Verdict)>,
    bytes: usize,
}

impl Verdicts {
    /// The verdict on `sql` under the catalog of `generation`, from
    /// `judge` when none is remembered.
    #[inline]
    pub(super) fn get_or(
        &self,
        sql: &str,
        generation: u64,
        judge: impl FnOnce() -> Verdict,
    ) -> Verdict {
        if let Some(&(seen, verdict)) = read_lock(&self.inner).entries.get(sql) {
            if seen == generation {
                return verdict;
            }
        }
        let verdict = judge();
        if sql.len() <= LONGEST {
            let mut inner = write_lock(&self.inner);
            if inner.entries.len() >= ENTRIES || inner.bytes + sql.len() > BYTES {
                inner.entries.clear();
                inner.bytes = 0;
            }
            if inner
                .entries
                .insert(sql.into(), (generation, verdict))
                .is_none()
            {
                inner.bytes += sql.len();
            }
        }
        verdict
    }

    /// Texts remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        read_lock(&self.inner).entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_is_remembered_per_text_and_generation() {
        let verdicts = Verdicts::default();
        let mut judged = 0;
        for _ in 0..3 {
            let verdict = verdicts.get_or("SELECT 1", 1, || {
                judged += 1;
                Ok(Code::Known)
            });
            assert_eq!(verdict, Ok(Code::Known));
        }
        assert_eq!(judged, 1, "judged once, then remembered");
        // Another catalog: judged again, and the new verdict holds.
        let verdict = verdicts.get_or("SELECT 1", 2, || Ok(Code::Unknown));
        assert_eq!(verdict, Ok(Code::Unknown));
        assert_eq!(
            verdicts.get_or("SELECT 1", 2, || unreachable!()),
            Ok(Code::Unknown)
        );
        // Other text, however similar, is its own entry.
        assert_eq!(verdicts.get_or("SELECT 1 ", 2, || Err("SET")), Err("SET"));
        assert_eq!(
            verdicts.get_or("SELECT 1", 2, || unreachable!()),
            Ok(Code::Unknown)
        );
    }

    #[test]
    fn it_is_bounded() {
        let verdicts = Verdicts::default();
        for n in 0..ENTRIES * 3 {
            let _ = verdicts.get_or(&format!("SELECT {n}"), 1, || Ok(Code::Known));
            assert!(verdicts.len() <= ENTRIES);
        }
        let long = "x".repeat(LONGEST + 1);
        let before = verdicts.len();
        let _ = verdicts.get_or(&long, 1, || Ok(Code::Known));
        assert_eq!(verdicts.len(), before, "a long text is not remembered");
        // Texts of the longest length remembered: the byte bound holds.
        let pad = "y".repeat(LONGEST - 8);
        for n in 0..(BYTES / LONGEST) * 3 {
            let _ = verdicts.get_or(&format!("{n:08}{pad}"), 1, || Ok(Code::Known));
            let inner = read_lock(&verdicts.inner);
            assert!(inner.bytes <= BYTES);
            assert_eq!(
                inner.bytes,
                inner.entries.keys().map(|k| k.len()).sum::<usize>()
            );
        }
    }
}
