//! A lane's view of its database's catalog: which names reach user code
//! ([`Catalog`]), learned from the server when the lane is first used,
//! every [`REFRESH_TICKS`] housekeeping ticks after (10 s), and at the next
//! tick (100 ms) after a shared connection showed session state the guard
//! let through (a quarantine: the server said something the pool did not
//! expect).
//!
//! A query on the pool path waits for the first load (at most
//! [`FIRST_LOAD_PATIENCE`]) so that it is judged by what the database holds.
//! A load that fails (a role that cannot read the catalog) leaves the last
//! catalog learned in place, or, before any, the strict side: every
//! statement counts as code the guard cannot read. What the catalog gains
//! between two refreshes (a function created a moment ago) is seen at the
//! next one: that is where the guarantee ends.

use std::sync::Arc;
use std::time::Duration;

use crate::lane::Lane;
use crate::lane::query;
use crate::protocol::catalog::{CATALOG_SQL, Catalog};

/// Housekeeping ticks between two loads.
pub(crate) const REFRESH_TICKS: u64 = 100;

/// How long a lane's first query waits for the first load.
const FIRST_LOAD_PATIENCE: Duration = Duration::from_secs(2);

/// Loads the catalog again, unless a load is under way.
pub(crate) async fn refresh(lane: Arc<Lane>) {
    let wire = lane.wire();
    let Ok(_loading) = wire.catalog_loading.try_lock() else {
        return;
    };
    let _ = tokio::time::timeout(FIRST_LOAD_PATIENCE * 5, load(&lane)).await;
    lane.wire().tried_catalog();
}

/// Before a statement on `lane` is judged: the lane's first load, if none
/// was tried yet (waited for, bounded).
pub(crate) async fn ready(lane: &Arc<Lane>) {
    if !lane.wire().catalog_tried() {
        crate::lane::housekeeping::start(lane);
        // Boxed: once per lane.
        Box::pin(first_load(lane)).await;
    }
}

/// The lane's first load, waited for (bounded) by the query that needs it.
async fn first_load(lane: &Arc<Lane>) {
    let wire = lane.wire();
    let Ok(_loading) = tokio::time::timeout(FIRST_LOAD_PATIENCE, wire.catalog_loading.lock()).await
    else {
        return;
    };
    if wire.catalog_tried() {
        return;
    }
    let _ = tokio::time::timeout(FIRST_LOAD_PATIENCE, load(lane)).await;
    wire.tried_catalog();
}

async fn load(lane: &Arc<Lane>) {
    match query::run_internal(lane, CATALOG_SQL).await {
        Ok(answer) => {
            let rows = answer.into_rows();
            let catalog = Catalog::from_rows(
                rows.iter()
                    .filter_map(|row| Some((row.try_get(0).ok()?, row.try_get(1).ok()?))),
            );
            lane.wire().set_catalog(catalog);
        }
        #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
        Err(e) => {
            crate::trace::pool_warn!(
                error = %e,
                "could not read the catalog; what runs user code is judged by the last \
                 catalog learned, or as unknown code"
            );
        }
    }
}
