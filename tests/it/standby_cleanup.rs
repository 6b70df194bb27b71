//! A session on a standby is cleaned like any other, and kept: the
//! cleanup the proof builds names nothing a server in recovery refuses
//! (it once asked `pg_replication_origin_session_is_setup()`, which
//! PostgreSQL refuses during recovery, so every standby connection whose
//! session needed cleaning was closed instead, found in the Patroni rig's
//! logs).

use std::time::Duration;

use pgpipe::{Pool, TargetSessionAttrs};
use pgpipe_test_support::{ReplicaSet, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_session_is_cleaned_and_kept_for_the_next_user() {
    let set = ReplicaSet::start(1).expect("a primary and a standby start");
    let pool = Pool::builder()
        .primary(&set.primary.url())
        .replicas([set.standbys[0].url().as_str()])
        .max_size(1)
        .pool_name(unique("standby_cleanup"))
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut pids = Vec::new();
    for round in 0..3 {
        let conn = pool.get_with(TargetSessionAttrs::Standby).await.unwrap();
        let row = conn
            .query_one(
                "SELECT pg_backend_pid(), current_setting('work_mem'), pg_is_in_recovery()",
                &[],
            )
            .await
            .unwrap();
        assert!(row.get::<_, bool>(2), "not on the standby");
        assert_ne!(
            row.get::<_, String>(1),
            "7MB",
            "round {round}: the last user's setting is still there"
        );
        pids.push(row.get::<_, i32>(0));
        conn.batch_execute("SET work_mem = '7MB'").await.unwrap();
    }
    assert!(
        pids.windows(2).all(|w| w[0] == w[1]),
        "the standby's session was closed instead of cleaned: backends {pids:?}"
    );
}
