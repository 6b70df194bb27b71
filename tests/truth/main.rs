//! The metrics tell the truth: each figure is held against ground truth
//! measured outside the pool (the latency proxy's own counts, wall-clock
//! time), never against another of the pool's figures.
//!
//! Timing-sensitive, so these tests run one at a time, in a test binary of
//! their own (cargo runs test binaries one after another).

#[allow(dead_code)]
#[path = "../it/support.rs"]
mod support;

use std::time::{Duration, Instant};

use prometheus::Registry;
use tokio::sync::Mutex;

use support::{Scrape, app, builder_via, echo_load, proxy, settle};

/// One accuracy test at a time.
static ALONE: Mutex<()> = Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rtt_estimate_matches_the_injected_round_trip() {
    let _alone = ALONE.lock().await;
    // 5 ms: large enough that the server's own time for `SELECT $1` and the
    // host's scheduling noise (about 0.3 to 0.5 ms here) stay well inside
    // the 20% allowed.
    let proxy = proxy(Duration::from_micros(2500));
    let registry = Registry::new();
    let pool = builder_via(&proxy, &app("rtt"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    // Solitary queries: one at a time.
    for i in 0..100i64 {
        pool.query_one("SELECT $1::int8", &[&i]).await.unwrap();
    }
    let estimate = Scrape::of(&registry).value("pgpipe_pipeline_rtt_seconds", &[]);
    let injected = 2.0 * proxy.delay().as_secs_f64();
    eprintln!(
        "rtt estimate {:.3} ms, injected {:.3} ms",
        estimate * 1e3,
        injected * 1e3
    );
    assert!(
        (estimate - injected).abs() <= 0.2 * injected,
        "estimate {estimate} vs injected {injected}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_sizes_and_round_trips_saved_agree_with_the_proxy() {
    let _alone = ALONE.lock().await;
    let proxy = proxy(Duration::from_micros(500));
    let registry = Registry::new();
    let pool = builder_via(&proxy, &app("batches"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    pool.query_one("SELECT $1::int8", &[&0i64]).await.unwrap();
    settle(&pool).await;
    let (pool_before, proxy_before) = (Scrape::of(&registry), proxy.stats());

    echo_load(&pool, 16, 300).await;
    settle(&pool).await;

    let (scrape, stats) = (Scrape::of(&registry), proxy.stats());
    let delta = |name: &str| scrape.value(name, &[]) - pool_before.value(name, &[]);
    let syncs = delta("pgpipe_pipeline_batch_size");
    let writes = (scrape.histogram_count("pgpipe_pipeline_batch_size")
        - pool_before.histogram_count("pgpipe_pipeline_batch_size")) as f64;
    let saved = delta("pgpipe_pipeline_round_trips_saved_total");
    let proxy_syncs = (stats.upstream.messages - proxy_before.upstream.messages) as f64;
    let proxy_chunks =
        (stats.upstream.chunks_with_messages - proxy_before.upstream.chunks_with_messages) as f64;
    let proxy_saved = proxy_syncs - (stats.busy_periods - proxy_before.busy_periods) as f64;
    eprintln!(
        "pool: {syncs} syncs in {writes} writes, {saved} saved; \
         proxy: {proxy_syncs} syncs in {proxy_chunks} chunks, {proxy_saved} saved"
    );
    let within = |a: f64, b: f64, share: f64| (a - b).abs() <= share * b.max(1.0);
    assert_eq!(syncs, proxy_syncs, "every Sync counted once");
    assert!(within(saved, proxy_saved, 0.05), "round trips saved");
    // The proxy sees a byte stream: two writes that reach it within a few
    // microseconds of each other arrive in one read, so its chunks are
    // fewer than the pool's writes: 3 to 9% here on a quiet machine, 11%
    // once under a clean CI build's load (how often writes meet in the
    // proxy's socket depends on scheduling). Its batch size is an upper
    // bound, and close; the exact check is the Sync count above.
    let (ours, theirs) = (syncs / writes, proxy_syncs / proxy_chunks);
    assert!(
        ours <= theirs * 1.01 && within(ours, theirs, 0.20),
        "batch size {ours} vs {theirs}"
    );
}

/// Up to three tries of a comparison with wall-clock time: a moment of
/// load from elsewhere on a 2-core machine (a build, another test's server
/// work) stretches one run's time without any fault of the code; a fault
/// fails all three.
async fn within_three_tries<F, Fut>(mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut failures = Vec::new();
    for _ in 0..3 {
        match attempt().await {
            Ok(()) => return,
            Err(why) => failures.push(why),
        }
        // Let what else runs (the server's own work after a suite, a
        // build) pass before the next try.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    }
    panic!("three tries failed: {failures:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_saved_agrees_with_the_measured_difference() {
    let _alone = ALONE.lock().await;
    within_three_tries(latency_saved_once).await;
}

async fn latency_saved_once() -> Result<(), String> {
    let proxy = proxy(Duration::from_micros(500));
    let (tasks, per_task) = (16, 40);
    let mut elapsed = Vec::new();
    let mut estimate = 0.0;
    for pipelining in [false, true] {
        let registry = Registry::new();
        let pool = builder_via(&proxy, &app("saved"))
            .max_size(1)
            .max_exclusive(1)
            .pipelining(pipelining)
            .registry(&registry)
            .build()
            .unwrap();
        // Warm up: a connection, a prepared statement and an RTT sample.
        for i in 0..20i64 {
            pool.query_one("SELECT $1::int8", &[&i]).await.unwrap();
        }
        let before =
            Scrape::of(&registry).value("pgpipe_pipeline_latency_saved_seconds_total", &[]);
        let start = Instant::now();
        echo_load(&pool, tasks, per_task).await;
        elapsed.push(start.elapsed().as_secs_f64());
        let after = Scrape::of(&registry).value("pgpipe_pipeline_latency_saved_seconds_total", &[]);
        if pipelining {
            estimate = after - before;
        }
    }
    let measured = elapsed[0] - elapsed[1];
    eprintln!(
        "off {:.3} s, on {:.3} s: saved {measured:.3} s measured, {estimate:.3} s estimated",
        elapsed[0], elapsed[1]
    );
    if (estimate - measured).abs() <= 0.25 * measured {
        Ok(())
    } else {
        Err(format!("estimated {estimate} vs measured {measured}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_is_calibrated() {
    let _alone = ALONE.lock().await;
    within_three_tries(calibrated_once).await;
}

async fn calibrated_once() -> Result<(), String> {
    // At 500 µs each way, one `SELECT 1` on a plain client takes at least
    // the 1 ms round trip, and not twice as long.
    let proxy = proxy(Duration::from_micros(500));
    let pool = builder_via(&proxy, &app("calibrate"))
        .max_size(1)
        .max_exclusive(1)
        .build()
        .unwrap();
    let conn = pool.get().await.unwrap();
    let statement = conn.prepare("SELECT 1").await.unwrap();
    let mut samples = Vec::new();
    for _ in 0..200 {
        let start = Instant::now();
        conn.query_one(&statement, &[]).await.unwrap();
        samples.push(start.elapsed());
    }
    samples.sort();
    let p50 = samples[samples.len() / 2];
    eprintln!(
        "SELECT 1 through the proxy: p50 {p50:?}, min {:?}",
        samples[0]
    );
    // Never faster than the delay, in any try.
    assert!(
        samples[0] >= Duration::from_millis(1),
        "min {:?}",
        samples[0]
    );
    if p50 >= Duration::from_millis(1) && p50 < Duration::from_millis(2) {
        Ok(())
    } else {
        Err(format!("p50 {p50:?}"))
    }
}
