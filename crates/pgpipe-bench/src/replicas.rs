//! `--replicas`: read throughput through `pool.read()` with 0, 1 and 2
//! streaming standbys, and what read-your-writes costs per write.
//!
//! The benchmark starts its own primary and two standbys (`pg_basebackup
//! -R`, from the test support) and puts a latency proxy in front of each,
//! so the injected round trip lies between the pool and every server. All
//! three servers share this machine's cores: at loopback, standbys add no
//! CPU, only at a round trip (where the work is bound by round trips, not
//! CPU) do they show what they add.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgpipe::Pool;
use pgpipe_proxy::Proxy;
use pgpipe_test_support::ReplicaSet;

use crate::plan::Plan;

/// What one cell measured.
struct Reads {
    per_second: f64,
    errors: u64,
}

/// Runs the `--replicas` plan and prints its tables.
pub(crate) async fn run(plan: &Plan) -> Result<bool, Box<dyn std::error::Error>> {
    let set = ReplicaSet::start(2)?;
    let servers = std::iter::once(&set.primary).chain(&set.standbys);
    let proxies: Vec<Proxy> = servers
        .map(|server| Proxy::builder(server.addr()).start())
        .collect::<Result<_, _>>()?;
    let table = format!("pgpipe_bench_ryw_{}", std::process::id());
    let admin = pgpipe_test_support::connect(&set.primary.url()).await?;
    admin
        .batch_execute(&format!("CREATE TABLE {table} (id int8 PRIMARY KEY)"))
        .await?;
    let tasks = plan.tasks.iter().copied().max().unwrap_or(512);
    println!("## pgpipe-bench --replicas");
    println!();
    println!(
        "A primary and two streaming standbys on this machine, a latency proxy in front of \
         each; pgpipe on (4 per lane), {tasks} tasks reading `SELECT $1::int8` through \
         `pool.read()`, {} s per cell, median of {} round(s). Standbys share the primary's \
         cores here.",
        plan.duration.as_secs_f64(),
        plan.rounds
    );
    println!();
    println!("| RTT | standbys | reads/s | × no standby | errors |");
    println!("|---|---|---|---|---|");
    let mut clean = true;
    for &delay in &plan.delays_us {
        for proxy in &proxies {
            proxy.set_delay(Duration::from_micros(delay));
        }
        let mut base = None;
        for standbys in 0..=2usize {
            let mut rounds = Vec::new();
            for _ in 0..plan.rounds {
                let pool = pool_of(&proxies, standbys)?;
                rounds.push(reads(&pool, tasks, plan.warmup, plan.duration).await);
                pool.close();
            }
            rounds.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
            let median = &rounds[rounds.len() / 2];
            let errors: u64 = rounds.iter().map(|r| r.errors).sum();
            clean &= errors == 0;
            let base = *base.get_or_insert(median.per_second);
            println!(
                "| {} | {standbys} | {:.0} | {:.2}× | {errors} |",
                rtt(delay),
                median.per_second,
                median.per_second / base
            );
        }
    }
    println!();
    println!("Read-your-writes: one task, `INSERT` per call, median latency of 300 calls.");
    println!();
    println!("| RTT | `execute` | `execute_tracked` | overhead per write |");
    println!("|---|---|---|---|");
    let pool = pool_of(&proxies, 2)?;
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let mut id = 0i64;
    for &delay in &plan.delays_us {
        for proxy in &proxies {
            proxy.set_delay(Duration::from_micros(delay));
        }
        let (mut plain, mut tracked) = (Vec::new(), Vec::new());
        for _ in 0..300 {
            id += 1;
            let started = Instant::now();
            pool.execute(&insert, &[&id]).await?;
            plain.push(started.elapsed());
            id += 1;
            let started = Instant::now();
            pool.execute_tracked(&insert, &[&id]).await?;
            tracked.push(started.elapsed());
        }
        let (plain, tracked) = (median(plain), median(tracked));
        println!(
            "| {} | {:.3} ms | {:.3} ms | {:+.3} ms |",
            rtt(delay),
            ms(plain),
            ms(tracked),
            ms(tracked) - ms(plain)
        );
    }
    admin.batch_execute(&format!("DROP TABLE {table}")).await?;
    Ok(clean)
}

/// The URL of a server through its proxy.
fn url(proxy: &Proxy) -> String {
    format!("postgres://postgres@{}/postgres", proxy.addr())
}

/// pgpipe on (4 per lane) over the primary (the first proxy) and
/// `standbys` standbys.
fn pool_of(proxies: &[Proxy], standbys: usize) -> Result<Pool, pgpipe::Error> {
    let replicas: Vec<String> = proxies[1..=standbys].iter().map(url).collect();
    Pool::builder()
        .primary(&url(&proxies[0]))
        .replicas(replicas.iter().map(String::as_str))
        .max_size(4)
        .pipelining(true)
        .build()
}

/// Closed-loop reads from `tasks` tasks: warm-up, then the measured window.
async fn reads(pool: &Pool, tasks: u64, warmup: Duration, duration: Duration) -> Reads {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (pool, done, errors, stop) = (
            pool.clone(),
            Arc::clone(&done),
            Arc::clone(&errors),
            Arc::clone(&stop),
        );
        handles.push(tokio::spawn(async move {
            let mut n = i64::try_from(task).unwrap_or(0) << 32;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                match pool.read().query_one("SELECT $1::int8", &[&n]).await {
                    Ok(row) if row.get::<_, i64>(0) == n => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(warmup).await;
    let (start, before) = (Instant::now(), done.load(Ordering::Relaxed));
    tokio::time::sleep(duration).await;
    let counted = done.load(Ordering::Relaxed) - before;
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        let _ = handle.await;
    }
    Reads {
        per_second: counted as f64 / elapsed.as_secs_f64(),
        errors: errors.load(Ordering::Relaxed),
    }
}

fn rtt(one_way_us: u64) -> String {
    match one_way_us {
        0 => "0 (proxy only)".into(),
        us => format!("{} ms", us as f64 * 2.0 / 1000.0),
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
