//! Bad input gets a clear error and costs nobody else anything.

use pgpipe::ErrorKind;
use tokio_postgres::error::SqlState;

use crate::support::{app, assert_echoed, backend_pid, builder, spawn_echoes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_parameters_and_invalid_sql_are_clear_errors() {
    for pipelining in [true, false] {
        let pool = builder(&app("bad_params"))
            .max_size(1)
            .max_exclusive(1)
            .pipelining(pipelining)
            .build()
            .unwrap();
        let e = pool.query("SELECT $1::int8", &[]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Params, "{e}");
        assert!(e.to_string().contains("1 parameters but 0"), "{e}");

        let e = pool.query("SELECT $1::int8", &[&"text"]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Params, "{e}");

        let e = pool.query("SELECT FROM WHERE", &[]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Db, "{e}");
        assert_eq!(e.code(), Some(&SqlState::SYNTAX_ERROR));

        let e = pool
            .query_one("SELECT 1 WHERE false", &[])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RowCount, "{e}");
        let e = pool
            .query_opt("SELECT generate_series(1, 2)", &[])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RowCount, "{e}");

        let e = pool
            .query("SELECT $1::text", &[&"nul\0byte"])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Db, "{e}");

        // The one connection is still fine.
        let row = pool
            .query_one("SELECT $1::int8 + 1", &[&41i64])
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), 42);
        assert!(pool.status().size <= 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_servers_limit_is_refused_before_it_is_sent() {
    let _memory = crate::support::MEMORY.lock().await;
    let app = crate::support::app("huge");
    let pool = builder(&app)
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .build()
        .unwrap();
    let pid = backend_pid(&pool).await;
    // Over 1 GiB − 1: the server would drop the connection, and every query
    // pipelined on it with it.
    let huge = "x".repeat((1 << 30) + 16);
    let neighbours = spawn_echoes(&pool, 0..20i64);
    let e = pool
        .query("SELECT length($1::text)", &[&huge])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TooLarge, "{e}");
    assert!(e.to_string().contains("nothing was sent"), "{e}");
    drop(huge);
    assert_echoed(neighbours).await;
    let same = backend_pid(&pool).await;
    assert_eq!(same, pid, "the connection survived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_over_the_cap_fail_alone() {
    let pool = builder(&crate::support::app("result_cap"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .max_result_bytes(1 << 20)
        .max_result_rows(2000)
        .build()
        .unwrap();
    let pid = backend_pid(&pool).await;
    let neighbours = spawn_echoes(&pool, 0..20i64);
    let e = pool
        .query(
            "SELECT repeat('x', 1000) FROM generate_series(1, 5000)",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TooLarge, "{e}");
    assert!(e.to_string().contains("max_result_bytes"), "{e}");
    let e = pool
        .query("SELECT generate_series(1, 5000)", &[])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TooLarge, "{e}");
    assert!(e.to_string().contains("max_result_rows (2000)"), "{e}");
    assert_echoed(neighbours).await;
    // The rest of the big answers was read and thrown away: in step.
    let rows = pool
        .query("SELECT generate_series(1, 1000)", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1000);
    let same = backend_pid(&pool).await;
    assert_eq!(same, pid, "the connection survived");
}

/// `query_one` and `query_opt` keep only the first row (issue #25: no
/// vector for it), yet read the whole answer: the count in a `RowCount`
/// error is every row's, an error behind the first row is the query's
/// error, and the result caps hold as for `query`. On every path that takes
/// them: the pool with pipelining and without, reads, slow queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_row_queries_read_the_whole_answer_within_the_caps() {
    for pipelining in [true, false] {
        let pool = builder(&app("one_row"))
            .max_size(1)
            .max_exclusive(1)
            .pipelining(pipelining)
            .max_result_rows(4)
            .build()
            .unwrap();
        let (read, slow) = (pool.read(), pool.slow());
        for path in ["pool", "read", "slow"] {
            let one = |sql: &'static str| {
                let (pool, read, slow) = (&pool, &read, &slow);
                async move {
                    match path {
                        "pool" => pool.query_one(sql, &[]).await,
                        "read" => read.query_one(sql, &[]).await,
                        _ => slow.query_one(sql, &[]).await,
                    }
                }
            };
            let opt = |sql: &'static str| {
                let (pool, read, slow) = (&pool, &read, &slow);
                async move {
                    match path {
                        "pool" => pool.query_opt(sql, &[]).await,
                        "read" => read.query_opt(sql, &[]).await,
                        _ => slow.query_opt(sql, &[]).await,
                    }
                }
            };
            let at = format!("{path}, pipelining {pipelining}");
            let row = one("SELECT 42::int8").await.unwrap();
            assert_eq!(row.get::<_, i64>(0), 42, "{at}");
            let row = opt("SELECT 7::int8").await.unwrap().expect("a row");
            assert_eq!(row.get::<_, i64>(0), 7, "{at}");
            assert!(opt("SELECT 1 WHERE false").await.unwrap().is_none(), "{at}");

            let e = one("SELECT 1 WHERE false").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::RowCount, "{at}: {e}");
            assert!(e.to_string().contains("returned 0 rows"), "{at}: {e}");
            for e in [
                one("SELECT generate_series(1, 3)").await.unwrap_err(),
                opt("SELECT generate_series(1, 3)").await.unwrap_err(),
            ] {
                assert_eq!(e.kind(), ErrorKind::RowCount, "{at}: {e}");
                assert!(e.to_string().contains("returned 3 rows"), "{at}: {e}");
            }
            // An error after the first row is the query's.
            let e = one("SELECT 1 / (2 - g) FROM generate_series(1, 3) g")
                .await
                .unwrap_err();
            assert_eq!(e.code(), Some(&SqlState::DIVISION_BY_ZERO), "{at}: {e}");
            // The caps count the rows not kept.
            let e = one("SELECT generate_series(1, 10)").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::TooLarge, "{at}: {e}");
            assert!(e.to_string().contains("max_result_rows (4)"), "{at}: {e}");
            // In step after all of it.
            let row = one("SELECT 43::int8").await.unwrap();
            assert_eq!(row.get::<_, i64>(0), 43, "{at}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_fail_fast_and_clearly() {
    let addr = pgpipe_test_support::server_addr();
    for pipelining in [true, false] {
        let pool = pgpipe::Pool::builder()
            .url(&format!("postgres://no_such_role_pgpipe@{addr}/postgres"))
            .pipelining(pipelining)
            .build()
            .unwrap();
        let start = std::time::Instant::now();
        let e = pool.query("SELECT 1", &[]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
        assert!(
            e.to_string().contains("no_such_role_pgpipe"),
            "says which role: {e}"
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(3));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_names_where_it_went_and_passes_the_code_through() {
    let mut config: tokio_postgres::Config = pgpipe_test_support::database_url().parse().unwrap();
    let role = pgpipe_test_support::unique("no_such_role");
    config.user(&role).dbname("postgres");
    let pool = pgpipe::Pool::builder().config(config).build().unwrap();
    let e = pool.query("SELECT 1", &[]).await.unwrap_err();
    assert_eq!(e.kind(), pgpipe::ErrorKind::Connect, "{e}");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION),
        "{e}"
    );
    let text = e.to_string();
    assert!(text.contains("/postgres"), "names host:port/db: {text}");
    assert!(!text.contains(&role) || text.contains("role"), "{text}");
}
