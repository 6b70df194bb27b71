//! The application's hooks, as deadpool-postgres has them: `post_create`
//! once per connection, `pre_recycle` and `post_recycle` around each
//! recycling; an `Err` refuses the connection. What the server sees
//! (backends, settings) is the evidence.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use pgpipe::ErrorKind;

use crate::support::{app, builder};

async fn backend(pool: &pgpipe::Pool) -> i32 {
    let conn = pool.get().await.unwrap();
    conn.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_create_runs_once_per_connection_and_can_refuse_it() {
    let created = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&created);
    let pool = builder(&app("hook_create"))
        .max_size(2)
        .post_create(move |client| {
            let seen = Arc::clone(&seen);
            Box::pin(async move {
                client.batch_execute("SELECT 1").await?;
                seen.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
        })
        .build()
        .unwrap();
    for _ in 0..5 {
        backend(&pool).await;
    }
    assert_eq!(created.load(Ordering::SeqCst), pool.status().size);
    assert_eq!(created.load(Ordering::SeqCst), 1, "one connection, reused");

    let refusing = builder(&app("hook_refuse"))
        .max_size(1)
        .post_create(|_| Box::pin(async { Err("not this server".into()) }))
        .build()
        .unwrap();
    let e = refusing.query("SELECT 1", &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
    assert!(e.to_string().contains("not this server"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycle_hooks_run_around_the_reset_and_a_refusal_replaces_the_connection() {
    // post_recycle sees the session after the pool's reset: the last
    // user's SET is gone by then.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let pool = builder(&app("hook_recycle"))
        .max_size(1)
        .post_recycle(move |client| {
            let record = Arc::clone(&record);
            Box::pin(async move {
                let row = client
                    .query_one("SELECT current_setting('work_mem')", &[])
                    .await?;
                record.lock().unwrap().push(row.get::<_, String>(0));
                Ok(())
            })
        })
        .build()
        .unwrap();
    let default: String = pool
        .query_one("SELECT current_setting('work_mem')", &[])
        .await
        .unwrap()
        .get(0);
    let conn = pool.get().await.unwrap();
    conn.batch_execute("SET work_mem = '7MB'").await.unwrap();
    drop(conn);
    let _conn = pool.get().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "post_recycle ran");
    assert!(seen.iter().all(|w| *w == default), "{seen:?} vs {default}");

    // pre_recycle refusing: the connection is closed and a new one taken.
    let pool = builder(&app("hook_pre"))
        .max_size(1)
        .pre_recycle(|_| Box::pin(async { Err("retire it".into()) }))
        .build()
        .unwrap();
    let first = backend(&pool).await;
    let second = backend(&pool).await;
    assert_ne!(first, second, "the refused connection was replaced");
}
