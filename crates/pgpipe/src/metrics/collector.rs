//! The pool's state, read when Prometheus scrapes: a [`PoolCollector`]
//! reads a [`Snapshot`] that the pool hands it, and knows nothing else of
//! the pool.

use std::sync::Arc;
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::{Gauge, IntGauge, IntGaugeVec, Registry, proto};

use super::{Labels, Metrics, opts};
use crate::error::Error;
use crate::status::Status;

/// What the collector reads from the pool at each scrape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snapshot {
    pub(crate) status: Status,
    /// Pipelined queries written and not yet answered.
    pub(crate) wire_depth: u64,
    /// Connections being opened for the shared path.
    pub(crate) opening: usize,
    pub(crate) queue_capacity: usize,
    pub(crate) rtt: Option<Duration>,
}

/// Takes a snapshot of the pool, or `None` once the pool is gone.
pub(crate) type SnapshotFn = Box<dyn Fn() -> Option<Snapshot> + Send + Sync>;

/// The pool's state, read at scrape time, plus every event metric.
pub(crate) struct PoolCollector {
    snapshot: SnapshotFn,
    depth: IntGauge,
    queue_depth: IntGauge,
    queue_capacity: IntGauge,
    rtt: Gauge,
    connections: IntGaugeVec,
    connections_max: IntGauge,
    pending: IntGauge,
    descs: Vec<Desc>,
}

impl PoolCollector {
    fn new(snapshot: SnapshotFn, name: &Labels) -> Result<PoolCollector, prometheus::Error> {
        let gauge = |metric: &str, help: &str| IntGauge::with_opts(opts(metric, help, name));
        let mut collector = PoolCollector {
            snapshot,
            depth: gauge(
                "pipeline_depth",
                "Queries written to shared connections and awaiting their answer now.",
            )?,
            queue_depth: gauge(
                "pipeline_queue_depth",
                "Pipelined queries submitted but not yet written: waiting for room, or \
                 admitted and on their way to the socket.",
            )?,
            queue_capacity: gauge(
                "pipeline_queue_capacity",
                "Most queries that may wait for room (queue_capacity).",
            )?,
            rtt: Gauge::with_opts(opts(
                "pipeline_rtt_seconds",
                "Round-trip estimate: a smoothed average of solitary round trips (a write to \
                 an idle connection until its first answer), leaving out any over 1.5 times \
                 the recent minimum (slow queries, answers read late).",
                name,
            ))?,
            connections: IntGaugeVec::new(
                opts("connections", "Open connections, by use.", name),
                &["state"],
            )?,
            connections_max: gauge("connections_max", "Most connections the pool may open.")?,
            pending: gauge(
                "pending_requests",
                "Queries and checkouts waiting for a connection.",
            )?,
            descs: Vec::new(),
        };
        for state in ["idle", "shared", "exclusive", "opening"] {
            collector.connections.with_label_values(&[state]);
        }
        collector.descs = collector
            .gauges()
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned())
            .collect();
        Ok(collector)
    }

    fn gauges(&self) -> [&dyn Collector; 7] {
        [
            &self.depth,
            &self.queue_depth,
            &self.queue_capacity,
            &self.rtt,
            &self.connections,
            &self.connections_max,
            &self.pending,
        ]
    }

    fn refresh(&self, snapshot: Snapshot) {
        let Snapshot {
            status, wire_depth, ..
        } = snapshot;
        self.depth.set(wire_depth as i64);
        let unwritten =
            (status.in_flight as u64).saturating_sub(wire_depth) + status.waiting as u64;
        self.queue_depth.set(unwritten as i64);
        self.queue_capacity
            .set(i64::try_from(snapshot.queue_capacity).unwrap_or(i64::MAX));
        self.rtt
            .set(snapshot.rtt.map_or(f64::NAN, |d| d.as_secs_f64()));
        for (state, count) in [
            ("idle", status.idle),
            ("shared", status.shared),
            ("exclusive", status.exclusive),
            ("opening", snapshot.opening),
        ] {
            self.connections
                .with_label_values(&[state])
                .set(count as i64);
        }
        self.connections_max.set(status.max_size as i64);
        self.pending
            .set((status.waiting + status.exclusive_waiting) as i64);
    }
}

impl Collector for PoolCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let Some(snapshot) = (self.snapshot)() else {
            return Vec::new();
        };
        self.refresh(snapshot);
        self.gauges().iter().flat_map(|c| c.collect()).collect()
    }
}

/// Registers the pool's metrics: the state read at scrape time, and every
/// event metric (each a handle on the same counters the pool updates).
pub(crate) fn register(
    registry: &Registry,
    snapshot: SnapshotFn,
    metrics: &Arc<Metrics>,
    name: &Labels,
    build_info: bool,
) -> Result<(), Error> {
    let fail = |e: prometheus::Error| {
        Error::config(format!(
            "could not register the metrics of pool \"{name}\" (is another pool of that \
             name in this registry?): {e}"
        ))
    };
    let state = PoolCollector::new(snapshot, name).map_err(fail)?;
    let build = IntGauge::with_opts(
        opts(
            "build_info",
            "pgpipe's version, as a label; always 1.",
            name,
        )
        .const_label("version", env!("CARGO_PKG_VERSION")),
    )
    .map_err(fail)?;
    build.set(1);
    let mut collectors: Vec<Box<dyn Collector>> = vec![
        Box::new(state),
        Box::new(metrics.queries_vec.clone()),
        Box::new(metrics.checkouts_vec.clone()),
        Box::new(metrics.pooler_errors_vec.clone()),
        Box::new(metrics.durations_family.clone()),
        Box::new(metrics.connection_wait_family.clone()),
        Box::new(metrics.flush_wait.clone()),
        Box::new(metrics.in_flight_family.clone()),
        Box::new(metrics.statement_hits.clone()),
        Box::new(metrics.statement_misses.clone()),
        Box::new(metrics.statements_evicted.clone()),
        Box::new(metrics.connection_open.clone()),
        Box::new(metrics.exclusive_hold.clone()),
        Box::new(metrics.inflight_failed.clone()),
        Box::new(metrics.rejected_vec.clone()),
        Box::new(metrics.created.clone()),
        Box::new(metrics.connection_errors.clone()),
        Box::new(metrics.closed_vec.clone()),
        Box::new(metrics.quarantined_vec.clone()),
        Box::new(metrics.wire.batch_size.clone()),
        Box::new(metrics.wire.round_trips_saved.clone()),
        Box::new(metrics.saved.saved.clone()),
        Box::new(metrics.saved.without.clone()),
        Box::new(metrics.saved.alone_gauge.clone()),
        Box::new(metrics.wire.syncs_saved.clone()),
        Box::new(metrics.wire.group_size.clone()),
        Box::new(metrics.wire.resent.clone()),
        Box::new(metrics.wire.evicted.clone()),
    ];
    if build_info {
        collectors.push(Box::new(build));
    }
    for collector in collectors.drain(..) {
        registry.register(collector).map_err(fail)?;
    }
    Ok(())
}
