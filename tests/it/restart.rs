//! A real server restart under load, on a throwaway cluster of the test's
//! own: no hang, no busy loop while the server is down, and waiters served
//! once it is back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgpipe::{ErrorKind, Pool};
use pgpipe_test_support::Cluster;

/// CPU time this process has used, from /proc (clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<u64> = after_name
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // utime and stime are fields 14 and 15 of the line: 12th and 13th here.
    let ticks = fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_under_load_heals_without_hanging_or_spinning() {
    let cluster = match Cluster::start() {
        Ok(cluster) => cluster,
        Err(e) => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{e}");
            eprintln!("no throwaway cluster here ({e}); skipping the restart test");
            return;
        }
    };
    let pool = Pool::builder()
        .url(&cluster.url())
        .max_size(3)
        .pipelining(true)
        .wait_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    pool.query_one("SELECT 1", &[]).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load: Vec<_> = (0..32i64)
        .map(|task| {
            let (pool, stop, ok, failed) = (
                pool.clone(),
                Arc::clone(&stop),
                Arc::clone(&ok),
                Arc::clone(&failed),
            );
            tokio::spawn(async move {
                let mut i = 0;
                let mut longest = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let v = task * 1_000_000 + i;
                    let start = Instant::now();
                    match pool.query_one("SELECT $1::int8", &[&v]).await {
                        Ok(row) => {
                            assert_eq!(row.get::<_, i64>(0), v);
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            assert!(
                                matches!(
                                    e.kind(),
                                    ErrorKind::ConnectionLost
                                        | ErrorKind::Connect
                                        | ErrorKind::Timeout
                                        | ErrorKind::QueryTimeout
                                ),
                                "{e}"
                            );
                            failed.fetch_add(1, Ordering::Relaxed);
                            // A client backs off a little, as a service would.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    longest = longest.max(start.elapsed());
                    i += 1;
                }
                longest
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    cluster.stop("fast").unwrap();
    let down = Instant::now();
    let cpu_before = cpu_time();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cpu_down = cpu_time() - cpu_before;
    let failed_while_down = failed.load(Ordering::Relaxed);
    cluster.start_server().unwrap();
    let ok_at_restart = ok.load(Ordering::Relaxed);

    // Served again soon after the server is back.
    let back = Instant::now();
    while ok.load(Ordering::Relaxed) < ok_at_restart + 100 {
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "the pool recovers"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered = back.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut longest = Duration::ZERO;
    for task in load {
        longest = longest.max(task.await.unwrap());
    }
    eprintln!(
        "down {:?}: {failed_while_down} failed fast, CPU while down {cpu_down:?}; \
         recovered {recovered:?} after restart; longest query {longest:?}",
        back - down
    );
    assert!(
        failed_while_down > 0,
        "queries failed while the server was down"
    );
    assert!(
        cpu_down < Duration::from_millis(600),
        "no busy loop: {cpu_down:?} in 1 s"
    );
    assert!(
        longest < Duration::from_secs(5),
        "no query hung: {longest:?}"
    );
}
