//! `--soak SECS`: the example service's mix of work (see [`mix`]) on one
//! pool over a primary and a streaming standby of the benchmark's own, a
//! proxy in front of each, for `SECS` seconds, with a fault every
//! `--fault-every` seconds in turn:
//!
//! - the pool's backends terminated (`pg_terminate_backend`) on both;
//! - the primary's proxy stalled for 3 s (sockets open, nothing moves);
//! - every connection through the primary's proxy cut;
//! - the primary restarted (`pg_ctl restart -m fast`);
//! - the standby stopped (immediate) for 15 s, then started.
//!
//! Sampled throughout ([`sample`]): RSS, open descriptors, tokio tasks,
//! the pool's connections and waiters and every gauge it exports (the
//! statement and verdict caches are bounded by construction and export no
//! size; RSS holds them). Passes when no answer went to the wrong question,
//! no task went a minute without finishing a call, the transfers kept the
//! sum of balances, every kind of work succeeded after the last fault, and
//! no series grew (the last quarter's median against the second's).

mod mix;
mod sample;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pgpipe::Pool;
use pgpipe_proxy::Proxy;
use pgpipe_test_support::{ReplicaSet, connect};
use prometheus::Registry;

use crate::plan::Plan;
use crate::targets::BoxError;
use mix::{ACCOUNTS, KINDS, Mix};

/// Longest a task may go without finishing a call.
const HUNG: Duration = Duration::from_secs(60);

/// The faults, in the order they come.
const FAULTS: [&str; 5] = ["terminate", "stall", "cut", "restart", "standby-lost"];

/// Runs the soak and prints its report; `Ok(false)` when it failed.
pub(crate) async fn run(plan: &Plan, length: Duration) -> Result<bool, BoxError> {
    let set = Arc::new(tokio::task::spawn_blocking(|| ReplicaSet::start(1)).await??);
    let proxies: Arc<[Proxy; 2]> = Arc::new([
        Proxy::builder(set.primary.addr()).start()?,
        Proxy::builder(set.standbys[0].addr()).start()?,
    ]);
    let url = |proxy: &Proxy| {
        format!(
            "postgres://postgres@{}/postgres?application_name=pgpipe-soak",
            proxy.addr()
        )
    };
    let table = "pgpipe_soak_accounts";
    let admin = connect(&set.primary.url()).await?;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int8 PRIMARY KEY, balance int8 NOT NULL); \
             INSERT INTO {table} SELECT g, 1000 FROM generate_series(1, {ACCOUNTS}) g"
        ))
        .await?;
    drop(admin);
    set.wait_caught_up(Duration::from_secs(30)).await;
    let registry = Registry::new();
    let pool = Pool::builder()
        .primary(&url(&proxies[0]))
        .replicas([url(&proxies[1]).as_str()])
        .max_size(8)
        .pipelining(true)
        .query_timeout(Duration::from_secs(5))
        .wait_timeout(Duration::from_secs(10))
        .registry(&registry)
        .pool_name("soak")
        .build()?;
    let sample_every = (length / 120).clamp(Duration::from_secs(1), Duration::from_secs(10));
    println!("## pgpipe-bench --soak {}", length.as_secs());
    println!();
    println!(
        "A primary and a streaming standby of the benchmark's own, a proxy in front of each; \
         one pgpipe pool (pipelining, 8 per lane); {} tasks of mixed work and a listener; a \
         fault every {} s; a sample every {:.1} s.",
        32,
        plan.fault_every.as_secs(),
        sample_every.as_secs_f64()
    );
    println!();

    let started = Instant::now();
    let mix = Mix::start(&pool, table, "pgpipe_soak_events");
    let faults = tokio::spawn(inject_faults(
        Arc::clone(&set),
        Arc::clone(&proxies),
        plan.fault_every,
        length.saturating_sub(Duration::from_secs(30)),
    ));
    let mut samples = Vec::new();
    let mut longest_stall = Duration::ZERO;
    let mut after_faults = None;
    while started.elapsed() < length {
        tokio::time::sleep(sample_every).await;
        samples.push(sample::take(started.elapsed(), &pool, &registry));
        longest_stall = longest_stall.max(mix.tally.longest_stall());
        if faults.is_finished() && after_faults.is_none() {
            after_faults = Some(right_per_kind(&mix.tally));
        }
    }
    let fault_log = faults.await??;
    let before_end = after_faults.unwrap_or_default();
    let tally = mix.stop().await;
    let recovered: Vec<bool> = right_per_kind(&tally)
        .iter()
        .zip(before_end.iter().chain(std::iter::repeat(&0)))
        .map(|(end, then)| end > then)
        .collect();

    let admin = connect(&set.primary.url()).await?;
    let sum: i64 = admin
        .query_one(&format!("SELECT sum(balance)::int8 FROM {table}"), &[])
        .await?
        .get(0);
    pool.close_and_wait(Duration::from_secs(5)).await;

    println!("Faults: {}", fault_log.join("; "));
    println!();
    println!("| work | right | wrong | failed | succeeded after the last fault |");
    println!("|---|---|---|---|---|");
    let mut wrong = 0;
    for (i, kind) in KINDS.iter().enumerate() {
        let counts = &tally.kinds[i];
        let w = counts.wrong.load(Ordering::Relaxed);
        wrong += w;
        println!(
            "| {kind} | {} | {w} | {} | {} |",
            counts.right.load(Ordering::Relaxed),
            counts.failed.load(Ordering::Relaxed),
            if recovered[i] { "yes" } else { "**no**" }
        );
    }
    println!();
    println!(
        "Notifications received: {} ({} gaps reported). Longest a task went without \
         finishing a call: {:.1} s. Sum of balances: {sum} (of {}).",
        tally.notifications.load(Ordering::Relaxed),
        tally.gaps.load(Ordering::Relaxed),
        longest_stall.as_secs_f64(),
        ACCOUNTS * 1000
    );
    println!();
    let judged = sample::judge(&samples);
    println!(
        "| series | first | max | last | slope (2nd half) per hour | last quarter's median − second's | flat |"
    );
    println!("|---|---|---|---|---|---|---|");
    for j in &judged {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:+.1} | {:+.1} | {} |",
            j.name,
            j.first,
            j.max,
            j.last,
            j.slope_per_hour,
            j.growth,
            match (j.limit, j.flat) {
                (true, _) => "(a limit)",
                (false, true) => "yes",
                (false, false) => "**no**",
            }
        );
    }
    println!();
    let passed = wrong == 0
        && longest_stall <= HUNG
        && sum == ACCOUNTS * 1000
        && recovered.iter().all(|&r| r)
        && judged.iter().all(|j| j.flat || j.limit);
    println!("Soak: {}", if passed { "passed" } else { "**failed**" });
    Ok(passed)
}

/// Right answers so far, per kind.
fn right_per_kind(tally: &mix::Tally) -> Vec<u64> {
    tally
        .kinds
        .iter()
        .map(|c| c.right.load(Ordering::Relaxed))
        .collect()
}

/// Injects [`FAULTS`] in turn every `every` until `until` has passed;
/// returns what was done, and when.
async fn inject_faults(
    set: Arc<ReplicaSet>,
    proxies: Arc<[Proxy; 2]>,
    every: Duration,
    until: Duration,
) -> Result<Vec<String>, BoxError> {
    let started = Instant::now();
    let mut log = Vec::new();
    for n in 0.. {
        tokio::time::sleep(every).await;
        if started.elapsed() >= until {
            break;
        }
        let fault = FAULTS[n % FAULTS.len()];
        let at = started.elapsed().as_secs();
        let what = match fault {
            "terminate" => {
                let mut ended = 0;
                for cluster in std::iter::once(&set.primary).chain(&set.standbys) {
                    let admin = connect(&cluster.url()).await?;
                    let row = admin
                        .query_one(
                            "SELECT count(pg_terminate_backend(pid))::int8 FROM pg_stat_activity \
                             WHERE application_name = 'pgpipe-soak' AND pid <> pg_backend_pid()",
                            &[],
                        )
                        .await?;
                    ended += row.get::<_, i64>(0);
                }
                format!("{ended} backends terminated")
            }
            "stall" => {
                proxies[0].stall();
                tokio::time::sleep(Duration::from_secs(3)).await;
                proxies[0].resume();
                "the primary's proxy stalled 3 s".to_string()
            }
            "cut" => {
                proxies[0].cut();
                "the primary's connections cut".to_string()
            }
            "restart" => {
                let set = Arc::clone(&set);
                tokio::task::spawn_blocking(move || set.primary.restart()).await??;
                "the primary restarted".to_string()
            }
            _ => {
                let set_stop = Arc::clone(&set);
                tokio::task::spawn_blocking(move || set_stop.standbys[0].stop("immediate"))
                    .await??;
                tokio::time::sleep(Duration::from_secs(15)).await;
                let set = Arc::clone(&set);
                tokio::task::spawn_blocking(move || set.standbys[0].start_server()).await??;
                "the standby lost for 15 s".to_string()
            }
        };
        log.push(format!("{at} s: {what}"));
    }
    Ok(log)
}
