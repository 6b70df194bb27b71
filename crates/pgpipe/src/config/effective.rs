//! What a [`PoolConfig`] means once the pool is built: the settings as they
//! take effect, and the values derived from them.

use super::PoolConfig;
use crate::pooler::Prepare;

impl PoolConfig {
    /// How statements are prepared, as set or as the pooler requires.
    pub(crate) fn prepare_mode(&self) -> Prepare {
        self.prepare.unwrap_or(if self.pooler.allows_named() {
            Prepare::Named
        } else {
            Prepare::Unnamed
        })
    }

    /// The settings as they take effect: through a pooler that cannot
    /// track a pipeline, one query in flight per connection.
    pub(crate) fn effective(mut self) -> PoolConfig {
        if !self.pooler.allows_pipeline() {
            self.max_pipeline_depth = 1;
        }
        // Nothing shares a pipeline without pipelining. (Behind a
        // transaction pooler it is carried per statement, not in the
        // session: `conn::run`'s `block`.)
        if !self.pipelining {
            self.head_of_line_budget = None;
        }
        self
    }

    /// The exclusive cap in effect.
    pub(crate) fn exclusive_limit(&self) -> usize {
        self.max_exclusive.unwrap_or(if self.pipelining {
            self.max_size.saturating_sub(1).max(1)
        } else {
            self.max_size
        })
    }
}
