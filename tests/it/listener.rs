//! `pool.listener()`: notifications arrive; a terminated backend is
//! replaced, every `LISTEN` sent again and the gap reported; `unlisten`
//! stops delivery; hostile channel names stay one channel; a slow consumer
//! is told what it lost; a cut network is a gap too, and a reconnection
//! that fails is tried again at the next `recv`.

use std::time::Duration;

use pgpipe::{Event, Gap, Listener, Pool};
use pgpipe_test_support::{admin, unique};
use tokio_postgres::Client;

use crate::support::{app, builder, builder_via, proxy, server_addr};

/// Long enough for anything on a loaded test machine, short enough that a
/// listener that would wait forever fails the test.
const PATIENCE: Duration = Duration::from_secs(15);

async fn notify(admin: &Client, channel: &str, payload: &str) {
    admin
        .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
        .await
        .unwrap();
}

async fn next(listener: &mut Listener) -> Event {
    tokio::time::timeout(PATIENCE, listener.recv())
        .await
        .expect("an event within the patience")
        .expect("recv")
}

/// The next event, which must be a notification: its channel and payload.
async fn next_notification(listener: &mut Listener) -> (String, String) {
    match next(listener).await {
        Event::Notification(n) => (n.channel().to_owned(), n.payload().to_owned()),
        other => panic!("expected a notification, got {other:?}"),
    }
}

/// Nothing more arrives for a while.
async fn assert_quiet(listener: &mut Listener) {
    let more = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(more.is_err(), "nothing else arrives, got {more:?}");
}

fn pool(app: &str) -> Pool {
    builder(app).max_size(3).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_arrive_in_order_on_one_counted_connection() {
    let pool = pool(&app("listen"));
    let channel = unique("listen");
    let admin = admin().await;
    let mut listener = pool.listener();
    assert_eq!(pool.status().exclusive, 0, "nothing checked out before");
    listener.listen(&channel).await.unwrap();
    assert_eq!(
        pool.status().exclusive,
        1,
        "the listener holds one connection"
    );
    for payload in ["one", "two", "three"] {
        notify(&admin, &channel, payload).await;
    }
    for payload in ["one", "two", "three"] {
        assert_eq!(
            next_notification(&mut listener).await,
            (channel.clone(), payload.to_owned())
        );
    }
    assert_eq!(listener.reconnects(), 0);
    assert_eq!(listener.dropped(), 0);
    drop(listener);
    assert_eq!(pool.status().exclusive, 0, "dropped, it gave it back");
}

/// The listener's backend: the one session of this pool that ran a `LISTEN`
/// last.
async fn listener_pid(admin: &Client, app: &str) -> i32 {
    let rows = admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
             AND query LIKE 'LISTEN%'",
            &[&app],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "one listening backend");
    rows[0].get(0)
}

/// What this pool's one backend ran last.
async fn last_query(admin: &Client, app: &str) -> String {
    let rows = admin
        .query(
            "SELECT query FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "one backend");
    rows[0].get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_backend_is_replaced_its_listens_sent_again_and_the_gap_reported() {
    let app = app("listen_kill");
    let pool = pool(&app);
    let (first, second) = (unique("listen_kill_a"), unique("listen_kill_b"));
    let admin = admin().await;
    let mut listener = pool.listener();
    listener.listen(&first).await.unwrap();
    listener.listen(&second).await.unwrap();
    notify(&admin, &first, "before").await;
    assert_eq!(
        next_notification(&mut listener).await,
        (first.clone(), "before".to_owned())
    );

    let old = listener_pid(&admin, &app).await;
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&old])
        .await
        .unwrap();
    // The gap comes only once the new connection listens to both channels.
    assert_eq!(
        match next(&mut listener).await {
            Event::Gap(gap) => gap,
            other => panic!("expected the gap, got {other:?}"),
        },
        Gap::Reconnected
    );
    assert_eq!(listener.reconnects(), 1);
    let new = listener_pid(&admin, &app).await;
    assert_ne!(new, old, "a new backend");
    for channel in [&first, &second] {
        notify(&admin, channel, "after").await;
        assert_eq!(
            next_notification(&mut listener).await,
            (channel.clone(), "after".to_owned())
        );
    }
    assert_quiet(&mut listener).await;
    assert_eq!(pool.status().exclusive, 1, "still one connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlisten_stops_delivery_even_of_what_already_waits() {
    let app = app("unlisten");
    let pool = pool(&app);
    let (gone, kept) = (unique("unlisten_gone"), unique("unlisten_kept"));
    let admin = admin().await;
    let mut listener = pool.listener();
    listener.listen(&gone).await.unwrap();
    listener.listen(&kept).await.unwrap();
    notify(&admin, &gone, "early").await;
    notify(&admin, &kept, "early").await;
    // Both have (very likely) reached the listener's connection.
    tokio::time::sleep(Duration::from_millis(100)).await;
    listener.unlisten(&gone).await.unwrap();
    assert_eq!(listener.channels().collect::<Vec<_>>(), [kept.as_str()]);
    // And on the server: the listener's backend ran the UNLISTEN last.
    assert_eq!(
        last_query(&admin, &app).await,
        format!("UNLISTEN \"{gone}\"")
    );
    notify(&admin, &gone, "late").await;
    notify(&admin, &kept, "late").await;
    for payload in ["early", "late"] {
        assert_eq!(
            next_notification(&mut listener).await,
            (kept.clone(), payload.to_owned())
        );
    }
    assert_quiet(&mut listener).await;
    listener.unlisten_all().await.unwrap();
    assert_eq!(last_query(&admin, &app).await, "UNLISTEN *");
    notify(&admin, &kept, "none").await;
    assert_quiet(&mut listener).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_channel_names_are_one_channel_and_inject_nothing() {
    let pool = pool(&app("listen_hostile"));
    let admin = admin().await;
    // Were the name pasted into SQL as is, the LISTEN would end at its
    // first quote and notify the probe.
    let probe = unique("p");
    let hostile = format!("{}\"; NOTIFY \"{probe}\"; --", unique("h"));
    assert!(hostile.len() <= 63, "{} bytes", hostile.len());
    let cased = unique("MiXeD Case");
    let mut listener = pool.listener();
    listener.listen(&probe).await.unwrap();
    listener.listen(&hostile).await.unwrap();
    listener.listen(&cased).await.unwrap();
    notify(&admin, &hostile, "hostile").await;
    notify(&admin, &cased, "cased").await;
    assert_eq!(
        next_notification(&mut listener).await,
        (hostile.clone(), "hostile".to_owned())
    );
    assert_eq!(
        next_notification(&mut listener).await,
        (cased.clone(), "cased".to_owned())
    );
    assert_quiet(&mut listener).await;
    let refused = listener.listen("nul\0byte").await.unwrap_err();
    assert_eq!(refused.kind(), pgpipe::ErrorKind::Params);
    let refused = listener.listen(&"x".repeat(64)).await.unwrap_err();
    assert_eq!(refused.kind(), pgpipe::ErrorKind::Params);
    assert_eq!(listener.channels().count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_is_told_how_many_were_dropped_and_where() {
    let pool = pool(&app("listen_slow"));
    let channel = unique("listen_slow");
    let admin = admin().await;
    let mut listener = pool.listener();
    listener.listen(&channel).await.unwrap();
    // 1100 at one commit; the listener keeps 1024, so the oldest 76 go.
    admin
        .execute(
            "SELECT pg_notify($1, g::text) FROM generate_series(1, 1100) g",
            &[&channel],
        )
        .await
        .unwrap();
    tokio::time::timeout(PATIENCE, async {
        while listener.dropped() < 76 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the notifications arrive");
    assert!(matches!(
        next(&mut listener).await,
        Event::Gap(Gap::Overflow { dropped: 76 })
    ));
    for expected in 77..=1100 {
        let (_, payload) = next_notification(&mut listener).await;
        assert_eq!(payload, expected.to_string());
    }
    assert_eq!(listener.dropped(), 76);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_pool_ends_recv_and_gives_the_connection_back() {
    let pool = pool(&app("listen_close"));
    let mut listener = pool.listener();
    listener.listen(&unique("listen_close")).await.unwrap();
    let waiting = tokio::spawn(async move { (listener.recv().await, listener) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(pool.close_and_wait(PATIENCE).await, "nothing held on");
    let (result, mut listener) = waiting.await.unwrap();
    assert_eq!(result.unwrap_err().kind(), pgpipe::ErrorKind::Closed);
    assert_eq!(
        listener.recv().await.unwrap_err().kind(),
        pgpipe::ErrorKind::Closed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_network_is_a_gap_and_a_failed_reconnect_is_tried_again() {
    let proxy = proxy(Duration::ZERO);
    let pool = builder_via(&proxy, &app("listen_cut"))
        .max_size(3)
        .build()
        .unwrap();
    let channel = unique("listen_cut");
    let admin = admin().await;
    let mut listener = pool.listener();
    listener.listen(&channel).await.unwrap();
    notify(&admin, &channel, "before").await;
    assert_eq!(next_notification(&mut listener).await.1, "before");

    // The network goes, and for now nothing answers where it went.
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = nowhere.local_addr().unwrap().to_string();
    drop(nowhere);
    proxy.set_upstream(&gone).unwrap();
    proxy.cut();
    let failed = tokio::time::timeout(PATIENCE, listener.recv())
        .await
        .expect("recv gives up on this attempt")
        .expect_err("no server to reconnect to");
    assert_eq!(failed.kind(), pgpipe::ErrorKind::Connect, "{failed}");
    assert_eq!(listener.reconnects(), 0);

    // It comes back: the next recv reconnects, listens again, says so.
    proxy.set_upstream(&server_addr()).unwrap();
    assert!(matches!(
        next(&mut listener).await,
        Event::Gap(Gap::Reconnected)
    ));
    assert_eq!(listener.reconnects(), 1);
    notify(&admin, &channel, "after").await;
    assert_eq!(
        next_notification(&mut listener).await,
        (channel.clone(), "after".to_owned())
    );
}
