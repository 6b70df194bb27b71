//! Pipelining through a real round trip: throughput above what one query
//! per connection per round trip allows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support::{app, builder_via, proxy, settle};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_connections_beat_two_per_round_trip_by_far() {
    let proxy = proxy(Duration::from_micros(500)); // 1 ms round trip
    let pool = builder_via(&proxy, &app("routing"))
        .max_size(2)
        .max_exclusive(1)
        .pipelining(true)
        .build()
        .unwrap();
    // The round trip as one query sees it.
    pool.query_one("SELECT 1", &[]).await.unwrap();
    let mut rtts = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        pool.query_one("SELECT 1", &[]).await.unwrap();
        rtts.push(start.elapsed());
    }
    rtts.sort();
    let rtt = rtts[rtts.len() / 2];
    assert!(
        rtt >= Duration::from_millis(1),
        "the proxy adds its delay: {rtt:?}"
    );

    let done = Arc::new(AtomicU64::new(0));
    let run_for = Duration::from_secs(2);
    let start = Instant::now();
    let mut handles = Vec::new();
    for task in 0..256i64 {
        let (pool, done) = (pool.clone(), Arc::clone(&done));
        handles.push(tokio::spawn(async move {
            let mut i = 0;
            while start.elapsed() < run_for {
                let id = task * 1_000_000 + i;
                let row = pool.query_one("SELECT $1::int8", &[&id]).await.unwrap();
                assert_eq!(row.get::<_, i64>(0), id);
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let qps = done.load(Ordering::Relaxed) as f64 / elapsed;
    let unpipelined_ceiling = 2.0 / rtt.as_secs_f64();
    eprintln!(
        "rtt {rtt:?}: {qps:.0} qps against a ceiling of {unpipelined_ceiling:.0} without pipelining"
    );
    assert!(
        qps > 5.0 * unpipelined_ceiling,
        "{qps:.0} qps is not far above {unpipelined_ceiling:.0}"
    );
    settle(&pool).await;
    let status = pool.status();
    assert!(status.shared <= 2, "{status:?}");
    // The proxy saw queries batched: fewer chunks than Syncs.
    let up = proxy.stats().upstream;
    assert!(up.messages > up.chunks_with_messages, "{up:?}");
}
