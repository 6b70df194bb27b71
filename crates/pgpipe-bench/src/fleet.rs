//! `--fleet K`: K app processes, each with a pool of its own, against one
//! server through the proxy, as a service scaled out to K replicas would
//! be. What runs out first at that scale is the server's connections
//! (`max_connections`), so beside the total throughput, the p99 and the
//! CPU per query, each row says how many server backends the fleet held.
//!
//! The parent starts the proxy and, for each cell, K copies of this binary
//! (`--fleet-member`, one tokio worker each unless `--workers` says
//! otherwise) that start their load at one agreed wall-clock instant and
//! measure the same window. Each prints one JSON line (its requests,
//! errors, mismatches, CPU and every latency); the parent merges them and
//! measures the server's CPU and backends over the window itself.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgpipe_proxy::Proxy;
use pgpipe_test_support::with_param;
use serde::{Deserialize, Serialize};

use crate::Server;
use crate::measure::{self, Window};
use crate::plan::Plan;
use crate::sysstat::Cpu;
use crate::targets::{BoxError, Kind, Target};
use crate::workload::{self, Workload};

/// The pools a fleet compares, each per process.
pub(crate) const TARGETS: [Kind; 3] = [Kind::PgpipeOn(4), Kind::Deadpool(16), Kind::SharedClient];

/// What one member process measured.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Member {
    requests: u64,
    errors: u64,
    mismatches: u64,
    first_error: Option<String>,
    client_cpu_us: u64,
    /// Every request's latency in microseconds.
    latencies: Vec<u32>,
}

/// One fleet cell, merged over its members.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FleetRecord {
    workload: String,
    delay_us: u64,
    target: String,
    processes: usize,
    tasks_per_process: u64,
    round: u32,
    queries_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Server backends the fleet held, counted mid-window.
    backends: u64,
    server_cpu_us_per_query: f64,
    client_cpu_us_per_query: f64,
    errors: u64,
    mismatches: u64,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The `Instant` of wall-clock `at_ms`, as near as this process can tell.
fn instant_of(at_ms: u64) -> Instant {
    let now = unix_ms();
    Instant::now() + Duration::from_millis(at_ms.saturating_sub(now))
}

/// The parent: every cell of the plan, `processes` members each.
pub(crate) async fn run(plan: &Plan, server: &Server, processes: usize) -> Result<bool, BoxError> {
    if let Some(w) = plan.workloads.iter().find(|w| !w.without_table()) {
        return Err(format!(
            "--fleet runs echo, reads, web and head-of-line, not {}",
            w.name()
        )
        .into());
    }
    let targets: Vec<Kind> = TARGETS
        .into_iter()
        .filter(|k| plan.targets.contains(k))
        .collect();
    if targets.is_empty() {
        return Err("--fleet compares pgpipe on (4), deadpool (16) and shared client (1)".into());
    }
    let (admin, connection) = tokio_postgres::connect(&server.url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let admin = &admin;
    let proxy = Arc::new(Proxy::builder(format!("{}:{}", server.host, server.port)).start()?);
    println!("## pgpipe-bench --fleet {processes}");
    println!();
    println!(
        "{processes} processes per cell, each with its own pool and {} tokio worker(s), through \
         one proxy; {} s measured after {} s warm-up, {} round(s), median shown. Backends: \
         the fleet's server connections, counted mid-window.",
        plan.workers.unwrap_or(1),
        plan.duration.as_secs_f64(),
        plan.warmup.as_secs_f64(),
        plan.rounds
    );
    println!();
    let mut records = Vec::new();
    for &delay in &plan.delays_us {
        proxy.set_delay(Duration::from_micros(delay));
        for &workload in &plan.workloads {
            for round in 0..plan.rounds {
                for &tasks in &plan.tasks {
                    let mut order = targets.clone();
                    let shift = round as usize % order.len();
                    order.rotate_left(shift);
                    for kind in order {
                        let cell = Cell {
                            kind,
                            workload,
                            tasks,
                            delay,
                            round,
                            processes,
                        };
                        records.push(cell.run(plan, server, &proxy, admin).await?);
                    }
                }
            }
        }
    }
    let medians = medians(&records);
    println!("{}", markdown(&medians));
    let mismatches: u64 = records.iter().map(|r| r.mismatches).sum();
    let errors: u64 = records.iter().map(|r| r.errors).sum();
    println!("mismatches: {mismatches}; errors: {errors}");
    let path = plan.out.with_extension("fleet.jsonl");
    let lines: Vec<String> = records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap_or_default())
        .collect();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, lines.join("\n") + "\n")?;
    eprintln!("wrote {}", path.display());
    Ok(mismatches == 0)
}

struct Cell {
    kind: Kind,
    workload: Workload,
    tasks: u64,
    delay: u64,
    round: u32,
    processes: usize,
}

impl Cell {
    async fn run(
        &self,
        plan: &Plan,
        server: &Server,
        proxy: &Proxy,
        admin: &tokio_postgres::Client,
    ) -> Result<FleetRecord, BoxError> {
        let app = format!("pgpipe_bench_fleet_{}", self.kind.tag());
        let url = with_param(&server.via(proxy), "application_name", &app);
        // Time for every member to start and open its pool.
        let start_ms = unix_ms() + 1500;
        let exe = std::env::current_exe()?;
        let mut children = Vec::with_capacity(self.processes);
        for _ in 0..self.processes {
            let mut command = Command::new(&exe);
            command
                .args(["--fleet-member", &self.kind.tag(), "--fleet-url", &url])
                .args(["--fleet-start-ms", &start_ms.to_string()])
                .args(["--workloads", self.workload.name()])
                .args(["--tasks", &self.tasks.to_string()])
                .args(["--duration", &plan.duration.as_secs_f64().to_string()])
                .args(["--warmup", &plan.warmup.as_secs_f64().to_string()])
                .args(["--workers", &plan.workers.unwrap_or(1).to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            if let Some(depth) = plan.tuning.depth {
                command.args(["--depth", &depth.to_string()]);
            }
            children.push(command.spawn()?);
        }
        let from = instant_of(start_ms) + plan.warmup;
        let window = Window {
            from,
            until: from + plan.duration,
        };
        tokio::time::sleep_until(window.from.into()).await;
        let before = Cpu::now(Some(proxy));
        tokio::time::sleep_until((window.from + plan.duration / 2).into()).await;
        let backends: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&app],
            )
            .await?
            .get(0);
        tokio::time::sleep_until(window.until.into()).await;
        let cpu = Cpu::now(Some(proxy)).since(before);
        let outputs = tokio::task::spawn_blocking(move || {
            children
                .into_iter()
                .map(|child| child.wait_with_output())
                .collect::<Result<Vec<_>, _>>()
        })
        .await??;
        let mut merged = Member::default();
        for output in outputs {
            let text = String::from_utf8_lossy(&output.stdout);
            let line = text.lines().last().unwrap_or_default();
            let member: Member = serde_json::from_str(line).map_err(|e| {
                format!("a fleet member ({}) answered {line:?}: {e}", output.status)
            })?;
            merged.requests += member.requests;
            merged.errors += member.errors;
            merged.mismatches += member.mismatches;
            merged.client_cpu_us += member.client_cpu_us;
            merged.first_error = merged.first_error.or(member.first_error);
            merged.latencies.extend(member.latencies);
        }
        merged.latencies.sort_unstable();
        let seconds = plan.duration.as_secs_f64();
        let queries = merged.requests * self.workload.queries_per_request();
        let per_query = |us: f64| us / queries.max(1) as f64;
        let record = FleetRecord {
            workload: self.workload.name().into(),
            delay_us: self.delay,
            target: self.kind.name(),
            processes: self.processes,
            tasks_per_process: self.tasks,
            round: self.round,
            queries_per_sec: queries as f64 / seconds,
            p50_ms: measure::quantile_ms(&merged.latencies, 0.50),
            p99_ms: measure::quantile_ms(&merged.latencies, 0.99),
            backends: backends as u64,
            server_cpu_us_per_query: per_query(cpu.server.as_secs_f64() * 1e6),
            client_cpu_us_per_query: per_query(merged.client_cpu_us as f64),
            errors: merged.errors,
            mismatches: merged.mismatches,
        };
        eprintln!(
            "fleet {:>2} × {:>18} {:>4} tasks {:>5}µs: {:>8.0} q/s  p99 {:>7.2} ms  backends {}  \
             server {:.1} µs/q  errors {}  mismatches {}{}",
            self.processes,
            record.target,
            self.tasks,
            self.delay,
            record.queries_per_sec,
            record.p99_ms,
            record.backends,
            record.server_cpu_us_per_query,
            record.errors,
            record.mismatches,
            merged
                .first_error
                .map_or(String::new(), |e| format!(" (first error: {e})")),
        );
        // Every member has exited: their connections are closing.
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(record)
    }
}

/// A member: opens its pool, runs the plan's one workload from the agreed
/// start, and prints what it measured as one JSON line.
pub(crate) async fn member(
    plan: &Plan,
    tag: &str,
    url: &str,
    start_ms: u64,
) -> Result<(), BoxError> {
    let kind = Kind::ALL
        .into_iter()
        .find(|k| k.tag() == tag)
        .ok_or_else(|| format!("unknown fleet target {tag}"))?;
    let workload = *plan.workloads.first().ok_or("no workload")?;
    let tasks = *plan.tasks.first().ok_or("no tasks")?;
    let direct = pgpipe_test_support::try_database_url()?;
    let (admin, connection) = tokio_postgres::connect(&direct, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let statements = workload.statements("unused");
    let target = Arc::new(Target::open(kind, url, &statements, plan.tuning, &admin).await?);
    drop(admin);
    let start = instant_of(start_ms);
    tokio::time::sleep_until(start.into()).await;
    let window = Window {
        from: start + plan.warmup,
        until: start + plan.warmup + plan.duration,
    };
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(window.from.into()).await;
        let before = Cpu::now(None);
        tokio::time::sleep_until(window.until.into()).await;
        Cpu::now(None).since(before).client
    });
    let measured = workload::closed_loop(
        Arc::clone(&target),
        (workload, None),
        Arc::from("unused"),
        tasks,
        window,
    )
    .await;
    let member = Member {
        requests: measured.requests,
        errors: measured.errors,
        mismatches: measured.mismatches,
        first_error: measured.first_error,
        client_cpu_us: cpu.await?.as_micros() as u64,
        latencies: measured.latencies,
    };
    target.close();
    println!("{}", serde_json::to_string(&member)?);
    Ok(())
}

/// The median round (by throughput) of each cell.
fn medians(records: &[FleetRecord]) -> Vec<FleetRecord> {
    let mut cells: Vec<Vec<&FleetRecord>> = Vec::new();
    for r in records {
        let same = |c: &&mut Vec<&FleetRecord>| {
            let first = c[0];
            (
                &first.workload,
                first.delay_us,
                &first.target,
                first.tasks_per_process,
            ) == (&r.workload, r.delay_us, &r.target, r.tasks_per_process)
        };
        match cells.iter_mut().find(|c| same(c)) {
            Some(cell) => cell.push(r),
            None => cells.push(vec![r]),
        }
    }
    cells
        .into_iter()
        .map(|mut cell| {
            cell.sort_by(|a, b| a.queries_per_sec.total_cmp(&b.queries_per_sec));
            cell[cell.len() / 2].clone()
        })
        .collect()
}

fn markdown(medians: &[FleetRecord]) -> String {
    let mut out = String::from(
        "| workload | RTT | processes × tasks | target (per process) | q/s (all) | p50 ms | p99 ms \
         | server backends | server µs/q | client µs/q |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in medians {
        let rtt = match r.delay_us {
            0 => "loopback".to_string(),
            d => format!("{} ms", d as f64 * 2.0 / 1000.0),
        };
        out.push_str(&format!(
            "| {} | {rtt} | {} × {} | {} | {:.1}k | {:.2} | {:.2} | {} | {:.1} | {:.1} |\n",
            r.workload,
            r.processes,
            r.tasks_per_process,
            r.target,
            r.queries_per_sec / 1000.0,
            r.p50_ms,
            r.p99_ms,
            r.backends,
            r.server_cpu_us_per_query,
            r.client_cpu_us_per_query,
        ));
    }
    out
}
