//! A network that stalls, a backend that stops, a connection cut in the
//! middle of a result: every query ends, none hangs, the pool heals.

use std::time::{Duration, Instant};

use pgpipe::ErrorKind;
use pgpipe_test_support::{admin, backend_pids};
use prometheus::Registry;

use crate::support::{Scrape, app, builder, builder_via, proxy, settle, spawn_echoes};

fn closed(scrape: &Scrape, reason: &str) -> f64 {
    scrape.value("pgpipe_connections_closed_total", &[("reason", reason)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_network_ends_in_timeouts_and_a_killed_connection() {
    let proxy = proxy(Duration::ZERO);
    let registry = Registry::new();
    let pool = builder_via(&proxy, &app("stall"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .query_timeout(Duration::from_millis(400))
        .stall_timeout(Duration::from_secs(1))
        .registry(&registry)
        .build()
        .unwrap();
    pool.query_one("SELECT 1", &[]).await.unwrap();
    proxy.stall();
    let start = Instant::now();
    let stuck = spawn_echoes(&pool, 0..20i64);
    for query in stuck {
        let e = tokio::time::timeout(Duration::from_secs(5), query)
            .await
            .expect("no query hangs")
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::QueryTimeout, "{e}");
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "per-query deadlines fired"
    );
    // The watchdog kills the connection that owes answers and hears nothing.
    let killed = Instant::now();
    while closed(&Scrape::of(&registry), "stalled") < 1.0 {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the watchdog fired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.resume();
    // A new connection serves the next queries; the stalled one is gone.
    let row = pool.query_one("SELECT 41 + 1", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    let status = pool.status();
    assert_eq!((status.shared, status.size), (1, 1), "{status:?}");
}

/// Sends SIGCONT on drop, so a failing test never leaves a stopped backend.
struct Stopped(i32);

impl Stopped {
    fn stop(pid: i32) -> Stopped {
        signal("-STOP", pid);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal("-CONT", self.0);
    }
}

fn signal(signal: &str, pid: i32) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {signal} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_backend_is_detected_and_abandoned() {
    stop_the_backend_under("sigstop", "SELECT $1::float8 * 0, $2::int8", 0.0).await;
}

/// A statement the pool learned is slow (30 ms each run, past the 5 ms
/// threshold) runs on the shared path under the head-of-line budget
/// (100 ms): the server answers it by then, so silence past the budget and
/// `stall_timeout` is a stall, not a long statement. The watchdog once
/// left a connection running a learned-slow statement alone, a guess: on a
/// stopped backend its queries hung (without `query_timeout`, for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_backend_running_a_learned_slow_statement_is_detected() {
    stop_the_backend_under("sigstop_slow", "SELECT pg_sleep($1), $2::int8", 0.03).await;
}

/// Runs `sql` (its parameters: `sleep`, an id) a few times on a pool of one
/// pipelined connection, stops its backend, and sends it ten more times:
/// each fails with `ConnectionLost` within `stall_timeout` and the budget,
/// the connection is counted as stalled, and the next query runs on
/// another backend.
async fn stop_the_backend_under(name: &str, sql: &str, sleep: f64) {
    let app = app(name);
    let registry = Registry::new();
    let pool = builder(&app)
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .stall_timeout(Duration::from_millis(800))
        .registry(&registry)
        .build()
        .unwrap();
    // Run beforehand, so that the queries below are sent, not just their
    // statement (a query whose statement never came back was never sent,
    // and the pool would rightly run it on another connection); and
    // learned, against the fastest statement's time.
    pool.query_one("SELECT $1::int8", &[&0i64]).await.unwrap();
    for i in 0..3i64 {
        pool.query_one(sql, &[&sleep, &i]).await.unwrap();
    }
    let admin = admin().await;
    let pid = backend_pids(&admin, &app).await[0];
    let stopped = Stopped::stop(pid);
    let start = Instant::now();
    let stuck: Vec<_> = (0..10i64)
        .map(|i| {
            let (pool, sql) = (pool.clone(), sql.to_owned());
            tokio::spawn(async move { pool.query_one(&sql, &[&sleep, &i]).await })
        })
        .collect();
    for query in stuck {
        let e = tokio::time::timeout(Duration::from_secs(5), query)
            .await
            .expect("no query hangs")
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionLost, "{e}");
    }
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(3), "failed after {waited:?}");
    assert_eq!(closed(&Scrape::of(&registry), "stalled"), 1.0);
    drop(stopped);
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let row = pool.query_one("SELECT 1 + 1", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 2);
    let pids = backend_pids(&admin, &app).await;
    assert!(
        !pids.contains(&pid),
        "the stopped backend is never used again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_result_fails_every_query_on_it() {
    for reset in [true, false] {
        let proxy = proxy(Duration::ZERO);
        let registry = Registry::new();
        let pool = builder_via(&proxy, &app("cut"))
            .max_size(1)
            .max_exclusive(1)
            .pipelining(true)
            .registry(&registry)
            .build()
            .unwrap();
        pool.query_one("SELECT 1", &[]).await.unwrap();
        let before = Scrape::of(&registry);
        if reset {
            // 100 kB into the answer below: inside a DataRow, mid-result.
            proxy.reset_after(Some(100_000));
        }
        // A 20 MB result, with small queries pipelined behind it.
        let big = {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.query(
                    "SELECT repeat('x', 1000) FROM generate_series(1, 20000)",
                    &[],
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(2)).await;
        let small = spawn_echoes(&pool, 0..20i64);
        if !reset {
            proxy.cut();
        }
        let big = tokio::time::timeout(Duration::from_secs(5), big)
            .await
            .expect("no hang")
            .unwrap();
        match big {
            // Cut before the query went out at all: it may have been re-run.
            Ok(rows) => assert_eq!(rows.len(), 20000, "never a partial result"),
            Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionLost, "{e}"),
        }
        for query in small {
            let result = tokio::time::timeout(Duration::from_secs(5), query)
                .await
                .expect("no hang")
                .unwrap();
            if let Err(e) = result {
                assert_eq!(e.kind(), ErrorKind::ConnectionLost, "{e}");
            }
        }
        settle(&pool).await;
        let after = Scrape::of(&registry);
        let delta = |name: &str| after.value(name, &[]) - before.value(name, &[]);
        assert!(delta("pgpipe_pipeline_inflight_failed_total") >= 1.0);
        // And the pool heals.
        let row = pool.query_one("SELECT 6 * 7", &[]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 42);
    }
}
