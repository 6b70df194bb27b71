//! What is known about one connection, shared by its socket tap, the router
//! and the pool, in parts grouped by who writes them:
//!
//! - [`load`]: the load word admission works on (admission, lending,
//!   closing).
//! - [`counts`]: requests written and answered and when the wire last
//!   moved (the tap).
//! - [`session`]: transaction status, "reset before the next user", the
//!   quarantine (the tap, lending, the reset).
//! - [`life`]: why it closes, its I/O task, when it was handed around
//!   (whoever decides; the exclusive side).
//! - [`held`]: whether a caller holds it, for the statements the tap
//!   counts (the exclusive side).
//! - [`traits`]: what it is: behind a pooler, a read lane's (fixed at
//!   open).
//! - [`settle`]: who waits for its answers.
//!
//! Each part keeps its atomics private and chooses each memory ordering
//! once, in the method that reads or writes; writers only the connection's
//! own code uses are `pub(in crate::conn)`. What spans parts (a
//! quarantine, a kill, waiting for the wire to settle) is here.

pub(crate) mod counts;
pub(crate) mod held;
pub(crate) mod life;
pub(crate) mod load;
pub(crate) mod session;
mod settle;
mod settlers;
pub(crate) mod traits;

use std::sync::Arc;

use crate::metrics::{CloseReason, Metrics, QuarantineReason};
use counts::WireCounts;
use held::Held;
use life::Lifecycle;
pub(crate) use load::{Load, LoadWord};
use session::Session;
use settle::Waiters;
pub(crate) use traits::{Behind, Traits};

/// Per-connection state shared by the tap, the router and the pool.
#[derive(Debug, Default)]
pub(crate) struct ConnState {
    /// In-flight count and flags.
    pub(crate) load: LoadWord,
    /// What the wire owes, as the tap counts it.
    pub(crate) counts: WireCounts,
    /// What the session may carry.
    pub(crate) session: Session,
    /// Why it closes, and when it was handed around.
    pub(crate) life: Lifecycle,
    /// What it is.
    pub(crate) traits: Traits,
    /// Whether a caller holds it (see [`held`]).
    pub(crate) held: Held,
    /// Who waits for its answers.
    waiters: Waiters,
    /// Where quarantines and closes are counted.
    metrics: Option<Arc<Metrics>>,
    /// The order in which requests join its pipeline (see `conn::turn`).
    pub(crate) turns: super::turn::Turns,
}

impl ConnState {
    pub(crate) fn new(metrics: Option<Arc<Metrics>>, traits: Traits) -> ConnState {
        ConnState {
            metrics,
            traits,
            ..ConnState::default()
        }
    }

    /// Waits until the wire is idle, when
    /// [`one_at_a_time`](Traits::one_at_a_time); else returns at once.
    pub(crate) async fn wire_idle(&self) {
        if self.traits.one_at_a_time() {
            self.until_answered().await;
        }
    }

    /// Waits until every request written has its answer (or the connection
    /// died), so that what the last answer showed (`tx_status`) is current.
    /// tokio-postgres hands a query its error as soon as it reads it, which
    /// may be before the ReadyForQuery behind it.
    pub(crate) async fn settled(&self) {
        // Nothing owed: what the last answer showed is current.
        if self.counts.depth() == 0 {
            return;
        }
        let _settling = self.waiters.settling();
        self.until_answered().await;
    }

    async fn until_answered(&self) {
        loop {
            let notified = self.waiters.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.counts.depth() == 0 || self.load.is_dead() {
                return;
            }
            notified.await;
        }
    }

    /// Wakes what waits in [`wire_idle`](ConnState::wire_idle) and
    /// [`settled`](ConnState::settled): a ReadyForQuery arrived, or the
    /// connection died.
    #[inline]
    pub(crate) fn wake(&self) {
        self.waiters.wake(self.traits.one_at_a_time());
    }

    /// Whether the session is in a transaction an error aborted, once every
    /// answer owed is in (see [`settled`](ConnState::settled)). `COMMIT`
    /// there rolls back, and the server says so only with its tag.
    pub(crate) async fn transaction_failed(&self) -> bool {
        self.settled().await;
        self.session.tx_status() == b'E'
    }

    /// Ends the connection now: its I/O task stops, the socket closes, and
    /// every query in flight fails with `ConnectionLost`.
    pub(crate) fn kill(&self, reason: CloseReason) {
        self.life.closing(reason);
        self.load.mark_dead();
        self.life.abort_io();
        self.life.count_close(self.metrics.as_deref(), reason);
    }

    /// Stops routing to this shared connection, and marks it for a reset
    /// before anyone uses it again: it shows session state (the tap saw a
    /// transaction or a changed setting, or a cleanup found what it cannot
    /// undo). Counted once. An exclusive connection may hold any state its
    /// user likes; it is reset when it comes back anyway.
    pub(crate) fn quarantine(&self, reason: QuarantineReason) {
        if !self.load.is_shared() {
            return;
        }
        self.session.mark_needs_reset();
        self.load.close();
        if self.session.quarantined(reason) {
            crate::trace::pool_warn!(
                reason = reason.label(),
                "a shared connection showed session state and was quarantined; it is reset \
                 before anyone uses it again"
            );
            if let Some(metrics) = &self.metrics {
                metrics.wire.quarantined(reason);
            }
        }
    }

    /// The session may carry state that could not be cleaned: quarantined if
    /// shared, reset before its next use either way.
    pub(crate) fn left_dirty(&self, reason: QuarantineReason) {
        self.session.mark_needs_reset();
        self.quarantine(reason);
    }

    /// Counts a statement-cache lookup: a hit, or a miss (a prepare was
    /// needed, by this query or one it waited for).
    pub(crate) fn statement_looked_up(&self, hit: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.statement_lookup(hit);
        }
    }

    /// Counts statements evicted from the connection's cache.
    pub(crate) fn statements_evicted(&self, evicted: u64) {
        if let (Some(metrics), true) = (&self.metrics, evicted > 0) {
            metrics.statements_evicted.inc_by(evicted);
        }
    }
}
