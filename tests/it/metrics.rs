//! The metrics work: exported, named, labelled and consistent. Their
//! accuracy against outside ground truth is tested in `tests/truth`, which
//! runs alone so that timing is not disturbed by other tests.

use std::sync::Arc;
use std::time::Duration;

use pgpipe::Pool;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::support::{Scrape, app, builder, echo_load, promtool, settle};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_stays_non_negative_and_returns_to_zero() {
    let registry = Registry::new();
    let pool = builder(&app("depth"))
        .max_size(2)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    // The lane's first use reads the database's catalog (one query of the
    // pool's own): counted before the load, not in it.
    pool.query("SELECT 1", &[]).await.unwrap();
    settle(&pool).await;
    let warm = Scrape::of(&registry);
    let admitted_before = warm.histogram_count("pgpipe_pipeline_in_flight");
    let alone_before = warm.histogram_at_most("pgpipe_pipeline_in_flight", 1.0);
    let within_before = warm.histogram_at_most("pgpipe_pipeline_in_flight", 64.0);
    let scrape_before_128 = warm.histogram_at_most("pgpipe_pipeline_in_flight", 128.0);
    let ok_before = warm.value(
        "pgpipe_queries_total",
        &[("mode", "pipelined"), ("outcome", "ok")],
    );
    let started = std::time::Instant::now();
    let load = {
        let pool = pool.clone();
        tokio::spawn(async move { echo_load(&pool, 64, 300).await })
    };
    let mut peak: f64 = 0.0;
    while !load.is_finished() {
        let scrape = Scrape::of(&registry);
        for name in ["pgpipe_pipeline_depth", "pgpipe_pipeline_queue_depth"] {
            assert!(scrape.value(name, &[]) >= 0.0, "{name} is negative");
        }
        peak = peak.max(scrape.value("pgpipe_pipeline_depth", &[]));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    load.await.unwrap();
    let seconds = started.elapsed().as_secs();
    settle(&pool).await;
    let scrape = Scrape::of(&registry);
    assert_eq!(scrape.value("pgpipe_pipeline_depth", &[]), 0.0);
    assert_eq!(scrape.value("pgpipe_pipeline_queue_depth", &[]), 0.0);
    // 64 callers, and the pool's own fingerprint beside them at most.
    assert!((1.0..=65.0).contains(&peak), "peak depth {peak}");
    // Queries in flight at each admission: some pipelined behind others,
    // never more than the 64 tasks (the count a scrape cannot reset).
    // The pool's own catalog fingerprint (once a second while statements
    // are judged, pipelined like any query) is admitted too: at most one
    // per second the load and the settling took, and it may be the 65th.
    let admitted = scrape.histogram_count("pgpipe_pipeline_in_flight") - admitted_before;
    let own = admitted
        .checked_sub(64 * 300)
        .unwrap_or_else(|| panic!("{admitted} admitted, fewer than the 19200 queries"));
    assert!(
        own <= seconds + 3,
        "{own} admissions beyond the callers' in {seconds} s"
    );
    let alone = scrape.histogram_at_most("pgpipe_pipeline_in_flight", 1.0) - alone_before;
    let within = scrape.histogram_at_most("pgpipe_pipeline_in_flight", 64.0) - within_before;
    assert!(alone < admitted, "never more than one in flight");
    // Above 64 only while the pool's own query is in flight beside the 64
    // (the buckets end at 64 and 128); without it, never.
    let within_two =
        scrape.histogram_at_most("pgpipe_pipeline_in_flight", 128.0) - scrape_before_128;
    assert_eq!(
        within_two, admitted,
        "more in flight than tasks and the pool's own"
    );
    if own == 0 {
        assert_eq!(within, admitted, "more in flight than tasks");
    }
    let ok = scrape.value(
        "pgpipe_queries_total",
        &[("mode", "pipelined"), ("outcome", "ok")],
    ) - ok_before;
    assert_eq!(ok, 64.0 * 300.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_share_one_registry() {
    let registry = Registry::new();
    let orders = builder(&app("two_a"))
        .pool_name("orders")
        .pipelining(true)
        .max_size(2)
        .registry(&registry)
        .build()
        .unwrap();
    let default_name = Pool::builder()
        .url("postgres://someone:sentinel-secret@127.0.0.1:5432/postgres")
        .registry(&registry)
        .build()
        .unwrap();
    orders.query("SELECT 1", &[]).await.unwrap();
    let duplicate = builder(&app("two_b"))
        .pool_name("orders")
        .registry(&registry)
        .build();
    assert_eq!(duplicate.unwrap_err().kind(), pgpipe::ErrorKind::Config);

    let scrape = Scrape::of(&registry);
    let ok = [("mode", "pipelined"), ("outcome", "ok")];
    assert_eq!(
        scrape.value("pgpipe_queries_total", &[("pool", "orders"), ok[0], ok[1]]),
        1.0
    );
    let text = TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(
        text.contains("pool=\"127.0.0.1:5432/postgres\""),
        "default name"
    );
    assert!(!text.contains("sentinel-secret") && !text.contains("someone"));
    drop(default_name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_scrape_passes_promtool() {
    let registry = Registry::new();
    let pool = Arc::new(
        builder(&app("promtool"))
            .pipelining(true)
            .max_size(2)
            .registry(&registry)
            .build()
            .unwrap(),
    );
    echo_load(&pool, 8, 20).await;
    let _ = pool.query("SELECT 1/0", &[]).await;
    let mut text = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut text)
        .unwrap();
    let Some(promtool) = promtool() else {
        return;
    };
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&text).unwrap();
    let output = child.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && report.trim().is_empty(),
        "promtool: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_its_caller_dropped_is_counted_as_cancelled() {
    let registry = Registry::new();
    let pool = builder(&app("dropped"))
        .max_size(1)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    let query = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.query("SELECT pg_sleep(1)", &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    query.abort();
    let _ = query.await;
    let scrape = Scrape::of(&registry);
    let cancelled = scrape.value(
        "pgpipe_queries_total",
        &[("mode", "pipelined"), ("outcome", "cancelled")],
    );
    assert_eq!(cancelled, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_operators_ask_for_next_is_exported_and_moves() {
    let registry = Registry::new();
    let pool = builder(&app("ops_metrics"))
        .max_size(2)
        .pipelining(true)
        .statement_cache_capacity(1)
        .registry(&registry)
        .build()
        .unwrap();
    for _ in 0..3 {
        pool.query("SELECT 1", &[]).await.unwrap();
    }
    pool.query("SELECT 2", &[]).await.unwrap(); // evicts SELECT 1
    let conn = pool.get().await.unwrap();
    drop(conn);
    let scrape = Scrape::of(&registry);
    assert!(scrape.value("pgpipe_statement_cache_hits_total", &[]) >= 2.0);
    assert!(scrape.value("pgpipe_statement_cache_misses_total", &[]) >= 2.0);
    assert!(scrape.value("pgpipe_statement_cache_evictions_total", &[]) >= 1.0);
    assert!(scrape.histogram_count("pgpipe_connection_open_seconds") >= 1);
    assert_eq!(scrape.histogram_count("pgpipe_exclusive_hold_seconds"), 1);
    assert_eq!(
        scrape.value(
            "pgpipe_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    assert!(scrape.value("pgpipe_connections", &[("state", "opening")]) >= 0.0);
}

/// Statements on a `get()` connection and its transactions count as
/// `mode="checkout"`, as the server answered them
/// (`BEGIN` and the `ROLLBACK` of a dropped transaction too), and `get()`
/// itself is counted by outcome, a refused one also as a rejection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_traffic_and_checkouts_are_counted() {
    use pgpipe::Executor;

    let registry = Registry::new();
    let pool = builder(&app("exclusive_counted"))
        .max_size(1)
        .pipelining(true)
        .wait_timeout(Duration::from_millis(200))
        .registry(&registry)
        .build()
        .unwrap();
    let exclusive = |outcome: &str| {
        Scrape::of(&registry).value(
            "pgpipe_queries_total",
            &[("mode", "checkout"), ("outcome", outcome)],
        )
    };
    let checkouts = |outcome: &str| {
        Scrape::of(&registry).value("pgpipe_checkouts_total", &[("outcome", outcome)])
    };

    let mut conn = pool.get().await.unwrap();
    conn.query_one("SELECT 1", &[]).await.unwrap();
    conn.execute("SELECT 2", &[]).await.unwrap();
    {
        let tx = conn.transaction().await.unwrap();
        tx.query("SELECT 3", &[]).await.unwrap();
        tx.execute("SELECT 1/0", &[]).await.unwrap_err();
    }
    // The dropped transaction's ROLLBACK goes out behind it: the next
    // statement's answer comes after the ROLLBACK's.
    conn.query_one("SELECT 4", &[]).await.unwrap();
    // SELECT 1, 2, BEGIN, SELECT 3, ROLLBACK, SELECT 4; and 1/0.
    assert_eq!(exclusive("ok"), 6.0);
    assert_eq!(exclusive("db_error"), 1.0);
    assert_eq!(checkouts("ok"), 1.0);

    let refused = pool.get().await.unwrap_err();
    assert_eq!(refused.kind(), pgpipe::ErrorKind::Deadlock);
    let other = pool.clone();
    let refused = tokio::spawn(async move { other.get().await.map(drop) })
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.kind(), pgpipe::ErrorKind::Timeout);
    assert_eq!(checkouts("rejected"), 1.0);
    assert_eq!(checkouts("timeout"), 1.0);
    for reason in ["deadlock", "timeout"] {
        assert_eq!(
            Scrape::of(&registry).value("pgpipe_pipeline_rejected_total", &[("reason", reason)]),
            1.0,
            "{reason}"
        );
    }

    // A statement its caller drops still runs: it counts as it ended on the
    // server, also when the connection went back to the pool meanwhile.
    let slow = conn.query("SELECT pg_sleep(0.5)", &[]);
    assert!(
        tokio::time::timeout(Duration::from_millis(100), slow)
            .await
            .is_err()
    );
    drop(conn);
    let patience = tokio::time::Instant::now() + Duration::from_secs(30);
    while exclusive("ok") < 7.0 && tokio::time::Instant::now() < patience {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(exclusive("ok"), 7.0);
    // The pool's own queries are pipelined, not exclusive.
    pool.query("SELECT 5", &[]).await.unwrap();
    assert_eq!(exclusive("ok"), 7.0);
    assert_eq!(exclusive("cancelled"), 0.0);
}
