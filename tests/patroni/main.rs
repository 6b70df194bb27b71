//! pgpipe in front of the HA stack production teams run: a real
//! three-member Patroni 4.1 cluster of PostgreSQL nodes on etcd 3.4
//! (`synchronous_mode: true`), started by the test (`Patroni` in
//! `pgpipe-test-support`), with every member listed in the pool, and then
//! through HAProxy's read-write and read-only ports.
//!
//! Each test runs a load of writers (unique keys, no primary key, so a
//! write run twice would show as a duplicate) and readers against the pool
//! while Patroni changes leader, then checks what the callers saw against
//! what the new leader holds. One cluster at a time: the tests take turns.

mod load;

use std::time::{Duration, Instant};

use pgpipe::{Pool, PoolBuilder};
use pgpipe_test_support::{Patroni, notice, unique};

use load::Load;

/// One cluster on the machine at a time (three servers, three agents and
/// etcd already fill two cores).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Patroni's `ttl` and `loop_wait` in the rig.
const TTL: Duration = Duration::from_secs(20);
const LOOP_WAIT: Duration = Duration::from_secs(1);

fn cluster() -> Option<Patroni> {
    Patroni::start().expect("the Patroni cluster starts")
}

/// The pool a user would build over the cluster: every member in one URL,
/// writes waiting for a leader up to 30 s, a query bound so that a write
/// stuck on a demoted leader ends.
fn pool_over(url: &str) -> PoolBuilder {
    Pool::builder()
        .url(url)
        .max_size(4)
        .pipelining(true)
        .pool_name(unique("patroni"))
        .failover_wait(Duration::from_secs(30))
        .query_timeout(Duration::from_secs(10))
        .wait_timeout(Duration::from_secs(30))
}

/// `patronictl switchover` under load: no acknowledged write lost or run
/// twice, writes resume within 3 s of the new leader, and reads go on from
/// standbys throughout (none fails, no gap over 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_under_load_loses_no_write_and_reads_never_stop() {
    let _turn = SERIAL.lock().await;
    let Some(cluster) = cluster() else { return };
    let pool = pool_over(&cluster.multi_host_url()).build().unwrap();
    switchover_under_load(
        &cluster,
        &pool,
        (Duration::from_secs(3), Duration::from_secs(2)),
        "patroni switchover",
    )
    .await;
}

/// A switchover to the synchronous standby under [`Load`]; checks the
/// writes, that they resumed within `bounds.0` of the new leader, and that
/// reads never stopped for `bounds.1`.
async fn switchover_under_load(
    cluster: &Patroni,
    pool: &Pool,
    bounds: (Duration, Duration),
    what: &str,
) {
    let candidate = cluster.sync_standby().expect("a synchronous standby");
    let load = Load::start(pool, cluster).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let switched = Instant::now();
    tokio::task::block_in_place(|| cluster.switchover(candidate)).unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let outcome = load.stop().await;
    let promoted = outcome
        .promoted_at(candidate)
        .expect("the candidate was promoted");
    outcome.check_writes(&cluster.url(candidate)).await;
    let resumed = outcome.writes_resumed_after(promoted);
    assert!(
        resumed < bounds.0,
        "writes resumed {resumed:?} after the new leader"
    );
    let gap = outcome.check_reads(bounds.1);
    notice(&format!(
        "{what}: {}; promoted {:?} after the request, writes resumed {resumed:?} after the \
         promotion, longest gap between reads {gap:?}",
        outcome.summary(),
        promoted - switched
    ));
}

/// The leader's postgres killed (`SIGKILL` of its postmaster): Patroni
/// fails over to the synchronous standby (`primary_start_timeout: 0`); no
/// acknowledged write is lost or run twice, writes resume within `ttl +
/// loop_wait + 2 s` of the kill, and the old leader rejoins (`pg_rewind`)
/// as a standby that serves reads only once caught up: no read anywhere is
/// staler than `max_replica_lag` plus a check interval (and slack).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_postgres_killed_fails_over_and_the_old_leader_reads_only_once_caught_up() {
    let _turn = SERIAL.lock().await;
    let Some(cluster) = cluster() else { return };
    let pool = pool_over(&cluster.multi_host_url())
        .max_replica_lag(Duration::from_secs(1))
        .host_recheck(Duration::from_millis(500))
        .build()
        .unwrap();
    let old = cluster.leader().expect("a leader");
    let load = Load::start(&pool, &cluster).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = Instant::now();
    cluster.kill_postgres(old).unwrap();
    // The old leader rejoins: a streaming standby again.
    let rejoined = tokio::task::block_in_place(|| {
        let back = cluster.wait_for(Duration::from_secs(60), |c| c.answers(old, "/replica"));
        assert!(back, "the old leader never rejoined");
        Instant::now()
    });
    // Until it serves reads again (once caught up, within the lag bound),
    // with the load running; then a little more of it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows = pool
            .read()
            .query("SELECT inet_server_port()", &[])
            .await
            .unwrap();
        if rows[0].get::<_, i32>(0) == i32::from(cluster.port(old)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rejoined old leader never came back into read rotation"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let outcome = load.stop().await;
    let new = cluster.leader().expect("a new leader");
    assert_ne!(new, old, "the leader did not change");
    outcome.check_writes(&cluster.url(new)).await;
    let promoted = outcome
        .promoted_at(new)
        .expect("the new leader was promoted");
    let resumed = promoted + outcome.writes_resumed_after(promoted) - killed;
    assert!(
        resumed < TTL + LOOP_WAIT + Duration::from_secs(2),
        "writes resumed {resumed:?} after the kill"
    );
    outcome.check_reads(Duration::from_secs(3));
    outcome.check_staleness(Duration::from_millis(1000 + 500 + 1000));
    notice(&format!(
        "patroni leader's postgres killed: {}; new leader {:?} after the kill, writes resumed \
         {resumed:?} after the kill, old leader rejoined {:?} after it",
        outcome.summary(),
        promoted - killed,
        rejoined - killed
    ));
}

/// The leader's Patroni agent killed (`SIGKILL`; its postgres keeps
/// running as a primary, as when the agent crashes): after the leader key
/// expires a standby is promoted on a higher timeline; pgpipe writes only
/// there (the old primary, still writable, gets nothing acknowledged after
/// the promotion), and no acknowledged write is lost or run twice. Writes
/// sent to the old primary around the promotion wait for a synchronous
/// standby that has left, until `query_timeout` (2 s here) ends them as in
/// doubt: writes resume within `ttl + loop_wait + 2 s` plus that bound of
/// the kill. The agent started again demotes its postgres and rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_agent_killed_fails_over_after_its_key_expires_and_rejoins() {
    let _turn = SERIAL.lock().await;
    let Some(cluster) = cluster() else { return };
    let query_timeout = Duration::from_secs(2);
    let pool = pool_over(&cluster.multi_host_url())
        .query_timeout(query_timeout)
        .build()
        .unwrap();
    let old = cluster.leader().expect("a leader");
    let load = Load::start(&pool, &cluster).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = Instant::now();
    cluster.kill_agent(old).unwrap();
    let elected = tokio::task::block_in_place(|| {
        cluster.wait_for(TTL * 3, |c| c.leader().is_some_and(|n| n != old))
    });
    assert!(elected, "no new leader");
    let new = cluster.leader().expect("the new leader");
    tokio::time::sleep(Duration::from_secs(8)).await;
    let outcome = load.stop().await;
    outcome.check_writes(&cluster.url(new)).await;
    let promoted = outcome
        .promoted_at(new)
        .expect("the new leader was promoted");
    let resumed = outcome.writes_resumed_after(promoted);
    let since_kill = promoted + resumed - killed;
    assert!(
        since_kill < TTL + LOOP_WAIT + Duration::from_secs(2) + query_timeout,
        "writes resumed {since_kill:?} after the kill"
    );
    outcome.check_reads(Duration::from_secs(3));
    // Nothing acknowledged after the promotion is on the old primary.
    let stray = outcome.acknowledged_on(&cluster.url(old), promoted).await;
    assert_eq!(
        stray, 0,
        "writes acknowledged after the promotion are on the old primary"
    );
    cluster.start_agent(old).unwrap();
    let rejoined = tokio::task::block_in_place(|| {
        cluster.wait_for(Duration::from_secs(60), |c| c.answers(old, "/replica"))
    });
    assert!(rejoined, "the old leader never rejoined as a standby");
    notice(&format!(
        "patroni leader's agent killed: {}; new leader {:?} after the kill, writes resumed \
         {resumed:?} after the promotion ({since_kill:?} after the kill)",
        outcome.summary(),
        promoted - killed
    ));
}

/// The leader frozen (issue #47): its postgres (postmaster and every
/// backend) and its Patroni agent stopped with `SIGSTOP`, sockets open,
/// until Patroni promotes another member after `ttl`, and well after; then
/// thawed. Writes waiting for the frozen leader move to the new one the
/// moment the pool elects it: the first is acknowledged within 2 s of the
/// promotion; no write call outlives its own bounds (`failover_wait` and
/// `wait_timeout` 60 s, `query_timeout` 3 s, as an operator's pool would
/// have); no acknowledged write is lost or run twice (Patroni 4: the
/// thawed leader finds the key taken, demotes itself and rejoins as a
/// standby, where Debian's 3.0.2 could take the key back and have the
/// new leader's writes rewound away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_hands_its_waiting_writes_to_the_new_one_when_it_is_promoted() {
    let _turn = SERIAL.lock().await;
    let Some(cluster) = cluster() else { return };
    let bound = Duration::from_secs(60);
    let pool = pool_over(&cluster.multi_host_url())
        .failover_wait(bound)
        .wait_timeout(bound)
        .query_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let old = cluster.leader().expect("a leader");
    let load = Load::start(&pool, &cluster).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let frozen = Instant::now();
    cluster.freeze(old).unwrap();
    let elected = tokio::task::block_in_place(|| {
        cluster.wait_for(TTL * 3, |c| c.leader().is_some_and(|n| n != old))
    });
    if !elected {
        cluster.thaw(old).unwrap();
    }
    assert!(
        elected,
        "no new leader while the old one was frozen; {}",
        cluster.log_tails()
    );
    let new = cluster.leader().expect("the new leader");
    let elected = frozen.elapsed();
    // Frozen well past the promotion, then thawed: it must not take the
    // leader key back.
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.thaw(old).unwrap();
    let rejoined = tokio::task::block_in_place(|| {
        cluster.wait_for(Duration::from_secs(90), |c| c.answers(old, "/replica"))
    });
    assert!(
        rejoined,
        "the thawed leader never rejoined as a standby; {}",
        cluster.log_tails()
    );
    let rejoined = frozen.elapsed();
    assert_eq!(
        cluster.leader(),
        Some(new),
        "the thawed leader took the key back"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let outcome = load.stop().await;
    let stopped = frozen.elapsed();
    outcome.check_writes(&cluster.url(new)).await;
    let promoted = outcome
        .promoted_at(new)
        .expect("the new leader was promoted");
    let resumed = outcome.writes_resumed_after(promoted);
    assert!(
        resumed < Duration::from_secs(2),
        "writes resumed {resumed:?} after the promotion"
    );
    notice(&format!(
        "frozen leader: elected {elected:?}, rejoined {rejoined:?}, load stopped {stopped:?}, \
         checked {:?} after the freeze",
        frozen.elapsed()
    ));
    let gap = outcome.check_reads(Duration::from_secs(3));
    let longest = outcome.longest_write();
    assert!(
        longest < bound + Duration::from_secs(5),
        "a write took {longest:?}, past its own bounds"
    );
    notice(&format!(
        "patroni leader frozen: {}; new leader {:?} after the freeze, writes resumed {resumed:?} \
         after the promotion, longest write {longest:?}, longest gap between reads {gap:?}",
        outcome.summary(),
        promoted - frozen
    ));
}

/// The second topology: the pool lists HAProxy's read-write port as its
/// primary and its read-only port as its replica, HAProxy choosing by
/// Patroni's REST API. A switchover under the same load: no acknowledged
/// write lost or run twice, writes resume and reads go on within 4 s: the
/// pool sees the cluster only through HAProxy, which takes up to 1 s of
/// checks (500 ms, two failures) to mark a server down or up, and holds a
/// connection while its backend has no server up for up to `timeout
/// connect` (2 s) before it drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_haproxy_a_switchover_loses_no_write_and_reads_go_on() {
    let _turn = SERIAL.lock().await;
    let Some(mut cluster) = cluster() else { return };
    let Some(ports) = cluster.haproxy().expect("haproxy starts") else {
        return;
    };
    let pool = pool_over(&format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
        ports.read_write, ports.read_only
    ))
    .build()
    .unwrap();
    switchover_under_load(
        &cluster,
        &pool,
        (Duration::from_secs(4), Duration::from_secs(4)),
        "patroni switchover through haproxy",
    )
    .await;
}
