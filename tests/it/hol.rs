//! Head-of-line awareness: fast queries do not queue behind slow ones on a
//! shared connection, and slow ones still run side by side.
//!
//! Checked by where queries ran (each answers its backend's pid), never by
//! how long they took: a busy machine slows everything down, but does not
//! move a fast query onto the slow query's connection.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pgpipe::Pool;

use crate::support::{app, builder, settle};

const FAST: &str = "SELECT $1::int8, pg_backend_pid()";

/// With `threshold` `None`, head-of-line awareness is off altogether: no
/// learned slowness and no budget (blocking.rs tests the budget).
fn pool(test: &str, threshold: Option<Duration>) -> Pool {
    let budget = threshold.map(|_| Duration::from_millis(100));
    builder(&app(test))
        .max_size(4)
        .pipelining(true)
        .slow_query_threshold(threshold)
        .head_of_line_budget(budget)
        .build()
        .unwrap()
}

/// Runs `slow` (which answers its backend's pid) and, from 30 ms into it,
/// `n` fast queries one after another. Returns the slow query's backend and
/// the backends of the fast queries sent before its answer was back.
async fn fast_while(pool: &Pool, slow: impl Future<Output = i32>, n: i64) -> (i32, Vec<i32>) {
    let answered = AtomicBool::new(false);
    let slow = async {
        let pid = slow.await;
        answered.store(true, Ordering::Release);
        pid
    };
    let fast = async {
        // Let the slow query reach the server first.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let mut during = Vec::new();
        for i in 0..n {
            let slow_running = !answered.load(Ordering::Acquire);
            let row = pool.query_one(FAST, &[&i]).await.unwrap();
            assert_eq!(row.get::<_, i64>(0), i);
            if slow_running {
                during.push(row.get::<_, i32>(1));
            }
        }
        during
    };
    let (slow, during) = tokio::join!(slow, fast);
    eprintln!("slow query on backend {slow}; fast queries sent meanwhile on {during:?}");
    (slow, during)
}

/// `sql` (which answers its backend's pid first) on the shared path.
async fn pid_of(pool: &Pool, sql: &str) -> i32 {
    pool.query_one(sql, &[]).await.unwrap().get(0)
}

/// The fast queries sent while the slow one ran all went elsewhere.
fn assert_kept_apart(slow: i32, during: &[i32]) {
    assert!(
        !during.is_empty(),
        "no fast query was sent while the slow one ran"
    );
    assert!(
        !during.contains(&slow),
        "a fast query was pipelined behind the slow one on backend {slow}: {during:?}"
    );
}

async fn warm(pool: &Pool) {
    for i in 0..50i64 {
        pool.query_one(FAST, &[&i]).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learned_slow_statement_does_not_hold_up_fast_queries() {
    const SLOW: &str = "SELECT pg_backend_pid() FROM pg_sleep(0.3)";
    let pool = pool("hol_learned", Some(Duration::from_millis(5)));
    warm(&pool).await;
    pid_of(&pool, SLOW).await; // learned: 300 ms at its fastest
    let (slow, during) = fast_while(&pool, pid_of(&pool, SLOW), 40).await;
    assert_kept_apart(slow, &during);
    settle(&pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_head_of_line_awareness_fast_queries_wait() {
    // The control for the test above: the same run, routed by load alone.
    const SLOW: &str = "SELECT pg_backend_pid() FROM pg_sleep(0.3)";
    let pool = pool("hol_off", None);
    warm(&pool).await;
    pid_of(&pool, SLOW).await;
    let (slow, during) = fast_while(&pool, pid_of(&pool, SLOW), 40).await;
    assert!(
        during.contains(&slow),
        "the oldest connection took the fast queries behind the slow one on backend \
         {slow}: {during:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_marked_slow_is_kept_off_the_fast_pipeline() {
    let pool = pool("hol_marked", Some(Duration::from_millis(5)));
    warm(&pool).await;
    let slow = async {
        // Never seen before: only the caller knows.
        pool.slow()
            .query_one("SELECT pg_backend_pid(), 'marked' FROM pg_sleep(0.3)", &[])
            .await
            .unwrap()
            .get(0)
    };
    let (slow, during) = fast_while(&pool, slow, 40).await;
    assert_kept_apart(slow, &during);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overdue_connection_is_avoided_even_for_an_unknown_slow_query() {
    let pool = pool("hol_overdue", Some(Duration::from_millis(5)));
    warm(&pool).await;
    // Unseen and unmarked: only its connection's silence gives it away.
    let slow = pid_of(
        &pool,
        "SELECT pg_backend_pid(), 'unknown' FROM pg_sleep(0.3)",
    );
    let (slow, during) = fast_while(&pool, slow, 40).await;
    assert_kept_apart(slow, &during);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_queries_still_run_side_by_side() {
    const SLOW: &str = "SELECT pg_backend_pid() FROM pg_sleep(0.2)";
    let pool = pool("hol_parallel", Some(Duration::from_millis(5)));
    warm(&pool).await;
    pid_of(&pool, SLOW).await;
    // Eight slow queries on four connections: two rounds, not eight. A
    // backend runs its queries one after another, so no backend may have
    // more than a few of them.
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pid_of(&pool, SLOW).await })
        })
        .collect();
    let mut per_backend = BTreeMap::<i32, usize>::new();
    for handle in handles {
        *per_backend.entry(handle.await.unwrap()).or_default() += 1;
    }
    let most = per_backend.values().copied().max().unwrap_or(0);
    eprintln!("8 slow queries ran on (pid: queries) {per_backend:?}");
    assert!(
        most <= 3 && per_backend.len() >= 3,
        "8 slow queries on 4 connections ran {per_backend:?} (pid: queries)"
    );
}
