//! Explicit batches: isolated and atomic, against a real server.

use std::time::Duration;

use pgpipe::{Answer, ErrorKind, Pool};
use pgpipe_test_support::admin;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::support::{
    Rng, app, builder, builder_via, count_rows, drop_table, idle_in_transaction, proxy,
    scratch_table,
};

fn pool(test: &str) -> Pool {
    builder(&app(test))
        .max_size(3)
        .pipelining(true)
        .build()
        .unwrap()
}

async fn table(columns: &str) -> String {
    scratch_table("batch", columns).await
}

async fn count(pool: &Pool, table: &str) -> i64 {
    count_rows(pool, table).await
}

fn value(answer: &Answer) -> i64 {
    answer.rows()[0].get(0)
}

#[tokio::test]
async fn an_isolated_batch_answers_every_item_in_one_round_trip() {
    let proxy = proxy(Duration::from_millis(2)); // 4 ms round trip
    let pool = builder_via(&proxy, &app("batch_rtt"))
        .max_size(2)
        .pipelining(true)
        .build()
        .unwrap();
    let values: Vec<i64> = (0..20).collect();
    // Round trips counted by the proxy (Syncs sent while no answer was owed),
    // not timed: a busy machine can slow a run down, not add round trips.
    let mut fewest = u64::MAX;
    for _ in 0..4 {
        let mut batch = pool.batch();
        for v in &values {
            batch.query("SELECT $1::int8", &[v]);
        }
        batch.execute("SELECT 1 FROM generate_series(1, 3)", &[]);
        let before = proxy.stats().busy_periods;
        let results = batch.run().await.unwrap();
        fewest = fewest.min(proxy.stats().busy_periods - before);
        assert_eq!(results.len(), 21);
        for (v, result) in values.iter().zip(&results) {
            assert_eq!(value(result.as_ref().unwrap()), *v);
        }
        assert_eq!(results[20].as_ref().unwrap().rows_affected(), 3);
    }
    // The first run prepares; later ones are one round trip.
    assert_eq!(fewest, 1, "21 items took {fewest} round trips at best");
}

#[tokio::test]
async fn a_failing_item_fails_alone_in_an_isolated_batch() {
    let pool = pool("batch_isolated");
    let (one, two, wrong) = (1i64, 2i64, 7i32);
    let mut batch = pool.batch();
    batch
        .query("SELECT $1::int8", &[&one])
        .query("SELECT 1 / (2 - $1::int8)", &[&two]) // division by zero
        .query("SELEC nonsense", &[])
        .query("SELECT $1::int8", &[]) // a parameter short
        .query("SELECT $1::int8", &[&wrong]) // an int4 for an int8
        .execute("SET search_path = nowhere", &[])
        .query("SELECT $1::int8 + 1", &[&one]);
    let results = batch.run().await.unwrap();
    let kind = |i: usize| results[i].as_ref().err().map(|e| e.kind());
    assert_eq!(value(results[0].as_ref().unwrap()), 1);
    assert_eq!(kind(1), Some(ErrorKind::Db));
    assert_eq!(
        results[1].as_ref().unwrap_err().code(),
        Some(&SqlState::DIVISION_BY_ZERO)
    );
    assert_eq!(kind(2), Some(ErrorKind::Db));
    assert_eq!(kind(3), Some(ErrorKind::Params));
    assert_eq!(kind(4), Some(ErrorKind::Params));
    assert_eq!(kind(5), Some(ErrorKind::NotAllowedOnShared));
    assert_eq!(value(results[6].as_ref().unwrap()), 2);
    // The connections are fine.
    let row = pool.query_one("SELECT 41::int8 + 1", &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 42);
}

#[tokio::test]
async fn items_run_in_order_even_past_the_pipeline_depth() {
    let table = table("n int8").await;
    let pool = builder(&app("batch_order"))
        .max_size(2)
        .pipelining(true)
        .max_pipeline_depth(4)
        .build()
        .unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let count_sql = format!("SELECT count(*) FROM {table}");
    let ns: Vec<i64> = (1..=10).collect();
    let mut batch = pool.batch();
    for n in &ns {
        batch.execute(&insert, &[n]);
        batch.query(&count_sql, &[]);
    }
    let results = batch.run().await.unwrap();
    for (i, n) in ns.iter().enumerate() {
        assert_eq!(results[2 * i].as_ref().unwrap().rows_affected(), 1);
        // Each count sees exactly the inserts before it.
        assert_eq!(value(results[2 * i + 1].as_ref().unwrap()), *n);
    }
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_from_many_tasks_never_cross() {
    let pool = builder(&app("batch_cross"))
        .max_size(3)
        .pipelining(true)
        .max_pipeline_depth(16)
        .build()
        .unwrap();
    let mut handles = Vec::new();
    for task in 0..48u64 {
        let pool = pool.clone();
        handles.push(tokio::spawn(async move {
            let mut rng = Rng::new(task + 11);
            for round in 0..40i64 {
                let len = 1 + rng.below(12) as usize;
                let values: Vec<i64> = (0..len as i64)
                    .map(|i| ((task as i64) << 32) | (round << 12) | i)
                    .collect();
                let mut batch = pool.batch();
                for v in &values {
                    batch.query("SELECT $1::int8", &[v]);
                }
                let first: [&(dyn ToSql + Sync); 1] = [&values[0]];
                let (results, single) =
                    tokio::join!(batch.run(), pool.query_one("SELECT $1::int8 * 2", &first));
                assert_eq!(single.unwrap().get::<_, i64>(0), values[0] * 2);
                let results = results.unwrap();
                assert_eq!(results.len(), len);
                for (v, result) in values.iter().zip(results) {
                    assert_eq!(value(&result.unwrap()), *v, "a misrouted answer");
                }
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
}

#[tokio::test]
async fn an_isolated_batch_works_without_pipelining_and_on_an_empty_or_closed_pool() {
    let pool = builder(&app("batch_off")).max_size(1).build().unwrap();
    assert!(pool.batch().run().await.unwrap().is_empty());
    let (a, b) = (5i64, 6i64);
    let mut batch = pool.batch();
    batch.query("SELECT $1::int8", &[&a]);
    batch.query("SELECT $1::int8", &[&b]);
    let results = batch.run().await.unwrap();
    assert_eq!(value(results[1].as_ref().unwrap()), 6);
    pool.close();
    let mut batch = pool.batch();
    batch.query("SELECT 1", &[]);
    assert_eq!(batch.run().await.unwrap_err().kind(), ErrorKind::Closed);
}

#[tokio::test]
async fn an_atomic_batch_commits_all_or_nothing() {
    let table = table("id int8 PRIMARY KEY").await;
    let pool = pool("batch_atomic");
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let (one, two, three) = (1i64, 2i64, 3i64);

    let mut batch = pool.atomic_batch();
    batch
        .execute(&insert, &[&one])
        .execute(&insert, &[&two])
        .execute(&insert, &[&one]) // a duplicate key
        .execute(&insert, &[&three]);
    let results = batch.run().await.unwrap();
    let failed = results[2].as_ref().unwrap_err();
    assert_eq!(failed.kind(), ErrorKind::Db);
    assert_eq!(failed.code(), Some(&SqlState::UNIQUE_VIOLATION));
    for i in [0, 1, 3] {
        let e = results[i].as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BatchAborted, "item {i}: {e}");
        assert_eq!(
            e.code(),
            Some(&SqlState::UNIQUE_VIOLATION),
            "the cause passes through"
        );
        let what = if i < 2 { "rolled back" } else { "skipped" };
        assert!(e.to_string().contains(what), "{e}");
        assert!(e.to_string().contains("item 2"), "{e}");
    }
    assert_eq!(count(&pool, &table).await, 0, "nothing was committed");

    let mut batch = pool.atomic_batch();
    batch.execute(&insert, &[&one]).execute(&insert, &[&two]);
    let count_sql = format!("SELECT count(*) FROM {table}");
    batch.query(&count_sql, &[]);
    let results = batch.run().await.unwrap();
    assert_eq!(
        value(results[2].as_ref().unwrap()),
        2,
        "inside the transaction"
    );
    assert_eq!(count(&pool, &table).await, 2);
    drop_table(&table).await;
}

#[tokio::test]
async fn an_atomic_batch_sends_nothing_when_an_item_cannot_run() {
    let table = table("id int8").await;
    let pool = pool("batch_unsent");
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let (one, wrong) = (1i64, 2i32);
    let cases: Vec<(Vec<(&str, bool)>, ErrorKind)> = vec![
        (
            vec![(insert.as_str(), true), ("COMMIT", false)],
            ErrorKind::NotAllowedInBatch,
        ),
        (
            vec![(insert.as_str(), true), ("SELEC x", false)],
            ErrorKind::Db,
        ),
        (
            vec![(insert.as_str(), true), (insert.as_str(), false)],
            ErrorKind::Params,
        ),
    ];
    for (items, kind) in cases {
        let mut batch = pool.atomic_batch();
        for (sql, good) in &items {
            if *good {
                batch.execute(sql, &[&one]);
            } else if sql.starts_with("INSERT") {
                batch.execute(sql, &[&wrong]); // int4 for an int8: caught before sending
            } else {
                batch.execute(sql, &[]);
            }
        }
        let results = batch.run().await.unwrap();
        assert_eq!(results[1].as_ref().unwrap_err().kind(), kind);
        let first = results[0].as_ref().unwrap_err();
        assert_eq!(first.kind(), ErrorKind::BatchAborted);
        assert!(first.to_string().contains("not run"), "{first}");
    }
    assert_eq!(count(&pool, &table).await, 0);
    drop_table(&table).await;
}

#[tokio::test]
async fn a_commit_refused_by_the_server_rolls_every_item_back() {
    let table = table("id int8 UNIQUE DEFERRABLE INITIALLY DEFERRED").await;
    let pool = pool("batch_commit");
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let one = 1i64;
    let mut batch = pool.atomic_batch();
    batch.execute(&insert, &[&one]).execute(&insert, &[&one]);
    let results = batch.run().await.unwrap();
    for result in &results {
        let e = result.as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BatchAborted);
        assert_eq!(e.code(), Some(&SqlState::UNIQUE_VIOLATION));
        assert!(e.to_string().contains("COMMIT failed"), "{e}");
    }
    assert_eq!(count(&pool, &table).await, 0);
    drop_table(&table).await;
}

#[tokio::test]
async fn an_answer_past_the_caps_is_reported_truthfully_in_an_atomic_batch() {
    let table = table("id int8").await;
    let pool = builder(&app("batch_caps"))
        .max_size(2)
        .pipelining(true)
        .max_result_rows(5)
        .build()
        .unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let one = 1i64;
    // Too many rows, but the statement succeeded: the batch committed.
    let mut batch = pool.atomic_batch();
    batch.execute(&insert, &[&one]);
    batch.query("SELECT g FROM generate_series(1, 100) g", &[]);
    let results = batch.run().await.unwrap();
    assert_eq!(results[0].as_ref().unwrap().rows_affected(), 1);
    let e = results[1].as_ref().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TooLarge);
    assert!(e.to_string().contains("committed"), "{e}");
    assert_eq!(count(&pool, &table).await, 1);
    // An error after the cap is still seen: the batch rolled back.
    let mut batch = pool.atomic_batch();
    batch.execute(&insert, &[&one]);
    batch.query(
        "SELECT CASE WHEN g < 50 THEN g ELSE 1 / (g - g) END FROM generate_series(1, 100) g",
        &[],
    );
    let results = batch.run().await.unwrap();
    assert_eq!(
        results[1].as_ref().unwrap_err().code(),
        Some(&SqlState::DIVISION_BY_ZERO)
    );
    assert_eq!(
        results[0].as_ref().unwrap_err().kind(),
        ErrorKind::BatchAborted
    );
    assert_eq!(count(&pool, &table).await, 1);
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_callers_never_land_inside_an_atomic_batch() {
    let table = table("id int8").await;
    let app = app("batch_inside");
    let pool = builder(&app).max_size(4).pipelining(true).build().unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let writer = {
        let (pool, insert) = (pool.clone(), insert.clone());
        tokio::spawn(async move {
            for n in 0..60i64 {
                let mut batch = pool.atomic_batch();
                batch.execute(&insert, &[&n]);
                batch.query("SELECT pg_sleep(0.002)", &[]);
                batch.query("SELECT 1 / 0", &[]); // always fails: never commits
                let results = batch.run().await.unwrap();
                assert!(results.iter().all(|r| r.is_err()));
            }
        })
    };
    let readers: Vec<_> = (0..16)
        .map(|_| {
            let (pool, table) = (pool.clone(), table.clone());
            tokio::spawn(async move {
                let sql = format!(
                    "SELECT (SELECT count(*) FROM {table}), pg_current_xact_id_if_assigned() IS NULL"
                );
                let mut seen = 0;
                while seen < 300 {
                    let row = pool.query_one(&sql, &[]).await.unwrap();
                    assert_eq!(row.get::<_, i64>(0), 0, "saw an uncommitted row");
                    assert!(row.get::<_, bool>(1), "ran inside someone's transaction");
                    seen += 1;
                }
            })
        })
        .collect();
    writer.await.unwrap();
    for reader in readers {
        reader.await.unwrap();
    }
    assert_eq!(
        idle_in_transaction(&app).await,
        0,
        "a transaction was left open"
    );
    drop_table(&table).await;
}

#[tokio::test]
async fn a_failed_or_abandoned_atomic_batch_never_leaves_its_connection_in_a_transaction() {
    let table = table("id int8").await;
    // One connection: whatever the batches leave behind, the next user
    // finds.
    let app = app("batch_leftover");
    let pool = builder(&app)
        .max_size(1)
        .pipelining(true)
        .max_exclusive(1)
        .build()
        .unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    for n in 0..20i64 {
        let mut batch = pool.atomic_batch();
        batch.execute(&insert, &[&n]);
        batch.query("SELECT pg_sleep(0.01)", &[]);
        let divisor = n % 2;
        batch.query("SELECT 1 / $1::int8", &[&divisor]);
        if n % 4 == 3 {
            // Abandoned mid-flight: its fate is the server's, but the
            // connection must come back clean.
            let _ = tokio::time::timeout(Duration::from_millis(3), batch.run()).await;
        } else {
            let results = batch.run().await.unwrap();
            assert_eq!(results.iter().all(|r| r.is_ok()), n % 2 == 1);
        }
        // Seen from outside, before the pool touches the connection again
        // (sharing it would reset the session and hide a leftover): once the
        // server has worked through what was sent, no transaction is open.
        let mut open = idle_in_transaction(&app).await;
        for _ in 0..100 {
            if open == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            open = idle_in_transaction(&app).await;
        }
        assert_eq!(open, 0, "the batch left its transaction open");
        let row = pool
            .query_one("SELECT pg_current_xact_id_if_assigned() IS NULL", &[])
            .await
            .unwrap();
        assert!(row.get::<_, bool>(0), "a transaction was left open");
    }
    drop_table(&table).await;
}

#[tokio::test]
async fn an_atomic_batch_is_one_round_trip_once_prepared() {
    let proxy = proxy(Duration::from_millis(2)); // 4 ms round trip
    let table = table("id int8").await;
    let pool = builder_via(&proxy, &app("batch_atomic_rtt"))
        .max_size(2)
        .pipelining(true)
        .build()
        .unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let ids: Vec<i64> = (0..10).collect();
    // Round trips counted by the proxy, as above.
    let mut fewest = u64::MAX;
    for _ in 0..4 {
        let mut batch = pool.atomic_batch();
        for id in &ids {
            batch.execute(&insert, &[id]);
        }
        let before = proxy.stats().busy_periods;
        let results = batch.run().await.unwrap();
        fewest = fewest.min(proxy.stats().busy_periods - before);
        assert!(results.iter().all(|r| r.is_ok()));
    }
    assert_eq!(
        fewest, 1,
        "BEGIN, 10 inserts, COMMIT took {fewest} round trips at best"
    );
    assert_eq!(count(&pool, &table).await, 40);
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_batches_take_at_most_half_a_pipelined_pool_and_reads_go_on_beside_them() {
    let app = app("batchquota");
    let pool = builder(&app).max_size(4).pipelining(true).build().unwrap();
    let mut batches = Vec::new();
    for _ in 0..6 {
        let pool = pool.clone();
        batches.push(tokio::spawn(async move {
            // Code the guard cannot read: an exclusive connection each (a
            // batch it vouches for is a unit of a shared pipeline).
            let mut batch = pool.atomic_batch();
            batch.execute("DO $$ BEGIN PERFORM pg_sleep(0.3); END $$", &[]);
            batch.run().await
        }));
    }
    let admin = admin().await;
    let sleeping = || async {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND query LIKE '%pg_sleep%' AND state = 'active' \
                   AND query NOT LIKE '/* pgpipe */%'",
                &[&app],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    // Watched until every batch is done (a fixed window measured the
    // machine: on a busy one the batches had not all begun in it).
    let (mut most, mut reads, mut beside) = (0, 0i64, 0);
    while !batches.iter().all(|batch| batch.is_finished()) {
        let before = sleeping().await;
        let row = pool.query_one("SELECT $1::int8", &[&reads]).await.unwrap();
        assert_eq!(row.get::<_, i64>(0), reads);
        reads += 1;
        let after = sleeping().await;
        most = most.max(before).max(after);
        // Answered while batches held their connections.
        beside += i32::from(before > 0 && after > 0);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for batch in batches {
        for result in batch.await.unwrap().unwrap() {
            result.unwrap();
        }
    }
    assert_eq!(most, 2, "atomic batches at once on a pool of 4");
    assert!(
        beside > 0,
        "no read went on beside the batches ({reads} reads)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_batch_that_would_wait_for_its_own_task_is_a_deadlock_at_once() {
    let pool = builder(&app("batchdeadlock"))
        .max_size(4)
        .pipelining(true)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    // This task holds every exclusive place (max_exclusive = 3) …
    let held = [
        pool.get().await.unwrap(),
        pool.get().await.unwrap(),
        pool.get().await.unwrap(),
    ];
    // … two other tasks' atomic batches (with session SQL, so each needs a
    // connection of its own) take both batch places and wait for a
    // connection this task holds …
    let others: Vec<_> = (0..2i64)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut batch = pool.atomic_batch();
                batch.execute("SET search_path = public", &[]);
                batch.query("SELECT $1::int8", &[&i]);
                batch.run().await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // … so its own batch could only wait for itself.
    let started = std::time::Instant::now();
    let mut batch = pool.atomic_batch();
    batch.execute("SET search_path = public", &[]);
    batch.query("SELECT 1", &[]);
    let error = batch.run().await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Deadlock, "{error}");
    assert!(started.elapsed() < Duration::from_secs(2));
    drop(held);
    for other in others {
        for result in other.await.unwrap().unwrap() {
            result.unwrap();
        }
    }
}
