//! `--faults`: what one blocked or slow statement does to its neighbours
//! (issue #42). 64 tasks loop the echo query; at 3 s a fault starts:
//!
//! - `row-lock`: another session holds a row for 3 s, and one task's
//!   `UPDATE` of that row waits for it (through `query`);
//! - `slow`: `SELECT pg_sleep(1)` every 2 s through `query`;
//! - `slow-marked`: the same through pgpipe's `slow()` (the other pools
//!   have no such handle: `query`).
//!
//! Per target and fault: the echo p99, p99.9 and max, calls over 100 ms
//! and over 1 s, echo throughput while the fault lasts, echo errors, and
//! the faulting statement's own outcome; medians of `--rounds` rounds.
//! Every echo answer is checked against its caller.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::measure::quantile_ms;
use crate::plan::Plan;
use crate::targets::{BoxError, Kind, Target};

const ECHO: &str = "SELECT $1::int8";
const SLEEP: &str = "SELECT pg_sleep(1)";
const TASKS: i64 = 64;
/// When the fault starts, and how long a cell runs after it.
const FAULT_AT: Duration = Duration::from_secs(3);
const LOCK_HELD: Duration = Duration::from_secs(3);

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    RowLock,
    Slow,
    SlowMarked,
}

impl Fault {
    const ALL: [Fault; 3] = [Fault::RowLock, Fault::Slow, Fault::SlowMarked];

    fn name(self) -> &'static str {
        match self {
            Fault::RowLock => "row-lock",
            Fault::Slow => "slow",
            Fault::SlowMarked => "slow-marked",
        }
    }
}

/// What one round of one cell measured.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    p99: f64,
    p999: f64,
    max: f64,
    over_100ms: usize,
    over_1s: usize,
    qps_during: f64,
    errors: usize,
    wrong: usize,
    /// The faulting statements: completed, failed.
    fault_ok: usize,
    fault_failed: usize,
}

/// Runs every fault on every target; `Ok(false)` when an answer went to
/// the wrong caller (or, with `--smoke`, an echo failed or the faulting
/// statement did not complete on pgpipe).
pub(crate) async fn run(plan: &Plan, url: &str) -> Result<bool, BoxError> {
    let (admin, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let table = format!("pgpipe_bench_hol_{}", std::process::id());
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id int PRIMARY KEY, v int); \
             INSERT INTO {table} VALUES (1, 0)"
        ))
        .await?;
    let update = format!("UPDATE {table} SET v = v + 1 WHERE id = 1");
    let statements = vec![ECHO.to_string(), SLEEP.to_string(), update.clone()];
    let kinds = [
        Kind::PgpipeOn(4),
        Kind::Deadpool(4),
        Kind::Deadpool(16),
        Kind::SharedClient,
    ];
    let after = plan.duration.max(Duration::from_secs(4));
    println!(
        "\n## Faults: {TASKS} echo tasks, the fault from {} s, {} s after it, median of {} rounds\n",
        FAULT_AT.as_secs(),
        after.as_secs(),
        plan.rounds
    );
    println!(
        "| fault | target | echo p99 ms | p99.9 ms | max ms | calls > 100 ms | > 1 s | q/s during | echo errors | fault stmt ok/failed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut good = true;
    for fault in Fault::ALL {
        for kind in kinds {
            if fault == Fault::SlowMarked && !matches!(kind, Kind::PgpipeOn(_)) {
                continue;
            }
            let mut rounds = Vec::new();
            for _ in 0..plan.rounds.max(1) {
                let target = Target::open(kind, url, &statements, plan.tuning, &admin).await?;
                let target = Arc::new(target);
                let round = cell(&target, fault, &admin, &update, after).await?;
                target.close();
                good &= round.wrong == 0;
                if plan.smoke && matches!(kind, Kind::PgpipeOn(_)) {
                    good &= round.errors == 0 && round.fault_failed == 0;
                }
                rounds.push(round);
            }
            let m = median(&rounds);
            println!(
                "| {} | {} | {:.1} | {:.1} | {:.0} | {} | {} | {:.0} | {} | {}/{} |",
                fault.name(),
                kind.name(),
                m.p99,
                m.p999,
                m.max,
                m.over_100ms,
                m.over_1s,
                m.qps_during,
                m.errors,
                m.fault_ok,
                m.fault_failed
            );
        }
    }
    admin.batch_execute(&format!("DROP TABLE {table}")).await?;
    Ok(good)
}

/// The median of each column over the rounds.
fn median(rounds: &[Round]) -> Round {
    fn mid<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        v[v.len() / 2]
    }
    let of = |f: fn(&Round) -> f64| mid(rounds.iter().map(f).collect());
    let count = |f: fn(&Round) -> usize| mid(rounds.iter().map(f).collect());
    Round {
        p99: of(|r| r.p99),
        p999: of(|r| r.p999),
        max: of(|r| r.max),
        over_100ms: count(|r| r.over_100ms),
        over_1s: count(|r| r.over_1s),
        qps_during: of(|r| r.qps_during),
        errors: count(|r| r.errors),
        wrong: rounds.iter().map(|r| r.wrong).sum(),
        fault_ok: count(|r| r.fault_ok),
        fault_failed: count(|r| r.fault_failed),
    }
}

/// One round: the echo load, the fault at [`FAULT_AT`], `after` more.
async fn cell(
    target: &Arc<Target>,
    fault: Fault,
    admin: &tokio_postgres::Client,
    update: &str,
    after: Duration,
) -> Result<Round, BoxError> {
    // Warm: every connection open, every statement prepared.
    for i in 0..TASKS {
        target.query(ECHO, &[&i]).await?;
    }
    let start = Instant::now();
    let end = start + FAULT_AT + after;
    let stop = Arc::new(AtomicBool::new(false));
    let echoes: Vec<_> = (0..TASKS)
        .map(|t| {
            let (target, stop) = (Arc::clone(target), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut log = Vec::new();
                let (mut errors, mut wrong, mut i) = (0usize, 0usize, t);
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    match target.query(ECHO, &[&i]).await {
                        Ok(rows) => {
                            if rows.first().map(|r| r.get::<_, i64>(0)) != Some(i) {
                                wrong += 1;
                            }
                            log.push((sent, sent.elapsed()));
                        }
                        Err(_) => errors += 1,
                    }
                    i += TASKS;
                }
                (log, errors, wrong)
            })
        })
        .collect();
    tokio::time::sleep_until((start + FAULT_AT).into()).await;
    let fault_started = Instant::now();
    let (mut fault_ok, mut fault_failed) = (0, 0);
    let fault_ended = match fault {
        Fault::RowLock => {
            admin.batch_execute("BEGIN").await?;
            admin.execute(update, &[]).await?;
            let write = {
                let (target, update) = (Arc::clone(target), update.to_string());
                tokio::spawn(async move { target.query(&update, &[]).await.map(drop) })
            };
            tokio::time::sleep(LOCK_HELD).await;
            admin.batch_execute("COMMIT").await?;
            let ended = Instant::now();
            match write.await {
                Ok(Ok(())) => fault_ok += 1,
                _ => fault_failed += 1,
            }
            ended
        }
        Fault::Slow | Fault::SlowMarked => {
            let mut sleeps = Vec::new();
            while Instant::now() + Duration::from_secs(1) < end {
                let target = Arc::clone(target);
                let marked = fault == Fault::SlowMarked;
                sleeps.push(tokio::spawn(async move {
                    match (&*target, marked) {
                        (Target::Pgpipe(pool, _), true) => pool
                            .slow()
                            .query(SLEEP, &[])
                            .await
                            .map(drop)
                            .map_err(BoxError::from),
                        (target, _) => target.query(SLEEP, &[]).await.map(drop),
                    }
                }));
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            for sleep in sleeps {
                match sleep.await {
                    Ok(Ok(())) => fault_ok += 1,
                    _ => fault_failed += 1,
                }
            }
            Instant::now()
        }
    };
    tokio::time::sleep_until(end.max(Instant::now()).into()).await;
    stop.store(true, Ordering::Relaxed);
    let (mut latencies, mut during, mut errors, mut wrong) = (Vec::new(), 0usize, 0, 0);
    for echo in echoes {
        let (log, e, w) = echo.await?;
        errors += e;
        wrong += w;
        for (sent, took) in log {
            if sent >= fault_started && sent < fault_ended {
                during += 1;
            }
            latencies.push(u32::try_from(took.as_micros()).unwrap_or(u32::MAX));
        }
    }
    latencies.sort_unstable();
    let ms = |us: u32| f64::from(us) / 1000.0;
    let window = fault_ended
        .saturating_duration_since(fault_started)
        .as_secs_f64();
    Ok(Round {
        p99: quantile_ms(&latencies, 0.99),
        p999: quantile_ms(&latencies, 0.999),
        max: latencies.last().copied().map_or(0.0, ms),
        over_100ms: latencies.iter().filter(|&&us| us > 100_000).count(),
        over_1s: latencies.iter().filter(|&&us| us > 1_000_000).count(),
        qps_during: if window > 0.0 {
            during as f64 / window
        } else {
            0.0
        },
        errors,
        wrong,
        fault_ok,
        fault_failed,
    })
}
