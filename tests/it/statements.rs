//! The shared statement cache: one prepare per connection, self-healing.

use std::sync::Arc;
use std::time::Duration;

use pgpipe_test_support::{admin, unique};

use crate::support::{app, builder, builder_via, proxy, settle};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_tasks_missing_one_sql_prepare_it_once() {
    let proxy = proxy(Duration::ZERO);
    let pool = builder_via(&proxy, &app("dedup"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .build()
        .unwrap();
    let marker = unique("never_seen");
    let sql = format!("SELECT $1::int8 + 0 AS {marker}");
    // The lane's first use reads the catalog (a statement of the pool's
    // own): before the count starts.
    pool.query("SELECT 1", &[]).await.unwrap();
    let parses_before = proxy.stats().upstream.parses;
    let mut handles = Vec::new();
    for i in 0..200i64 {
        let (pool, sql) = (pool.clone(), sql.clone());
        handles.push(tokio::spawn(async move {
            let row = pool.query_one(&sql, &[&i]).await.unwrap();
            assert_eq!(row.get::<_, i64>(0), i);
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    assert_eq!(
        proxy.stats().upstream.parses - parses_before,
        1,
        "one Parse on the wire"
    );
    // And one statement in that session, counted by the session itself.
    let count: i64 = pool
        .query_one(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1",
            &[&sql],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_table_is_healed_with_one_prepare_per_connection() {
    let table = unique("heal");
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (a int8); INSERT INTO {table} SELECT generate_series(1, 3)"
        ))
        .await
        .unwrap();
    let proxy = proxy(Duration::ZERO);
    let app = app("heal");
    let pool = Arc::new(
        builder_via(&proxy, &app)
            .max_size(2)
            .max_exclusive(1)
            .pipelining(true)
            .build()
            .unwrap(),
    );
    let sql = format!("SELECT * FROM {table} ORDER BY a");
    let storm = |pool: Arc<pgpipe::Pool>, columns: usize| {
        let sql = sql.clone();
        async move {
            let mut handles = Vec::new();
            for _ in 0..200 {
                let (pool, sql) = (Arc::clone(&pool), sql.clone());
                handles.push(tokio::spawn(async move {
                    let rows = pool.query(&sql, &[]).await.expect("healed transparently");
                    assert_eq!(rows.len(), 3);
                    assert_eq!(rows[0].len(), columns);
                }));
            }
            for handle in handles {
                handle.await.unwrap();
            }
        }
    };
    storm(Arc::clone(&pool), 1).await;
    settle(&pool).await;
    // A connection the first storm asked for may still be opening (and
    // preparing the read groups' head as it does): wait until every server
    // backend of the pool is a connection the pool holds.
    let count_backends = || async {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&app],
            )
            .await
            .unwrap()
            .get::<_, i64>(0) as usize
    };
    for _ in 0..200 {
        if pool.status().size >= count_backends().await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connections = pool.status().shared as u64;
    assert!(connections >= 1);
    let before = proxy.stats();

    admin
        .batch_execute(&format!("ALTER TABLE {table} ADD COLUMN b int8 DEFAULT 7"))
        .await
        .unwrap();
    storm(Arc::clone(&pool), 2).await;

    // Each of the pool's connections prepares the statement at most once
    // more: again, or for the first time where the first storm never
    // reached it (under `Routing::Fill` a connection may be open and yet
    // unused, so the shared path's count says too little; the server's
    // does not). A connection whose first request comes now, opened
    // meanwhile or open and unused until now, also prepares the read
    // groups' head, a `Parse` of the pool's own, with its first.
    let stats = proxy.stats();
    let (reprepares, opened, first) = (
        stats.upstream.parses - before.upstream.parses,
        stats.connections - before.connections,
        stats.upstream.connections_with_parses - before.upstream.connections_with_parses,
    );
    let connections = connections.max(count_backends().await as u64);
    assert!(
        reprepares <= connections + opened + first,
        "{reprepares} prepares on {connections} connections, {opened} opened meanwhile, \
         {first} preparing for the first time"
    );
    admin
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_is_bounded() {
    let pool = builder(&app("bounded"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .statement_cache_capacity(4)
        .build()
        .unwrap();
    for i in 0..20 {
        let sql = format!("SELECT {i}::int4 AS bounded_{i}");
        assert_eq!(pool.query_one(&sql, &[]).await.unwrap().get::<_, i32>(0), i);
    }
    settle(&pool).await;
    // Evicted statements are closed on the server (their Close goes out with
    // the next request): of our 20, at most the cache's 4 are left, and at
    // least the most recent one (it was just used). The counting query is
    // prepared in the same session and its own text matches the LIKE
    // pattern, so it is left out by name.
    let count: i64 = pool
        .query_one(
            "SELECT count(*) FROM pg_prepared_statements \
             WHERE statement LIKE 'SELECT % AS bounded_%' \
             AND statement NOT LIKE '%pg_prepared_statements%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        (1..=4).contains(&count),
        "{count} of our statements left on the server, expected 1 to 4"
    );
}
