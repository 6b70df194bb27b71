//! Past one server: a real primary and two real streaming standbys
//! (`pg_basebackup -R`, started by the test on free ports). Discovery,
//! routing by target, fallback, lag, read-your-writes, failover under
//! load, split brain, a writer name that moves to a reader, recovery
//! conflicts and a promotion under reads in flight.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgpipe::{Consistency, ErrorKind, Pool, PoolBuilder, ReplicaFallback, TargetSessionAttrs};
use pgpipe_test_support::{ReplicaSet, ReplicaSetBuilder, connect, unique};
use prometheus::Registry;

use crate::support::Scrape;

/// Starts a primary and two standbys (the server binaries are required:
/// the tests' own server comes from them too).
fn replica_set(setup: ReplicaSetBuilder) -> ReplicaSet {
    setup.start().expect("a primary and two standbys start")
}

fn label(set_member: &pgpipe_test_support::Cluster) -> String {
    set_member.addr()
}

/// A pool over the set: the primary, then the standbys.
fn pool_over(set: &ReplicaSet, registry: &Registry) -> PoolBuilder {
    let standbys: Vec<String> = set.standbys.iter().map(|s| s.url()).collect();
    Pool::builder()
        .primary(&set.primary.url())
        .replicas(standbys.iter().map(String::as_str))
        .max_size(4)
        .pipelining(true)
        .registry(registry)
        .pool_name(unique("replicas"))
        .wait_timeout(Duration::from_secs(10))
}

async fn server_port(rows: Vec<tokio_postgres::Row>) -> u16 {
    let port: i32 = rows[0].get(0);
    u16::try_from(port).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_finds_the_primary_in_any_order_and_spreads_reads_over_both_standbys() {
    let set = replica_set(ReplicaSet::builder(2));
    // A multi-host URL, standby first: the order says nothing about roles.
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/postgres",
        set.standbys[0].port(),
        set.primary.port(),
        set.standbys[1].port()
    );
    let registry = Registry::new();
    let pool = Pool::builder()
        .url(&url)
        .max_size(4)
        .pipelining(true)
        .registry(&registry)
        .pool_name(unique("discovery"))
        .build()
        .unwrap();
    for _ in 0..20 {
        let rows = pool
            .query("SELECT inet_server_port(), pg_is_in_recovery()", &[])
            .await
            .unwrap();
        assert_eq!(server_port(rows.clone()).await, set.primary.port());
        assert!(!rows[0].get::<_, bool>(1), "writes go to the primary");
    }
    let mut by_port: HashMap<u16, u32> = HashMap::new();
    let mut reads = Vec::new();
    for _ in 0..1000 {
        let pool = pool.clone();
        reads.push(tokio::spawn(async move {
            pool.read()
                .query("SELECT inet_server_port()", &[])
                .await
                .unwrap()
        }));
    }
    for read in reads {
        *by_port
            .entry(server_port(read.await.unwrap()).await)
            .or_default() += 1;
    }
    for standby in &set.standbys {
        let share = by_port.get(&standby.port()).copied().unwrap_or(0);
        assert!(
            share >= 300,
            "each standby takes at least 30% of the reads: {by_port:?}"
        );
    }
    assert_eq!(by_port.get(&set.primary.port()), None, "{by_port:?}");
    let scrape = Scrape::of(&registry);
    let role = |host: String, role: &str| {
        scrape.value("pgpipe_host_role", &[("host", &host), ("role", role)])
    };
    assert_eq!(role(label(&set.primary), "primary"), 1.0);
    assert_eq!(role(label(&set.standbys[0]), "standby"), 1.0);
    assert_eq!(role(label(&set.standbys[1]), "standby"), 1.0);
    assert_eq!(
        scrape.value("pgpipe_queries_routed_total", &[("route", "replica")]),
        1000.0
    );
    // A read is read-only wherever it lands: 25006 on a standby.
    let error = pool
        .read()
        .execute("CREATE TABLE never_here (x int)", &[])
        .await
        .unwrap_err();
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_with_reaches_each_target_and_reads_fall_back_or_fail_without_standbys() {
    let set = replica_set(ReplicaSet::builder(2));
    let registry = Registry::new();
    let pool = pool_over(&set, &registry).build().unwrap();
    let standbys = [set.standbys[0].port(), set.standbys[1].port()];
    let primary = set.primary.port();
    let reached = async |target: TargetSessionAttrs| -> (u16, bool) {
        let conn = pool.get_with(target).await.unwrap();
        let row = conn
            .query_one(
                "SELECT inet_server_port(), current_setting('transaction_read_only') = 'on'",
                &[],
            )
            .await
            .unwrap();
        (u16::try_from(row.get::<_, i32>(0)).unwrap(), row.get(1))
    };
    use TargetSessionAttrs as T;
    assert_eq!(reached(T::Any).await, (primary, false));
    assert_eq!(reached(T::ReadWrite).await, (primary, false));
    assert_eq!(reached(T::Primary).await, (primary, false));
    assert_eq!(reached(T::PreferPrimary).await, (primary, false));
    for target in [T::ReadOnly, T::Standby, T::PreferStandby] {
        let (port, read_only) = reached(target).await;
        assert!(standbys.contains(&port), "{target}: {port}");
        assert!(read_only, "{target}");
    }
    // Both standbys stop: roles are re-checked, reads fall back.
    for standby in &set.standbys {
        standby.stop("immediate").unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = pool.read().query("SELECT inet_server_port()", &[]).await;
        match rows {
            Ok(rows) if server_port(rows.clone()).await == primary => break,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            other => panic!("reads never fell back to the primary: {other:?}"),
        }
    }
    assert_eq!(
        reached(T::ReadOnly).await,
        (primary, true),
        "read-only on the primary"
    );
    assert_eq!(reached(T::PreferStandby).await, (primary, false));
    assert_eq!(reached(T::Any).await, (primary, false));
    let error = pool.get_with(T::Standby).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NoReplica, "{error}");
    // The fallback is read-only, as a standby would be.
    let error = pool
        .read()
        .execute("CREATE TABLE never_here (x int)", &[])
        .await
        .unwrap_err();
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION)
    );
    assert!(Scrape::of(&registry).value("pgpipe_route_fallbacks_total", &[]) >= 1.0);
    // With the fallback switched off, a read fails instead.
    let strict = pool_over(&set, &Registry::new())
        .replica_fallback(ReplicaFallback::Fail)
        .build()
        .unwrap();
    strict.query("SELECT 1", &[]).await.unwrap();
    let error = strict.read().query("SELECT 1", &[]).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NoReplica, "{error}");
    // The URL takes all six libpq values; pgpipe reads the key itself.
    let url = format!(
        "postgres://postgres@127.0.0.1:{primary}/postgres?target_session_attrs=prefer-standby"
    );
    let one = Pool::builder().url(&url).build().unwrap();
    let conn = one.get().await.unwrap();
    conn.query_one("SELECT 1", &[]).await.unwrap();
    let error = Pool::builder().url(&format!("{url}x")).build().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_standby_leaves_the_rotation_and_comes_back_and_an_idle_one_reads_zero_lag() {
    let set = replica_set(ReplicaSet::builder(2));
    let registry = Registry::new();
    let pool = pool_over(&set, &registry)
        .host_recheck(Duration::from_millis(250))
        .max_replica_lag(Duration::from_millis(500))
        .build()
        .unwrap();
    let table = unique("lag");
    pool.execute(
        &format!("CREATE TABLE {table} (id bigserial, at timestamptz)"),
        &[],
    )
    .await
    .unwrap();
    let (lagging, fresh) = (&set.standbys[0], &set.standbys[1]);
    let paused = connect(&lagging.url()).await.unwrap();
    paused
        .execute("SELECT pg_wal_replay_pause()", &[])
        .await
        .unwrap();
    // Writes go on; within one re-check plus a second, no read goes to the
    // paused standby, and none does for as long as it stays paused.
    let writing = Arc::new(AtomicU64::new(1));
    let writer = {
        let (pool, table, writing) = (pool.clone(), table.clone(), Arc::clone(&writing));
        tokio::spawn(async move {
            while writing.load(Ordering::Relaxed) == 1 {
                pool.execute(&format!("INSERT INTO {table} (at) VALUES (now())"), &[])
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(250 + 500 + 1000)).await;
    for _ in 0..200 {
        let port = server_port(
            pool.read()
                .query("SELECT inet_server_port()", &[])
                .await
                .unwrap(),
        )
        .await;
        assert_ne!(port, lagging.port(), "a read went to the paused standby");
    }
    let scrape = Scrape::of(&registry);
    let lag = scrape.value("pgpipe_replica_lag_seconds", &[("host", &label(lagging))]);
    assert!(lag > 0.5, "the paused standby lags: {lag}");
    assert!(scrape.value("pgpipe_replica_lag_bytes", &[("host", &label(lagging))]) > 0.0);
    // Replay resumes: it comes back into rotation.
    paused
        .execute("SELECT pg_wal_replay_resume()", &[])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let port = server_port(
            pool.read()
                .query("SELECT inet_server_port()", &[])
                .await
                .unwrap(),
        )
        .await;
        if port == lagging.port() {
            break;
        }
        assert!(Instant::now() < deadline, "the standby never came back");
    }
    // The primary goes idle: a caught-up standby reads zero lag however
    // long it idles (now() - pg_last_xact_replay_timestamp() would grow).
    writing.store(0, Ordering::Relaxed);
    writer.await.unwrap();
    assert!(set.wait_caught_up(Duration::from_secs(10)).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let scrape = Scrape::of(&registry);
    for standby in [lagging, fresh] {
        assert_eq!(
            scrape.value("pgpipe_replica_lag_seconds", &[("host", &label(standby))]),
            0.0,
            "{}",
            label(standby)
        );
        assert_eq!(
            scrape.value("pgpipe_replica_lag_bytes", &[("host", &label(standby))]),
            0.0
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_your_writes_always_finds_the_row_and_a_plain_read_does_not() {
    let set =
        replica_set(ReplicaSet::builder(2).standby_setting("recovery_min_apply_delay", "500ms"));
    let registry = Registry::new();
    let pool = pool_over(&set, &registry)
        .host_recheck(Duration::from_millis(250))
        .build()
        .unwrap();
    let table = unique("ryw");
    pool.execute(&format!("CREATE TABLE {table} (id int8 PRIMARY KEY)"), &[])
        .await
        .unwrap();
    assert!(set.wait_caught_up(Duration::from_secs(10)).await);
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let select = format!("SELECT id FROM {table} WHERE id = $1");
    let mut tasks = Vec::new();
    for task in 0..8i64 {
        let (pool, insert, select) = (pool.clone(), insert.clone(), select.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..250i64 {
                let id = task * 1_000_000 + i;
                let (n, token) = pool.execute_tracked(&insert, &[&id]).await.unwrap();
                assert_eq!(n, 1);
                let found = pool
                    .read_with(Consistency::AtLeast(token))
                    .query_opt(&select, &[&id])
                    .await
                    .unwrap();
                assert!(found.is_some(), "read-your-writes missed {id} ({token})");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // The control: a plain read right behind a write misses on a standby
    // that applies WAL half a second late.
    let mut missed = 0;
    for i in 0..50i64 {
        let id = 9_000_000 + i;
        pool.execute(&insert, &[&id]).await.unwrap();
        let read = pool.read().query_opt(&select, &[&id]).await;
        if read.unwrap().is_none() {
            missed += 1;
        }
    }
    assert!(
        missed > 0,
        "a plain read never missed: the test could not fail"
    );
    let token: pgpipe::WriteToken = pool.execute_tracked(&insert, &[&-1i64]).await.unwrap().1;
    assert_eq!(
        token.to_string().parse::<pgpipe::WriteToken>().unwrap(),
        token
    );
}
