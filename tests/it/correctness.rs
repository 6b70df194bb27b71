//! Every answer reaches its own caller, under load, errors and cancellation.

use std::sync::Arc;
use std::time::Duration;

use pgpipe::{ErrorKind, Pool};
use pgpipe_test_support::{admin, unique};
use tokio_postgres::error::SqlState;

use crate::support::{Rng, app, builder, settle};

/// Runs `tasks` × `per_task` queries, each with values unique to its task and
/// position, and checks every answer against its own question.
async fn echo_storm(pool: &Pool, tasks: usize, per_task: usize) {
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let pool = pool.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                let id = (task * per_task + i) as i64;
                let tag = format!("t{task}-q{i}");
                let row = pool
                    .query_one("SELECT $1::int8, $2::text", &[&id, &tag])
                    .await
                    .unwrap_or_else(|e| panic!("task {task} query {i}: {e}"));
                let (got_id, got_tag): (i64, String) = (row.get(0), row.get(1));
                assert_eq!(
                    (got_id, got_tag.as_str()),
                    (id, tag.as_str()),
                    "misrouted answer"
                );
            }
        }));
    }
    for handle in handles {
        handle.await.expect("task panicked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tasks_get_their_own_answers_pipelined() {
    let pool = builder(&app("storm_on"))
        .max_size(4)
        .pipelining(true)
        .build()
        .unwrap();
    echo_storm(&pool, 1000, 50).await;
    settle(&pool).await;
    let status = pool.status();
    assert!(status.shared >= 1 && status.shared <= 4, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tasks_get_their_own_answers_exclusive() {
    let pool = builder(&app("storm_off"))
        .max_size(4)
        .pipelining(false)
        .build()
        .unwrap();
    echo_storm(&pool, 1000, 50).await;
    let status = pool.status();
    assert_eq!(status.shared, 0, "{status:?}");
    assert!(status.size <= 4, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_query_fails_only_its_caller() {
    let table = unique("uniq");
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (k int8 PRIMARY KEY); INSERT INTO {table} VALUES (1)"
        ))
        .await
        .unwrap();
    // One connection, so that every query shares one pipeline.
    let pool = Arc::new(
        builder(&app("neighbours"))
            .max_size(1)
            .max_exclusive(1)
            .pipelining(true)
            .build()
            .unwrap(),
    );
    let mut handles = Vec::new();
    for task in 0..200i64 {
        let pool = Arc::clone(&pool);
        let table = table.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..20i64 {
                let n = task * 100 + i;
                match (task + i) % 10 {
                    3 => {
                        let e = pool
                            .query_one("SELECT 1 / $1::int8", &[&0i64])
                            .await
                            .unwrap_err();
                        assert_eq!(e.code(), Some(&SqlState::DIVISION_BY_ZERO), "{e}");
                        assert_eq!(e.kind(), ErrorKind::Db);
                    }
                    5 => {
                        let e = pool.query("SELEC 1", &[]).await.unwrap_err();
                        assert_eq!(e.code(), Some(&SqlState::SYNTAX_ERROR), "{e}");
                    }
                    7 => {
                        let e = pool
                            .execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&1i64])
                            .await
                            .unwrap_err();
                        assert_eq!(e.code(), Some(&SqlState::UNIQUE_VIOLATION), "{e}");
                    }
                    _ => {
                        let row = pool.query_one("SELECT $1::int8 * 2", &[&n]).await.unwrap();
                        assert_eq!(row.get::<_, i64>(0), n * 2);
                    }
                }
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    // The failures left the connection and its statement cache usable.
    assert_eq!(
        pool.query_one("SELECT 41 + 1", &[])
            .await
            .unwrap()
            .get::<_, i32>(0),
        42
    );
    assert_eq!(pool.status().shared, 1);
    admin
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_futures_never_disturb_the_survivors() {
    for pipelining in [true, false] {
        let pool = builder(&app("drops"))
            .max_size(3)
            .pipelining(pipelining)
            .build()
            .unwrap();
        let mut handles = Vec::new();
        for task in 0..500u64 {
            let pool = pool.clone();
            handles.push(tokio::spawn(async move {
                let mut rng = Rng::new(task + 1);
                // (answers checked, futures given up on)
                let (mut answered, mut dropped) = (0u64, 0u64);
                for i in 0..10i64 {
                    let id = task as i64 * 1000 + i;
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
                    let query = pool.query_one("SELECT $1::int8, pg_sleep(0)::text", &params);
                    if task % 2 == 0 {
                        // Give up after a random sub-millisecond wait: the
                        // future is dropped wherever it happens to be.
                        let limit = Duration::from_micros(rng.below(800));
                        match tokio::time::timeout(limit, query).await {
                            Ok(result) => {
                                assert_eq!(result.unwrap().get::<_, i64>(0), id);
                                answered += 1;
                            }
                            Err(_) => dropped += 1,
                        }
                    } else {
                        assert_eq!(query.await.unwrap().get::<_, i64>(0), id);
                        answered += 1;
                    }
                }
                (answered, dropped)
            }));
        }
        let (mut answered, mut dropped) = (0, 0);
        for handle in handles {
            let (a, d) = handle.await.unwrap();
            answered += a;
            dropped += d;
        }
        eprintln!("pipelining {pipelining}: {answered} answers checked, {dropped} dropped");
        assert_eq!(answered + dropped, 5000, "every query was accounted for");
        // The patient half (2,500) is answered in full; without some drops
        // in the impatient half the test would have tested nothing.
        assert!(
            (2500..5000).contains(&answered) && dropped > 0,
            "{answered} answered, {dropped} dropped: some futures must be dropped mid-flight"
        );
        settle(&pool).await;
        // Nothing is desynced: a fresh round is answered correctly, each
        // answer its own caller's, all of them.
        let mut fresh = 0;
        for i in 0..50i64 {
            let row = pool.query_one("SELECT $1::int8 + 1", &[&i]).await.unwrap();
            assert_eq!(row.get::<_, i64>(0), i + 1);
            fresh += 1;
        }
        assert_eq!(fresh, 50);
        let status = pool.status();
        assert_eq!((status.in_flight, status.waiting), (0, 0), "{status:?}");
    }
}
