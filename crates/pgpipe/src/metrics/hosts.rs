//! The metrics of a pool of several hosts: each host's role and lag, the
//! elections, and where reads went. Label values are fixed lists, and
//! `host` is the configured `host:port`, a set the configuration bounds.

use prometheus::{
    GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use super::{Labels, NAMESPACE, SECONDS, opts};
use crate::error::Error;

/// A host's role, as the last check found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RoleLabel {
    Primary,
    Standby,
    Down,
    Unknown,
}

impl RoleLabel {
    const ALL: [RoleLabel; 4] = [
        RoleLabel::Primary,
        RoleLabel::Standby,
        RoleLabel::Down,
        RoleLabel::Unknown,
    ];

    fn label(self) -> &'static str {
        match self {
            RoleLabel::Primary => "primary",
            RoleLabel::Standby => "standby",
            RoleLabel::Down => "down",
            RoleLabel::Unknown => "unknown",
        }
    }
}

/// Where a query was routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RouteLabel {
    Primary,
    Replica,
    PrimaryFallback,
}

/// Why a read went to the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FallbackReason {
    /// No standby is up (or none is configured).
    NoReplica,
    /// Every standby that is up lags past `max_replica_lag`.
    Lag,
    /// No standby is known to have replayed the read's token.
    Token,
}

/// Why a query was run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryReason {
    /// A write reached a read-only host (25006, 0A000).
    ReadOnly,
    /// A read on a standby was cancelled by a recovery conflict (40001).
    RecoveryConflict,
    /// A read's connection to a standby broke.
    ReplicaLost,
    /// A write could not be sent to the primary (it is down); it waited
    /// for the next one within `failover_wait`.
    PrimaryDown,
    /// A write waited for a place on the old primary when another host was
    /// elected; it ran on the new one.
    PrimaryMoved,
}

/// The handles, resolved once.
#[derive(Debug)]
pub(crate) struct HostMetrics {
    role: IntGaugeVec,
    checks: IntCounterVec,
    lag_seconds: GaugeVec,
    lag_bytes: GaugeVec,
    in_rotation: IntGaugeVec,
    pub(crate) primary_changes: IntCounter,
    pub(crate) discovery: Histogram,
    pub(crate) conflicts: IntCounter,
    routes: IntCounterVec,
    fallbacks: IntCounterVec,
    role_errors: IntCounterVec,
    retries: IntCounterVec,
}

impl HostMetrics {
    /// Makes and registers them.
    pub(crate) fn register(
        registry: &Registry,
        pool: &str,
        hosts: &[&str],
    ) -> Result<HostMetrics, Error> {
        let labels = Labels::pool(pool);
        let fail = |e: prometheus::Error| {
            Error::config(format!(
                "could not register the host metrics of pool \"{pool}\": {e}"
            ))
        };
        let o = |name: &str, help: &str| -> Opts { opts(name, help, &labels) };
        let metrics = HostMetrics {
            role: IntGaugeVec::new(
                o(
                    "host_role",
                    "Each configured host's role as last checked: 1 for the current one.",
                ),
                &["host", "role"],
            )
            .map_err(fail)?,
            checks: IntCounterVec::new(
                o(
                    "host_checks_total",
                    "Role and lag checks, by host and outcome.",
                ),
                &["host", "outcome"],
            )
            .map_err(fail)?,
            lag_seconds: GaugeVec::new(
                o(
                    "replica_lag_seconds",
                    "How long ago the primary was where this standby has replayed to (0 when \
                     caught up, whatever the primary's activity).",
                ),
                &["host"],
            )
            .map_err(fail)?,
            lag_bytes: GaugeVec::new(
                o(
                    "replica_lag_bytes",
                    "WAL bytes between the primary's position and this standby's replay.",
                ),
                &["host"],
            )
            .map_err(fail)?,
            in_rotation: IntGaugeVec::new(
                o(
                    "replica_in_rotation",
                    "1 for a standby that serves reads (up, within max_replica_lag), else 0.",
                ),
                &["host"],
            )
            .map_err(fail)?,
            primary_changes: IntCounter::with_opts(o(
                "primary_changes_total",
                "A new primary was elected after another (failovers and switchovers).",
            ))
            .map_err(fail)?,
            discovery: Histogram::with_opts(
                HistogramOpts::new(
                    "primary_discovery_seconds",
                    "How long the pool had no primary before it elected one.",
                )
                .namespace(NAMESPACE)
                .const_label("pool", pool)
                .buckets(SECONDS.to_vec()),
            )
            .map_err(fail)?,
            conflicts: IntCounter::with_opts(o(
                "primary_conflicts_total",
                "Checks that found more than one writable server (split brain).",
            ))
            .map_err(fail)?,
            routes: IntCounterVec::new(
                o(
                    "queries_routed_total",
                    "Queries by where they were sent: the primary, a standby, or the primary \
                     for a read that no standby could take.",
                ),
                &["route"],
            )
            .map_err(fail)?,
            fallbacks: IntCounterVec::new(
                o(
                    "route_fallbacks_total",
                    "Reads sent to the primary, by why no standby took them.",
                ),
                &["reason"],
            )
            .map_err(fail)?,
            role_errors: IntCounterVec::new(
                o(
                    "role_errors_total",
                    "Server errors that come from a host's role (25006 read-only, 0A000, \
                     40001 recovery conflict), by SQLSTATE.",
                ),
                &["code"],
            )
            .map_err(fail)?,
            retries: IntCounterVec::new(
                o(
                    "retries_total",
                    "Queries run again where nothing can have been written, by reason.",
                ),
                &["reason"],
            )
            .map_err(fail)?,
        };
        for collector in [
            Box::new(metrics.role.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(metrics.checks.clone()),
            Box::new(metrics.lag_seconds.clone()),
            Box::new(metrics.lag_bytes.clone()),
            Box::new(metrics.in_rotation.clone()),
            Box::new(metrics.primary_changes.clone()),
            Box::new(metrics.discovery.clone()),
            Box::new(metrics.conflicts.clone()),
            Box::new(metrics.routes.clone()),
            Box::new(metrics.fallbacks.clone()),
            Box::new(metrics.role_errors.clone()),
            Box::new(metrics.retries.clone()),
        ] {
            registry.register(collector).map_err(fail)?;
        }
        // Every host has its series from the start: unknown role, lag not
        // measured (NaN: no comparison with it is true), out of rotation.
        for host in hosts {
            metrics.role(host, RoleLabel::Unknown);
            metrics.checks.with_label_values(&[host, "ok"]);
            metrics.checks.with_label_values(&[host, "error"]);
            metrics.no_lag(host);
            metrics.in_rotation.with_label_values(&[host]).set(0);
        }
        for reason in ["no_replica", "lag", "token"] {
            metrics.fallbacks.with_label_values(&[reason]);
        }
        for reason in [
            "read_only",
            "recovery_conflict",
            "replica_lost",
            "primary_down",
        ] {
            metrics.retries.with_label_values(&[reason]);
        }
        for code in ["25006", "0A000", "40001"] {
            metrics.role_errors.with_label_values(&[code]);
        }
        for route in ["primary", "replica", "primary_fallback"] {
            metrics.routes.with_label_values(&[route]);
        }
        Ok(metrics)
    }

    /// Sets a host's role: 1 for it, 0 for the others.
    pub(crate) fn role(&self, host: &str, role: RoleLabel) {
        for each in RoleLabel::ALL {
            self.role
                .with_label_values(&[host, each.label()])
                .set(i64::from(each == role));
        }
    }

    pub(crate) fn checked(&self, host: &str, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.checks.with_label_values(&[host, outcome]).inc();
    }

    pub(crate) fn lag(&self, host: &str, seconds: f64, bytes: u64) {
        self.lag_seconds.with_label_values(&[host]).set(seconds);
        self.lag_bytes.with_label_values(&[host]).set(bytes as f64);
    }

    /// A host that is no standby has no lag.
    pub(crate) fn no_lag(&self, host: &str) {
        self.lag_seconds.with_label_values(&[host]).set(f64::NAN);
        self.lag_bytes.with_label_values(&[host]).set(f64::NAN);
    }

    pub(crate) fn in_rotation(&self, host: &str, serving: bool) {
        self.in_rotation
            .with_label_values(&[host])
            .set(i64::from(serving));
    }

    pub(crate) fn routed(&self, route: RouteLabel) {
        let label = match route {
            RouteLabel::Primary => "primary",
            RouteLabel::Replica => "replica",
            RouteLabel::PrimaryFallback => "primary_fallback",
        };
        self.routes.with_label_values(&[label]).inc();
    }

    pub(crate) fn fallback(&self, reason: FallbackReason) {
        let label = match reason {
            FallbackReason::NoReplica => "no_replica",
            FallbackReason::Lag => "lag",
            FallbackReason::Token => "token",
        };
        self.fallbacks.with_label_values(&[label]).inc();
    }

    pub(crate) fn role_error(&self, code: &'static str) {
        self.role_errors.with_label_values(&[code]).inc();
    }

    pub(crate) fn retry(&self, reason: RetryReason) {
        let label = match reason {
            RetryReason::ReadOnly => "read_only",
            RetryReason::RecoveryConflict => "recovery_conflict",
            RetryReason::ReplicaLost => "replica_lost",
            RetryReason::PrimaryDown => "primary_down",
            RetryReason::PrimaryMoved => "primary_moved",
        };
        self.retries.with_label_values(&[label]).inc();
    }
}
