//! The SQL guard reads what the server reads (#21, the lexical class): each
//! disguise below changes the session on a plain connection (the positive
//! control, against the real server), and the shared path refuses it
//! before anything is sent. A disguise the guard misread would have run on
//! a connection other tasks share.

use pgpipe::{ErrorKind, Executor, Pool};
use pgpipe_test_support::{connect, database_url};

use crate::support::{search_path, session_pid};

fn pool() -> Pool {
    Pool::builder()
        .url(&database_url())
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap()
}

/// Each SQL text, run on a plain connection (simple protocol, with the
/// session setting it needs), moves `search_path`; on the shared path it is
/// refused, and a later query there sees the path untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lexical_disguises_of_a_set_are_refused_and_really_are_sets() {
    let cases: [(&str, &str); 3] = [
        ("", "-- note\rSET search_path TO pg_catalog"),
        (
            "SET standard_conforming_strings = off",
            "SELECT 'x\\''; SET search_path TO pg_catalog; --'",
        ),
        (
            "",
            "UPDATE U&\"pg\\005Fsettings\" SET setting = 'pg_catalog' WHERE name = 'search_path'",
        ),
    ];
    let pool = pool();
    let before: String = pool
        .query_one("SHOW search_path", &[])
        .await
        .unwrap()
        .get(0);
    for (setup, sql) in cases {
        // The control: on a connection of its own it does change the path.
        let plain = connect(&database_url()).await.unwrap();
        if !setup.is_empty() {
            plain.batch_execute(setup).await.unwrap();
        }
        plain.batch_execute(sql).await.unwrap();
        assert_eq!(search_path(&plain).await, "pg_catalog", "control: {sql:?}");
        // The shared path refuses it.
        let err = pool.execute(sql, &[]).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAllowedOnShared, "{sql:?}: {err}");
        let after: String = pool
            .query_one("SHOW search_path", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(after, before, "{sql:?}");
    }
}

/// What no reset undoes is refused on the shared path: `setseed` (the next
/// task's `random()` would be predictable: shown on a plain connection)
/// and `LOAD`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_no_reset_undoes_is_refused() {
    // The control: after setseed and DISCARD ALL the sequence is the seeded
    // one, the same in two sessions.
    let mut draws = Vec::new();
    for _ in 0..2 {
        let client = connect(&database_url()).await.unwrap();
        client.batch_execute("SELECT setseed(0.25)").await.unwrap();
        client.batch_execute("DISCARD ALL").await.unwrap();
        draws.push(
            client
                .query_one("SELECT random()", &[])
                .await
                .unwrap()
                .get::<_, f64>(0),
        );
    }
    assert_eq!(draws[0], draws[1], "control: DISCARD ALL keeps the seed");
    let pool = pool();
    for sql in ["SELECT setseed(0.25)", "LOAD 'auto_explain'"] {
        let err = pool.execute(sql, &[]).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAllowedOnShared, "{sql}: {err}");
    }
}

/// On a connection checked out with `get()`, what no reset undoes runs,
/// and the connection is closed when it comes back instead of being reset
/// and handed to the next user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_session_that_did_what_no_reset_undoes_is_closed() {
    let pool = Pool::builder()
        .url(&database_url())
        .max_size(1)
        .build()
        .unwrap();
    let conn = pool.get().await.unwrap();
    let first = session_pid(&conn).await;
    drop(conn);
    // The control: a plain checkout comes back to the same session.
    let conn = pool.get().await.unwrap();
    assert_eq!(session_pid(&conn).await, first);
    conn.execute("SELECT setseed(0.25)", &[]).await.unwrap();
    drop(conn);
    let conn = pool.get().await.unwrap();
    let next = session_pid(&conn).await;
    assert_ne!(next, first, "the seeded session was handed on");
}

/// The same through the raw tokio-postgres client a checkout derefs to,
/// which bypasses the pool's methods: the connection's own bytes decide
/// (its tap reads the SQL of every `Query` and `Parse` an exclusive
/// connection sends), by the simple protocol and by the extended one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_client_of_a_checkout_cannot_hand_on_what_no_reset_undoes() {
    let pool = Pool::builder()
        .url(&database_url())
        .max_size(1)
        .build()
        .unwrap();
    type Step = fn(&pgpipe::tokio_postgres::Client) -> futures_like::Boxed<'_>;
    let steps: [(&str, Step); 3] = [
        ("batch_execute setseed", |c| {
            Box::pin(async move { c.batch_execute("SELECT setseed(0.25)").await.map(drop) })
        }),
        ("query setseed($1)", |c| {
            Box::pin(async move { c.query("SELECT setseed($1)", &[&0.25f64]).await.map(drop) })
        }),
        ("batch_execute LOAD", |c| {
            Box::pin(async move { c.batch_execute("LOAD 'auto_explain'").await.map(drop) })
        }),
    ];
    for (what, step) in steps {
        let conn = pool.get().await.unwrap();
        let first = session_pid(&conn).await;
        let raw: &pgpipe::tokio_postgres::Client = &conn;
        step(raw).await.unwrap();
        drop(conn);
        let conn = pool.get().await.unwrap();
        let next = session_pid(&conn).await;
        assert_ne!(next, first, "{what}: the session was handed on");
    }
}

mod futures_like {
    pub(super) type Boxed<'a> = std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<(), pgpipe::tokio_postgres::Error>> + Send + 'a,
        >,
    >;
}

/// An atomic batch runs on a connection of its own, where session SQL is
/// allowed and cleaned behind its `COMMIT`; what no cleanup undoes closes
/// that connection instead of returning it to the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_batch_that_did_what_no_reset_undoes_closes_its_connection() {
    let pool = Pool::builder()
        .url(&database_url())
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    let backend = || async { session_pid(&pool.get().await.unwrap()).await };
    let first = backend().await;
    let mut batch = pool.atomic_batch();
    batch.execute("SELECT setseed(0.25)", &[]);
    for result in batch.run().await.unwrap() {
        result.unwrap();
    }
    assert_ne!(
        backend().await,
        first,
        "the seeded session went back to the pool"
    );
}
