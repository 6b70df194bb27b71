//! Through PgBouncer 1.24 (built by `.ci/install-pgbouncer-1.24`; the
//! binary named by `PGPIPE_PGBOUNCER_1_21`) beyond what `poolers.rs` runs
//! through it: session mode, and server connections killed under load in
//! transaction mode with named statements tracked
//! (`max_prepared_statements`): what was in flight fails saying it may
//! have run, nothing gets another caller's answer, and the pool heals.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgpipe::{Pool, Pooler};
use pgpipe_test_support::{Pgbouncer, admin, unique};

use super::poolers::{load, pool, upstream};

/// The newer PgBouncer, or `None` (skipped, outside CI) when unset.
fn binary() -> Option<String> {
    pgpipe_test_support::newer_pgbouncer("the PgBouncer 1.24 suite")
}

/// Session mode gives each client connection a server of its own: the
/// pool's full behaviour (named statements, 32 in flight) works through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_through_pgbouncer_1_24_pipelines_as_usual() {
    let Some(binary) = binary() else { return };
    let bouncer = Pgbouncer::builder(&upstream())
        .binary(binary)
        .setting("pool_mode", "session")
        .setting("default_pool_size", "8")
        .start()
        .expect("PgBouncer starts")
        .expect("the binary given");
    let through = pool(&bouncer.url(), Pooler::Session);
    let deadline = Instant::now() + Duration::from_secs(120);
    let report = load(&through, 1, 32, 20_000, deadline, false).await;
    report.assert_all_right(20_960);
}

/// How the load's calls ended.
#[derive(Debug, Default)]
struct Tally {
    ok: AtomicU64,
    /// Another caller's answer: must stay 0.
    wrong: AtomicU64,
    /// Failed saying the server connection was lost or could not be had.
    lost: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_connections_killed_under_load_give_no_wrong_answer_and_the_pool_heals() {
    let Some(binary) = binary() else { return };
    // A database of the test's own: its backends are all this bouncer's,
    // and only they are terminated.
    let database = unique("pgpipe_b124");
    let admin = admin().await;
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await
        .unwrap();
    let bouncer = Pgbouncer::builder(&upstream())
        .binary(binary)
        .database(&database)
        .setting("max_prepared_statements", "200")
        .start()
        .expect("PgBouncer starts")
        .expect("the binary given");
    let pool = Pool::builder()
        .url(&bouncer.url())
        .max_size(4)
        .pipelining(true)
        .pooler(Pooler::pgbouncer_transaction((1, 24), 200))
        .query_timeout(Duration::from_secs(5))
        .wait_timeout(Duration::from_secs(30))
        .pool_name(unique("b124_kills"))
        .build()
        .unwrap();
    let tally = Arc::new(Tally::default());
    let running = Arc::new(AtomicBool::new(true));
    let unexpected = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..32i64)
        .map(|task| {
            let (pool, tally, running, unexpected) = (
                pool.clone(),
                Arc::clone(&tally),
                Arc::clone(&running),
                Arc::clone(&unexpected),
            );
            tokio::spawn(async move {
                let mut i = 0i64;
                while running.load(Ordering::Relaxed) {
                    i += 1;
                    let id = task << 32 | i;
                    // Eight statement texts, named and tracked by PgBouncer.
                    let sql = format!("SELECT $1::int8, length($2::text) /* v{} */", i % 8);
                    let pad = "x".repeat((i % 300) as usize);
                    match pool.query_one(&sql, &[&id, &pad]).await {
                        Ok(row)
                            if row.get::<_, i64>(0) == id
                                && row.get::<_, i32>(1) as usize == pad.len() =>
                        {
                            tally.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => {
                            tally.wrong.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) if is_loss(&e) => {
                            tally.lost.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => unexpected
                            .lock()
                            .unwrap()
                            .push(format!("{:?}: {e}", e.kind())),
                    }
                }
            })
        })
        .collect();
    // Every 300 ms for 6 s, every server connection of the bouncer's.
    let mut killed = 0i64;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(300)).await;
        killed += admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&database],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
    }
    // Then calm: every call must succeed again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = tally.lost.load(Ordering::Relaxed);
    let ok_before = tally.ok.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    running.store(false, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let unexpected = std::mem::take(&mut *unexpected.lock().unwrap());
    let (ok, wrong, lost) = (
        tally.ok.load(Ordering::Relaxed),
        tally.wrong.load(Ordering::Relaxed),
        tally.lost.load(Ordering::Relaxed),
    );
    pgpipe_test_support::notice(&format!(
        "pgbouncer 1.24, {killed} server connections killed: {ok} right, {wrong} wrong, {lost} \
         lost, {} unexpected",
        unexpected.len()
    ));
    assert_eq!(wrong, 0, "answers given to the wrong caller");
    assert!(
        unexpected.is_empty(),
        "{:?}",
        &unexpected[..unexpected.len().min(5)]
    );
    assert!(killed > 0, "no server connection was killed");
    assert_eq!(lost, before, "calls still failing 2 s after the last kill");
    assert!(ok > ok_before, "no call succeeded after the kills");
    pool.close_and_wait(Duration::from_secs(5)).await;
    drop(bouncer);
    admin
        .batch_execute(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .await
        .unwrap();
}

/// A failure a killed server connection explains: lost (it may have run;
/// PgBouncer's `server conn crashed?` too), or no connection to be had.
fn is_loss(error: &pgpipe::Error) -> bool {
    use pgpipe::ErrorKind::{Connect, ConnectionLost};
    matches!(error.kind(), ConnectionLost | Connect)
}
