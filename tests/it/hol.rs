//! Head-of-line awareness: fast queries do not queue behind slow ones on a
//! shared connection, and slow ones still run side by side.

use std::time::{Duration, Instant};

use pgpipe::Pool;

use crate::support::{app, builder, settle};

const FAST: &str = "SELECT $1::int8";

fn pool(test: &str, threshold: Option<Duration>) -> Pool {
    builder(&app(test))
        .max_size(4)
        .pipelining(true)
        .slow_query_threshold(threshold)
        .build()
        .unwrap()
}

/// The slowest of `n` fast queries run one after another while `slow` runs.
async fn fast_while(pool: &Pool, slow: impl Future<Output = ()>, n: i64) -> Duration {
    let fast = async {
        // Let the slow query reach the server first.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let mut worst = Duration::ZERO;
        for i in 0..n {
            let start = Instant::now();
            let row = pool.query_one(FAST, &[&i]).await.unwrap();
            assert_eq!(row.get::<_, i64>(0), i);
            worst = worst.max(start.elapsed());
        }
        worst
    };
    let ((), worst) = tokio::join!(slow, fast);
    worst
}

async fn warm(pool: &Pool) {
    for i in 0..50i64 {
        pool.query_one(FAST, &[&i]).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learned_slow_statement_does_not_hold_up_fast_queries() {
    const SLOW: &str = "SELECT pg_sleep(0.3)";
    let pool = pool("hol_learned", Some(Duration::from_millis(5)));
    warm(&pool).await;
    pool.query(SLOW, &[]).await.unwrap(); // learned: 300 ms at its fastest
    let slow = async {
        pool.query(SLOW, &[]).await.unwrap();
    };
    let worst = fast_while(&pool, slow, 40).await;
    assert!(
        worst < Duration::from_millis(150),
        "a fast query waited {worst:?} behind a known slow one"
    );
    settle(&pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_head_of_line_awareness_fast_queries_wait() {
    // The control for the test above: the same run, routed by load alone.
    const SLOW: &str = "SELECT pg_sleep(0.3)";
    let pool = pool("hol_off", None);
    warm(&pool).await;
    pool.query(SLOW, &[]).await.unwrap();
    let slow = async {
        pool.query(SLOW, &[]).await.unwrap();
    };
    let worst = fast_while(&pool, slow, 40).await;
    assert!(
        worst > Duration::from_millis(150),
        "the oldest connection took the fast queries behind the slow one: {worst:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_marked_slow_is_kept_off_the_fast_pipeline() {
    let pool = pool("hol_marked", Some(Duration::from_millis(5)));
    warm(&pool).await;
    let slow = async {
        // Never seen before: only the caller knows.
        pool.slow()
            .query("SELECT 'marked' FROM pg_sleep(0.3)", &[])
            .await
            .unwrap();
    };
    let worst = fast_while(&pool, slow, 40).await;
    assert!(worst < Duration::from_millis(150), "{worst:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overdue_connection_is_avoided_even_for_an_unknown_slow_query() {
    let pool = pool("hol_overdue", Some(Duration::from_millis(5)));
    warm(&pool).await;
    let slow = async {
        // Unseen and unmarked: only its connection's silence gives it away.
        pool.query("SELECT 'unknown' FROM pg_sleep(0.3)", &[])
            .await
            .unwrap();
    };
    let worst = fast_while(&pool, slow, 40).await;
    assert!(worst < Duration::from_millis(150), "{worst:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_queries_still_run_side_by_side() {
    const SLOW: &str = "SELECT pg_sleep(0.2)";
    let pool = pool("hol_parallel", Some(Duration::from_millis(5)));
    warm(&pool).await;
    pool.query(SLOW, &[]).await.unwrap();
    // Eight slow queries on four connections: two rounds, not eight.
    let start = Instant::now();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.query(SLOW, &[]).await.unwrap() })
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    let took = start.elapsed();
    assert!(
        took < Duration::from_millis(700),
        "8 × 200 ms on 4 connections took {took:?}"
    );
}
