//! Cancel requests through PgBouncer 1.18 leave it running. 1.18 exits
//! (`FATAL ... disconnect_client(): bad client state: 0`, pgbouncer#801,
//! fixed in 1.20) when a cancel request's client closes its socket, or
//! only its sending half, before the bouncer has passed the request on to
//! the server. pgpipe, like libpq, sends the request and then only waits
//! for the other end to close.

use std::time::Duration;

use pgpipe::{Executor, Pool, Pooler};
use pgpipe_test_support::{Pgbouncer, admin, unique};

use super::poolers::upstream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_requests_leave_pgbouncer_1_18_running() {
    let Some(bouncer) = Pgbouncer::builder(&upstream())
        .setting("pool_mode", "session")
        .setting("default_pool_size", "4")
        .start()
        .expect("PgBouncer starts")
    else {
        return;
    };
    let pool = Pool::builder()
        .url(&bouncer.url())
        .max_size(2)
        .pooler(Pooler::Session)
        .query_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let admin = admin().await;
    let sleep = format!("SELECT pg_sleep(30) /* {} */", unique("cancel_1_18"));
    // Each late statement is cancelled: the bouncer opens a server
    // connection of its own for the request, a window in which a client
    // that closed early makes it exit.
    for round in 0..30 {
        let conn = pool.get().await.unwrap_or_else(|e| {
            panic!("round {round}: {e}; the bouncer's log:\n{}", bouncer.log())
        });
        let late = Executor::query(&conn, &sleep, &[]).await;
        assert!(late.is_err(), "round {round}: the sleep was not stopped");
        drop(conn);
        bouncer.assert_up(&format!("round {round}"));
        // The server's word that the cancel landed: the backend stopped
        // sleeping (closing the connection instead would leave it asleep).
        let mut stopped = false;
        for _ in 0..100 {
            let asleep: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = $1",
                    &[&sleep],
                )
                .await
                .unwrap()
                .get(0);
            if asleep == 0 {
                stopped = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        assert!(
            stopped,
            "round {round}: the cancel did not reach the server"
        );
    }
    // Still there, for a new client too.
    let fresh = Pool::builder()
        .url(&bouncer.url())
        .max_size(1)
        .pooler(Pooler::Session)
        .build()
        .unwrap();
    let row = fresh.query_one("SELECT 1::int4", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
}
