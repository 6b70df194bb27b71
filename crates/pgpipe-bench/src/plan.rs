//! What a run of the benchmark is asked to do: its command line, parsed.

use std::path::PathBuf;
use std::time::Duration;

use crate::targets::Kind;
use crate::tuning::Tuning;
use crate::workload::Workload;

pub(crate) const HELP: &str = "\
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
  --pgbouncer-binary PATH
                     as --pgbouncer, through this PgBouncer (1.21 or later): in
                     transaction mode with max_prepared_statements 200, pgpipe
                     declared for it (pipelined, named statements)
  --replicas         a primary and two streaming standbys of the benchmark's own, a proxy in
                     front of each: read throughput through pool.read() with 0, 1 and 2
                     standbys, and execute_tracked's cost per write (--delays-us, --tasks,
                     --rounds, --duration apply)
  --faults           a blocked and a slow statement under 64 echo tasks: a held row lock,
                     pg_sleep(1) every 2 s through query and through slow(), against
                     deadpool-postgres (4, 16) and a shared client: echo p99, p99.9, max,
                     calls over 100 ms and 1 s, q/s during the fault (--rounds and
                     --duration, the seconds after the fault, apply)
  --soak SECS        the example service's mix (echo, reads on a standby, transfers, batches,
                     slow(), notifications) on one pool over a primary and a standby of its own
                     for SECS seconds, a fault every --fault-every seconds (backends
                     terminated, proxy stalled, connections cut, primary restarted, standby
                     lost): wrong answers, hangs, and whether RSS, descriptors, tasks,
                     connections or any gauge grew
  --fault-every SECS with --soak (default 180)
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
  --budget-ms N|off  pgpipe: head_of_line_budget in milliseconds, or off
";

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) workloads: Vec<Workload>,
    pub(crate) delays_us: Vec<u64>,
    pub(crate) tasks: Vec<u64>,
    pub(crate) rounds: u32,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) rates: Vec<f64>,
    pub(crate) targets: Vec<Kind>,
    pub(crate) pgbench: Option<Duration>,
    /// Through a PgBouncer 1.18 of the benchmark's own, in transaction mode.
    pub(crate) pgbouncer: bool,
    /// `--pgbouncer-binary`: another PgBouncer (1.21+) than Debian's.
    pub(crate) pgbouncer_binary: Option<PathBuf>,
    /// The `--replicas` tables instead of the comparison.
    pub(crate) replicas: bool,
    /// The `--faults` table (issue #42) instead of the comparison.
    pub(crate) faults: bool,
    /// `--soak SECS` (issue #45) instead of the comparison.
    pub(crate) soak: Option<Duration>,
    pub(crate) fault_every: Duration,
    pub(crate) smoke: bool,
    pub(crate) out: PathBuf,
    pub(crate) chart: PathBuf,
    pub(crate) tuning: Tuning,
    /// transfers and batches: the transactions per second their
    /// transaction tasks aim at together (closed loop when `None`).
    pub(crate) tx_rate: Option<f64>,
    /// The tokio runtime's worker threads (`None`: one per core).
    pub(crate) workers: Option<usize>,
    /// `--fleet K`: K app processes per cell (see [`fleet`]).
    pub(crate) fleet: Option<usize>,
    /// One of a fleet's processes: its target's tag, URL and start (Unix
    /// milliseconds).
    pub(crate) fleet_member: Option<(String, String, u64)>,
}

impl Plan {
    pub(crate) fn quick() -> Plan {
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
            pgbouncer_binary: None,
            replicas: false,
            faults: false,
            soak: None,
            fault_every: Duration::from_secs(180),
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

    pub(crate) fn parse(args: &[String]) -> Result<Plan, String> {
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
                "--pgbouncer-binary" => {
                    let binary = PathBuf::from(value()?);
                    plan.tuning.bouncer = Some(bouncer_version(&binary)?);
                    plan.pgbouncer_binary = Some(binary);
                    plan.pgbouncer = true;
                    plan.targets = Kind::THROUGH_PGBOUNCER.to_vec();
                    plan.pgbench = None;
                }
                "--pgbouncer" => {
                    plan.pgbouncer = true;
                    plan.targets = Kind::THROUGH_PGBOUNCER.to_vec();
                    plan.pgbench = None;
                }
                "--faults" => plan.faults = true,
                "--soak" => match parse_one::<u64>(&value()?)? {
                    0 => return Err("--soak needs a length in seconds".to_string()),
                    secs => plan.soak = Some(Duration::from_secs(secs)),
                },
                "--fault-every" => match parse_one::<u64>(&value()?)? {
                    0 => return Err("--fault-every must be at least 1 second".to_string()),
                    secs => plan.fault_every = Duration::from_secs(secs),
                },
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
                "--budget-ms" => {
                    plan.tuning.budget = Some(match value()?.as_str() {
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

pub(crate) fn parse_one<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.trim().parse().map_err(|_| format!("not a number: {s}"))
}

pub(crate) fn parse_list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>, String> {
    s.split(',').map(parse_one).collect()
}

/// `(major, minor)` of the PgBouncer at `binary`, from `--version`; 1.21 or
/// later (the ones that track pipelines and named statements).
fn bouncer_version(binary: &std::path::Path) -> Result<(u16, u16), String> {
    let output = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|e| format!("--pgbouncer-binary {}: {e}", binary.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| {
            let mut parts = v.split('.').map(str::parse::<u16>);
            Some((parts.next()?.ok()?, parts.next()?.ok()?))
        })
        .ok_or_else(|| format!("--pgbouncer-binary: no version in {text:?}"))?;
    if version < (1, 21) {
        return Err(format!(
            "--pgbouncer-binary: PgBouncer {}.{} does not track named statements (1.21+)",
            version.0, version.1
        ));
    }
    Ok(version)
}
