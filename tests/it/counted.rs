//! Every statement on a checkout is counted, whichever method sent it:
//! pgpipe's `Executor`, or the tokio-postgres client a checkout
//! dereferences to (prepared statements, `batch_execute`, `simple_query`,
//! a transaction of its own). Counted at the connection, from the server's
//! answers; the pool's own session resets are not the caller's.

use std::time::Duration;

use pgpipe::Executor;
use pgpipe::tokio_postgres::Client;
use prometheus::Registry;

use crate::support::{Scrape, app, builder};

fn counted(registry: &Registry, outcome: &str) -> f64 {
    Scrape::of(registry).value(
        "pgpipe_queries_total",
        &[("mode", "checkout"), ("outcome", outcome)],
    )
}

fn timed(registry: &Registry) -> u64 {
    Scrape::of(registry)
        .histogram_count_of("pgpipe_query_duration_seconds", &[("mode", "checkout")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_clients_statements_are_counted() {
    let registry = Registry::new();
    let pool = builder(&app("counted_raw"))
        .max_size(2)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    let ok = || counted(&registry, "ok");

    let mut conn = pool.get().await.unwrap();
    let raw: &Client = &conn;
    // A prepared statement: its Parse is no statement, its run is.
    let statement = raw.prepare("SELECT $1::int8").await.unwrap();
    assert_eq!(ok(), 0.0);
    let row = raw.query_one(&statement, &[&7i64]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 7);
    assert_eq!(ok(), 1.0);
    raw.execute("SELECT 1", &[]).await.unwrap();
    // A simple query of three statements counts three.
    raw.batch_execute("SELECT 1; SELECT 2; SELECT 3")
        .await
        .unwrap();
    raw.simple_query("SELECT 4").await.unwrap();
    assert_eq!(ok(), 6.0);
    // An error is counted as one, and so is the empty query.
    raw.batch_execute("SELECT 1/0").await.unwrap_err();
    raw.batch_execute("").await.unwrap();
    assert_eq!(counted(&registry, "db_error"), 1.0);
    assert_eq!(ok(), 7.0);
    // tokio-postgres' own transaction on the checkout: BEGIN, the
    // statement, COMMIT.
    let tx = Client::transaction(&mut conn).await.unwrap();
    tx.execute("SELECT 5", &[]).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ok(), 10.0);
    // COPY FROM STDIN is one statement, and the count stays in step after
    // it (its first Sync is answered by none of its own).
    let raw: &Client = &conn;
    raw.batch_execute("CREATE TEMP TABLE counted_copy (x int)")
        .await
        .unwrap();
    let sink = raw
        .copy_in::<str, bytes::Bytes>("COPY counted_copy FROM STDIN")
        .await
        .unwrap();
    let mut sink = std::pin::pin!(sink);
    assert_eq!(sink.as_mut().finish().await.unwrap(), 0);
    assert_eq!(ok(), 12.0);
    raw.execute("SELECT 6", &[]).await.unwrap();
    assert_eq!(ok(), 13.0);
    // Every one of them timed as well.
    assert_eq!(timed(&registry), 14);
    // The same through pgpipe's methods: counted once each, not twice.
    conn.query_one("SELECT 7", &[]).await.unwrap();
    assert_eq!(ok(), 14.0);
    drop(conn);

    // Statements sent after the connection went back are not the caller's:
    // its reset (between users) is not counted.
    pool.query("SELECT 8", &[]).await.unwrap();
    let conn = pool.get().await.unwrap();
    assert_eq!(ok(), 14.0);
    drop(conn);
}

/// `begin()`'s reset rides along with its `BEGIN` and its `COMMIT`: the
/// caller's statements count, the pool's own do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owned_transaction_counts_its_statements_not_the_pools_resets() {
    let registry = Registry::new();
    let pool = builder(&app("counted_begin"))
        .max_size(1)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    // The session left dirty: the next begin() owes it a reset.
    let conn = pool.get().await.unwrap();
    conn.client()
        .batch_execute("SET work_mem = '8MB'")
        .await
        .unwrap();
    drop(conn);
    let before = counted(&registry, "ok");

    let tx = pool.begin().await.unwrap();
    tx.query_one("SELECT 1", &[]).await.unwrap();
    tx.client().query_one("SELECT 2", &[]).await.unwrap();
    tx.commit().await.unwrap();
    // BEGIN, SELECT 1, SELECT 2, COMMIT.
    assert_eq!(counted(&registry, "ok") - before, 4.0);

    let tx = pool.begin().await.unwrap();
    tx.execute("SELECT 1/0", &[]).await.unwrap_err();
    tx.rollback().await.unwrap();
    // BEGIN, ROLLBACK; the division's error.
    assert_eq!(counted(&registry, "ok") - before, 6.0);
    assert_eq!(counted(&registry, "db_error"), 1.0);
}

/// A statement whose connection is lost under it counts once: as the
/// error the server sent while ending the session, or as lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_on_a_lost_connection_counts_once() {
    let registry = Registry::new();
    let pool = builder(&app("counted_lost"))
        .max_size(1)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    let conn = pool.get().await.unwrap();
    let pid: i32 = conn
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let sleeping = conn.client().query("SELECT pg_sleep(30)", &[]);
    let killer = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        pgpipe_test_support::admin()
            .await
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
    };
    let (slept, ()) = tokio::join!(sleeping, killer);
    slept.unwrap_err();
    drop(conn);
    // The pool heals; then the ended statement has been counted once.
    pool.query("SELECT 1", &[]).await.unwrap();
    let ended = counted(&registry, "db_error") + counted(&registry, "connection_lost");
    assert_eq!(ended, 1.0);
    assert_eq!(counted(&registry, "ok"), 1.0);
}
