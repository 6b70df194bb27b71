//! A lane's view of its database's catalog: what statements can run
//! ([`Catalog`], proven from the server's own catalog), learned when the
//! lane is first used, and again whenever it may have changed:
//!
//! - **DDL through the pool** (`CREATE`, `ALTER`, `DROP`, `IMPORT`, on any
//!   path) makes it stale at once: until it is read again (at the next
//!   housekeeping tick, 100 ms), nothing is proven, and every statement is
//!   cleaned behind. It is marked again when the DDL's answer comes, so a
//!   read that raced its commit is read again.
//! - **DDL from elsewhere**, or run by user code: every
//!   [`FINGERPRINT_TICKS`] ticks (1 s) a cheap query sums the catalog rows'
//!   transaction ids ([`FINGERPRINT_SQL`]); when the sum moves, the catalog
//!   is read again. That second is the window, documented in the guide.
//! - **A quarantine** (a shared connection showed session state the guard
//!   let through) checks the fingerprint at the next tick.
//!
//! A query on the pool path waits for the first load (at most
//! [`FIRST_LOAD_PATIENCE`]) so that it is judged by what the database
//! holds. A load that fails (a role that cannot read the catalog) leaves
//! the last catalog learned in place, or, before any, the strict side:
//! every statement counts as unproven.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::lane::Lane;
use crate::lane::query;
use crate::protocol::catalog::{BUILTIN_SQL, CATALOG_SQL, Catalog};
use crate::sync::lock;

/// Housekeeping ticks between two fingerprints.
pub(crate) const FINGERPRINT_TICKS: u64 = 10;

/// How long a lane's first query waits for the first load.
const FIRST_LOAD_PATIENCE: Duration = Duration::from_secs(2);

/// Every catalog the proof reads, as one number that moves with any row
/// written or removed: the count and the sum of the rows' transaction ids.
/// A few milliseconds on a small database (measured in the guide).
pub(crate) const FINGERPRINT_SQL: &str = "/* pgpipe */ SELECT pg_catalog.count(*)::pg_catalog.text \
     || '/' || pg_catalog.sum(x::pg_catalog.text::pg_catalog.int8)::pg_catalog.text \
     AS pgpipe_fingerprint FROM (\
     SELECT xmin x FROM pg_catalog.pg_proc UNION ALL SELECT xmin FROM pg_catalog.pg_class \
     UNION ALL SELECT xmin FROM pg_catalog.pg_type UNION ALL SELECT xmin FROM pg_catalog.pg_attribute \
     UNION ALL SELECT xmin FROM pg_catalog.pg_attrdef UNION ALL SELECT xmin FROM pg_catalog.pg_constraint \
     UNION ALL SELECT xmin FROM pg_catalog.pg_index UNION ALL SELECT xmin FROM pg_catalog.pg_inherits \
     UNION ALL SELECT xmin FROM pg_catalog.pg_partitioned_table UNION ALL SELECT xmin FROM pg_catalog.pg_policy \
     UNION ALL SELECT xmin FROM pg_catalog.pg_rewrite UNION ALL SELECT xmin FROM pg_catalog.pg_trigger \
     UNION ALL SELECT xmin FROM pg_catalog.pg_statistic_ext UNION ALL SELECT xmin FROM pg_catalog.pg_aggregate \
     UNION ALL SELECT xmin FROM pg_catalog.pg_operator UNION ALL SELECT xmin FROM pg_catalog.pg_amproc \
     UNION ALL SELECT xmin FROM pg_catalog.pg_amop UNION ALL SELECT xmin FROM pg_catalog.pg_opclass \
     UNION ALL SELECT xmin FROM pg_catalog.pg_am UNION ALL SELECT xmin FROM pg_catalog.pg_cast \
     UNION ALL SELECT xmin FROM pg_catalog.pg_range UNION ALL SELECT xmin FROM pg_catalog.pg_transform \
     UNION ALL SELECT xmin FROM pg_catalog.pg_language UNION ALL SELECT xmin FROM pg_catalog.pg_foreign_data_wrapper \
     UNION ALL SELECT xmin FROM pg_catalog.pg_foreign_server UNION ALL SELECT xmin FROM pg_catalog.pg_foreign_table \
     UNION ALL SELECT xmin FROM pg_catalog.pg_conversion UNION ALL SELECT xmin FROM pg_catalog.pg_event_trigger \
     UNION ALL SELECT xmin FROM pg_catalog.pg_ts_parser UNION ALL SELECT xmin FROM pg_catalog.pg_ts_template \
     UNION ALL SELECT xmin FROM pg_catalog.pg_extension UNION ALL SELECT xmin FROM pg_catalog.pg_namespace) c";

/// Reads the catalog again if it may have changed (see the module docs),
/// unless a read is under way. Only on a lane that judged a statement
/// since the last check (an idle lane's connections may close; the next
/// statement is judged by the catalog of the last check, and the tick
/// after it checks again).
pub(crate) async fn refresh(lane: Arc<Lane>) {
    let wire = lane.wire();
    let Ok(_loading) = wire.catalog_loading.try_lock() else {
        return;
    };
    let _ = tokio::time::timeout(FIRST_LOAD_PATIENCE * 5, load(&lane, false)).await;
    lane.wire().tried_catalog();
    again_if_unread(&lane);
}

/// Until a catalog is read, nothing is proven and every statement runs
/// alone: a read that failed (a server not answering yet, a pooler not
/// routing yet) is tried again at the next tick, not a second later.
fn again_if_unread(lane: &Arc<Lane>) {
    if !lane.wire().catalog_full().is_loaded() {
        lane.wire().suspect_catalog();
    }
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
    let _ = tokio::time::timeout(FIRST_LOAD_PATIENCE, load(lane, true)).await;
    wire.tried_catalog();
    again_if_unread(lane);
}

/// Reads the fingerprint, and the catalog when it moved, when DDL went
/// out through the pool, or when `first`.
async fn load(lane: &Arc<Lane>, first: bool) {
    let wire = lane.wire();
    let (ddl, stale) = wire.reading_catalog();
    let fingerprint = match query::run_internal(lane, FINGERPRINT_SQL, &[]).await {
        Ok(answer) => answer
            .into_rows()
            .first()
            .and_then(|row| row.try_get::<_, String>(0).ok()),
        Err(_) => None,
    };
    let known = lock(&wire.catalog_fingerprint).clone();
    let moved = fingerprint.is_none() || fingerprint.as_deref() != known.as_deref();
    if !(first || stale || moved || !wire.catalog_full().is_loaded()) {
        // Unchanged since the catalog in use was read (DDL that had not
        // committed when the fingerprint was read is counted again at
        // its answer).
        wire.read_catalog(ddl);
        return;
    }
    match read(lane).await {
        Ok(catalog) => {
            *lock(&wire.catalog_fingerprint) = fingerprint.map(Into::into);
            wire.set_catalog(catalog);
            wire.read_catalog(ddl);
        }
        #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
        Err(e) => {
            crate::trace::pool_warn!(
                error = %e,
                "could not read the catalog; what statements can run is judged by the last \
                 catalog learned, or as unproven"
            );
        }
    }
}

/// The catalog query, as the pool's own on the lane's path, in two
/// statements of a few tens of milliseconds each on a small database (the
/// server's own views' edges, read once per lane, then the rest): past
/// the head-of-line budget (a large database, a busy server) the server
/// stops one and it runs again alone, as any statement would. Both are
/// planned without JIT where their estimates stay under `jit_above_cost`
/// (see `proof.sql`).
async fn read(lane: &Arc<Lane>) -> Result<Catalog, Error> {
    let wire = lane.wire();
    let known = lock(&wire.builtin_edges).clone();
    let builtin = match known {
        Some(edges) => edges,
        None => {
            let answer = query::run_internal(lane, &BUILTIN_SQL, &[]).await?;
            let edges: Arc<[i64]> = answer
                .into_rows()
                .first()
                .and_then(|row| row.try_get::<_, Option<Vec<i64>>>(0).ok().flatten())
                .unwrap_or_default()
                .into();
            *lock(&wire.builtin_edges) = Some(Arc::clone(&edges));
            edges
        }
    };
    let builtin: &[i64] = &builtin;
    let answer = query::run_internal(lane, &CATALOG_SQL, &[&builtin]).await?;
    let rows = answer.into_rows();
    Ok(Catalog::from_rows(rows.iter().filter_map(|row| {
        Some((row.try_get(0).ok()?, row.try_get(1).ok()?))
    })))
}
