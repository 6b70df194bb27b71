//! `pgpipe-bench`: pgpipe against deadpool-postgres and a shared
//! tokio-postgres client, side by side in one run, at injected round-trip
//! times.
//!
//! ```text
//! cargo run --release -p pgpipe-bench -- --quick      # about a minute
//! cargo run --release -p pgpipe-bench -- --full       # the whole sweep
//! cargo run --release -p pgpipe-bench -- --quick --smoke   # seconds; CI
//! ```
//!
//! The server comes from `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). Round trips are injected
//! by a proxy on its own real-time thread; a delay of 0 connects directly.
//! Output: a Markdown table on stdout, JSON lines (`--out`) and an SVG chart
//! (`--chart`). `--help` lists every option.

mod fleet;
mod pgbench;
mod replicas;
mod report;
mod sysstat;
mod targets;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgpipe_proxy::Proxy;
use pgpipe_test_support::{try_database_url, with_param};
use report::Record;
use sysstat::Cpu;
use targets::{Kind, Savings, Target, Tuning};
use workload::{Window, Workload};

const HELP: &str = "\
pgpipe-bench: pgpipe against deadpool-postgres and a shared tokio-postgres client

USAGE: pgpipe-bench [--quick | --full] [--smoke] [OPTIONS]

  --quick            echo workload, loopback and 1 ms RTT, 1/64/512 tasks, 1 round (default)
  --full             all workloads, loopback/1 ms/5 ms RTT, 3 rounds, open loop, pgbench
  --smoke            a few seconds; exits non-zero on any mismatch or error (CI)
  --rounds N         rounds per cell; tables show the median round
  --duration SECS    measured seconds per cell
  --warmup SECS      unmeasured seconds before each cell
  --workloads LIST   echo,reads,web,head-of-line,writes,functions,transfers,batches,begins
  --delays-us LIST   one-way delays in microseconds (0 = direct)
  --tasks LIST       concurrent tasks, e.g. 1,64,512
  --targets LIST     only targets whose name contains one of these texts (comma-separated)
  --rates LIST       open-loop rates (requests/s) for the echo and head-of-line workloads
  --out PATH         JSON lines (default bench-results/results.jsonl; with --smoke, bench-results/smoke.jsonl)
  --chart PATH       SVG chart (default bench-results/throughput.svg)
  --no-pgbench       skip the pgbench ceiling
  --pgbouncer        through PgBouncer in front of the proxy: in transaction mode (4 server
                     connections) pgpipe declared for it against deadpool-postgres with
                     query_typed; pgpipe through session mode; pgpipe direct. Give it
                     before --targets
  --replicas         a primary and two streaming standbys of the benchmark's own, a proxy in
                     front of each: read throughput through pool.read() with 0, 1 and 2
                     standbys, and execute_tracked's cost per write (--delays-us, --tasks,
                     --rounds, --duration apply)
  --depth N          pgpipe: max_pipeline_depth (default: the pool's default)
  --max-exclusive N  pgpipe: max_exclusive (default: the pool's default)
  --workers N        tokio worker threads for every target (default: one per core; with
                     --fleet, per process, default 1)
  --fleet K          K app processes per cell, each with its own pool (pgpipe on (4),
                     deadpool (16), a shared client), through one proxy: total q/s, p99,
                     server backends and CPU per query (--delays-us, --tasks per process,
                     --rounds, --duration apply; echo, reads, web, head-of-line)
  --tx-rate N        transfers, batches, begins: transactions per second, paced, for all targets
                     alike (default: as many as the transaction tasks can)
  --routing R        pgpipe: spread or fill
  --window-us N      pgpipe: batch_window in microseconds
  --slow-ms N|off    pgpipe: slow_query_threshold in milliseconds, or off
";

/// What to run.
#[derive(Debug, Clone)]
struct Plan {
    workloads: Vec<Workload>,
    delays_us: Vec<u64>,
    tasks: Vec<u64>,
    rounds: u32,
    duration: Duration,
    warmup: Duration,
    rates: Vec<f64>,
    targets: Vec<Kind>,
    pgbench: Option<Duration>,
    /// Through a PgBouncer 1.18 of the benchmark's own, in transaction mode.
    pgbouncer: bool,
    /// The `--replicas` tables instead of the comparison.
    replicas: bool,
    smoke: bool,
    out: PathBuf,
    chart: PathBuf,
    tuning: Tuning,
    /// transfers and batches: the transactions per second their
    /// transaction tasks aim at together (closed loop when `None`).
    tx_rate: Option<f64>,
    /// The tokio runtime's worker threads (`None`: one per core).
    workers: Option<usize>,
    /// `--fleet K`: K app processes per cell (see [`fleet`]).
    fleet: Option<usize>,
    /// One of a fleet's processes: its target's tag, URL and start (Unix
    /// milliseconds).
    fleet_member: Option<(String, String, u64)>,
}

impl Plan {
    fn quick() -> Plan {
        Plan {
            workloads: vec![Workload::Echo],
            delays_us: vec![0, 500],
            tasks: vec![1, 64, 512],
            rounds: 1,
            duration: Duration::from_millis(1000),
            warmup: Duration::from_millis(300),
            rates: Vec::new(),
            targets: Kind::ALL.to_vec(),
            pgbench: Some(Duration::from_secs(2)),
            pgbouncer: false,
            replicas: false,
            smoke: false,
            out: PathBuf::from("bench-results/results.jsonl"),
            chart: PathBuf::from("bench-results/throughput.svg"),
            tuning: Tuning::default(),
            workers: None,
            fleet: None,
            fleet_member: None,
            tx_rate: None,
        }
    }

    fn full() -> Plan {
        Plan {
            workloads: Workload::ALL.to_vec(),
            delays_us: vec![0, 500, 2500],
            rounds: 3,
            duration: Duration::from_secs(2),
            warmup: Duration::from_millis(500),
            rates: vec![2_000.0, 8_000.0],
            pgbench: Some(Duration::from_secs(5)),
            ..Plan::quick()
        }
    }

    fn parse(args: &[String]) -> Result<Plan, String> {
        let mut plan = if args.iter().any(|a| a == "--full") {
            Plan::full()
        } else {
            Plan::quick()
        };
        let mut out_given = false;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = || it.next().cloned().ok_or(format!("{arg} needs a value"));
            match arg.as_str() {
                "--quick" | "--full" => {}
                "--smoke" => {
                    plan.smoke = true;
                    plan.tasks = vec![64];
                    plan.duration = Duration::from_millis(300);
                    plan.warmup = Duration::from_millis(100);
                    plan.rounds = 1;
                    plan.rates.clear();
                    plan.pgbench = None;
                }
                "--rounds" => plan.rounds = parse_one(&value()?)?,
                "--duration" => plan.duration = Duration::from_secs_f64(parse_one(&value()?)?),
                "--warmup" => plan.warmup = Duration::from_secs_f64(parse_one(&value()?)?),
                "--workloads" => {
                    plan.workloads = value()?
                        .split(',')
                        .map(|w| Workload::parse(w).ok_or(format!("unknown workload {w}")))
                        .collect::<Result<_, _>>()?;
                }
                "--delays-us" => plan.delays_us = parse_list(&value()?)?,
                "--tasks" => plan.tasks = parse_list(&value()?)?,
                "--rates" => plan.rates = parse_list(&value()?)?,
                "--targets" => {
                    let filters = value()?;
                    let filters: Vec<&str> = filters.split(',').collect();
                    plan.targets
                        .retain(|k| filters.iter().any(|f| k.name().contains(f)));
                }
                "--out" => {
                    plan.out = PathBuf::from(value()?);
                    out_given = true;
                }
                "--chart" => plan.chart = PathBuf::from(value()?),
                "--no-pgbench" => plan.pgbench = None,
                "--pgbouncer" => {
                    plan.pgbouncer = true;
                    plan.targets = Kind::THROUGH_PGBOUNCER.to_vec();
                    plan.pgbench = None;
                }
                "--replicas" => {
                    plan.replicas = true;
                    plan.tasks = vec![512];
                    plan.pgbench = None;
                }
                "--depth" => plan.tuning.depth = Some(parse_one(&value()?)?),
                "--max-exclusive" => plan.tuning.max_exclusive = Some(parse_one(&value()?)?),
                "--tx-rate" => plan.tx_rate = Some(parse_one(&value()?)?),
                "--fleet" => match parse_one(&value()?)? {
                    0 => return Err("--fleet needs at least 1 process".to_string()),
                    n => {
                        plan.fleet = Some(n);
                        plan.pgbench = None;
                    }
                },
                "--fleet-member" => {
                    let tag = value()?;
                    plan.fleet_member = Some((tag, String::new(), 0));
                }
                "--fleet-url" => {
                    let url = value()?;
                    if let Some(member) = plan.fleet_member.as_mut() {
                        member.1 = url;
                    }
                }
                "--fleet-start-ms" => {
                    let start = parse_one(&value()?)?;
                    if let Some(member) = plan.fleet_member.as_mut() {
                        member.2 = start;
                    }
                }
                "--workers" => match parse_one(&value()?)? {
                    0 => return Err("--workers must be at least 1".to_string()),
                    n => plan.workers = Some(n),
                },
                "--slow-ms" => {
                    plan.tuning.slow = Some(match value()?.as_str() {
                        "off" => None,
                        ms => Some(Duration::from_secs_f64(parse_one::<f64>(ms)? / 1000.0)),
                    });
                }
                "--window-us" => {
                    plan.tuning.window = Some(Duration::from_micros(parse_one(&value()?)?));
                }
                "--routing" => {
                    plan.tuning.routing = Some(match value()?.as_str() {
                        "spread" => pgpipe::Routing::Spread,
                        "fill" => pgpipe::Routing::Fill,
                        other => return Err(format!("unknown routing {other}")),
                    });
                }
                other => return Err(format!("unknown option {other}\n\n{HELP}")),
            }
        }
        // A smoke run is not a result: it never overwrites the last real
        // run's JSON lines (whose chart it does not redraw either).
        if plan.smoke && !out_given {
            plan.out = PathBuf::from("bench-results/smoke.jsonl");
        }
        if plan.rounds == 0 || plan.targets.is_empty() || plan.tasks.is_empty() {
            return Err("nothing to run".into());
        }
        Ok(plan)
    }
}

fn parse_one<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.trim().parse().map_err(|_| format!("not a number: {s}"))
}

fn parse_list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>, String> {
    s.split(',').map(parse_one).collect()
}

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
        Ok(
            pgpipe_test_support::Pgbouncer::builder(&proxy.addr().to_string())
                .setting("pool_mode", mode)
                .setting("default_pool_size", servers)
                .start()?
                .ok_or("--pgbouncer needs PgBouncer (apt-get install pgbouncer)")?,
        )
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
         pgpipe's own estimate of the latency a pipelined query saved (round trips avoided × \
         the RTT estimate), then the measured difference per query against `pgpipe off` with \
         the same pool size in the same cell (which at high concurrency is mostly queueing, not \
         round trips: the two are different quantities, not an estimate and its error); \
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

/// One measurement.
#[derive(Debug, Clone, Copy)]
struct Cell {
    kind: Kind,
    workload: Workload,
    tasks: u64,
    delay: u64,
    round: u32,
    rate: Option<f64>,
}

impl Cell {
    async fn run(
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
            mean_ms: workload::mean_ms(&measured.latencies),
            saved_ms_per_query: savings.map(|s| s.seconds * 1e3 / queries.max(1) as f64),
            round_trips_saved_share: savings.map(|s| s.round_trips / queries.max(1) as f64),
            p50_ms: workload::quantile_ms(&measured.latencies, 0.50),
            p99_ms: workload::quantile_ms(&measured.latencies, 0.99),
            p999_ms: workload::quantile_ms(&measured.latencies, 0.999),
            slow_p99_ms: hol.then(|| workload::quantile_ms(&measured.slow_latencies, 0.99)),
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
        .map(|(after, before)| Savings {
            round_trips: after.round_trips - before.round_trips,
            seconds: after.seconds - before.seconds,
        });
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
