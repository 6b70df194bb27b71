//! [`Cost`]: what the lane knows of one query's cost before it runs, from
//! the router's learned costs (`shared/costs.rs`) and the caller's word.

use std::time::Instant;

use super::Lane;
use crate::shared::costs::{CostKey, Costs};

/// What head-of-line-aware routing knows of one query: where its cost is
/// learned (with `slow_query_threshold` or the head-of-line budget on),
/// whether it must run alone (marked slow, or stopped at the budget
/// before), whether it is learned to be slow, and whether this run is timed
/// (see [`Costs::times`]).
#[derive(Clone, Copy)]
pub(super) struct Cost {
    pub(super) key: Option<CostKey>,
    pub(super) alone: bool,
    slow: bool,
    timed: bool,
}

impl Cost {
    #[inline]
    pub(super) fn of(pool: &Lane, sql: &str, slow: bool) -> Cost {
        let config = pool.config();
        let threshold = config.slow_query_threshold;
        if threshold.is_none() && config.head_of_line_budget.is_none() {
            return Cost {
                key: None,
                alone: slow,
                slow,
                timed: false,
            };
        }
        let key = Costs::key(sql);
        let costs = pool.router().costs();
        Cost {
            key: Some(key),
            alone: slow || costs.is_blocked(key),
            slow: slow || threshold.is_some_and(|t| costs.is_slow(key, t)),
            timed: threshold.is_some() && costs.times(key),
        }
    }

    pub(super) fn is_slow(self) -> bool {
        self.slow
    }

    /// Whether this run is timed.
    pub(super) fn learns(self) -> bool {
        self.timed
    }

    /// Records the run, from admission to answer, if it is timed.
    #[inline]
    pub(super) fn learn(self, costs: &Costs, admitted: Option<Instant>) {
        if let (Some(key), true, Some(admitted)) = (self.key, self.timed, admitted) {
            costs.observe(key, admitted.elapsed());
        }
    }
}
