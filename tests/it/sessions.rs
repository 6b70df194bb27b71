//! Transactions and session state stay on exclusive connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pgpipe::ErrorKind;
use pgpipe_test_support::{admin, unique};

use crate::support::{app, backend_pid, builder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_is_invisible_to_pipelined_queries() {
    let table = unique("tx");
    let admin = admin().await;
    admin
        .batch_execute(&format!("CREATE TABLE {table} (a int8)"))
        .await
        .unwrap();
    let pool = builder(&app("tx"))
        .max_size(3)
        .pipelining(true)
        .build()
        .unwrap();
    let count_sql = format!("SELECT count(*) FROM {table}");
    let mut conn = pool.get().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    tx.execute(&format!("INSERT INTO {table} VALUES (1)"), &[])
        .await
        .unwrap();
    // Many pipelined readers while the transaction is open: none sees it.
    let mut handles = Vec::new();
    for _ in 0..100 {
        let (pool, sql) = (pool.clone(), count_sql.clone());
        handles.push(tokio::spawn(async move {
            pool.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0)
        }));
    }
    for handle in handles {
        assert_eq!(handle.await.unwrap(), 0);
    }
    tx.commit().await.unwrap();
    drop(conn);
    let seen: i64 = pool.query_one(&count_sql, &[]).await.unwrap().get(0);
    assert_eq!(seen, 1);
    admin
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dirty_exclusive_connection_is_clean_when_shared_again() {
    let app = app("dirty");
    // One connection, so the shared path must reuse the dirty one.
    let pool = builder(&app)
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .build()
        .unwrap();
    let backend = backend_pid(&pool).await;
    {
        let conn = pool.get().await.unwrap();
        conn.batch_execute(
            "SET search_path = nowhere; SET application_name = 'dirty'; \
             CREATE TEMP TABLE leftover (a int); SELECT pg_advisory_lock(4242); \
             LISTEN somewhere; BEGIN; INSERT INTO leftover VALUES (1)",
        )
        .await
        .unwrap();
        // Dropped with the transaction still open.
    }
    let row = pool
        .query_one(
            "SELECT pg_backend_pid(), current_setting('search_path'), \
                    current_setting('application_name'), \
                    to_regclass('pg_temp.leftover') IS NULL, \
                    (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()), \
                    (SELECT count(*) FROM pg_listening_channels()), \
                    pg_current_xact_id_if_assigned() IS NULL",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), backend, "the same session was reused");
    assert_eq!(row.get::<_, String>(1), "\"$user\", public");
    assert_eq!(row.get::<_, String>(2), app);
    assert!(row.get::<_, bool>(3), "temp table dropped");
    assert_eq!(row.get::<_, i64>(4), 0, "advisory lock released");
    assert_eq!(row.get::<_, i64>(5), 0, "no LISTEN left");
    assert!(
        row.get::<_, bool>(6),
        "not inside the leftover (writing) transaction"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_sql_is_refused_on_the_shared_path() {
    let pool = builder(&app("refuse"))
        .max_size(2)
        .pipelining(true)
        .build()
        .unwrap();
    for sql in [
        "BEGIN",
        "-- leading comment\n  commit",
        "/* x */ SET search_path = x",
        "LISTEN chan",
        "CREATE TEMP TABLE t (a int)",
        "SELECT pg_advisory_lock(1)",
        "SELECT set_config('search_path', 'x', false)",
        "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
    ] {
        let e = pool.execute(sql, &[]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotAllowedOnShared, "{sql}: {e}");
        assert!(e.to_string().contains("pool.get()"), "{e}");
    }
    // The guard applies without pipelining too, so code behaves the same in
    // both modes.
    let exclusive = builder(&app("refuse_off")).max_size(1).build().unwrap();
    let e = exclusive.execute("BEGIN", &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotAllowedOnShared);
    // Allowed forms still run.
    pool.execute("SELECT set_config('a.b', 'c', true)", &[])
        .await
        .unwrap();
    pool.execute("SELECT pg_advisory_xact_lock(7)", &[])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_the_only_connection_and_querying_fails_fast() {
    let pool = builder(&app("self_wait"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let conn = pool.get().await.unwrap();
    let start = Instant::now();
    let e = pool.query("SELECT 1", &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Deadlock, "{e}");
    // At once, not at the 30 s wait_timeout.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let e = pool.get().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Deadlock, "{e}");
    drop(conn);
    pool.query("SELECT 1", &[]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_checkouts_are_served_under_pipelined_load() {
    let pool = builder(&app("starve"))
        .max_size(2)
        .pipelining(true)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..64 {
        let (pool, stop) = (pool.clone(), Arc::clone(&stop));
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                pool.query_one("SELECT 1", &[]).await.unwrap();
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..5 {
        let start = Instant::now();
        let conn = pool.get().await.unwrap();
        // Served, not starved until the 20 s wait_timeout.
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        conn.simple_query("SELECT 1").await.unwrap();
        drop(conn);
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
}

/// A connection given back while other tasks wait in `get()` goes to the
/// next of them: the waiters keep their room reserved, so the shared path
/// (whose queries are queued) does not open it meanwhile. Were the shared
/// path to take it, the waiter would make a shared connection drain, with
/// the pipelined queries on it behind the drain; the backends below would
/// show it. Fails every run with the open's own room check removed, and
/// about one run in six on this machine without the reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_given_back_goes_to_the_next_waiting_get() {
    let pool = builder(&app("handoff"))
        .max_size(2)
        .max_exclusive(1)
        .max_pipeline_depth(2)
        .pipelining(true)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // The first checkout, then the backends the shared path uses from now.
    let first = pool.get().await.unwrap();
    let exclusive_pid = backend_pid_of(&first).await;
    let mut load = Vec::new();
    for _ in 0..32 {
        let (pool, stop) = (pool.clone(), Arc::clone(&stop));
        load.push(tokio::spawn(async move {
            let mut pids = std::collections::BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                let row = pool
                    .query_one("SELECT pg_backend_pid()", &[])
                    .await
                    .unwrap();
                pids.insert(row.get::<_, i32>(0));
            }
            pids
        }));
    }
    let mut users = Vec::new();
    for _ in 0..3 {
        let (pool, stop) = (pool.clone(), Arc::clone(&stop));
        users.push(tokio::spawn(async move {
            let mut pids = std::collections::BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                let conn = pool.get().await.unwrap();
                pids.insert(backend_pid_of(&conn).await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            pids
        }));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(first);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut exclusive = std::collections::BTreeSet::from([exclusive_pid]);
    for user in users {
        exclusive.extend(user.await.unwrap());
    }
    let mut shared = std::collections::BTreeSet::new();
    for task in load {
        shared.extend(task.await.unwrap());
    }
    eprintln!("exclusive backends {exclusive:?}, shared {shared:?}");
    assert_eq!(
        exclusive.len(),
        1,
        "the exclusive connection moved: {exclusive:?}"
    );
    assert!(
        shared.is_disjoint(&exclusive),
        "the shared path took the connection between two checkouts: \
         exclusive {exclusive:?}, shared {shared:?}"
    );
}

async fn backend_pid_of(conn: &pgpipe::Connection) -> i32 {
    conn.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_on_a_checkout_receives_notifications_and_the_next_user_does_not() {
    let channel = pgpipe_test_support::unique("chan");
    let pool = crate::support::builder(&crate::support::app("listen"))
        .max_size(1)
        .build()
        .unwrap();
    let conn = pool.get().await.unwrap();
    conn.batch_execute(&format!("LISTEN {channel}"))
        .await
        .unwrap();
    let other = pgpipe_test_support::admin().await;
    other
        .batch_execute(&format!(
            "NOTIFY {channel}, 'first'; NOTIFY {channel}, 'second'"
        ))
        .await
        .unwrap();
    for expected in ["first", "second"] {
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), conn.notification())
            .await
            .expect("a notification arrives")
            .unwrap();
        assert_eq!((n.channel(), n.payload()), (channel.as_str(), expected));
    }
    // Left unread when the connection goes back: not the next user's.
    other
        .batch_execute(&format!("NOTIFY {channel}, 'unread'"))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    drop(conn);
    let conn = pool.get().await.unwrap();
    other
        .batch_execute(&format!("NOTIFY {channel}, 'after'"))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        conn.try_notification().is_none(),
        "the next user read the last one's notifications (or its LISTEN)"
    );
}

/// Statements a user made with SQL `PREPARE` on a checked-out connection
/// (odd names too) are gone before its next user; the pool's own stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_prepared_statements_do_not_outlive_their_user() {
    let pool = builder(&app("sql_prepare"))
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    for _ in 0..3 {
        let conn = pool.get().await.unwrap();
        let pid = backend_pid_of(&conn).await;
        conn.batch_execute(r#"PREPARE plain AS SELECT 1; PREPARE "odd ""name""" AS SELECT 2"#)
            .await
            .unwrap();
        drop(conn);
        let conn = pool.get().await.unwrap();
        assert_eq!(backend_pid_of(&conn).await, pid, "the same connection");
        let left: i64 = conn
            .query_one(
                "SELECT count(*) FROM pg_prepared_statements WHERE from_sql",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            left, 0,
            "a user's prepared statements reached the next user"
        );
    }
}
