//! Far more work than the pool can take: it refuses or waits within its
//! bounds, memory stays bounded, and it recovers.

use std::time::{Duration, Instant};

use pgpipe::ErrorKind;
use prometheus::Registry;

use crate::support::{Scrape, app, builder, settle};

/// This process's resident set size, from /proc.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_waiting_tasks_are_bounded_and_the_pool_recovers() {
    let registry = Registry::new();
    let pool = builder(&app("overload"))
        .max_size(2)
        .max_exclusive(1)
        .pipelining(true)
        .max_pipeline_depth(16)
        .queue_capacity(2000)
        .wait_timeout(Duration::from_millis(500))
        .registry(&registry)
        .build()
        .unwrap();
    pool.query_one("SELECT pg_sleep(0)", &[]).await.unwrap();
    let rss_before = rss_bytes();
    let start = Instant::now();
    let tasks: Vec<_> = (0..10_000)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let result = pool.query("SELECT pg_sleep(0.002)", &[]).await;
                (result.map(drop), started.elapsed())
            })
        })
        .collect();
    let (mut ok, mut full, mut timeout, mut longest) = (0, 0, 0, Duration::ZERO);
    for task in tasks {
        let (result, took) = task.await.unwrap();
        match result {
            Ok(()) => ok += 1,
            Err(e) if e.kind() == ErrorKind::QueueFull => full += 1,
            Err(e) if e.kind() == ErrorKind::Timeout => timeout += 1,
            Err(e) => panic!("unexpected {e}"),
        }
        longest = longest.max(took);
    }
    let rss_peak = rss_bytes();
    eprintln!(
        "10000 tasks in {:?}: {ok} answered, {full} refused (queue full), {timeout} timed out; \
         longest {longest:?}; RSS {} -> {} MiB",
        start.elapsed(),
        rss_before >> 20,
        rss_peak >> 20
    );
    assert_eq!(ok + full + timeout, 10_000);
    assert!(full > 0, "the queue's bound was reached");
    assert!(ok > 0);
    assert!(
        longest < Duration::from_secs(3),
        "waits end within their deadline"
    );
    assert!(rss_peak < rss_before + (256 << 20), "memory stays bounded");
    let scrape = Scrape::of(&registry);
    let rejected =
        |reason: &str| scrape.value("pgpipe_pipeline_rejected_total", &[("reason", reason)]) as u64;
    assert_eq!(rejected("queue_full"), full);
    assert_eq!(rejected("timeout"), timeout);
    // Full recovery.
    settle(&pool).await;
    for i in 0..100i64 {
        let row = pool.query_one("SELECT $1::int8", &[&i]).await.unwrap();
        assert_eq!(row.get::<_, i64>(0), i);
    }
    let status = pool.status();
    assert_eq!((status.waiting, status.in_flight), (0, 0), "{status:?}");
}
