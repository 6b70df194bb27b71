//! Starts the example service on port 0 against the test server and drives
//! it with concurrent requests.

mod http;

use std::time::Duration;

use http::{call, call_with_retry_after};
use hyper::{Method, StatusCode};
use pgpipe_examples::{Account, AppState, router};
use pgpipe_test_support::{database_url, unique};

/// The value of the first series of `name` whose line contains `labels`.
fn series(scrape: &str, name: &str, labels: &str) -> f64 {
    scrape
        .lines()
        .find(|line| line.starts_with(name) && line.contains(labels) && !line.starts_with('#'))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{name}{{{labels}}} in the scrape"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_answers_concurrent_requests_and_its_metrics_move() {
    let registry = prometheus::Registry::new();
    let pool = pgpipe::Pool::builder()
        .url(&database_url())
        .max_size(4)
        .pipelining(true)
        .registry(&registry)
        .pool_name("bank")
        .build()
        .unwrap();
    let state = AppState::new(pool, registry, &unique("bank"));
    state.create_schema(50).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(axum::serve(listener, router(state.clone())).into_future());

    // A few hundred concurrent reads, and transfers among them.
    let mut requests = Vec::new();
    for i in 0..300i64 {
        requests.push(tokio::spawn(async move {
            let id = i % 50 + 1;
            if i % 10 == 0 {
                let body = format!(r#"{{"from": {id}, "to": {}, "amount": 1}}"#, id % 50 + 1);
                let (status, _) = call(addr, Method::POST, "/transfers", &body).await;
                assert_eq!(status, StatusCode::CREATED);
            } else {
                let (status, body) = call(addr, Method::GET, &format!("/accounts/{id}"), "").await;
                assert_eq!(status, StatusCode::OK, "{body}");
                let account: Account = serde_json::from_str(&body).unwrap();
                assert_eq!(account.id, id, "the answer is for the account asked about");
                assert_eq!(account.total, 50 * 100, "money is never created or lost");
            }
        }));
    }
    for request in requests {
        tokio::time::timeout(Duration::from_secs(30), request)
            .await
            .expect("no request hangs")
            .unwrap();
    }
    let (status, _) = call(addr, Method::GET, "/accounts/999", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, scrape) = call(addr, Method::GET, "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    let ok = series(
        &scrape,
        "pgpipe_queries_total",
        r#"mode="pipelined",outcome="ok",pool="bank""#,
    );
    assert!(ok >= 270.0 * 3.0, "{ok} pipelined queries");
    assert!(
        series(
            &scrape,
            "pgpipe_pipeline_batch_size_count",
            r#"pool="bank""#
        ) > 0.0
    );
    assert!(
        series(
            &scrape,
            "pgpipe_pipeline_round_trips_saved_total",
            r#"pool="bank""#
        ) > 0.0
    );
    assert!(
        series(
            &scrape,
            "pgpipe_connection_wait_seconds_count",
            r#"pool="bank""#
        ) > 0.0
    );

    server.abort();
    state.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_errors_that_leak_nothing() {
    let pool = pgpipe::Pool::builder()
        .url(&database_url())
        .max_size(2)
        .pipelining(true)
        .build()
        .unwrap();
    let prefix = unique("bank");
    let state = AppState::new(pool.clone(), prometheus::Registry::new(), &prefix);
    state.create_schema(5).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, router(state.clone())).into_future());

    assert_eq!(
        call(addr, Method::GET, "/healthz", "").await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(addr, Method::GET, "/readyz", "").await.0,
        StatusCode::OK
    );
    // A database error (bigint out of range): 500, and not a word of the
    // server's message.
    let overflow = r#"{"from": 1, "to": 2, "amount": -9223372036854775808}"#;
    let (status, _, body) = call_with_retry_after(addr, Method::POST, "/transfers", overflow).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body, "internal error");
    // A closed pool: not ready, and requests are told when to come back.
    pool.close();
    assert_eq!(
        call(addr, Method::GET, "/readyz", "").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let (status, retry_after, body) =
        call_with_retry_after(addr, Method::GET, "/accounts/1", "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(!body.contains("closed"), "{body}");
    let cleanup = AppState::new(
        pgpipe::Pool::builder()
            .url(&database_url())
            .build()
            .unwrap(),
        prometheus::Registry::new(),
        &prefix,
    );
    cleanup.drop_schema().await.unwrap();
}

#[test]
fn settings_come_from_the_environment() {
    use pgpipe_examples::{environment, pool_settings};

    let env = |vars: &[(&str, &str)]| {
        let vars = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        environment().source(Some(vars))
    };
    let defaults = pool_settings(env(&[])).unwrap();
    assert_eq!((defaults.max_size, defaults.pipelining), (8, true));

    let settings = pool_settings(env(&[
        ("PGPIPE__MAX_SIZE", "3"),
        ("PGPIPE__PIPELINING", "false"),
        ("PGPIPE__WAIT_TIMEOUT", "250ms"),
        ("PGPIPE__SESSION_SETTINGS__SEARCH_PATH", "bank"),
    ]))
    .unwrap();
    assert_eq!((settings.max_size, settings.pipelining), (3, false));
    assert_eq!(settings.wait_timeout, Duration::from_millis(250));
    assert_eq!(
        settings
            .session_settings
            .get("search_path")
            .map(String::as_str),
        Some("bank")
    );
    // The settings build a pool.
    pgpipe::Pool::builder()
        .url(&database_url())
        .pool_config(settings)
        .build()
        .unwrap();

    let bad = pool_settings(env(&[("PGPIPE__WAIT_TIMEOUT", "soon")])).unwrap_err();
    assert!(bad.to_string().contains("wait_timeout"), "{bad}");
    let unknown = pool_settings(env(&[("PGPIPE__MAX_SIZ", "3")])).unwrap_err();
    assert!(unknown.to_string().contains("max_siz"), "{unknown}");
}
