//! What PostgreSQL 17 and 18 changed for a shared session (issue #44), on
//! throwaway clusters of each (`.ci/install-postgres-majors`):
//!
//! - limits a role may set that end the *session*, not a statement
//!   (`transaction_timeout`, 17+; `idle_session_timeout`, 14+): on a shared
//!   connection they would fail every neighbour in flight, or close the
//!   connection between two queries, so the pool turns them off there;
//! - 18 reports `search_path` (a `ParameterStatus`): a change that user
//!   code makes is seen on the wire, and quarantines the connection.

use std::time::Duration;

use pgpipe::Pool;
use pgpipe_test_support::{Cluster, major_bin};
use prometheus::Registry;

use crate::support::Scrape;

/// A throwaway cluster of `major` and a superuser connection to it; `None`
/// (outside CI) when that major is not installed.
async fn cluster_of(major: u32) -> Option<(Cluster, tokio_postgres::Client)> {
    let cluster = Cluster::builder()
        .bin(major_bin(major)?)
        .start()
        .expect("cluster starts");
    let (admin, connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    Some((cluster, admin))
}

async fn on_major(major: u32) {
    let Some((cluster, admin)) = cluster_of(major).await else {
        return;
    };
    let version: String = admin
        .query_one("SHOW server_version", &[])
        .await
        .unwrap()
        .get(0);
    assert!(version.starts_with(&major.to_string()), "{version}");
    admin
        .batch_execute(
            "CREATE ROLE limited LOGIN; \
             ALTER ROLE limited SET transaction_timeout = '300ms'; \
             ALTER ROLE limited SET idle_session_timeout = '300ms'",
        )
        .await
        .unwrap();
    let url = cluster.url().replace("postgres@", "limited@");
    // The budget off: the statement below must outlast transaction_timeout
    // on the shared connection (with it, it would be stopped at 100 ms and
    // run alone, which hides the limit).
    let pool = Pool::builder()
        .url(&url)
        .max_size(2)
        .pipelining(true)
        .head_of_line_budget(None)
        .build()
        .unwrap();
    let pid: i32 = pool
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    // A statement longer than transaction_timeout, neighbours pipelined
    // behind it: none of them fails.
    let slow = pool.query("SELECT pg_sleep(0.6)", &[]);
    let echoes = async {
        let mut answered = 0;
        for i in 0..50i64 {
            let row = pool.query_one("SELECT $1::int8", &[&i]).await.unwrap();
            assert_eq!(row.get::<_, i64>(0), i);
            answered += 1;
        }
        answered
    };
    let (slow, answered) = tokio::join!(slow, echoes);
    slow.expect("transaction_timeout did not end the shared session");
    assert_eq!(answered, 50);
    // Idle past idle_session_timeout: the same session still serves.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let again: i32 = pool
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(again, pid, "idle_session_timeout ended the shared session");
    // A checkout keeps the role's limits: the session is the caller's.
    let conn = pool.get().await.unwrap();
    let limit: String = conn
        .query_one("SHOW transaction_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(limit, "300ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_and_idle_session_timeouts_never_end_a_shared_session_on_17() {
    on_major(17).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_and_idle_session_timeouts_never_end_a_shared_session_on_18() {
    on_major(18).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_18_a_search_path_changed_by_user_code_quarantines_its_connection() {
    let Some((cluster, admin)) = cluster_of(18).await else {
        return;
    };
    admin
        .batch_execute("CREATE SCHEMA elsewhere")
        .await
        .unwrap();
    let registry = Registry::new();
    let pool = Pool::builder()
        .url(&cluster.url())
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    let quarantined = || {
        Scrape::of(&registry).value(
            "pgpipe_pipeline_quarantined_total",
            &[("reason", "session_state")],
        )
    };
    let path = || async {
        pool.query_one("SHOW search_path", &[])
            .await
            .unwrap()
            .get::<_, String>(0)
    };
    let default = path().await;
    assert_eq!(quarantined(), 0.0);
    // Code the guard cannot prove runs alone (#43): only a function
    // created after the lane's last check of its catalog, under a proven
    // built-in's name, reaches the shared path. A second of quiet, and no
    // check is under way.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    admin
        .batch_execute(
            "CREATE FUNCTION public.initcap(integer) RETURNS int LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM set_config('search_path', 'elsewhere', false); RETURN 1; END $$",
        )
        .await
        .unwrap();
    pool.query("SELECT initcap(1)", &[]).await.unwrap();
    // The server reported the change before the function's answer.
    assert_eq!(quarantined(), 1.0, "the reported search_path was not seen");
    for _ in 0..3 {
        assert_eq!(
            path().await,
            default,
            "a shared query saw the changed search_path"
        );
    }
}
