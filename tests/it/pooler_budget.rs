//! The head-of-line budget behind a transaction pooler (issue #42): there
//! each shared statement carries the budget in a transaction block of its
//! own, so a row-lock wait stalls no neighbour through PgBouncer either,
//! and the budget never reaches another client of the pooler.
//!
//! Checked as `blocking` checks a direct connection: by what happened on
//! the server, never by how long a call took.

use std::time::Duration;

use pgpipe::{Pool, Pooler};
use pgpipe_test_support::{Pgbouncer, admin, connect};
use prometheus::Registry;

use crate::blocking::{echoes, evicted, hold_row, until_evicted, until_waiting_on_lock};
use crate::support::{drop_table, scratch_table, server_addr};

/// A PgBouncer in transaction mode with room for the blocked statement's
/// server connection and the neighbours' (`binary`: another than Debian's).
fn bouncer(binary: Option<String>) -> Option<Pgbouncer> {
    let mut builder = Pgbouncer::builder(&server_addr())
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "4");
    if let Some(binary) = binary {
        builder = builder
            .binary(binary)
            .setting("max_prepared_statements", "200");
    }
    builder.start().expect("PgBouncer starts")
}

/// While another session holds a row: one task's `UPDATE` of it through the
/// pooler waits, is stopped at the budget and runs again alone; the echo
/// queries of 16 tasks go on meanwhile; the update runs once when the row
/// is free; and a plain client of the same pooler never sees the budget.
async fn a_row_lock_wait_through(bouncer: &Pgbouncer, pooler: Pooler) {
    let table = scratch_table("hol_pooler", "id int PRIMARY KEY, v int").await;
    let registry = Registry::new();
    let pool = Pool::builder()
        .url(&bouncer.url())
        .max_size(4)
        .pipelining(true)
        .pooler(pooler)
        .registry(&registry)
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
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
    echoes(&pool, 256).await;
    until_evicted(&registry, 1.0).await;
    until_waiting_on_lock(&watcher, &update).await;
    // Another client of the pooler, on whichever server connection it is
    // given: the budget ended with each statement's own transaction.
    let other = connect(&bouncer.url()).await.unwrap();
    let (_, seen) = tokio::join!(echoes(&pool, 256), async {
        let mut seen = Vec::new();
        for _ in 0..40 {
            let rows = other.simple_query("SHOW statement_timeout").await.unwrap();
            seen.extend(rows.iter().filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            }));
        }
        seen
    });
    assert!(
        seen.len() == 40 && seen.iter().all(|s| s == "0"),
        "the budget reached another client: {seen:?}"
    );
    assert!(!write.is_finished(), "the write waits for the row");
    assert_eq!(evicted(&registry), 1.0, "stopped once at the budget");
    holder.batch_execute("COMMIT").await.unwrap();
    assert_eq!(write.await.unwrap().unwrap(), 1);
    let v: i32 = pool
        .query_one(&format!("SELECT v FROM {table} WHERE id = 1"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, 11, "it ran once: the stopped run committed nothing");
    drop_table(&table).await;
}

/// PgBouncer 1.18 (Debian's): one query on the wire at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_1_18_a_row_lock_wait_stalls_no_neighbour() {
    let Some(bouncer) = bouncer(None) else { return };
    a_row_lock_wait_through(&bouncer, Pooler::pgbouncer_transaction((1, 18), 0)).await;
}

/// PgBouncer 1.21+ (CI: 1.24): pipelines and named statements tracked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_1_24_a_row_lock_wait_stalls_no_neighbour() {
    let Some(binary) = pgpipe_test_support::newer_pgbouncer(
        "through_pgbouncer_1_24_a_row_lock_wait_stalls_no_neighbour",
    ) else {
        return;
    };
    let bouncer = bouncer(Some(binary)).expect("the binary given");
    a_row_lock_wait_through(&bouncer, Pooler::pgbouncer_transaction((1, 24), 200)).await;
}
