//! What a lane is made from: the server, the settings, the metrics'
//! labels and registry, TLS, the application's hooks.

use std::sync::Arc;

use super::Lane;
use crate::config::PoolConfig;
use crate::conn::hooks::Hooks;
use crate::conn::tls::Tls;
use crate::error::Error;
use crate::metrics::Labels;

/// What a pool's lanes need besides the settings: where their metrics
/// go, the pool's name, TLS.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) registry: Option<prometheus::Registry>,
    pub(crate) name: String,
    pub(crate) tls: Tls,
    pub(crate) hooks: Hooks,
}

/// Everything one lane is made from; a read lane is made at its first use,
/// so a pool that never reads through [`Pool::read`](crate::Pool::read) opens and exports
/// nothing for it.
#[derive(Debug, Clone)]
pub(crate) struct LaneRecipe {
    pub(crate) server: tokio_postgres::Config,
    pub(crate) config: PoolConfig,
    pub(crate) labels: Labels,
    pub(crate) registry: Option<prometheus::Registry>,
    pub(crate) tls: Tls,
    pub(crate) hooks: Hooks,
    /// Whether this lane exports the pool's `pgpipe_build_info` (one per pool).
    pub(crate) build_info: bool,
}

impl LaneRecipe {
    pub(crate) fn make(&self) -> Result<Arc<Lane>, Error> {
        Lane::new(self.clone())
    }

    /// Makes the lane; if its metrics cannot be registered (another pool
    /// took its name in the registry since), without them.
    pub(crate) fn make_or_without_metrics(&self) -> Arc<Lane> {
        self.make().unwrap_or_else(|_error| {
            crate::trace::pool_warn!(
                pool = %self.labels,
                error = %_error,
                "a read lane's metrics could not be registered; it runs without them"
            );
            Lane::new(LaneRecipe {
                registry: None,
                ..self.clone()
            })
            .expect("a lane without metrics is always made")
        })
    }
}
