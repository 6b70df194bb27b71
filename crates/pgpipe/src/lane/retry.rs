//! The one rule for running again what never ran, on one lane: work that
//! never left the client because its connection died first runs on another
//! connection twice more; work that never left it because its connection
//! was quarantined first (another task's statement left state there: a
//! neighbour's doing, not the server's) up to 16 times; reads the server
//! skipped in a read group (a neighbour failed, so they never ran) up to 16
//! times.
//! Work that was sent is never run again here: whether it ran is the
//! caller's to know (see [`Error::may_have_run`](crate::Error::may_have_run)).
//! Queries, isolated batches and atomic batches as units of a pipeline all
//! spend the same budget.

/// How many times work that never left the client is run on another
/// connection: twice more, so that one connection dying under a burst does
/// not fail queries that never reached it, while a server that drops every
/// connection fails them fast.
const UNSENT_RETRIES: u32 = 2;

/// How many times work refused by a quarantine is run on another
/// connection: each quarantine is some neighbour's statement, so only a run
/// that long of neighbours dirtying sessions could make its caller see one.
/// Bounded all the same: a quarantine has a cause the pool does not control.
const QUARANTINED_RETRIES: u32 = 16;

/// How many times a read the server skipped is run again: each time it
/// lands in a new group, so only a run of failing neighbours that long
/// could make its caller see the skip.
const SKIPPED_RETRIES: u32 = 16;

/// What one piece of work has spent of its budget.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Retries {
    unsent: u32,
    quarantined: u32,
    skipped: u32,
}

impl Retries {
    /// Takes a run again for work that was never sent (`quarantined`:
    /// because its connection was quarantined, not lost); false once that
    /// budget is spent.
    #[inline]
    pub(crate) fn take_unsent(&mut self, quarantined: bool) -> bool {
        let (spent, limit) = if quarantined {
            (&mut self.quarantined, QUARANTINED_RETRIES)
        } else {
            (&mut self.unsent, UNSENT_RETRIES)
        };
        let again = *spent < limit;
        *spent += u32::from(again);
        again
    }

    /// Takes a run again for a read the server skipped; false once the
    /// budget is spent.
    #[inline]
    pub(crate) fn take_skipped(&mut self) -> bool {
        let again = self.may_skip();
        self.skipped += u32::from(again);
        again
    }

    /// Whether a skipped read may still run again (for a batch, whose
    /// items are judged one by one and counted once per round).
    #[inline]
    pub(crate) fn may_skip(&self) -> bool {
        self.skipped < SKIPPED_RETRIES
    }

    /// A batch's round of skipped items is done: counted once.
    #[inline]
    pub(crate) fn note_skipped_round(&mut self) {
        self.skipped += 1;
    }

    /// Whether no run again for unsent work was taken yet.
    #[inline]
    pub(crate) fn none_unsent(&self) -> bool {
        self.unsent == 0 && self.quarantined == 0
    }

    /// Whether no skipped read ran again yet.
    #[inline]
    pub(crate) fn none_skipped(&self) -> bool {
        self.skipped == 0
    }

    /// A batch's new round of skipped items: its unsent budget starts over.
    #[inline]
    pub(crate) fn new_round(&mut self) {
        self.unsent = 0;
        self.quarantined = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsent_work_runs_again_twice() {
        let mut retries = Retries::default();
        assert!(retries.none_unsent());
        assert!(retries.take_unsent(false));
        assert!(retries.take_unsent(false));
        assert!(!retries.take_unsent(false));
        assert!(!retries.none_unsent());
    }

    #[test]
    fn work_refused_by_quarantines_runs_again_sixteen_times_apart() {
        let mut retries = Retries::default();
        assert!((0..16).all(|_| retries.take_unsent(true)));
        assert!(!retries.take_unsent(true));
        assert!(!retries.none_unsent());
        assert!(
            retries.take_unsent(false),
            "a lost connection's budget is its own"
        );
    }

    #[test]
    fn skipped_reads_run_again_sixteen_times() {
        let mut retries = Retries::default();
        assert!((0..16).all(|_| retries.take_skipped()));
        assert!(!retries.take_skipped());
        assert!(!retries.may_skip());
    }

    #[test]
    fn a_new_round_renews_only_the_unsent_budget() {
        let mut retries = Retries::default();
        retries.take_unsent(false);
        retries.take_unsent(false);
        retries.note_skipped_round();
        retries.new_round();
        assert!(retries.take_unsent(false));
        assert!(!retries.none_skipped());
    }
}
