//! One cell of the comparison: a target, a workload, a task count and a
//! round trip, measured over one window.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgpipe_proxy::Proxy;
use pgpipe_test_support::with_param;

use crate::measure::{self, Window};
use crate::plan::Plan;
use crate::report::Record;
use crate::sysstat::Cpu;
use crate::targets::{Kind, Savings, Target};
use crate::workload::{self, Workload};

/// One measurement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cell {
    pub(crate) kind: Kind,
    pub(crate) workload: Workload,
    pub(crate) tasks: u64,
    pub(crate) delay: u64,
    pub(crate) round: u32,
    pub(crate) rate: Option<f64>,
}

impl Cell {
    pub(crate) async fn run(
        self,
        plan: &Plan,
        url: &str,
        proxy: Option<Arc<Proxy>>,
        table: &Arc<str>,
        admin: &tokio_postgres::Client,
    ) -> Result<Record, Box<dyn std::error::Error>> {
        let app = format!("pgpipe_bench_{}", self.kind.tag());
        let url = with_param(url, "application_name", &app);
        let target = Arc::new(
            Target::open(
                self.kind,
                &url,
                &self.workload.statements(table),
                plan.tuning,
                admin,
            )
            .await
            .map_err(|e| format!("{}: {e}", self.kind.name()))?,
        );
        let start = Instant::now();
        let window = Window {
            from: start + plan.warmup,
            until: start + plan.warmup + plan.duration,
        };
        let sampler = tokio::spawn(sample(window, proxy.clone(), Arc::clone(&target)));
        let measured = match self.rate {
            None => {
                workload::closed_loop(
                    Arc::clone(&target),
                    (self.workload, plan.tx_rate),
                    Arc::clone(table),
                    self.tasks,
                    window,
                )
                .await
            }
            Some(rate) => {
                workload::open_loop(
                    Arc::clone(&target),
                    self.workload,
                    Arc::clone(table),
                    rate,
                    start,
                    window,
                )
                .await
            }
        };
        let Sampled {
            cpu,
            proxy: proxy_stats,
            savings,
        } = sampler.await?;
        let connections: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&app],
            )
            .await?
            .get(0);
        target.close();
        drop(target);
        wait_for_disconnect(admin, &app).await;

        let seconds = plan.duration.as_secs_f64();
        let queries = measured.requests * self.workload.queries_per_request();
        let per_query = |d: Duration| d.as_secs_f64() * 1e6 / queries.max(1) as f64;
        let hol = self.workload.has_second_class();
        let record = Record {
            workload: self.workload.name().into(),
            mode: match (self.rate, plan.tx_rate) {
                (Some(_), _) => "open".into(),
                (None, Some(tx)) if self.workload.has_transaction_tasks() => {
                    format!("closed, {tx} transactions/s")
                }
                (None, _) => "closed".into(),
            },
            rate: self.rate,
            delay_us: self.delay,
            target: self.kind.name(),
            tasks: self.tasks,
            round: self.round,
            seconds,
            queries_per_sec: queries as f64 / seconds,
            requests_per_sec: measured.requests as f64 / seconds,
            mean_ms: measure::mean_ms(&measured.latencies),
            saved_ms_per_query: savings.and_then(Savings::per_query_ms),
            round_trips_saved_share: savings.map(|s| s.round_trips / queries.max(1) as f64),
            p50_ms: measure::quantile_ms(&measured.latencies, 0.50),
            p99_ms: measure::quantile_ms(&measured.latencies, 0.99),
            p999_ms: measure::quantile_ms(&measured.latencies, 0.999),
            slow_p99_ms: hol.then(|| measure::quantile_ms(&measured.slow_latencies, 0.99)),
            slow_per_sec: hol.then(|| measured.slow_latencies.len() as f64 / seconds),
            errors: measured.errors,
            first_error: measured.first_error,
            mismatches: measured.mismatches,
            dropped: measured.dropped,
            connections: connections as u64,
            client_cpu_us_per_query: per_query(cpu.client),
            server_cpu_us_per_query: per_query(cpu.server),
            proxy_cpu_share: proxy.as_ref().map(|_| cpu.proxy.as_secs_f64() / seconds),
            proxy_realtime: proxy.as_ref().map(|p| p.realtime()),
            syncs_per_write: proxy_stats.map(|(syncs, writes)| syncs as f64 / writes.max(1) as f64),
            measured_rtt_ms: None,
        };
        eprintln!(
            "{:>12} {:>18} {:>5} tasks {:>7}: {:>8.0} q/s  p50 {:>6.2} ms  p99 {:>7.2} ms  conns {}  errors {}  mismatches {}",
            record.workload,
            record.target,
            record.tasks,
            if self.delay == 0 {
                "direct".into()
            } else {
                format!("{}µs", self.delay)
            },
            record.queries_per_sec,
            record.p50_ms,
            record.p99_ms,
            record.connections,
            record.errors,
            record.mismatches,
        );
        if let (Some(share), Some(saved)) =
            (record.round_trips_saved_share, record.saved_ms_per_query)
        {
            eprintln!(
                "{:>40} pgpipe: {:.0}% of queries rode along, {saved:.2} ms saved each (est.)",
                "",
                share * 100.0
            );
        }
        Ok(record)
    }
}

/// CPU used during the window, and the proxy's Syncs and Sync-carrying
/// chunks upstream.
/// What changed during the window besides the answers.
#[derive(Debug, Default)]
struct Sampled {
    cpu: Cpu,
    /// The proxy's Syncs and Sync-carrying chunks upstream.
    proxy: Option<(u64, u64)>,
    /// pgpipe's own savings figures.
    savings: Option<Savings>,
}

async fn sample(window: Window, proxy: Option<Arc<Proxy>>, target: Arc<Target>) -> Sampled {
    let upstream = |p: &Proxy| {
        let up = p.stats().upstream;
        (up.messages, up.chunks_with_messages)
    };
    tokio::time::sleep_until(window.from.into()).await;
    let cpu_before = Cpu::now(proxy.as_deref());
    let proxy_before = proxy.as_deref().map(upstream);
    let savings_before = target.savings();
    tokio::time::sleep_until(window.until.into()).await;
    let cpu = Cpu::now(proxy.as_deref()).since(cpu_before);
    let proxy_delta = proxy
        .as_deref()
        .map(upstream)
        .zip(proxy_before)
        .map(|(after, before)| (after.0 - before.0, after.1 - before.1));
    let savings = target
        .savings()
        .zip(savings_before)
        .map(|(after, before)| after.since(before));
    Sampled {
        cpu,
        proxy: proxy_delta,
        savings,
    }
}

/// Waits (up to 3 s) until the cell's connections have left the server, so
/// they do not cost the next cell anything.
async fn wait_for_disconnect(admin: &tokio_postgres::Client, app: &str) {
    for _ in 0..300 {
        let left: i64 = match admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&app],
            )
            .await
        {
            Ok(row) => row.get(0),
            Err(_) => return,
        };
        if left == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
