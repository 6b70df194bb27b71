//! Through a real PgBouncer 1.18 in transaction mode, with a proxy between
//! it and the pool that splits every write at random offsets (as a network
//! may deliver it) and observes the wire: every public path, mixed under
//! load, gets only its own answers, and no request group is written before
//! the previous group's `ReadyForQuery` (PgBouncer 1.18 may hand its server
//! to another client at that answer, so a group written earlier can run
//! partly on another client's server).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgpipe::{Executor, Pool, Pooler};
use pgpipe_proxy::Proxy;
use pgpipe_test_support::Pgbouncer;

fn upstream() -> String {
    super::support::server_addr()
}

/// PgBouncer in transaction mode with two servers, and a splitting proxy
/// in front of it; `None` outside CI when PgBouncer is missing.
fn rig() -> Option<(Pgbouncer, Proxy)> {
    let bouncer = Pgbouncer::builder(&upstream())
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .start()
        .expect("PgBouncer starts")?;
    let proxy = Proxy::builder(format!("127.0.0.1:{}", bouncer.port()))
        .split_writes(true)
        .realtime(false)
        .start()
        .unwrap();
    Some((bouncer, proxy))
}

fn pool(proxy: &Proxy, pipelining: bool) -> Pool {
    let url = format!(
        "postgres://postgres@{}/{}",
        proxy.addr(),
        pgpipe_test_support::database_name()
    );
    Pool::builder()
        .url(&url)
        .max_size(3)
        .pipelining(pipelining)
        .pooler(Pooler::pgbouncer_transaction((1, 18), 0))
        .wait_timeout(Duration::from_secs(30))
        .query_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Tallies of one run.
#[derive(Debug, Default)]
struct Tally {
    ok: AtomicU64,
    wrong: AtomicU64,
    unexpected: AtomicU64,
    samples: std::sync::Mutex<Vec<String>>,
}

impl Tally {
    fn check(&self, what: &str, want: i64, got: Result<i64, pgpipe::Error>) {
        match got {
            Ok(got) if got == want => {
                self.ok.fetch_add(1, Ordering::Relaxed);
            }
            Ok(got) => {
                self.wrong.fetch_add(1, Ordering::Relaxed);
                self.sample(format!("{what}: asked {want}, got {got}"));
            }
            Err(e) => {
                self.unexpected.fetch_add(1, Ordering::Relaxed);
                self.sample(format!("{what}: {e}"));
            }
        }
    }

    fn sample(&self, line: String) {
        let mut samples = self.samples.lock().unwrap();
        if samples.len() < 8 {
            samples.push(line);
        }
    }

    fn assert_clean(&self, proxy: &Proxy, min_ok: u64) {
        let (ok, wrong, unexpected) = (
            self.ok.load(Ordering::Relaxed),
            self.wrong.load(Ordering::Relaxed),
            self.unexpected.load(Ordering::Relaxed),
        );
        let early = proxy.stats().early_groups;
        let samples = self.samples.lock().unwrap();
        assert!(
            wrong == 0 && unexpected == 0 && early == 0 && ok >= min_ok,
            "ok {ok}, wrong {wrong}, unexpected {unexpected}, groups written before the \
             previous answer {early}: {samples:?}"
        );
    }
}

/// The SQL of an echo with a padding parameter: `id` back, and the pad's
/// length, so a misrouted answer shows.
const ECHO: &str = "SELECT $1::int8 + length($2::text) - length($2::text) AS id /* wire */";

/// A padding of 0-200 bytes, or every fourth time 16-64 KiB: a group large
/// enough to reach the pooler in many pieces.
fn pad(id: i64) -> String {
    let big = id % 4 == 3;
    "x".repeat(if big {
        16_384 * (1 + (id as usize % 4))
    } else {
        id as usize % 200
    })
}

async fn echo(db: &impl Executor, id: i64) -> Result<i64, pgpipe::Error> {
    let pad = pad(id);
    let rows = db.query(ECHO, &[&id, &pad]).await?;
    Ok(rows.first().map_or(-1, |r| r.get(0)))
}

/// One step of path `path` for the caller's `id`.
async fn step(pool: &Pool, path: u64, id: i64, tally: &Tally) {
    match path {
        0 => tally.check("query", id, echo(pool, id).await),
        1 => tally.check("read", id, echo(&pool.read(), id).await),
        2 | 3 => {
            let atomic = path == 3;
            let ids = [id, id + 1, id + 2];
            let pads: Vec<String> = ids.iter().map(|i| pad(*i)).collect();
            let mut batch = if atomic {
                pool.atomic_batch()
            } else {
                pool.batch()
            };
            for (i, pad) in ids.iter().zip(&pads) {
                batch.query(ECHO, &[i, pad]);
            }
            let what = if atomic { "atomic batch" } else { "batch" };
            match batch.run().await {
                Ok(results) => {
                    for (result, want) in results.into_iter().zip(ids) {
                        let got = result.map(|a| a.rows().first().map_or(-1, |r| r.get(0)));
                        tally.check(what, want, got);
                    }
                }
                Err(e) => tally.check(what, id, Err(e)),
            }
        }
        4 => {
            // A transaction dropped without commit: tokio-postgres queues
            // its ROLLBACK; the next query on the connection follows it.
            let mut conn = match pool.get().await {
                Ok(conn) => conn,
                Err(e) => return tally.check("get", id, Err(e)),
            };
            match conn.transaction().await {
                Ok(tx) => {
                    tally.check("transaction", id, echo(&tx, id).await);
                    drop(tx);
                }
                Err(e) => return tally.check("transaction", id, Err(e)),
            }
            tally.check(
                "after a dropped transaction",
                id + 1,
                echo(&conn, id + 1).await,
            );
        }
        5 => {
            let mut conn = match pool.get().await {
                Ok(conn) => conn,
                Err(e) => return tally.check("get", id, Err(e)),
            };
            tally.check("get", id, echo(&conn, id).await);
            match conn.transaction().await {
                Ok(tx) => {
                    tally.check("transaction", id + 1, echo(&tx, id + 1).await);
                    let end = if id % 2 == 0 {
                        tx.commit().await
                    } else {
                        tx.rollback().await
                    };
                    tally.check("commit or rollback", id, end.map(|()| id));
                }
                Err(e) => tally.check("transaction", id, Err(e)),
            }
            tally.check("after a transaction", id + 2, echo(&conn, id + 2).await);
        }
        _ => match pool.begin().await {
            Ok(tx) => {
                tally.check("begin", id, echo(&tx, id).await);
                tally.check("commit", id, tx.commit().await.map(|()| id));
            }
            Err(e) => tally.check("begin", id, Err(e)),
        },
    }
}

/// `tasks` tasks for `for_how_long`, each going through every path in turn.
async fn mixed(pool: &Pool, tasks: u64, for_how_long: Duration, paths: &[u64]) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let deadline = Instant::now() + for_how_long;
    let paths: Arc<[u64]> = paths.into();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (pool, tally, paths) = (pool.clone(), Arc::clone(&tally), Arc::clone(&paths));
            tokio::spawn(async move {
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let id = ((task << 32) | (i * 4)) as i64;
                    let path = paths[((task + i) % paths.len() as u64) as usize];
                    // A hang is a failure too, not a test that never ends.
                    let step = step(&pool, path, id, &tally);
                    if tokio::time::timeout(Duration::from_secs(20), step)
                        .await
                        .is_err()
                    {
                        tally.unexpected.fetch_add(1, Ordering::Relaxed);
                        tally.sample(format!("path {path} hung for 20 s"));
                    }
                    i += 1;
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    tally
}

/// Every public path, pipelining on and then off, mixed under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_through_a_splitting_network_gets_its_own_answers() {
    let Some((_bouncer, proxy)) = rig() else {
        return;
    };
    for pipelining in [true, false] {
        let pool = pool(&proxy, pipelining);
        let tally = mixed(&pool, 12, Duration::from_secs(4), &[0, 1, 2, 3, 4, 5, 6]).await;
        tally.assert_clean(&proxy, 100);
        pool.close_and_wait(Duration::from_secs(5)).await;
    }
}

/// The `ROLLBACK` tokio-postgres queues for a dropped transaction goes out
/// one group at a time like everything else (on the old code the next
/// query went out before its answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_transactions_rollback_is_answered_before_the_next_query_goes_out() {
    let Some((_bouncer, proxy)) = rig() else {
        return;
    };
    let pool = pool(&proxy, true);
    let tally = mixed(&pool, 6, Duration::from_secs(3), &[4]).await;
    tally.assert_clean(&proxy, 50);
}

/// An isolated batch without pipelining writes one item's group at a time
/// (on the old code it wrote them all at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_batch_without_pipelining_sends_one_group_at_a_time() {
    let Some((_bouncer, proxy)) = rig() else {
        return;
    };
    let pool = pool(&proxy, false);
    let tally = mixed(&pool, 6, Duration::from_secs(3), &[2]).await;
    tally.assert_clean(&proxy, 50);
}
