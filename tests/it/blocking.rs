//! The head-of-line budget (issue #42): a statement that waits on a lock or
//! runs long on a shared connection is stopped by the *server* at the
//! budget, runs again on a connection of its own, and never shares a
//! pipeline again; its neighbours go on meanwhile.
//!
//! Checked by what happened, in order, on the server (a lock still held, a
//! statement still waiting, rows written once or never), and by the pool's
//! own counts; never by how long a call took, which a busy machine moves.

use std::time::Duration;

use pgpipe::{ErrorKind, Pool};
use pgpipe_test_support::admin;
use prometheus::Registry;

use crate::support::{Scrape, app, builder, count_rows, drop_table, scratch_table};

/// Generous: a bound on a stall the budget ends in 100 ms; past it, the
/// neighbours are stuck behind the blocked statement.
const STUCK: Duration = Duration::from_secs(15);

fn pool(test: &str, registry: &Registry) -> Pool {
    builder(&app(test))
        .max_size(4)
        .pipelining(true)
        .registry(registry)
        .build()
        .unwrap()
}

pub(crate) fn evicted(registry: &Registry) -> f64 {
    Scrape::of(registry).value("pgpipe_head_of_line_evicted_total", &[])
}

/// Waits until the budget has stopped `n` statements (bounded by [`STUCK`]).
pub(crate) async fn until_evicted(registry: &Registry, n: f64) {
    let deadline = std::time::Instant::now() + STUCK;
    while evicted(registry) < n {
        assert!(
            std::time::Instant::now() < deadline,
            "never stopped at the budget"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `n` echo queries from 16 tasks, each answer checked; fails past
/// [`STUCK`].
pub(crate) async fn echoes(pool: &Pool, n: i64) {
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let pool = pool.clone();
            tokio::spawn(async move {
                for i in (t..n).step_by(16) {
                    let row = pool.query_one("SELECT $1::int8", &[&i]).await.unwrap();
                    assert_eq!(row.get::<_, i64>(0), i);
                }
            })
        })
        .collect();
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    if tokio::time::timeout(STUCK, all).await.is_err() {
        panic!(
            "echo queries stuck behind a statement waiting on a lock: {:?}",
            pool.status()
        );
    }
}

/// Another session holds row 1 of `table` until it commits.
pub(crate) async fn hold_row(table: &str) -> tokio_postgres::Client {
    let holder = admin().await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute(&format!("UPDATE {table} SET v = v + 1 WHERE id = 1"), &[])
        .await
        .unwrap();
    holder
}

/// Waits until a backend of the server runs `like` and waits on a lock.
pub(crate) async fn until_waiting_on_lock(admin: &tokio_postgres::Client, like: &str) {
    for _ in 0..500 {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE $1",
                &[&format!("%{like}%")],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no backend ever waited on the lock for {like}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_lock_wait_stalls_no_neighbour_and_the_write_runs_once() {
    let table = scratch_table("hol_lock", "id int PRIMARY KEY, v int").await;
    let registry = Registry::new();
    let pool = pool("hol_lock", &registry);
    pool.execute(&format!("INSERT INTO {table} VALUES (1, 0)"), &[])
        .await
        .unwrap();
    echoes(&pool, 64).await;
    let holder = hold_row(&table).await;
    let update = format!("UPDATE {table} SET v = v + 10 WHERE id = 1");
    let write = {
        let (pool, update) = (pool.clone(), update.clone());
        tokio::spawn(async move { pool.execute(&update, &[]).await })
    };
    let watcher = admin().await;
    until_waiting_on_lock(&watcher, &update).await;
    // While the row is still held, the neighbours are answered, during its
    // first run and after the server stopped it.
    echoes(&pool, 512).await;
    until_evicted(&registry, 1.0).await;
    until_waiting_on_lock(&watcher, &update).await;
    echoes(&pool, 512).await;
    assert!(!write.is_finished(), "the write waits for the row");
    assert_eq!(evicted(&registry), 1.0, "stopped once at the budget");
    holder.batch_execute("COMMIT").await.unwrap();
    assert_eq!(write.await.unwrap().unwrap(), 1);
    // It ran once: the stopped run committed nothing.
    let v: i32 = pool
        .query_one(&format!("SELECT v FROM {table} WHERE id = 1"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, 11);
    drop_table(&table).await;
}

/// A tracked write (`execute_tracked`: the write and the position query,
/// an isolated batch of two) that the budget stops runs again to its end,
/// once, and its token is read after it: the caller sees no
/// `statement_timeout` it never set (it did, under a busy CI machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracked_write_stopped_at_the_budget_runs_again_once() {
    let table = scratch_table("hol_tracked", "id int PRIMARY KEY, v int").await;
    let registry = Registry::new();
    let pool = pool("hol_tracked", &registry);
    pool.execute(&format!("INSERT INTO {table} VALUES (1, 0)"), &[])
        .await
        .unwrap();
    let holder = hold_row(&table).await;
    let update = format!("UPDATE {table} SET v = v + 10 WHERE id = 1");
    let write = {
        let (pool, update) = (pool.clone(), update.clone());
        tokio::spawn(async move { pool.execute_tracked(&update, &[]).await })
    };
    let watcher = admin().await;
    until_evicted(&registry, 1.0).await;
    until_waiting_on_lock(&watcher, &update).await;
    assert!(!write.is_finished(), "the write waits for the row again");
    holder.batch_execute("COMMIT").await.unwrap();
    let (n, token) = write.await.unwrap().unwrap();
    assert_eq!(n, 1);
    assert_ne!(token, pgpipe::WriteToken::PRIMARY, "the position was read");
    let v: i32 = pool
        .query_one(&format!("SELECT v FROM {table} WHERE id = 1"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, 11, "the stopped run committed nothing; the second once");
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_stopped_once_never_shares_a_pipeline_again() {
    let registry = Registry::new();
    let pool = pool("hol_remember", &registry);
    echoes(&pool, 64).await;
    const SLOW: &str = "SELECT 'hol_remember', pg_sleep(0.3)";
    pool.query(SLOW, &[]).await.unwrap();
    assert_eq!(evicted(&registry), 1.0, "its first run was stopped");
    for _ in 0..3 {
        let (slow, ()) = tokio::join!(pool.query(SLOW, &[]), echoes(&pool, 64));
        slow.unwrap();
    }
    assert_eq!(
        evicted(&registry),
        1.0,
        "its next runs went to a connection of their own from the start"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_runs_alone_from_its_first_call() {
    let registry = Registry::new();
    let pool = pool("hol_slow", &registry);
    echoes(&pool, 64).await;
    let marked = pool.slow();
    let slow = marked.query("SELECT 'hol_slow', pg_sleep(0.3)", &[]);
    let (slow, ()) = tokio::join!(slow, echoes(&pool, 64));
    slow.unwrap();
    // It never reached a shared connection, so the budget never stopped it.
    assert_eq!(evicted(&registry), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_past_its_deadline_is_stopped_by_the_server_and_never_runs() {
    let table = scratch_table("hol_deadline", "a int").await;
    let registry = Registry::new();
    let pool = builder(&app("hol_deadline"))
        .max_size(2)
        .pipelining(true)
        .query_timeout(Duration::from_millis(400))
        .registry(&registry)
        .build()
        .unwrap();
    echoes(&pool, 32).await;
    let insert = format!("INSERT INTO {table} SELECT 1 FROM pg_sleep(1.5)");
    let e = pool.execute(&insert, &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueryTimeout, "{e}");
    assert!(e.is_timeout());
    assert!(!e.may_have_run(), "the server stopped it: {e}");
    // Well past the sleep: it never ran later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(count_rows(&pool, &table).await, 0);
    echoes(&pool, 32).await;
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_unit_stopped_at_the_budget_runs_again_alone_once() {
    let table = scratch_table("hol_unit", "id int PRIMARY KEY, v int").await;
    let registry = Registry::new();
    let pool = pool("hol_unit", &registry);
    pool.execute(&format!("INSERT INTO {table} VALUES (1, 0)"), &[])
        .await
        .unwrap();
    let holder = hold_row(&table).await;
    let update = format!("UPDATE {table} SET v = v + 10 WHERE id = 1");
    let insert = format!("INSERT INTO {table} VALUES (2, 0)");
    let unit = {
        let (pool, update, insert) = (pool.clone(), update.clone(), insert.clone());
        tokio::spawn(async move {
            let mut batch = pool.atomic_batch();
            batch.execute(&insert, &[]);
            batch.execute(&update, &[]);
            batch.run().await
        })
    };
    let watcher = admin().await;
    until_waiting_on_lock(&watcher, &update).await;
    echoes(&pool, 256).await;
    // Stopped at the budget, then waiting again, alone.
    until_evicted(&registry, 1.0).await;
    until_waiting_on_lock(&watcher, &update).await;
    echoes(&pool, 256).await;
    holder.batch_execute("COMMIT").await.unwrap();
    let results = unit.await.unwrap().unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let rows: Vec<(i32, i32)> = pool
        .query(&format!("SELECT id, v FROM {table} ORDER BY id"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, [(1, 11), (2, 0)], "the unit committed once");
    drop_table(&table).await;
}

#[test]
fn the_budget_is_validated() {
    for bad in [
        Duration::ZERO,
        Duration::from_micros(500),
        Duration::from_secs(3_000_000),
    ] {
        let e = Pool::builder()
            .url("postgres://localhost/test")
            .pipelining(true)
            .head_of_line_budget(bad)
            .build()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        assert!(e.to_string().contains("head_of_line_budget"), "{e}");
    }
}
