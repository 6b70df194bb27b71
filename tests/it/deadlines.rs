//! A deadline for one call (`Pool::within`, issue #42 item 5): it replaces
//! the pool's `query_timeout` for that call only, on the primary, on reads
//! and on `slow()`; on the shared path the server enforces it once the
//! head-of-line budget has stopped the statement, so a write past it fails
//! saying it did not run, and never runs later.
//!
//! Checked by what the server holds afterwards, never by how long a call
//! took.

use std::time::Duration;

use pgpipe::ErrorKind;

use crate::blocking::echoes;
use crate::support::{app, builder, count_rows, drop_table, scratch_table};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_own_deadline_is_stopped_by_the_server_and_never_runs() {
    let table = scratch_table("within_deadline", "a int").await;
    // No pool-wide deadline: only the call's own.
    let pool = builder(&app("within_deadline"))
        .max_size(2)
        .pipelining(true)
        .build()
        .unwrap();
    echoes(&pool, 32).await;
    let insert = format!("INSERT INTO {table} SELECT 1 FROM pg_sleep(1.5)");
    let e = pool
        .within(Duration::from_millis(400))
        .execute(&insert, &[])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueryTimeout, "{e}");
    assert!(!e.may_have_run(), "the server stopped it: {e}");
    // Well past the sleep: it never ran later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(count_rows(&pool, &table).await, 0);
    // The pool's other calls keep no deadline: the same statement runs to
    // its end.
    assert_eq!(pool.execute(&insert, &[]).await.unwrap(), 1);
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_own_deadline_replaces_the_pools_on_every_handle() {
    let pool = builder(&app("within_longer"))
        .max_size(3)
        .pipelining(true)
        .query_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    const SLEEP: &str = "SELECT 'within_longer', pg_sleep(0.6)";
    let e = pool.query(SLEEP, &[]).await.unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::QueryTimeout,
        "the pool's deadline: {e}"
    );
    let longer = Duration::from_secs(30);
    pool.within(longer).query(SLEEP, &[]).await.unwrap();
    pool.slow().within(longer).query(SLEEP, &[]).await.unwrap();
    pool.read().within(longer).query(SLEEP, &[]).await.unwrap();
    let e = pool
        .read()
        .within(Duration::from_millis(100))
        .query(SLEEP, &[])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueryTimeout, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_deadline_is_a_config_error_and_sends_nothing() {
    let pool = builder(&app("within_zero"))
        .pipelining(true)
        .build()
        .unwrap();
    let e = pool
        .within(Duration::ZERO)
        .query_one("SELECT 1", &[])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(!e.may_have_run());
    assert_eq!(pool.status().size, 0, "nothing was opened for it");
}
