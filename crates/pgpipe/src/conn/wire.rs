//! [`PoolWire`]: what every connection's tap reports to the pool, the
//! pool's clock, and the registry of live connections.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use arc_swap::ArcSwap;

use super::state::ConnState;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::protocol::catalog::Catalog;
use crate::protocol::rtt::RttFilter;
use crate::protocol::sql_guard::{self, Code, Verdicts};
use crate::sync::lock;

/// What every connection's tap reports to the pool, and the pool's clock.
#[derive(Debug, Default)]
pub(crate) struct PoolWire {
    pub(crate) rtt: RttFilter,
    pub(crate) metrics: Option<Arc<Metrics>>,
    /// Ticks of the pool's housekeeping: a clock that the hot path can read
    /// without a system call.
    pub(crate) clock: AtomicU64,
    /// Every connection opened and not yet dropped, for the stall watchdog.
    states: Mutex<Vec<Weak<ConnState>>>,
    /// Where [`now_nanos`](PoolWire::now_nanos) counts from.
    epoch: Epoch,
    /// What this lane's connections tell their host's monitor: a role
    /// change, a connection lost.
    host: std::sync::OnceLock<Arc<HostSignal>>,
    /// Which names reach user code in the database, as last learned (see
    /// the lane's `catalog` module); the guard and the tap read it.
    catalog: ArcSwap<Catalog>,
    /// Bumped whenever the catalog learned differs from the one before.
    catalog_generation: AtomicU64,
    /// One load of the catalog at a time; held while it runs.
    pub(crate) catalog_loading: tokio::sync::Mutex<()>,
    /// A first load was tried (done, or failed): queries stop waiting for
    /// one.
    catalog_tried: std::sync::atomic::AtomicBool,
    /// A connection showed state the guard did not expect: load the
    /// catalog again at the next tick.
    catalog_suspect: std::sync::atomic::AtomicBool,
    /// The guard's verdicts per SQL text, for the catalog's generation.
    verdicts: Verdicts,
    /// A statement was judged since the last fingerprint.
    judged: std::sync::atomic::AtomicBool,
    /// DDL went out through the pool since the catalog was last read:
    /// until it is read again, nothing is proven.
    /// Counted up at each: stale while it differs from `catalog_fresh`.
    catalog_ddl: AtomicU64,
    /// The count of DDL the catalog in use was read after.
    catalog_fresh: AtomicU64,
    /// The edges of the server's own stored expressions, read once.
    pub(crate) builtin_edges: Mutex<Option<Arc<[i64]>>>,
    /// What the catalog's fingerprint was when it was last read.
    pub(crate) catalog_fingerprint: Mutex<Option<Box<str>>>,
    /// The fewest settings a session of this lane was seen with
    /// (`u64::MAX` until one is): a session with more has a library
    /// loaded into it that no reset unloads.
    settings_floor: Floor,
}

/// The fewest settings seen; `u64::MAX` until the first.
#[derive(Debug)]
struct Floor(AtomicU64);

impl Default for Floor {
    fn default() -> Floor {
        Floor(AtomicU64::new(u64::MAX))
    }
}

/// What the connections to one host (its lanes' and its monitor's) tell
/// the monitor. A server that restarts ends every connection to it first,
/// so a host whose count of lost connections moved since its last check
/// may be a new server, back behind where it was checked: until a check
/// that started after the loss, what that check found (its replay
/// position, its lag) vouches for nothing.
#[derive(Debug)]
pub(crate) struct HostSignal {
    /// Wakes the monitor for a round now.
    wake: Arc<tokio::sync::Notify>,
    losses: AtomicU64,
}

impl HostSignal {
    pub(crate) fn new(wake: Arc<tokio::sync::Notify>) -> HostSignal {
        HostSignal {
            wake,
            losses: AtomicU64::new(0),
        }
    }

    /// Connections to the host lost so far.
    pub(crate) fn losses(&self) -> u64 {
        self.losses.load(Ordering::Acquire)
    }
}

#[derive(Debug)]
struct Epoch(Instant);

impl Default for Epoch {
    fn default() -> Epoch {
        Epoch(Instant::now())
    }
}

impl PoolWire {
    pub(crate) fn new(metrics: Option<Arc<Metrics>>) -> PoolWire {
        PoolWire {
            metrics,
            ..PoolWire::default()
        }
    }

    /// Where [`role_changed`](PoolWire::role_changed) and
    /// [`lost`](PoolWire::lost) report.
    pub(crate) fn on_host(&self, signal: Arc<HostSignal>) {
        let _ = self.host.set(signal);
    }

    /// A connection saw its host's role change (a standby promoted).
    pub(crate) fn role_changed(&self) {
        if let Some(signal) = self.host.get() {
            signal.wake.notify_one();
        }
    }

    /// A connection ended without the pool closing it (the server went
    /// away, or ended the session): see [`HostSignal`].
    pub(crate) fn lost(&self) {
        if let Some(signal) = self.host.get() {
            signal.losses.fetch_add(1, Ordering::AcqRel);
            signal.wake.notify_one();
        }
    }

    /// The shared path's guard on `sql` ([`sql_guard::check`]) under the
    /// catalog as last learned, remembered per text.
    #[inline]
    pub(crate) fn check(&self, sql: &str) -> Result<Code, Error> {
        // The generation first: a catalog stored after it is read is at
        // worst judged under an older generation, and judged again.
        // Read first: the flag is written once per fingerprint, not per
        // query.
        if !self.judged.load(Ordering::Relaxed) {
            self.judged.store(true, Ordering::Relaxed);
        }
        let generation = self.catalog_generation();
        let code =
            sql_guard::check_remembered(sql, || self.catalog_full(), generation, &self.verdicts)?;
        if code == Code::Known {
            // DDL is never proven (see `sql_guard`): a verdict of `Known`
            // needs only the one load.
            let stale = self.catalog_ddl.load(Ordering::Acquire)
                != self.catalog_fresh.load(Ordering::Acquire);
            return Ok(if stale { Code::Unknown } else { code });
        }
        if sql_guard::changes_catalog(sql) {
            self.catalog_changed();
        }
        Ok(code)
    }

    /// Whether a statement was judged since the last call.
    pub(crate) fn take_judged(&self) -> bool {
        self.judged.swap(false, Ordering::Relaxed)
    }

    /// DDL went out through the pool (on any path): nothing is proven until
    /// the catalog is read again, at the next housekeeping tick.
    pub(crate) fn catalog_changed(&self) {
        self.catalog_ddl.fetch_add(1, Ordering::AcqRel);
        self.suspect_catalog();
    }

    /// The fewest settings of libraries no extension or language installed
    /// any session of this lane showed, once one did.
    pub(crate) fn settings_floor(&self) -> Option<u64> {
        Some(self.settings_floor.0.load(Ordering::Acquire)).filter(|&n| n != u64::MAX)
    }

    /// A session showed `settings` settings (`pg_settings`): whether that
    /// is more than the fewest any session of this lane showed.
    pub(crate) fn loaded_a_library(&self, settings: u64) -> bool {
        settings > self.settings_floor.0.fetch_min(settings, Ordering::AcqRel)
    }

    /// Whether a first load of the catalog was tried.
    pub(crate) fn catalog_tried(&self) -> bool {
        self.catalog_tried.load(Ordering::Acquire)
    }

    /// A load of the catalog was tried (done, or failed): DDL sent before
    /// it started is in it, or its window is the documented one.
    pub(crate) fn tried_catalog(&self) {
        self.catalog_tried.store(true, Ordering::Release);
    }

    /// The catalog is about to be read: the count of DDL it will reflect
    /// (hand it to [`read_catalog`](PoolWire::read_catalog)), and whether
    /// DDL went out since the catalog in use was read.
    pub(crate) fn reading_catalog(&self) -> (u64, bool) {
        let ddl = self.catalog_ddl.load(Ordering::Acquire);
        (ddl, ddl != self.catalog_fresh.load(Ordering::Acquire))
    }

    /// The catalog in use reflects the DDL counted at `ddl` (installed, or
    /// found unchanged): stale no more, unless more went out since.
    pub(crate) fn read_catalog(&self, ddl: u64) {
        self.catalog_fresh.fetch_max(ddl, Ordering::AcqRel);
    }

    /// A shared connection showed session state the guard let through:
    /// the catalog is loaded again at the next housekeeping tick.
    pub(crate) fn suspect_catalog(&self) {
        self.catalog_suspect.store(true, Ordering::Release);
    }

    /// Whether the catalog was suspected since the last call.
    pub(crate) fn take_catalog_suspect(&self) -> bool {
        self.catalog_suspect.swap(false, Ordering::AcqRel)
    }

    /// The catalog as last learned, to keep.
    pub(crate) fn catalog_full(&self) -> Arc<Catalog> {
        self.catalog.load_full()
    }

    /// How many times the catalog learned has changed.
    pub(crate) fn catalog_generation(&self) -> u64 {
        self.catalog_generation.load(Ordering::Acquire)
    }

    /// Keeps what was learned of the catalog; a change bumps the
    /// generation.
    pub(crate) fn set_catalog(&self, catalog: Catalog) {
        if let Some(settings) = catalog.settings() {
            self.loaded_a_library(settings);
        }
        if **self.catalog.load() != catalog {
            self.catalog.store(Arc::new(catalog));
            self.catalog_generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A fine clock for the hot path: nanoseconds since the pool was made.
    pub(crate) fn now_nanos(&self) -> u64 {
        self.epoch.0.elapsed().as_nanos() as u64
    }

    /// The pool's coarse clock: housekeeping ticks so far.
    pub(crate) fn ticks(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    pub(crate) fn register(&self, state: &Arc<ConnState>) {
        let mut states = lock(&self.states);
        states.retain(|s| s.strong_count() > 0);
        states.push(Arc::downgrade(state));
    }

    /// The connections still alive.
    pub(crate) fn states(&self) -> Vec<Arc<ConnState>> {
        lock(&self.states)
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}
