//! A frozen primary (issue #47): its postmaster and every backend stopped
//! with SIGSTOP, its sockets left open, a standby promoted. Writes that
//! wait for the frozen one move to the new primary as soon as it is
//! elected, not at their `connect_timeout` or `wait_timeout`: queries, and
//! what waits for a connection of its own (`get()`, `begin()`, an atomic
//! batch).

use std::time::{Duration, Instant};

use pgpipe::{Error, ErrorKind, Executor, Pool};
use pgpipe_test_support::{Cluster, ReplicaSet, connect, unique};

/// Far above what the move takes (a check round or two after the
/// promotion), far below the timeouts the writes would otherwise wait
/// out (`connect_timeout` 60 s here).
const MOVED_WITHIN: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_waiting_for_a_frozen_primary_move_to_the_new_one_when_it_is_elected() {
    let set = ReplicaSet::start(1).expect("a primary and a standby start");
    let pool = Pool::builder()
        .primary(&set.primary.url())
        .replicas([set.standbys[0].url().as_str()])
        .max_size(4)
        .pipelining(true)
        .pool_name(unique("frozen"))
        .host_recheck(Duration::from_millis(250))
        .query_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(60))
        .failover_wait(Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let table = unique("frozen");
    // Made on a plain connection: DDL through the pool leaves nothing
    // proven until the lane reads its catalog again, which a primary frozen
    // a moment later would not let it do (its writes would run alone).
    connect(&set.primary.url())
        .await
        .unwrap()
        .batch_execute(&format!("CREATE TABLE {table} (id int8 PRIMARY KEY)"))
        .await
        .unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    pool.execute(&insert, &[&0i64]).await.unwrap();
    // The standby has the table before the primary freezes.
    let standby = connect(&set.standbys[0].url()).await.unwrap();
    let replayed = Instant::now() + Duration::from_secs(30);
    let count = format!("SELECT count(*) FROM {table}");
    while standby
        .query_one(&count, &[])
        .await
        .map(|r| r.get::<_, i64>(0))
        .ok()
        != Some(1)
    {
        assert!(
            Instant::now() < replayed,
            "the standby never replayed the table"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    set.primary.pause().expect("the primary freezes");
    let thaw = Thaw(&set.primary);
    // Sent onto the frozen primary's open connection: past query_timeout
    // they fail saying they may have run.
    let sent: Vec<_> = (1..=4i64)
        .map(|id| {
            let (pool, insert) = (pool.clone(), insert.clone());
            tokio::spawn(async move { pool.execute(&insert, &[&id]).await })
        })
        .collect();
    for write in sent {
        let e = write.await.unwrap().unwrap_err();
        assert!(e.may_have_run(), "{e}");
    }
    // Now no connection to the frozen primary takes work: these wait for
    // one (its connect hangs).
    let waiting: Vec<_> = (100..108i64)
        .map(|id| {
            let (pool, insert) = (pool.clone(), insert.clone());
            tokio::spawn(async move { (id, pool.execute(&insert, &[&id]).await) })
        })
        .collect();
    let exclusive = [
        tokio::spawn(through_get(pool.clone(), insert.clone(), 300)),
        tokio::spawn(through_begin(pool.clone(), insert.clone(), 301)),
        tokio::spawn(through_atomic_batch(pool.clone(), insert.clone(), 302)),
    ];
    tokio::time::sleep(Duration::from_millis(500)).await;
    set.standbys[0].promote().expect("the standby is promoted");
    let promoted = Instant::now();
    for write in waiting {
        let (id, result) = tokio::time::timeout(MOVED_WITHIN, write)
            .await
            .expect("a write waited for the frozen primary past the new one's election")
            .unwrap();
        match result {
            Ok(written) => assert_eq!(written, 1),
            Err(e) => panic!("write {id} failed: {e} ({:?})", e.kind()),
        }
    }
    for write in exclusive {
        let (id, result) = tokio::time::timeout(MOVED_WITHIN, write)
            .await
            .expect("a checkout waited for the frozen primary past the new one's election")
            .unwrap();
        if let Err(e) = result {
            panic!(
                "write {id} on a connection of its own failed: {e} ({:?})",
                e.kind()
            );
        }
    }
    let moved_after = promoted.elapsed();
    drop(thaw);
    // Each moved write is on the new primary, once.
    let new_primary = connect(&set.standbys[0].url()).await.unwrap();
    let ids: Vec<i64> = new_primary
        .query(
            &format!("SELECT id FROM {table} WHERE id >= 100 ORDER BY id"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, (100..108).chain(300..303).collect::<Vec<_>>());
    // New writes go there too.
    pool.execute(&insert, &[&200i64]).await.unwrap();
    let e = pool.execute(&insert, &[&200i64]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Db, "the new primary has it: {e}");
    pgpipe_test_support::notice(&format!(
        "writes waiting for a frozen primary moved to the new one {moved_after:?} after the \
         promotion"
    ));
}

async fn through_get(pool: Pool, insert: String, id: i64) -> (i64, Result<(), Error>) {
    let written = async {
        let conn = pool.get().await?;
        conn.execute(&insert, &[&id]).await.map(drop)
    };
    (id, written.await)
}

async fn through_begin(pool: Pool, insert: String, id: i64) -> (i64, Result<(), Error>) {
    let written = async {
        let tx = pool.begin().await?;
        tx.execute(&insert, &[&id]).await?;
        tx.commit().await
    };
    (id, written.await)
}

async fn through_atomic_batch(pool: Pool, insert: String, id: i64) -> (i64, Result<(), Error>) {
    let written = async {
        let mut batch = pool.atomic_batch();
        batch.execute(&insert, &[&id]);
        batch.run().await?.into_iter().try_for_each(|r| r.map(drop))
    };
    (id, written.await)
}

/// Resumes a frozen server however the test ends, so that it can be
/// stopped.
struct Thaw<'a>(&'a Cluster);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        let _ = self.0.resume();
    }
}
