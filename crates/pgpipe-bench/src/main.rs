//! `pgpipe-bench`: pgpipe against deadpool-postgres and a shared
//! tokio-postgres client, side by side in one run, at injected round-trip
//! times.
//!
//! ```text
//! cargo run --release -p pgpipe-bench -- --quick      # about a minute
//! cargo run --release -p pgpipe-bench -- --full       # the whole sweep
//! cargo run --release -p pgpipe-bench -- --quick --smoke   # seconds; CI
//! cargo run --release -p pgpipe-bench -- --faults --rounds 3   # issue #42
//! cargo run --release -p pgpipe-bench -- --soak 3600           # issue #45
//! ```
//!
//! The server comes from `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). Round trips are injected
//! by a proxy on its own real-time thread; a delay of 0 connects directly.
//! Output: a Markdown table on stdout, JSON lines (`--out`) and an SVG chart
//! (`--chart`). `--help` lists every option.

mod cell;
mod faults;
mod fleet;
mod measure;
mod pgbench;
mod plan;
mod replicas;
mod report;
mod soak;
mod sysstat;
mod targets;
mod tuning;
mod workload;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cell::Cell;
use pgpipe_proxy::Proxy;
use pgpipe_test_support::try_database_url;
use plan::{HELP, Plan};
use targets::Kind;
use workload::Workload;

/// The server, split into the parts the proxy and pgbench need.
#[derive(Debug, Clone)]
struct Server {
    url: String,
    host: String,
    port: u16,
    user: String,
    db: String,
}

impl Server {
    fn from_url(url: String) -> Result<Server, String> {
        let config: tokio_postgres::Config = url.parse().map_err(|e| format!("{e}"))?;
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => return Err("the benchmark needs a TCP host in DATABASE_URL".into()),
        };
        Ok(Server {
            port: config.get_ports().first().copied().unwrap_or(5432),
            user: config.get_user().unwrap_or("postgres").to_string(),
            db: config.get_dbname().unwrap_or("postgres").to_string(),
            host,
            url,
        })
    }

    fn via(&self, proxy: &Proxy) -> String {
        format!("postgres://{}@{}/{}", self.user, proxy.addr(), self.db)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let plan = match Plan::parse(&args) {
        Ok(plan) => plan,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = plan.workers {
        runtime.worker_threads(workers);
    }
    match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(run_plan(plan, args)),
        Err(e) => {
            eprintln!("pgpipe-bench: cannot start the runtime: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run_plan(plan: Plan, args: Vec<String>) -> ExitCode {
    let server = match try_database_url().and_then(Server::from_url) {
        Ok(server) => server,
        Err(message) => {
            eprintln!("pgpipe-bench: {message}");
            return ExitCode::from(2);
        }
    };
    let ran = if let Some((tag, url, start)) = &plan.fleet_member {
        fleet::member(&plan, tag, url, *start)
            .await
            .map(|()| true)
            .map_err(|e| e.to_string().into())
    } else if let Some(processes) = plan.fleet {
        fleet::run(&plan, &server, processes)
            .await
            .map_err(|e| e.to_string().into())
    } else if plan.replicas {
        replicas::run(&plan).await
    } else if let Some(length) = plan.soak {
        soak::run(&plan, length)
            .await
            .map_err(|e| e.to_string().into())
    } else if plan.faults {
        faults::run(&plan, &server.url)
            .await
            .map_err(|e| e.to_string().into())
    } else {
        run(&plan, &server, &args).await
    };
    match ran {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("pgpipe-bench: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs the plan; `Ok(false)` when any answer was wrong (or, with
/// `--smoke`, any query failed).
async fn run(
    plan: &Plan,
    server: &Server,
    args: &[String],
) -> Result<bool, Box<dyn std::error::Error>> {
    let (admin, connection) = tokio_postgres::connect(&server.url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("cannot connect to {}:{}: {e}", server.host, server.port))?;
    tokio::spawn(connection);
    let version: String = admin.query_one("SHOW server_version", &[]).await?.get(0);
    let table: Arc<str> = Arc::from(format!("pgpipe_bench_writes_{}", std::process::id()));
    admin
        .batch_execute(&format!(
            "CREATE UNLOGGED TABLE IF NOT EXISTS {table} (task int8, n int8); {}; {}",
            workload::function_ddl(&table),
            workload::accounts_ddl(&table)
        ))
        .await?;
    let proxy = Arc::new(Proxy::builder(format!("{}:{}", server.host, server.port)).start()?);
    // In front of the proxy, so that the injected round trip lies between
    // PgBouncer and the server.
    let start_bouncer = |mode: &str, servers: &str| -> Result<_, Box<dyn std::error::Error>> {
        let mut bouncer = pgpipe_test_support::Pgbouncer::builder(&proxy.addr().to_string())
            .setting("pool_mode", mode)
            .setting("default_pool_size", servers);
        if let Some(binary) = &plan.pgbouncer_binary {
            bouncer = bouncer
                .binary(binary)
                .setting("max_prepared_statements", "200");
        }
        Ok(bouncer
            .start()?
            .ok_or("--pgbouncer needs PgBouncer (apt-get install pgbouncer)")?)
    };
    let bouncers = if plan.pgbouncer {
        Some((
            start_bouncer("transaction", "4")?,
            start_bouncer("session", "8")?,
        ))
    } else {
        None
    };

    print_header(plan, server, &version, &proxy, args);
    let mut records = Vec::new();
    for &delay in &plan.delays_us {
        proxy.set_delay(Duration::from_micros(delay));
        let url = if delay == 0 {
            server.url.clone()
        } else {
            server.via(&proxy)
        };
        let via = (delay > 0).then(|| Arc::clone(&proxy));
        let measured = measure_rtt(&url).await?;
        let first = records.len();
        for &workload in &plan.workloads {
            for round in 0..plan.rounds {
                for &tasks in &plan.tasks {
                    let mut order = plan.targets.clone();
                    let shift = round as usize % order.len();
                    order.rotate_left(shift);
                    for kind in order {
                        let url = via_bouncer(&bouncers, kind, &url);
                        let cell = Cell {
                            kind,
                            workload,
                            tasks,
                            delay,
                            round,
                            rate: None,
                        };
                        records.push(cell.run(plan, &url, via.clone(), &table, &admin).await?);
                    }
                }
            }
            if matches!(workload, Workload::Echo | Workload::HeadOfLine) {
                for &rate in &plan.rates {
                    for round in 0..plan.rounds {
                        for &kind in &plan.targets {
                            let url = via_bouncer(&bouncers, kind, &url);
                            let cell = Cell {
                                kind,
                                workload,
                                tasks: 0,
                                delay,
                                round,
                                rate: Some(rate),
                            };
                            records.push(cell.run(plan, &url, via.clone(), &table, &admin).await?);
                        }
                    }
                }
            }
        }
        for record in &mut records[first..] {
            record.measured_rtt_ms = Some(measured);
        }
    }
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {table}_accounts; \
             DROP FUNCTION IF EXISTS {table}_echo(int8)"
        ))
        .await?;

    let medians = report::medians(&records);
    let order: Vec<String> = plan.targets.iter().map(|k| k.name()).collect();
    println!("{}", report::markdown(&medians, &order));
    if let Some(duration) = plan.pgbench {
        print_pgbench(server, &proxy, &plan.delays_us, duration);
    }
    report::write_json_lines(&plan.out, &records)?;
    eprintln!("wrote {}", plan.out.display());
    if !plan.smoke {
        let chart_workload = plan.workloads.first().map_or("echo", |w| w.name());
        report::chart(&plan.chart, &medians, chart_workload, &order)?;
        eprintln!("wrote {}", plan.chart.display());
    }
    let mismatches: u64 = records.iter().map(|r| r.mismatches).sum();
    let errors: u64 = records.iter().map(|r| r.errors).sum();
    println!(
        "mismatches: {mismatches} (answers delivered to the wrong caller or wrong); errors: {errors}"
    );
    for r in records.iter().filter(|r| r.errors > 0).take(5) {
        println!(
            "  first error for {} ({} tasks): {}",
            r.target,
            r.tasks,
            r.first_error.as_deref().unwrap_or("?")
        );
    }
    Ok(mismatches == 0 && !(plan.smoke && errors > 0))
}

/// A lone `SELECT 1` on `url`, median of 50, in milliseconds: the round
/// trip a client sees (network, proxy and server), printed beside the
/// nominal one.
async fn measure_rtt(url: &str) -> Result<f64, Box<dyn std::error::Error>> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let mut samples = Vec::with_capacity(50);
    for _ in 0..50 {
        let started = Instant::now();
        client.simple_query("SELECT 1").await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// Where `kind` connects: one of the `--pgbouncer` PgBouncers
/// (transaction, session), or `url`.
fn via_bouncer(
    bouncers: &Option<(
        pgpipe_test_support::Pgbouncer,
        pgpipe_test_support::Pgbouncer,
    )>,
    kind: Kind,
    url: &str,
) -> String {
    match bouncers {
        Some((transaction, _)) if kind.through_pgbouncer() => transaction.url(),
        Some((_, session)) if kind.through_session_pgbouncer() => session.url(),
        _ => url.to_string(),
    }
}

fn print_header(plan: &Plan, server: &Server, version: &str, proxy: &Proxy, args: &[String]) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let workers = plan.workers.unwrap_or(cores);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("## pgpipe-bench");
    println!();
    println!(
        "`pgpipe-bench {}` · {cores} cores, {workers} tokio worker(s) · Linux {} · \
         PostgreSQL {version} at {}:{} · \
         {} s measured per cell after {} s warm-up, {} round(s), median shown · \
         proxy SCHED_FIFO: {}",
        args.join(" "),
        kernel.trim(),
        server.host,
        server.port,
        plan.duration.as_secs_f64(),
        plan.warmup.as_secs_f64(),
        plan.rounds,
        if proxy.realtime() { "yes" } else { "no" },
    );
    println!();
    println!(
        "Columns: `× deadpool (16)` and `× shared client` are this row's queries/s over that \
         target's in the same cell; `conns`: server connections used; `syncs/write`: queries \
         per socket write, counted by the proxy (RTT > 0 only); `saved ms/q: est. / vs off`: \
         pgpipe's own estimate of the latency a pipelined query saved against the same pool \
         with pipelining off (its latency-saved counterfactual, per pipelined query), then the \
         measured difference in mean latency against `pgpipe off` with the same pool size in \
         the same cell: the estimate and what it estimates (the model assumes callers that send \
         their next query at once; requests that do work between queries make it run low); \
         `client/server µs/q`: CPU per query."
    );
}

fn print_pgbench(server: &Server, proxy: &Proxy, delays: &[u64], duration: Duration) {
    println!(
        "\n#### Server-bound ceiling: pgbench, 4 clients, 50 `SELECT 1` per pipeline (one Sync per 50)\n"
    );
    println!("| path | statements/s |\n|---|---|");
    for &delay in delays {
        proxy.set_delay(Duration::from_micros(delay));
        let (host, port, label) = if delay == 0 {
            (
                server.host.clone(),
                server.port,
                "loopback (direct)".to_string(),
            )
        } else {
            let addr = proxy.addr();
            (
                addr.ip().to_string(),
                addr.port(),
                format!("RTT {} ms (proxy)", delay as f64 * 2.0 / 1000.0),
            )
        };
        match pgbench::ceiling(&host, port, &server.user, &server.db, 4, duration) {
            Some(rate) => println!("| {label} | {rate:.0} |"),
            None => println!("| {label} | pgbench not available |"),
        }
    }
}
