//! Failover promises that `replicas.rs` does not reach: reads with no
//! primary elected, a primary that stops answering for a moment,
//! `failover_wait(0)`, two names for one server, and transactions and
//! atomic batches while the primary dies and a standby is promoted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pgpipe::{ErrorKind, Executor, Pool, PoolBuilder, TargetSessionAttrs};
use pgpipe_test_support::{ReplicaSet, connect, unique};
use prometheus::Registry;

use crate::support::Scrape;

fn pool_over(set: &ReplicaSet, registry: &Registry) -> PoolBuilder {
    let standbys: Vec<String> = set.standbys.iter().map(|s| s.url()).collect();
    Pool::builder()
        .primary(&set.primary.url())
        .replicas(standbys.iter().map(String::as_str))
        .max_size(4)
        .pipelining(true)
        .registry(registry)
        .pool_name(unique("failover"))
        .wait_timeout(Duration::from_secs(10))
}

/// With the primary gone and no other elected, reads carry on from both
/// standbys without an error, and with `failover_wait(0)` (the default) a
/// write fails at once with `NoPrimary`, naming what each host was seen as.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_primary_reads_go_on_from_both_standbys_and_writes_fail_at_once() {
    let set = ReplicaSet::start(2).expect("a primary and two standbys start");
    let registry = Registry::new();
    let pool = pool_over(&set, &registry)
        .host_recheck(Duration::from_millis(250))
        .build()
        .unwrap();
    pool.execute("SELECT 1", &[]).await.unwrap();
    set.primary.stop("immediate").unwrap();
    // The monitor finds out (at once: its connection broke).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let scrape = Scrape::of(&registry);
        let down = scrape.value(
            "pgpipe_host_role",
            &[("host", &set.primary.addr()), ("role", "down")],
        );
        if down == 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the primary was never seen down");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut ports = std::collections::HashSet::new();
    let until = Instant::now() + Duration::from_secs(2);
    let mut reads = 0;
    while Instant::now() < until {
        let rows = pool
            .read()
            .query("SELECT inet_server_port()", &[])
            .await
            .unwrap_or_else(|e| panic!("read {reads} with no primary failed: {e}"));
        ports.insert(rows[0].get::<_, i32>(0));
        reads += 1;
    }
    let standbys: std::collections::HashSet<i32> =
        set.standbys.iter().map(|s| i32::from(s.port())).collect();
    assert_eq!(ports, standbys, "reads did not spread over both standbys");
    for _ in 0..20 {
        let started = Instant::now();
        let error = pool.execute("SELECT 1", &[]).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::NoPrimary, "{error}");
        assert!(!error.may_have_run());
        assert!(error.to_string().contains("down"), "{error}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "failover_wait(0) waited {:?}",
            started.elapsed()
        );
    }
}

/// A primary that stops answering (every process `SIGSTOP`ped, so its
/// checks time out) keeps its role for a few rounds while no other host is
/// writable: writes sent meanwhile wait and succeed once it goes on, none
/// fails with `NoPrimary` (`failover_wait(0)`: there is no waiting for
/// another), and no change of primary is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_hangs_for_a_moment_keeps_its_role() {
    let set = ReplicaSet::start(1).expect("a primary and a standby start");
    let registry = Registry::new();
    let pool = pool_over(&set, &registry)
        .host_recheck(Duration::from_millis(300))
        .build()
        .unwrap();
    let table = unique("hangs");
    pool.execute(&format!("CREATE TABLE {table} (id int8)"), &[])
        .await
        .unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    set.primary.pause().unwrap();
    let paused = Instant::now();
    let mut writes = Vec::new();
    // Writes while it hangs, the last after a check has timed out (2 s).
    for (id, at) in [(1i64, 0u64), (2, 1000), (3, 2300), (4, 2600)] {
        tokio::time::sleep_until((paused + Duration::from_millis(at)).into()).await;
        let (pool, insert) = (pool.clone(), insert.clone());
        writes.push(tokio::spawn(
            async move { pool.execute(&insert, &[&id]).await },
        ));
    }
    tokio::time::sleep_until((paused + Duration::from_secs(3)).into()).await;
    set.primary.resume().unwrap();
    for write in writes {
        let result = tokio::time::timeout(Duration::from_secs(20), write)
            .await
            .expect("a write hung after the primary went on")
            .unwrap();
        assert_eq!(result.unwrap(), 1);
    }
    let scrape = Scrape::of(&registry);
    assert_eq!(scrape.value("pgpipe_primary_changes_total", &[]), 0.0);
    assert!(
        scrape.value(
            "pgpipe_host_checks_total",
            &[("host", &set.primary.addr()), ("outcome", "error")]
        ) >= 1.0,
        "no check of the primary timed out: the test could not fail"
    );
}

/// Two configured names for one server (the instance and a proxy in front
/// of it, as a writer endpoint and its instance) are one primary, not split
/// brain: writes go, and no conflict is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_names_for_one_server_are_one_primary() {
    let set = ReplicaSet::start(1).expect("a primary and a standby start");
    let proxy = pgpipe_proxy::Proxy::builder(set.primary.addr())
        .start()
        .unwrap();
    let registry = Registry::new();
    let url = format!(
        "postgres://postgres@{},{},{}/postgres",
        proxy.addr(),
        set.primary.addr(),
        set.standbys[0].addr()
    );
    let pool = Pool::builder()
        .url(&url)
        .max_size(2)
        .registry(&registry)
        .pool_name(unique("two_names"))
        .build()
        .unwrap();
    for _ in 0..20 {
        pool.execute("SELECT 1", &[]).await.unwrap();
    }
    let rows = pool
        .read()
        .query("SELECT inet_server_port()", &[])
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, i32>(0), i32::from(set.standbys[0].port()));
    let scrape = Scrape::of(&registry);
    assert_eq!(scrape.value("pgpipe_primary_conflicts_total", &[]), 0.0);
    assert_eq!(scrape.value("pgpipe_primary_changes_total", &[]), 0.0);
}

/// How each unit of the failover test ended.
#[derive(Debug, Default)]
struct Units {
    /// Committed, and when: both rows of the unit must be on the new
    /// primary.
    committed: Vec<(i64, Instant)>,
    /// Failed saying nothing ran: neither row may be there.
    not_run: Vec<i64>,
    in_doubt: u32,
    unexpected: Vec<String>,
}

/// Transactions from `begin()` and `begin_with(ReadWrite)` and atomic
/// batches while the primary is killed and a synchronous standby promoted:
/// each either commits (both of its rows on the new primary), fails saying
/// nothing ran (neither row there), or fails in doubt (`ConnectionLost`);
/// none hangs, and units commit again after the promotion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_and_atomic_batches_during_a_failover_commit_whole_or_not_at_all() {
    let set = ReplicaSet::builder(2)
        .primary_setting("synchronous_commit", "on")
        .start()
        .expect("a primary and two standbys start");
    set.synchronous("s1").await;
    let registry = Registry::new();
    let pool = pool_over(&set, &registry)
        .failover_wait(Duration::from_secs(10))
        .build()
        .unwrap();
    let table = unique("units");
    pool.execute(&format!("CREATE TABLE {table} (unit int8, part int)"), &[])
        .await
        .unwrap();
    let insert = Arc::new(format!("INSERT INTO {table} VALUES ($1, $2)"));
    let running = Arc::new(AtomicBool::new(true));
    let mut tasks = Vec::new();
    for task in 0..12i64 {
        let (pool, insert, running) = (pool.clone(), insert.clone(), running.clone());
        tasks.push(tokio::spawn(async move {
            let mut units = Units::default();
            let mut i = 0;
            while running.load(Ordering::Relaxed) {
                let unit = task * 1_000_000 + i;
                i += 1;
                let result = match task % 3 {
                    0 => transaction(&pool, &insert, unit, None).await,
                    1 => {
                        let target = Some(TargetSessionAttrs::ReadWrite);
                        transaction(&pool, &insert, unit, target).await
                    }
                    _ => {
                        let mut batch = pool.atomic_batch();
                        batch.execute(&insert, &[&unit, &1i32]);
                        batch.execute(&insert, &[&unit, &2i32]);
                        batch
                            .run()
                            .await
                            .and_then(|results| results.into_iter().try_for_each(|r| r.map(drop)))
                    }
                };
                match result {
                    Ok(()) => units.committed.push((unit, Instant::now())),
                    Err(e) if e.may_have_run() => units.in_doubt += 1,
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::ConnectionLost | ErrorKind::NoPrimary | ErrorKind::Connect
                        ) =>
                    {
                        units.not_run.push(unit);
                    }
                    Err(e) => units.unexpected.push(format!("{:?}: {e}", e.kind())),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            units
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    set.primary.stop("immediate").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    set.standbys[0].promote().unwrap();
    let promoted = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    running.store(false, Ordering::Relaxed);
    let mut all = Units::default();
    for task in tasks {
        let units = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a unit hung")
            .unwrap();
        all.committed.extend(units.committed);
        all.not_run.extend(units.not_run);
        all.in_doubt += units.in_doubt;
        all.unexpected.extend(units.unexpected);
    }
    assert!(
        all.unexpected.is_empty(),
        "unexpected: {:?}",
        &all.unexpected[..all.unexpected.len().min(5)]
    );
    let new_primary = connect(&set.standbys[0].url()).await.unwrap();
    let rows = new_primary
        .query(
            &format!("SELECT unit, count(*) FROM {table} GROUP BY unit"),
            &[],
        )
        .await
        .unwrap();
    let held: std::collections::HashMap<i64, i64> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    for (unit, _) in &all.committed {
        assert_eq!(
            held.get(unit),
            Some(&2),
            "committed unit {unit} is not whole"
        );
    }
    for unit in &all.not_run {
        assert_eq!(
            held.get(unit),
            None,
            "unit {unit} reported as not run is there"
        );
    }
    for (unit, parts) in &held {
        assert_eq!(*parts, 2, "unit {unit} is half there");
    }
    let resumed = all
        .committed
        .iter()
        .filter(|(_, at)| *at > promoted)
        .count();
    assert!(resumed > 0, "no unit committed after the promotion");
    pgpipe_test_support::notice(&format!(
        "units during a failover: {} committed ({resumed} after the promotion), {} not run, \
         {} in doubt",
        all.committed.len(),
        all.not_run.len(),
        all.in_doubt
    ));
}

async fn transaction(
    pool: &Pool,
    insert: &str,
    unit: i64,
    target: Option<TargetSessionAttrs>,
) -> Result<(), pgpipe::Error> {
    let tx = match target {
        Some(target) => pool.begin_with(target).await?,
        None => pool.begin().await?,
    };
    tx.execute(insert, &[&unit, &1i32]).await?;
    tx.execute(insert, &[&unit, &2i32]).await?;
    tx.commit().await
}
