//! Errors that tell the truth and counts that add up: each test here is a
//! defect found by an independent review, with its trigger.

use std::time::{Duration, Instant};

use pgpipe::{ErrorKind, Executor, Pool};
use pgpipe_test_support::{admin, database_url, unique};
use prometheus::Registry;

use crate::support::{Scrape, app, backend_pid, builder, create_role, drop_role, until_running};

async fn table(ddl: &str) -> String {
    let name = unique("truth");
    admin()
        .await
        .batch_execute(&format!("CREATE TABLE {name} {ddl}"))
        .await
        .unwrap();
    name
}

async fn drop_table(name: &str) {
    admin()
        .await
        .batch_execute(&format!("DROP TABLE IF EXISTS {name}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_in_leaves_no_answer_owed() {
    let table = table("(a int)").await;
    let registry = Registry::new();
    let pool = builder(&app("truth_copy"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .stall_timeout(Duration::from_millis(300))
        .registry(&registry)
        .build()
        .unwrap();
    let conn = pool.get().await.unwrap();
    let pid: i32 = conn
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let copy = format!("COPY {table} FROM STDIN");
    let sink = conn
        .client()
        .copy_in::<str, bytes_free::Bytes>(copy.as_str())
        .await
        .unwrap();
    let mut sink = std::pin::pin!(sink);
    assert_eq!(sink.as_mut().finish().await.unwrap(), 0);
    drop(conn);
    // Were an answer still owed, the stall watchdog would kill the
    // connection as stalled once it is no longer checked out.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let stalled =
        Scrape::of(&registry).value("pgpipe_connections_closed_total", &[("reason", "stalled")]);
    assert_eq!(stalled, 0.0, "the connection was killed as stalled");
    assert_eq!(backend_pid(&pool).await, pid, "the connection was replaced");
    drop(pool);
    drop_table(&table).await;
}

/// `copy_in` wants a `Buf` type; tokio-postgres re-exports none, so this is
/// the smallest one.
mod bytes_free {
    pub(super) struct Bytes;

    impl bytes::Buf for Bytes {
        fn remaining(&self) -> usize {
            0
        }
        fn chunk(&self) -> &[u8] {
            &[]
        }
        fn advance(&mut self, _: usize) {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_batches_forget_a_stale_plan() {
    let table = table("(a int)").await;
    let pool = builder(&app("truth_stale")).max_size(1).build().unwrap();
    let select = format!("SELECT * FROM {table}");
    let run = || async {
        let mut batch = pool.atomic_batch();
        batch.query(&select, &[]);
        batch.run().await.unwrap().remove(0)
    };
    run().await.unwrap();
    admin()
        .await
        .batch_execute(&format!("ALTER TABLE {table} ADD COLUMN b int"))
        .await
        .unwrap();
    // The stale plan fails once (the refusal aborts the transaction, so it
    // is not retried in place), and is forgotten.
    let _ = run().await;
    for _ in 0..3 {
        run().await.expect("the plan was prepared again");
    }
    drop(pool);
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_timeout_says_the_query_may_have_run() {
    let table = table("(a int)").await;
    let registry = Registry::new();
    // The budget off: a deadline the client keeps alone. With the budget
    // (the default), the server stops the statement and says it did not
    // run: blocking.rs.
    let pool = builder(&app("truth_timeout"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .head_of_line_budget(None)
        .query_timeout(Duration::from_millis(200))
        .registry(&registry)
        .build()
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    let insert = format!("INSERT INTO {table} SELECT 1 FROM pg_sleep(0.4)");
    let write = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.execute(&insert, &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    // A neighbour in the pipeline: the late insert is not cancelled.
    let neighbour = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.query("SELECT 1", &[]).await })
    };
    let e = write.await.unwrap().unwrap_err();
    let _ = neighbour.await;
    assert_eq!(e.kind(), ErrorKind::QueryTimeout, "{e}");
    assert!(e.may_have_run() && e.is_timeout());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let written: i64 = admin()
        .await
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        written, 1,
        "the timed-out insert ran, as its error said it may"
    );
    let scrape = Scrape::of(&registry);
    let outcome = |o| {
        scrape.value(
            "pgpipe_queries_total",
            &[("mode", "pipelined"), ("outcome", o)],
        )
    };
    // The insert, and its neighbour if it waited past the deadline too.
    assert!(outcome("query_timeout") >= 1.0);
    assert_eq!(outcome("timeout"), 0.0);
    assert_eq!(
        scrape.value("pgpipe_pipeline_rejected_total", &[("reason", "timeout")]),
        0.0,
        "a query that ran is not 'refused before running'"
    );
    drop(pool);
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_timeout_says_the_query_never_ran() {
    let registry = Registry::new();
    let name = app("truth_wait");
    // The budget off: the busy statement must hold the one connection
    // (blocking.rs tests the budget).
    let pool = builder(&name)
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .head_of_line_budget(None)
        .max_pipeline_depth(1)
        .wait_timeout(Duration::from_millis(100))
        .registry(&registry)
        .build()
        .unwrap();
    // The one connection open before the busy statement takes it.
    pool.query("SELECT 2", &[]).await.unwrap();
    let busy = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.query("SELECT pg_sleep(3)", &[]).await })
    };
    // Until the server runs it: a fixed sleep guessed how long that takes,
    // and on a busy machine `SELECT 1` once went first.
    until_running(&name, "pg_sleep(3)").await;
    let e = pool.query("SELECT 1", &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(!e.may_have_run());
    busy.await.unwrap().unwrap();
    let scrape = Scrape::of(&registry);
    assert_eq!(
        scrape.value("pgpipe_pipeline_rejected_total", &[("reason", "timeout")]),
        1.0
    );
    assert_eq!(
        scrape.histogram_count("pgpipe_connection_wait_seconds"),
        3,
        "the failed wait is recorded too (beside the warm-up's and the busy one's)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_of_any_size_are_settings_not_panics() {
    let huge = Duration::MAX;
    let pool = builder(&app("truth_durations"))
        .pipelining(true)
        .wait_timeout(huge)
        .query_timeout(huge)
        .slow_query_threshold(huge)
        .stall_timeout(huge)
        .idle_timeout(huge)
        .max_lifetime(huge)
        .build()
        .unwrap();
    for _ in 0..3 {
        pool.query("SELECT 1", &[]).await.unwrap();
        pool.get().await.unwrap();
    }
    // A few housekeeping ticks: a watchdog limit that wrapped to zero would
    // kill the busy connection.
    let slow = pool.query("SELECT pg_sleep(0.4)", &[]);
    slow.await.unwrap();
    let error = builder("x")
        .statement_timeout(Duration::from_secs(3_000_000))
        .build()
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config, "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_is_refused_where_it_cannot_work() {
    let table = table("(a int)").await;
    let pool = builder(&app("truth_copy_refused"))
        .max_size(1)
        .build()
        .unwrap();
    let (insert, copy) = (
        format!("INSERT INTO {table} VALUES (1)"),
        format!("COPY {table} FROM STDIN"),
    );
    let mut batch = pool.atomic_batch();
    batch.execute(&insert, &[]);
    batch.execute(&copy, &[]);
    let results = batch.run().await.unwrap();
    assert_eq!(
        results[1].as_ref().unwrap_err().kind(),
        ErrorKind::NotAllowedInBatch
    );
    assert_eq!(
        results[0].as_ref().unwrap_err().kind(),
        ErrorKind::BatchAborted
    );
    let conn = pool.get().await.unwrap();
    let e = Executor::query(
        &conn,
        &format!("COPY (SELECT * FROM {table}) TO STDOUT"),
        &[],
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    // Nothing was sent: the connection is fine.
    Executor::query(&conn, "SELECT 1", &[]).await.unwrap();
    drop(conn);
    drop(pool);
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_checkouts_and_waiters_truthfully() {
    let pool = builder(&app("truth_status"))
        .max_size(1)
        .max_exclusive(1)
        .wait_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let held = pool.get().await.unwrap();
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.get().await.map(drop) })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let status = pool.status();
    assert_eq!(
        (status.exclusive, status.exclusive_waiting),
        (1, 1),
        "{status:?}"
    );
    // A waiter that gives up stops counting.
    waiter.abort();
    let _ = waiter.await;
    assert_eq!(pool.status().exclusive_waiting, 0, "{:?}", pool.status());
    drop(held);
    assert_eq!(pool.status().exclusive, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_keep_within_the_pipeline_depth() {
    let pool = builder(&app("truth_depth"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .max_pipeline_depth(4)
        .build()
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    let stop = Instant::now() + Duration::from_millis(1500);
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let values: Vec<i64> = (0..4).collect();
                while Instant::now() < stop {
                    let mut batch = pool.batch();
                    for i in &values {
                        batch.query("SELECT $1::int8", &[i]);
                    }
                    for result in batch.run().await.unwrap() {
                        result.unwrap();
                    }
                }
            })
        })
        .collect();
    let mut most = 0;
    while Instant::now() < stop {
        most = most.max(pool.status().in_flight);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(most > 0, "nothing was ever in flight");
    assert!(most <= 4, "{most} in flight on one connection of depth 4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_queries_are_not_stranded_when_no_connection_can_be_opened() {
    // A role that may hold one connection: the second open always fails.
    let role = create_role("truth_limited", "LOGIN CONNECTION LIMIT 1").await;
    let mut config: tokio_postgres::Config = database_url().parse().unwrap();
    config.user(&role).application_name(app("truth_strand"));
    let pool = Pool::builder()
        .config(config)
        .max_size(2)
        .max_exclusive(1)
        .pipelining(true)
        .wait_timeout(Duration::from_secs(1))
        // The budget off: the slow statement must stay on the one shared
        // connection there is (with it, it would need a second, which
        // the role cannot open).
        .head_of_line_budget(None)
        .build()
        .unwrap();
    let user: String = pool
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(user, role);
    // Longer than wait_timeout: a query stranded in the queue times out.
    let slow = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.query("SELECT pg_sleep(2.5)", &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Routing would rather open a connection than queue behind the slow
    // query; none can be opened (and the opens back off, longer each time),
    // so fast queries must take the one there is.
    let mut fast = Vec::new();
    for _ in 0..20 {
        let pool = pool.clone();
        fast.push(tokio::spawn(
            async move { pool.query("SELECT 1", &[]).await },
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for query in fast {
        let result = query.await.unwrap();
        assert!(result.is_ok(), "{:?}", result.err());
    }
    slow.await.unwrap().unwrap();
    drop(pool);
    drop_role(&role).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_query_is_not_a_stall() {
    let pool = builder(&app("truth_slow_stall"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .stall_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let rows = pool.slow().query("SELECT pg_sleep(1)", &[]).await;
    assert!(rows.is_ok(), "{:?}", rows.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_caps_holds_its_connection_until_drained() {
    // Head-of-line awareness off: it would see the connection as overdue
    // anyway; the drain itself must keep new queries off it.
    let pool = builder(&app("truth_caps"))
        .max_size(2)
        .max_exclusive(1)
        .pipelining(true)
        .slow_query_threshold(None)
        .max_result_rows(10)
        .build()
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let big = {
        let (pool, order) = (pool.clone(), order.clone());
        tokio::spawn(async move {
            let e = pool
                .query("SELECT generate_series(1, 3000000)", &[])
                .await
                .unwrap_err();
            order.lock().unwrap().push("big");
            e
        })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    // While the server streams the rest of the big answer, a new query does
    // not queue behind it: the connection counts as held up.
    pool.query("SELECT 1", &[]).await.unwrap();
    order.lock().unwrap().push("small");
    let e = big.await.unwrap();
    assert_eq!(e.kind(), ErrorKind::TooLarge, "{e}");
    assert!(
        e.may_have_run(),
        "the statement ran; only its answer was dropped"
    );
    assert_eq!(*order.lock().unwrap(), ["small", "big"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cancel_hits_the_statement_after_a_timed_out_one() {
    let pool = builder(&app("truth_cancel_next"))
        .max_size(1)
        .query_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let conn = pool.get().await.unwrap();
    // Queries that end right around their deadline: the cancel may arrive
    // after the query is done. It must never hit the next statement.
    for i in 0..30 {
        let sleep = format!("SELECT pg_sleep({})", 0.095 + f64::from(i % 3) * 0.005);
        let _ = Executor::query(&conn, &sleep, &[]).await;
        let next = Executor::query(&conn, "SELECT pg_sleep(0.02)", &[]).await;
        assert!(next.is_ok(), "round {i}: {:?}", next.err());
    }
}
