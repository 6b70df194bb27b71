//! The pool's housekeeping: a task that ticks every 100 ms, keeps the
//! pool's coarse clock, and runs the periodic passes (the stall watchdog,
//! lifetimes, idle retirement, the round-trip and cost windows).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::lane::Lane;

/// How often the pool's housekeeping runs, and so the tick of its clock.
const TICK: Duration = Duration::from_millis(100);
/// The round-trip estimate's and the learned costs' window, in ticks.
const WINDOW_TICKS: u64 = 50;

/// Starts the housekeeping task on first use (the builder may run outside a
/// runtime, so it cannot start it). It holds only a weak reference and ends
/// when the pool is dropped or closed.
#[inline]
pub(crate) fn start(pool: &Arc<Lane>) {
    if pool.claim_housekeeping() {
        pool.router().top_up();
        tokio::spawn(run(Arc::downgrade(pool)));
    }
}

async fn run(pool: Weak<Lane>) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        if pool.is_closed() {
            return;
        }
        let wire = pool.wire();
        let tick = wire.clock.fetch_add(1, Ordering::Relaxed) + 1;
        if (tick % crate::lane::catalog::FINGERPRINT_TICKS == 0 && wire.take_judged())
            || wire.take_catalog_suspect()
        {
            tokio::spawn(crate::lane::catalog::refresh(Arc::clone(&pool)));
        }
        let rotate = tick % WINDOW_TICKS == 0;
        if rotate {
            wire.rtt.rotate();
        }
        pool.router().tick(TICK, rotate);
        pool.fold_saved();
    }
}
