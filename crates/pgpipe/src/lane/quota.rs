//! The atomic batches a pipelined lane runs at once: each holds a
//! connection of its own for its transaction, so at most half the lane.

use super::Lane;
use crate::error::Error;

impl Lane {
    /// With pipelining, a place among the atomic batches that may run at
    /// once, waited for until `deadline`; `None` (no wait) without. A task
    /// that holds every exclusive place there is gets `Deadlock` at once,
    /// as its checkout would.
    pub(crate) async fn atomic_batch_place(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<Option<tokio::sync::SemaphorePermit<'_>>, Error> {
        let Some(quota) = &self.atomic_batches else {
            return Ok(None);
        };
        match quota.try_acquire() {
            Ok(permit) => return Ok(Some(permit)),
            Err(tokio::sync::TryAcquireError::Closed) => return Err(Error::closed()),
            Err(tokio::sync::TryAcquireError::NoPermits) => {}
        }
        self.exclusive.would_wait_for_itself()?;
        let _waiting = self.exclusive.waiting_for_place();
        match tokio::time::timeout_at(deadline, quota.acquire()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            Ok(Err(_)) => Err(Error::closed()),
            Err(_) => Err(Error::timeout(
                "a place among the atomic batches running at once",
            )),
        }
    }
}

/// Most atomic batches that run at once on a pipelined pool: half of
/// `max_size` (at least one). Each holds a connection of its own for its
/// transaction; past half the pool they squeeze the pipelined reads beside
/// them (measured at 1 ms RTT, pool of 4, 10% of tasks running atomic
/// batches: the reads kept 0.73 of their throughput alone with 3 batches at
/// once, 0.81 with 2, and the batches still ran at 3.4 × deadpool's
/// transactions on the same pool size; docs/benchmarks.md).
pub(super) fn atomic_batch_quota(max_size: usize) -> usize {
    (max_size / 2).max(1)
}
