//! What the metrics cost per query, counted in instructions rather than
//! seconds (this machine's timing noise hides a few percent).
//!
//! ```text
//! cargo build --release -p pgpipe-bench --example metrics_cost
//! for m in off on; do
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$m \
//!     target/release/examples/metrics_cost $m 20000
//! done
//! ```
//!
//! Then compare the two totals (`callgrind_annotate /tmp/cg.on | head`):
//! their difference divided by the number of queries is the cost of the
//! metrics per query. A third argument, `hol-off`, turns head-of-line
//! awareness off, to count its cost the same way; `distinct` makes every
//! query's text new (a comment with its number), to count what a statement
//! costs the first time it is seen (the guard's verdict, the statement
//! cache's prepare), and `read` sends every query through `pool.read()`
//! (the reads workload: read groups on the primary's read lane), and
//! `no-groups` turns read groups off (`pool.query`'s plain reads then keep
//! a `Sync` each, as before they were grouped on the primary). It also
//! prints the size of the futures `pool.query_one` and
//! `pool.read().query_one` return. The server comes from `DATABASE_URL`.
//!
//! `METRICS_COST_TASKS` and `METRICS_COST_CONNS` (default 8 and 1) set
//! the tasks and the pool's `max_size`: 512 and 4 is the load of the
//! profile in issue #25 (512 tasks waiting for places on 4 connections).

use std::time::Instant;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let metrics = args.next().as_deref() == Some("on");
    let queries: i64 = args.next().map_or(Ok(20_000), |n| n.parse())?;
    let third = args.next();
    let hol = third.as_deref() != Some("hol-off");
    let distinct = third.as_deref() == Some("distinct");
    let read = third.as_deref() == Some("read");
    let groups = third.as_deref() != Some("no-groups");
    let env =
        |name: &str, default: i64| std::env::var(name).map_or(Ok(default), |v| v.parse::<i64>());
    let tasks = env("METRICS_COST_TASKS", 8)?;
    let conns = env("METRICS_COST_CONNS", 1)?;
    let registry = prometheus::Registry::new();
    let mut builder = pgpipe::Pool::builder()
        .url(&pgpipe_test_support::database_url())
        .max_size(conns as usize)
        .pipelining(true)
        .read_groups(groups);
    if !hol {
        builder = builder.slow_query_threshold(None);
    }
    if metrics {
        builder = builder.registry(&registry);
    }
    let pool = builder.build()?;
    pool.query_one("SELECT $1::int8", &[&0i64]).await?;
    pool.read().query_one("SELECT $1::int8", &[&0i64]).await?;
    eprintln!(
        "future sizes: pool.query_one {} bytes, pool.read().query_one {} bytes",
        std::mem::size_of_val(&pool.query_one("SELECT $1::int8", &[&0i64])),
        std::mem::size_of_val(&pool.read().query_one("SELECT $1::int8", &[&0i64])),
    );
    let start = Instant::now();
    // Eight tasks by default, so that queries pipeline as they would in a
    // service.
    let tasks: Vec<_> = (0..tasks)
        .map(|t| {
            let pool = pool.clone();
            tokio::spawn(async move {
                for i in 0..queries / tasks {
                    let v = t * 1_000_000 + i;
                    let row = if distinct {
                        let sql = format!("SELECT $1::int8 /* {v} */");
                        pool.query_one(&sql, &[&v]).await?
                    } else if read {
                        pool.read().query_one("SELECT $1::int8", &[&v]).await?
                    } else {
                        pool.query_one("SELECT $1::int8", &[&v]).await?
                    };
                    assert_eq!(row.get::<_, i64>(0), v);
                }
                Ok::<_, pgpipe::Error>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let scraped = registry.gather().len();
    eprintln!(
        "metrics {}: {queries} queries in {:?} ({scraped} metric families)",
        if metrics { "on" } else { "off" },
        start.elapsed()
    );
    Ok(())
}
