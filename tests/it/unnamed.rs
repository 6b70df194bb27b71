//! Unnamed statements (`Prepare::Unnamed`) against PostgreSQL itself:
//! everything the query methods do with named statements works the same,
//! and a table changed under `SELECT *` never fails with a stale plan.

use std::time::Duration;

use pgpipe::{ErrorKind, Executor, Pool, Prepare};

use crate::support::{app, builder};

fn pool(name: &str) -> Pool {
    builder(&app(name))
        .max_size(2)
        .pipelining(true)
        .prepare(Prepare::Unnamed)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_batches_and_exclusive_connections_work_unnamed() {
    let pool = pool("unnamed_all");
    // Concurrent queries, each checked against its own parameters.
    let mut handles = Vec::new();
    for task in 0..16i64 {
        let pool = pool.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..50i64 {
                let id = task * 1000 + i;
                let row = pool
                    .query_one("SELECT $1::int8 + 0, $2::text", &[&id, &format!("t{id}")])
                    .await
                    .unwrap();
                assert_eq!(row.get::<_, i64>(0), id);
                assert_eq!(row.get::<_, String>(1), format!("t{id}"));
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    // Bad input fails alone, and says what is wrong.
    let e = pool.query("SELECT $1::int8", &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Params, "{e}");
    let e = pool.query("SELECT $1::int8", &[&"text"]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Params, "{e}");
    let e = pool.query("SELEC 1", &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Db, "{e}");
    assert_eq!(
        pool.execute("SELECT 1 WHERE $1::int4 > 0", &[&1i32])
            .await
            .unwrap(),
        1
    );

    // Batches, isolated and atomic.
    let mut batch = pool.batch();
    batch.query("SELECT $1::int8", &[&1i64]);
    batch.query("SELECT 1/0", &[]);
    batch.query("SELECT $1::int8", &[&3i64]);
    let results = batch.run().await.unwrap();
    assert_eq!(results[0].as_ref().unwrap().rows()[0].get::<_, i64>(0), 1);
    assert_eq!(results[1].as_ref().unwrap_err().kind(), ErrorKind::Db);
    assert_eq!(results[2].as_ref().unwrap().rows()[0].get::<_, i64>(0), 3);
    let mut atomic = pool.atomic_batch();
    atomic.query("SELECT $1::int8", &[&7i64]);
    atomic.query("SELECT $1::text", &[&"x"]);
    for result in atomic.run().await.unwrap() {
        result.unwrap();
    }

    // An exclusive connection and a transaction on it.
    let mut conn = pool.get().await.unwrap();
    let row = conn.query_one("SELECT $1::int4", &[&5i32]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 5);
    let e = conn.prepare_cached("SELECT 1").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    let tx = conn.transaction().await.unwrap();
    let row = tx
        .query_one("SELECT $1::int8 * 2", &[&21i64])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 42);
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_table_never_fails_with_a_stale_plan() {
    let pool = pool("unnamed_stale");
    let table = pgpipe_test_support::unique("unnamed_stale");
    pool.get()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE {table} (a int8); INSERT INTO {table} VALUES (1)"
        ))
        .await
        .unwrap();
    let select = format!("SELECT * FROM {table}");
    assert_eq!(pool.query_one(&select, &[]).await.unwrap().len(), 1);
    pool.get()
        .await
        .unwrap()
        .batch_execute(&format!(
            "ALTER TABLE {table} ADD COLUMN b text DEFAULT 'x'"
        ))
        .await
        .unwrap();
    // Named statements would answer `0A000 cached plan must not change
    // result type` here (and heal with a retry); unnamed ones describe the
    // live statement every time.
    for _ in 0..3 {
        let row = pool.query_one(&select, &[]).await.unwrap();
        assert_eq!(row.len(), 2);
        assert_eq!(row.get::<_, String>(1), "x");
    }
    pool.get()
        .await
        .unwrap()
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_type_is_refused_and_nothing_else_is_affected() {
    let pool = pool("unnamed_custom");
    let schema = pgpipe_test_support::unique("unnamed_custom");
    pool.get()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; CREATE TYPE {schema}.mood AS ENUM ('ok')"
        ))
        .await
        .unwrap();
    let custom = format!("SELECT 'ok'::{schema}.mood");
    for _ in 0..3 {
        let e = pool.query(&custom, &[]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
        assert!(e.to_string().contains("mood"), "{e}");
        assert!(!e.may_have_run());
    }
    let text = format!("SELECT 'ok'::{schema}.mood::text");
    let row = pool.query_one(&text, &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "ok");
    // A describe whose caller gave up does not hold up the next one.
    let described = pool.clone();
    let sql = "SELECT $1::int8 AS given_up";
    let abandoned = tokio::spawn(async move { described.query(sql, &[&1i64]).await });
    abandoned.abort();
    let row = tokio::time::timeout(
        Duration::from_secs(5),
        pool.query_one("SELECT $1::int8 AS after", &[&2i64]),
    )
    .await
    .expect("not held up")
    .unwrap();
    assert_eq!(row.get::<_, i64>(0), 2);
    pool.get()
        .await
        .unwrap()
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
