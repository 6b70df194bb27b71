//! Atomic batches as units of a shared pipeline: `BEGIN`, the items and
//! `COMMIT` go out on a shared connection with nothing in between, so a
//! neighbour never runs inside the transaction, and batches from many tasks
//! follow each other without a round trip each.

use std::collections::BTreeSet;
use std::time::Duration;

use pgpipe::{ErrorKind, Pool};
use pgpipe_test_support::{admin, unique};
use prometheus::Registry;
use tokio_postgres::error::SqlState;

use crate::support::{
    Scrape, app, builder, builder_via, count_rows, drop_table, proxy, scratch_table,
};

async fn table(columns: &str) -> String {
    scratch_table("unit", columns).await
}

async fn count(pool: &Pool, table: &str) -> i64 {
    count_rows(pool, table).await
}

fn pipelined(registry: &Registry) -> f64 {
    Scrape::of(registry).value("pgpipe_queries_total", &[("mode", "pipelined")])
}

fn quarantined(registry: &Registry) -> f64 {
    Scrape::of(registry).value("pgpipe_pipeline_quarantined_total", &[])
}

/// Every neighbour asks for its own transaction id, which makes the
/// server assign one: a neighbour that ran inside a batch's transaction
/// would get that batch's id, which the batch's last item reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_neighbour_never_runs_inside_a_pipelined_atomic_batch() {
    let table = table("task int8, n int8, part int8").await;
    let registry = Registry::new();
    let pool = builder(&app("unit_neighbours"))
        .max_size(2)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1, $2, $3)");
    let (tasks, rounds) = (48i64, 60i64);
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (pool, insert) = (pool.clone(), insert.clone());
            tokio::spawn(async move {
                let mut xids = Vec::new();
                for n in 0..rounds {
                    if task % 2 == 0 {
                        let mut batch = pool.atomic_batch();
                        batch.execute(&insert, &[&task, &n, &1i64]);
                        batch.execute(&insert, &[&task, &n, &2i64]);
                        batch.query("SELECT pg_current_xact_id()::text", &[]);
                        let results = batch.run().await.unwrap();
                        let xid: String = results[2].as_ref().unwrap().rows()[0].get(0);
                        xids.push((true, xid));
                    } else {
                        let row = pool
                            .query_one("SELECT pg_current_xact_id()::text", &[])
                            .await
                            .unwrap();
                        xids.push((false, row.get(0)));
                    }
                }
                xids
            })
        })
        .collect();
    let (mut units, mut neighbours) = (BTreeSet::new(), BTreeSet::new());
    for handle in handles {
        for (unit, xid) in handle.await.unwrap() {
            if unit {
                units.insert(xid);
            } else {
                neighbours.insert(xid);
            }
        }
    }
    let batches = tasks / 2 * rounds;
    assert_eq!(units.len() as i64, batches, "one transaction per batch");
    assert_eq!(neighbours.len() as i64, tasks / 2 * rounds);
    let inside: Vec<_> = units.intersection(&neighbours).collect();
    assert!(
        inside.is_empty(),
        "neighbours ran inside batches: {inside:?}"
    );
    assert_eq!(count(&pool, &table).await, batches * 2);
    // They went out on the shared path, which their open transactions did
    // not make quarantine.
    assert!(pipelined(&registry) >= (batches * 3) as f64);
    assert_eq!(quarantined(&registry), 0.0);
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_item_fails_its_batch_alone_and_leaves_the_connection_shared() {
    let table = table("id int8").await;
    let registry = Registry::new();
    let pool = builder(&app("unit_failed"))
        .max_size(1)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    let before: i32 = pool
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    for round in 0..20i64 {
        let neighbours: Vec<_> = (0..50i64)
            .map(|i| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let row = pool.query_one("SELECT $1::int8", &[&i]).await.unwrap();
                    assert_eq!(row.get::<_, i64>(0), i);
                })
            })
            .collect();
        let mut batch = pool.atomic_batch();
        batch.execute(&insert, &[&round]);
        batch.query("SELECT 1 / $1::int8", &[&0i64]);
        batch.execute(&insert, &[&round]);
        let results = batch.run().await.unwrap();
        let failed = results[1].as_ref().unwrap_err();
        assert_eq!(failed.code(), Some(&SqlState::DIVISION_BY_ZERO), "{failed}");
        for (i, what) in [(0, "rolled back"), (2, "skipped")] {
            let e = results[i].as_ref().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::BatchAborted, "{e}");
            assert!(e.to_string().contains(what), "{e}");
        }
        for neighbour in neighbours {
            neighbour.await.unwrap();
        }
    }
    assert_eq!(
        count(&pool, &table).await,
        0,
        "nothing of a failed batch stays"
    );
    let after: i32 = pool
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(before, after, "the connection stayed in use");
    assert_eq!(quarantined(&registry), 0.0);
    drop_table(&table).await;
}

/// `COMMIT` refused (a deferred constraint): the server answers it with an
/// error, every item was rolled back, and the neighbours never knew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_rolls_back_every_item_and_no_neighbour() {
    let table = table("id int8 UNIQUE DEFERRABLE INITIALLY DEFERRED").await;
    let pool = builder(&app("unit_commit"))
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let neighbours: Vec<_> = (0..100i64)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.query_one("SELECT $1::int8", &[&i]).await })
        })
        .collect();
    let mut batch = pool.atomic_batch();
    batch.execute(&insert, &[&7i64]);
    batch.execute(&insert, &[&7i64]);
    let results = batch.run().await.unwrap();
    for result in &results {
        let e = result.as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BatchAborted, "{e}");
        assert!(e.to_string().contains("COMMIT failed"), "{e}");
    }
    for (i, neighbour) in neighbours.into_iter().enumerate() {
        let row = neighbour.await.unwrap().unwrap();
        assert_eq!(row.get::<_, i64>(0), i as i64);
    }
    assert_eq!(count(&pool, &table).await, 0);
    drop_table(&table).await;
}

/// The backend dies under a batch: it fails with `ConnectionLost`, says its
/// commit is unknown (here: nothing committed), and the pool heals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_makes_the_commit_unknown_and_the_pool_heals() {
    let table = table("id int8").await;
    let app = app("unit_lost");
    let pool = builder(&app).max_size(1).pipelining(true).build().unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let running = {
        let (pool, insert) = (pool.clone(), insert.clone());
        tokio::spawn(async move {
            let mut batch = pool.atomic_batch();
            batch.execute(&insert, &[&1i64]);
            batch.query("SELECT pg_sleep(5)", &[]);
            // (Not the prepare of it: the backend is found only once it
            // sleeps, below. A kill during the prepare would rightly send
            // the batch to another connection.)
            batch.execute(&insert, &[&2i64]);
            batch.run().await
        })
    };
    let admin = admin().await;
    let mut killed = false;
    for _ in 0..200 {
        let rows = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1 AND wait_event = 'PgSleep'",
                &[&app],
            )
            .await
            .unwrap();
        if !rows.is_empty() {
            killed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(killed, "the batch's backend was found");
    let error = running.await.unwrap().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionLost, "{error}");
    assert!(error.to_string().contains("unknown"), "{error}");
    assert_eq!(count(&pool, &table).await, 0, "the server rolled it back");
    drop_table(&table).await;
}

/// Twenty batches from twenty tasks at once share one connection's
/// round trips: with an exclusive connection each, they would take at least
/// one round trip each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_from_many_tasks_share_round_trips() {
    let proxy = proxy(Duration::from_millis(5)); // 10 ms round trip
    let table = table("id int8").await;
    let pool = builder_via(&proxy, &app("unit_rtt"))
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    // Prepared once, so that the round trips below are the batches' own.
    let mut warm = pool.atomic_batch();
    warm.execute(&insert, &[&-1i64]);
    warm.run().await.unwrap();
    let before = proxy.stats().busy_periods;
    let batches: Vec<_> = (0..20i64)
        .map(|i| {
            let (pool, insert) = (pool.clone(), insert.clone());
            tokio::spawn(async move {
                let other = i + 100;
                let mut batch = pool.atomic_batch();
                batch.execute(&insert, &[&i]);
                batch.execute(&insert, &[&other]);
                batch.run().await
            })
        })
        .collect();
    for batch in batches {
        for result in batch.await.unwrap().unwrap() {
            result.unwrap();
        }
    }
    let paid = proxy.stats().busy_periods - before;
    assert!(paid <= 5, "20 atomic batches took {paid} round trips");
    assert_eq!(count(&pool, &table).await, 41);
    drop_table(&table).await;
}

/// Preparing a statement whose types are not PostgreSQL's own takes
/// tokio-postgres several requests (it looks the types up), sent on later
/// polls. A batch waits until no prepare is under way on its connection:
/// were one of those look-ups to land inside a failed batch's transaction,
/// it would fail (`25P02`), and with it a neighbour that never saw the
/// batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_with_its_type_lookups_never_lands_inside_a_batch() {
    let types: Vec<String> = (0..40).map(|_| unique("unit_enum")).collect();
    let admin = admin().await;
    for ty in &types {
        admin
            .batch_execute(&format!("CREATE TYPE {ty} AS ENUM ('a', 'b')"))
            .await
            .unwrap();
    }
    let pool = builder(&app("unit_prepare"))
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failing: Vec<_> = (0..16)
        .map(|_| {
            let (pool, stop) = (pool.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Long batches: their turns take a while.
                    let values: Vec<i64> = (0..60).collect();
                    let mut batch = pool.atomic_batch();
                    batch.query("SELECT 1 / $1::int8", &[&0i64]);
                    for value in &values {
                        batch.query("SELECT $1::int8", &[value]);
                    }
                    let results = batch.run().await.unwrap();
                    assert!(results[0].is_err());
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let lookups: Vec<_> = types
        .iter()
        .map(|ty| {
            let (pool, sql) = (
                pool.clone(),
                format!("SELECT 'a'::{ty}, $1::text::{ty}::text"),
            );
            tokio::spawn(async move { pool.query_one(&sql, &[&"b"]).await.map(drop) })
        })
        .collect();
    for lookup in lookups {
        lookup.await.unwrap().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in failing {
        task.await.unwrap();
    }
    for ty in &types {
        admin
            .batch_execute(&format!("DROP TYPE {ty}"))
            .await
            .unwrap();
    }
}

/// A value that encodes the first time and fails the second: the batch
/// checks every value before anything is sent, so only a value that
/// changes its mind fails while the batch's requests go out.
#[derive(Debug)]
struct ChangesItsMind(std::sync::atomic::AtomicU32);

impl tokio_postgres::types::ToSql for ChangesItsMind {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        if self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
            return Err("changed its mind".into());
        }
        7i64.to_sql(ty, out)
    }

    tokio_postgres::types::accepts!(INT8);
    tokio_postgres::types::to_sql_checked!();
}

/// An item whose request cannot leave while the others do: `ROLLBACK`
/// goes out in place of `COMMIT`, and nothing of the batch stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_that_cannot_be_sent_rolls_its_batch_back() {
    let table = table("id int8").await;
    let pool = builder(&app("unit_left_behind"))
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let odd = ChangesItsMind(std::sync::atomic::AtomicU32::new(0));
    let mut batch = pool.atomic_batch();
    batch.execute(&insert, &[&1i64]);
    batch.execute(&insert, &[&odd]);
    batch.execute(&insert, &[&3i64]);
    let results = batch.run().await.unwrap();
    let own = results[1].as_ref().unwrap_err();
    assert_ne!(own.kind(), ErrorKind::BatchAborted, "{own}");
    for i in [0, 2] {
        let e = results[i].as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BatchAborted, "{e}");
        assert!(e.to_string().contains("rolled back"), "{e}");
    }
    assert_eq!(count(&pool, &table).await, 0, "nothing of the batch stays");
    drop_table(&table).await;
}

/// `SET LOCAL` of a setting the server reports (`application_name`) inside
/// a batch: the server reports it, and again when `COMMIT` undoes it. The
/// connection is not quarantined for that, and the setting is gone after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_local_inside_a_batch_stays_inside_it() {
    let registry = Registry::new();
    let app = app("unit_set_local");
    let pool = builder(&app)
        .max_size(1)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    for _ in 0..10 {
        let mut batch = pool.atomic_batch();
        batch.execute("SET LOCAL application_name = 'inside'", &[]);
        batch.query("SELECT current_setting('application_name')", &[]);
        let results = batch.run().await.unwrap();
        let inside: String = results[1].as_ref().unwrap().rows()[0].get(0);
        assert_eq!(inside, "inside");
        let row = pool
            .query_one("SELECT current_setting('application_name')", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), app);
    }
    assert_eq!(quarantined(&registry), 0.0);
}
