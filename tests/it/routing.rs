//! Routing on the shared path: pipelining carries many concurrent queries on
//! few connections and many queries per round trip, `Routing::Fill` keeps
//! to the fewest connections and `Routing::Spread` spreads. Everything here
//! is counted (connections, backends, Syncs per write, round trips), never
//! timed, so a busy machine cannot fail it.

use std::collections::BTreeSet;
use std::time::Duration;

use pgpipe::{Pool, Routing};
use prometheus::Registry;

use crate::support::{Scrape, app, builder, builder_via, histogram_mean, proxy, settle};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_queries_share_two_connections_and_their_round_trips() {
    let proxy = proxy(Duration::from_micros(500)); // 1 ms round trip
    let registry = Registry::new();
    let pool = builder_via(&proxy, &app("routing"))
        .max_size(2)
        .max_exclusive(1)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    let (tasks, per_task) = (256i64, 20i64);
    let queries = (tasks * per_task) as u64;
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut pids = BTreeSet::new();
                for i in 0..per_task {
                    let id = task * 1_000_000 + i;
                    let row = pool
                        .query_one("SELECT $1::int8, pg_backend_pid()", &[&id])
                        .await
                        .unwrap();
                    assert_eq!(row.get::<_, i64>(0), id);
                    pids.insert(row.get::<_, i32>(1));
                }
                pids
            })
        })
        .collect();
    let mut pids = BTreeSet::new();
    for handle in handles {
        pids.extend(handle.await.unwrap());
    }
    settle(&pool).await;
    let status = pool.status();
    let scrape = Scrape::of(&registry);
    let per_write = histogram_mean(&scrape, "pgpipe_pipeline_batch_size");
    let saved = scrape.value("pgpipe_pipeline_round_trips_saved_total", &[]);
    let stats = proxy.stats();
    let paid = stats.busy_periods;
    eprintln!(
        "{queries} queries from {tasks} tasks: backends {pids:?}, {per_write:.1} queries per \
         write, {saved} round trips saved, {paid} paid (proxy); {status:?}"
    );
    // 256 tasks at once, on at most the two connections the pool may open.
    assert!(status.shared <= 2, "{status:?}");
    assert!((1..=2).contains(&pids.len()), "backends used: {pids:?}");
    // Many queries per write and per round trip. One query per connection
    // per round trip would pay `queries` round trips; the proxy counts the
    // round trips actually paid.
    assert!(per_write > 2.0, "{per_write:.2} queries per write");
    assert!(saved > queries as f64 / 2.0, "{saved} round trips saved");
    assert!(
        paid * 5 < queries,
        "{paid} round trips paid for {queries} queries: not 5 per round trip"
    );
    // The proxy saw queries batched: fewer chunks than Syncs.
    let up = stats.upstream;
    assert!(up.messages > up.chunks_with_messages, "{up:?}");
}

/// Distinct backends that answered `tasks` tasks × `per_task` queries of
/// about 10 ms each, all at once.
async fn backends_used(pool: &Pool, tasks: usize, per_task: usize) -> BTreeSet<i32> {
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut pids = BTreeSet::new();
                for _ in 0..per_task {
                    let row = pool
                        .query_one("SELECT pg_backend_pid() FROM pg_sleep(0.01)", &[])
                        .await
                        .unwrap();
                    pids.insert(row.get::<_, i32>(0));
                }
                pids
            })
        })
        .collect();
    let mut pids = BTreeSet::new();
    for handle in handles {
        pids.extend(handle.await.unwrap());
    }
    pids
}

/// A pool of four for the routing comparison. Head-of-line awareness is off
/// (its 10 ms queries would count as slow, and slow work is spread whatever
/// the routing), so that only `routing` differs.
fn four(test: &str, routing: Routing) -> Pool {
    builder(&app(test))
        .max_size(4)
        .pipelining(true)
        .routing(routing)
        .slow_query_threshold(None::<Duration>)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fill_keeps_to_the_fewest_connections_and_spread_spreads() {
    // 12 tasks fit in one connection's pipeline (depth 64): Fill has no
    // reason to open a second one, Spread opens one as soon as every open
    // connection is busy, up to four.
    let (tasks, per_task) = (12, 15);
    let fill = four("route_fill", Routing::Fill);
    let filled = backends_used(&fill, tasks, per_task).await;
    let fill_status = fill.status();
    let spread = four("route_spread", Routing::Spread);
    let spread_over = backends_used(&spread, tasks, per_task).await;
    let spread_status = spread.status();
    eprintln!(
        "Fill: backends {filled:?}, {fill_status:?}; Spread: backends {spread_over:?}, \
         {spread_status:?}"
    );
    assert!(
        filled.len() <= 2 && fill_status.shared <= 2,
        "Fill used {} backends: {fill_status:?}",
        filled.len()
    );
    assert!(
        spread_over.len() >= 3,
        "Spread used {} backends: {spread_status:?}",
        spread_over.len()
    );
    assert!(spread_over.len() > filled.len());
}

/// Connections held by exclusive checkouts do not shrink what the shared
/// path may carry: its budget is `max_pipeline_depth` × `max_size`, so the
/// connection it keeps goes deeper instead of making queries wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_holding_connections_do_not_shrink_the_shared_budget() {
    // The budget off: the 0.5 s statements must stay on the shared
    // connection for this (blocking.rs tests the budget).
    let pool = builder(&app("elastic_depth"))
        .max_size(2)
        .max_pipeline_depth(2)
        .pipelining(true)
        .head_of_line_budget(None)
        .build()
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    // A transaction holds one of the two connections.
    let held = pool.get().await.unwrap();
    let sleeps: Vec<_> = (0..4)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.query("SELECT pg_sleep(0.5)", &[]).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = pool.status();
    assert_eq!(status.shared, 1, "{status:?}");
    assert_eq!(
        (status.in_flight, status.waiting),
        (4, 0),
        "four queries in flight on the one shared connection, none waiting: {status:?}"
    );
    for sleep in sleeps {
        sleep.await.unwrap().unwrap();
    }
    drop(held);
    settle(&pool).await;
}
