//! [`Session`]: what the connection's server session may carry.
//!
//! The transaction status is written by the tap, at every `ReadyForQuery`.
//! "Reset before the next user" is set by whoever lends the connection out
//! to someone who may change the session (an exclusive checkout, the shared
//! path when it takes it back) and by a quarantine, and cleared by the reset
//! itself. The quarantine reason is set once, by
//! [`ConnState::quarantine`](super::ConnState::quarantine), and cleared by
//! the reset. Read by recycling (roll back? reset?), the query runner (is a
//! transaction open? quarantined before this query went out?) and the router.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

use crate::metrics::QuarantineReason;

/// Transaction status, "needs a reset" and the quarantine.
#[derive(Debug, Default)]
pub(crate) struct Session {
    /// Transaction status from the last ReadyForQuery.
    tx_status: AtomicU8,
    /// The session may carry state from an exclusive user or a quarantine;
    /// reset it before the connection is shared again.
    needs_reset: AtomicBool,
    /// Why the connection was quarantined ([`QuarantineReason`] + 1), if it
    /// was.
    quarantined: AtomicU8,
    /// The head-of-line budget the server enforces in this session, in
    /// milliseconds (its `statement_timeout`, set by the pool); 0 for none.
    budget_ms: AtomicU32,
    /// The limits that end a session are off in it (readied for sharing).
    guarded: AtomicBool,
    /// Its user sent DDL: the lane's catalog is stale again when it comes
    /// back (the DDL committed by then, or never will).
    sent_ddl: AtomicBool,
}

impl Session {
    /// The transaction status byte of the last ReadyForQuery (`I` idle, `T`
    /// in a transaction, `E` failed; 0 before the first).
    #[inline]
    pub(crate) fn tx_status(&self) -> u8 {
        self.tx_status.load(Ordering::Acquire)
    }

    /// A ReadyForQuery showed `status`.
    #[inline]
    pub(in crate::conn) fn set_tx_status(&self, status: u8) {
        self.tx_status.store(status, Ordering::Release);
    }

    /// Its user sent DDL (the tap saw it go out).
    pub(in crate::conn) fn sent_ddl(&self) {
        self.sent_ddl.store(true, Ordering::Release);
    }

    /// Whether its user sent DDL since the last call.
    pub(in crate::conn) fn take_ddl(&self) -> bool {
        self.sent_ddl.swap(false, Ordering::AcqRel)
    }

    /// Whether the session must be reset before its next user.
    #[inline]
    pub(crate) fn needs_reset(&self) -> bool {
        self.needs_reset.load(Ordering::Acquire)
    }

    /// The session may carry state of its user's: reset it before the next.
    #[inline]
    pub(crate) fn mark_needs_reset(&self) {
        self.needs_reset.store(true, Ordering::Release);
    }

    /// Notes a quarantine for `reason`; returns whether it is the first.
    #[inline]
    pub(super) fn quarantined(&self, reason: QuarantineReason) -> bool {
        self.quarantined
            .compare_exchange(0, reason as u8 + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether it was quarantined: a query not yet sent must not go out on it.
    #[inline]
    pub(crate) fn is_quarantined(&self) -> bool {
        self.quarantined.load(Ordering::Acquire) != 0
    }

    /// Why it was quarantined, if it was.
    pub(crate) fn quarantine_reason(&self) -> Option<QuarantineReason> {
        match self.quarantined.load(Ordering::Acquire) {
            0 => None,
            n => QuarantineReason::ALL.get(usize::from(n) - 1).copied(),
        }
    }

    /// The session was reset: clean again, and its `statement_timeout`
    /// back to its default.
    #[inline]
    pub(in crate::conn) fn cleaned(&self) {
        self.needs_reset.store(false, Ordering::Release);
        self.quarantined.store(0, Ordering::Release);
        self.budget_ms.store(0, Ordering::Release);
        self.guarded.store(false, Ordering::Release);
    }

    /// Whether the session was readied for sharing (the limits that end a
    /// session off): a cleanup's `RESET ALL` must ready it again.
    #[inline]
    pub(crate) fn guarded(&self) -> bool {
        self.guarded.load(Ordering::Acquire)
    }

    #[inline]
    pub(in crate::conn) fn set_guarded(&self) {
        self.guarded.store(true, Ordering::Release);
    }

    /// The head-of-line budget the server enforces on this session's
    /// statements, if the pool set one (see
    /// [`PgConn::apply_budget`](crate::conn::PgConn::apply_budget)).
    #[inline]
    pub(crate) fn budget(&self) -> Option<Duration> {
        match self.budget_ms.load(Ordering::Acquire) {
            0 => None,
            ms => Some(Duration::from_millis(u64::from(ms))),
        }
    }

    /// The server now stops this session's statements after `ms`
    /// milliseconds (0: the pool set nothing).
    #[inline]
    pub(in crate::conn) fn set_budget(&self, ms: u32) {
        self.budget_ms.store(ms, Ordering::Release);
    }
}
