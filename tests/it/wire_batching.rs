//! How queries from concurrent tasks are grouped into writes on a shared
//! connection, counted on the wire: the batch window when it is set, and the
//! connection task's step-aside (always on) when it is not.

use std::time::Duration;

use pgpipe::Pool;
use prometheus::Registry;

use crate::support::{Scrape, app, builder_via, proxy, settle};

/// What one run put on the wire.
#[derive(Debug)]
struct Wire {
    /// Mean queries per socket write, from `pgpipe_pipeline_batch_size`.
    per_write: f64,
    /// The same from the proxy's count: `Execute`s over chunks carrying
    /// any (queries, whether each has its own `Sync` or a read group shares
    /// one; a group's read-only head is one more).
    proxy_per_chunk: f64,
    /// Observations of `pgpipe_pipeline_flush_wait_seconds`.
    flush_waits: u64,
}

/// How the queries of a run arrive.
#[derive(Debug, Clone, Copy)]
enum Load {
    /// `tasks` tasks each run `per_task` echoes back to back: the tasks
    /// that one burst of answers wakes send their next queries together.
    Closed { tasks: u64, per_task: i64 },
    /// One echo every millisecond, each in a task of its own, `n` in all:
    /// queries arrive one at a time, never in bursts.
    Trickle { n: i64 },
}

async fn run(pool: &Pool, load: Load) {
    let mut handles = Vec::new();
    match load {
        Load::Closed { tasks, per_task } => {
            for task in 0..tasks {
                let pool = pool.clone();
                handles.push(tokio::spawn(async move {
                    for i in 0..per_task {
                        let id = task as i64 * 1_000_000 + i;
                        let row = pool.query_one("SELECT $1::int8", &[&id]).await.unwrap();
                        assert_eq!(row.get::<_, i64>(0), id);
                    }
                }));
            }
        }
        Load::Trickle { n } => {
            for id in 0..n {
                let pool = pool.clone();
                handles.push(tokio::spawn(async move {
                    let row = pool.query_one("SELECT $1::int8", &[&id]).await.unwrap();
                    assert_eq!(row.get::<_, i64>(0), id);
                }));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
    for handle in handles {
        handle.await.unwrap();
    }
    settle(pool).await;
}

/// One run on a fresh one-connection pipelined pool behind the proxy, with
/// the given batch window (zero: off).
async fn on_the_wire(window: Duration, one_way: Duration, load: Load) -> Wire {
    let proxy = proxy(one_way);
    let registry = Registry::new();
    let pool = builder_via(&proxy, &app("wire_batching"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .batch_window(window)
        .max_batch(64)
        .registry(&registry)
        .build()
        .unwrap();
    // Prepared first, so that the run's writes are its queries alone.
    pool.query_one("SELECT $1::int8", &[&0i64]).await.unwrap();
    let before = proxy.stats().upstream;
    let scrape = Scrape::of(&registry);
    let (sum_before, count_before) = (
        scrape.value("pgpipe_pipeline_batch_size", &[]),
        scrape.histogram_count("pgpipe_pipeline_batch_size"),
    );
    run(&pool, load).await;
    let up = proxy.stats().upstream;
    let scrape = Scrape::of(&registry);
    let writes = scrape.histogram_count("pgpipe_pipeline_batch_size") - count_before;
    let wire = Wire {
        per_write: (scrape.value("pgpipe_pipeline_batch_size", &[]) - sum_before)
            / writes.max(1) as f64,
        proxy_per_chunk: (up.executes - before.executes) as f64
            / (up.chunks_with_executes - before.chunks_with_executes).max(1) as f64,
        flush_waits: scrape.histogram_count("pgpipe_pipeline_flush_wait_seconds"),
    };
    eprintln!("window {window:?}, one way {one_way:?}, {load:?}: {wire:?}");
    wire
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_window_makes_bigger_writes_and_counts_its_cost() {
    // One query a millisecond (or a little more: tokio's timer) on a
    // connection with a 5 ms round trip: each finds the connection busy.
    // Without a window each is written as it comes, alone (measured: 1.0
    // per write); a 20 ms window holds the ones that come meanwhile and
    // lets them go together (measured: about 7 per write).
    let (one_way, load) = (Duration::from_micros(2500), Load::Trickle { n: 200 });
    let off = on_the_wire(Duration::ZERO, one_way, load).await;
    let on = on_the_wire(Duration::from_millis(20), one_way, load).await;
    assert_eq!(off.flush_waits, 0, "no window, no holding: {off:?}");
    assert!(on.flush_waits > 0, "the window held queries: {on:?}");
    assert!(
        on.per_write > 2.0 * off.per_write,
        "with the window {:.2} queries per write, without {:.2}",
        on.per_write,
        off.per_write
    );
    // The proxy, counting on its own, sees the same difference.
    assert!(
        on.proxy_per_chunk > 2.0 * off.proxy_per_chunk,
        "proxy: with the window {:.2} queries per chunk, without {:.2}",
        on.proxy_per_chunk,
        off.proxy_per_chunk
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_aside_batches_concurrent_queries_on_one_connection() {
    // StepAside: with more than one query in flight, the connection's task
    // yields once before it writes, so the tasks that the same burst of
    // answers woke enqueue first and one write carries them all. It is always
    // on (no batch window here, and no switch to turn it off): 64 tasks on
    // one connection behind a 5 ms round trip go out many queries per write,
    // not one by one. Measured: 9 to 11 per write on an earlier machine (at
    // a 1 ms round trip the debug build is CPU-bound there and it swings
    // from 4 to 8); 3.2 to 4.1 on the one of 2026-11-30, with or without
    // that day's changes, and 1.4 to 1.6 there with the step-aside taken
    // out. 2.5 tells the two apart.
    let load = Load::Closed {
        tasks: 64,
        per_task: 50,
    };
    let wire = on_the_wire(Duration::ZERO, Duration::from_micros(2500), load).await;
    assert_eq!(wire.flush_waits, 0, "{wire:?}");
    assert!(
        wire.per_write >= 2.5,
        "{:.2} queries per write on the wire",
        wire.per_write
    );
    assert!(
        wire.proxy_per_chunk >= 2.5,
        "the proxy saw {:.2} queries per chunk",
        wire.proxy_per_chunk
    );
}
