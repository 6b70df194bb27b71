//! Connections age out, idle ones close, and `close()` ends a pool
//! gracefully: no query fails because of any of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pgpipe::ErrorKind;
use pgpipe_test_support::{admin, backend_pids};
use prometheus::Registry;

use crate::support::{Scrape, app, builder, spawn_echoes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_lifetime_drains_connections_without_failing_a_query() {
    let app = app("lifetime");
    let registry = Registry::new();
    let pool = builder(&app)
        .max_size(2)
        .pipelining(true)
        .max_lifetime(Duration::from_millis(700))
        .registry(&registry)
        .build()
        .unwrap();
    let admin = admin().await;
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..16i64)
        .map(|task| {
            let (pool, stop) = (pool.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let v = task * 1_000_000 + i;
                    let row = pool
                        .query_one("SELECT $1::int8, pg_sleep(0.001)::text", &[&v])
                        .await
                        .expect("no query fails because a connection aged out");
                    assert_eq!(row.get::<_, i64>(0), v);
                    i += 1;
                }
            })
        })
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        seen.extend(backend_pids(&admin, &app).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let retired = Scrape::of(&registry).value(
        "pgpipe_connections_closed_total",
        &[("reason", "max_lifetime")],
    );
    eprintln!(
        "{} backends over 2.5 s, {retired} closed at max_lifetime",
        seen.len()
    );
    assert!(retired >= 1.0, "old connections were closed");
    assert!(seen.len() >= 3, "and replaced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_after_idle_timeout() {
    let registry = Registry::new();
    let pool = builder(&app("idle"))
        .max_size(3)
        .pipelining(true)
        .idle_timeout(Duration::from_millis(500))
        .registry(&registry)
        .build()
        .unwrap();
    let queries = spawn_echoes(&pool, 0..100i64);
    for query in queries {
        query.await.unwrap().unwrap();
    }
    let conn = pool.get().await.unwrap();
    drop(conn);
    assert!(pool.status().size >= 1);
    // Shared connections go idle after 1 s, then close after 0.5 s more.
    let start = Instant::now();
    while pool.status().size > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            pool.status()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let idle =
        Scrape::of(&registry).value("pgpipe_connections_closed_total", &[("reason", "idle")]);
    assert!(idle >= 1.0);
    // And the pool opens new ones on demand.
    pool.query_one("SELECT 1", &[]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_refuses_new_work_at_once_and_lets_running_queries_finish() {
    let app = app("graceful");
    let pool = builder(&app).max_size(2).pipelining(true).build().unwrap();
    let running: Vec<_> = (0..10i64)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.query_one("SELECT $1::int8, pg_sleep(0.3)::text", &[&i])
                    .await
            })
        })
        .collect();
    // Until all ten are running (a lane's first queries wait for its
    // catalog read first; a busy machine takes longer to send them).
    let admitted = Instant::now();
    while pool.status().in_flight < 10 {
        assert!(
            admitted.elapsed() < Duration::from_secs(10),
            "{:?}",
            pool.status()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    pool.close();
    let start = Instant::now();
    assert_eq!(
        pool.query("SELECT 1", &[]).await.unwrap_err().kind(),
        ErrorKind::Closed
    );
    assert_eq!(pool.get().await.unwrap_err().kind(), ErrorKind::Closed);
    // At once, not after the 20 s wait_timeout (a bound load cannot reach).
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "refused at once, not after waiting: {:?}",
        start.elapsed()
    );
    for (i, query) in running.into_iter().enumerate() {
        let row = tokio::time::timeout(Duration::from_secs(10), query)
            .await
            .expect("running queries finish")
            .unwrap()
            .expect("and succeed");
        assert_eq!(row.get::<_, i64>(0), i as i64);
    }
    // Then the connections close.
    let admin = admin().await;
    let start = Instant::now();
    while !backend_pids(&admin, &app).await.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "connections closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_idle_connections_open_at_once_and_stay() {
    let app = crate::support::app("min_idle");
    let pool = crate::support::builder(&app)
        .max_size(4)
        .min_idle(2)
        .idle_timeout(std::time::Duration::from_millis(200))
        .build()
        .unwrap();
    // Not one query: built inside a runtime, the pool opens them itself.
    let admin = pgpipe_test_support::admin().await;
    let mut opened = 0;
    for _ in 0..100 {
        opened = pgpipe_test_support::backend_pids(&admin, &app).await.len();
        if opened == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(opened, 2, "min_idle connections opened without a query");
    // Idle far past idle_timeout: still two, no more, no fewer.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    assert_eq!(pool.status().size, 2, "{:?}", pool.status());
    assert_eq!(
        pgpipe_test_support::backend_pids(&admin, &app).await.len(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_and_wait_lets_running_work_finish_and_closes_every_connection() {
    let app = crate::support::app("close_wait");
    let pool = crate::support::builder(&app)
        .max_size(2)
        .pipelining(true)
        .build()
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    let running = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.query("SELECT pg_sleep(0.3)", &[]).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(pool.close_and_wait(std::time::Duration::from_secs(5)).await);
    running.await.unwrap().expect("running work finishes");
    assert_eq!(pool.status().size, 0);
    let admin = pgpipe_test_support::admin().await;
    let mut left = usize::MAX;
    for _ in 0..50 {
        left = pgpipe_test_support::backend_pids(&admin, &app).await.len();
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(left, 0, "a backend outlived close_and_wait");
    assert_eq!(
        pool.query("SELECT 1", &[]).await.unwrap_err().kind(),
        pgpipe::ErrorKind::Closed
    );
    // A deadline that cannot be met says so.
    let busy = crate::support::builder(&crate::support::app("close_busy"))
        .build()
        .unwrap();
    let conn = busy.get().await.unwrap();
    assert!(
        !busy
            .close_and_wait(std::time::Duration::from_millis(100))
            .await
    );
    drop(conn);
}
