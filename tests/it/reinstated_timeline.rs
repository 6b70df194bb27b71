//! Liveness after an HA manager reinstates a lower timeline (issue #47,
//! item 3): the standby promoted on a higher timeline is lost, then
//! rebuilt to follow the old primary, which kept its lower timeline. The
//! pool refuses the lower timeline while the higher one may still be
//! writable (down, or not yet shown to follow), and takes writes there
//! again once every server seen writable above it streams from it: the
//! servers say it is the only truth left.

use std::time::{Duration, Instant};

use pgpipe::{ErrorKind, Pool};
use pgpipe_test_support::{ReplicaSet, connect, unique};

/// Far above a few rounds of checks (`host_recheck` 250 ms) and the
/// rebuilt standby's first WAL, far below anything a caller waits out.
const REINSTATED_WITHIN: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_timeline_takes_writes_again_only_once_the_higher_one_follows_it() {
    let set = ReplicaSet::start(1).expect("a primary and a standby start");
    let (old, promoted) = (&set.primary, &set.standbys[0]);
    let pool = Pool::builder()
        .primary(&old.url())
        .replicas([promoted.url().as_str()])
        .max_size(2)
        .pipelining(true)
        .pool_name(unique("reinstated"))
        .host_recheck(Duration::from_millis(250))
        .failover_wait(Duration::from_millis(500))
        .build()
        .unwrap();
    let table = unique("reinstated");
    connect(&old.url())
        .await
        .unwrap()
        .batch_execute(&format!("CREATE TABLE {table} (id int8)"))
        .await
        .unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1) RETURNING inet_server_port()");
    let write = |id: i64| {
        let (pool, insert) = (pool.clone(), insert.clone());
        async move {
            pool.query(&insert, &[&id])
                .await
                .map(|rows| u16::try_from(rows[0].get::<_, i32>(0)).unwrap())
        }
    };
    assert_eq!(write(1).await.unwrap(), old.port());
    assert!(set.wait_caught_up(Duration::from_secs(30)).await);

    // The standby is promoted (timeline 2) while the old primary stays
    // writable on timeline 1: split brain, and the higher timeline wins.
    promoted.promote().unwrap();
    let deadline = Instant::now() + REINSTATED_WITHIN;
    while write(2).await.ok() != Some(promoted.port()) {
        assert!(
            Instant::now() < deadline,
            "the promoted standby never took writes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The higher timeline goes down: it may still be writable for all the
    // pool knows, so the lower one gets nothing.
    promoted.stop("immediate").unwrap();
    let refused_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < refused_until {
        let error = write(3).await.unwrap_err();
        assert!(
            matches!(
                error.kind(),
                ErrorKind::NoPrimary | ErrorKind::ConnectionLost | ErrorKind::Connect
            ),
            "{error}"
        );
    }

    // Rebuilt as a standby of the old primary, on its own address: it now
    // receives timeline 1, and the old primary takes writes again.
    tokio::task::block_in_place(|| promoted.rebuild_as_standby_of(old)).unwrap();
    let rebuilt = Instant::now();
    let mut id = 4;
    let port = loop {
        id += 1;
        match write(id).await {
            Ok(port) => break port,
            Err(e) => assert!(
                rebuilt.elapsed() < REINSTATED_WITHIN,
                "the lower timeline was never reinstated: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(port, old.port(), "the write went to the rebuilt standby");
    let on_old: i64 = connect(&old.url())
        .await
        .unwrap()
        .query_one(&format!("SELECT count(*) FROM {table} WHERE id >= 3"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(on_old, 1, "only the write after the reinstatement is there");
    pgpipe_test_support::notice(&format!(
        "lower timeline reinstated {:?} after its higher one was rebuilt to follow it",
        rebuilt.elapsed()
    ));
}
