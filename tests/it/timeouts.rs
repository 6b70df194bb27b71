//! Per-query deadlines: the late query fails alone, and no cancel request
//! ever hits another caller's query.

use std::time::{Duration, Instant};

use pgpipe::ErrorKind;
use pgpipe_test_support::{admin, backend_pids};
use tokio_postgres::error::SqlState;

use crate::support::{Rng, app, builder, spawn_echoes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_query_alone_on_its_connection_is_cancelled_on_the_server() {
    let app = app("late_alone");
    let pool = builder(&app)
        .max_size(2)
        .max_exclusive(1)
        .pipelining(true)
        .query_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    pool.query_one("SELECT 1", &[]).await.unwrap();
    let admin = admin().await;
    let pid = backend_pids(&admin, &app).await[0];
    let start = Instant::now();
    let e = pool.query("SELECT pg_sleep(5)", &[]).await.unwrap_err();
    // Stopped at the head-of-line budget, run again alone with what was
    // left of query_timeout as its statement_timeout: the server stopped
    // it, so it did not run.
    assert_eq!(e.kind(), ErrorKind::QueryTimeout, "{e}");
    assert!(e.is_timeout() && !e.may_have_run(), "{e}");
    // At the 300 ms deadline, not after the 5 s sleep (generous: load can
    // slow the answer, not turn it into the sleep's).
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    // The server stops sleeping: the cancel reached the backend.
    let mut idle = false;
    for _ in 0..50 {
        let state: Option<String> = admin
            .query_one("SELECT state FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .await
            .unwrap()
            .get(0);
        if state.as_deref() == Some("idle") {
            idle = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(idle, "the backend stopped running the late query");
    // Its connection takes no new work; the pool goes on with another.
    let row = pool.query_one("SELECT 2", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cancel_ever_hits_another_callers_query() {
    // A late query with fast queries pipelined right behind it, many times,
    // its length straddling the deadline: were a cancel sent while they are
    // in flight, one of them would sooner or later be the one cancelled.
    let pool = builder(&app("no_cross_cancel"))
        .max_size(2)
        .max_exclusive(1)
        .pipelining(true)
        .query_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let mut rng = Rng::new(7);
    let (mut timeouts, mut answered) = (0, 0);
    for round in 0..30 {
        let sleep = 0.08 + rng.below(40) as f64 / 1000.0; // 80 to 120 ms
        let slow = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.query("SELECT pg_sleep($1)", &[&sleep]).await })
        };
        tokio::task::yield_now().await;
        let fast: Vec<_> = (0..5i64)
            .map(|i| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    pool.query_one("SELECT $1::int8", &[&(round * 10 + i)])
                        .await
                })
            })
            .collect();
        let mut results = vec![slow.await.unwrap().map(drop)];
        for query in fast {
            results.push(query.await.unwrap().map(drop));
        }
        for result in results {
            match result {
                Ok(()) => answered += 1,
                Err(e) => {
                    assert_ne!(
                        e.code(),
                        Some(&SqlState::QUERY_CANCELED),
                        "a cancel hit {e}"
                    );
                    assert_eq!(e.kind(), ErrorKind::QueryTimeout, "{e}");
                    timeouts += 1;
                }
            }
        }
    }
    eprintln!("{timeouts} timed out, {answered} answered, none cancelled by mistake");
    assert!(timeouts > 0 && answered > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_fails_only_its_query() {
    let pool = builder(&app("stmt_timeout"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .statement_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let slow = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.query("SELECT pg_sleep(2)", &[]).await })
    };
    tokio::task::yield_now().await;
    let neighbours = spawn_echoes(&pool, 0..10i64);
    let e = slow.await.unwrap().unwrap_err();
    assert_eq!(e.code(), Some(&SqlState::QUERY_CANCELED), "{e}");
    assert_eq!(e.kind(), ErrorKind::Db);
    for (i, query) in neighbours.into_iter().enumerate() {
        let row = query.await.unwrap().unwrap();
        assert_eq!(row.get::<_, i64>(0), i as i64);
    }
    // Set at connect time, it is the session's default, not a `SET` (a
    // shared connection shows the head-of-line budget instead, 100 ms,
    // shorter: see the guide).
    let conn = pool.get().await.unwrap();
    let row = conn.query_one("SHOW statement_timeout", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "200ms");
}
