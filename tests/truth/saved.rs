//! Latency saved against an on/off run (issue #27): the same load through
//! the latency proxy on two pools of the same size, one pipelining and one
//! not, in interleaved rounds, so that load from elsewhere on the machine
//! falls on both alike. The pool's estimate of the time its queries would
//! have taken without pipelining, less the time they took, is held against
//! the difference the callers measured.

use std::time::{Duration, Instant};

use pgpipe::{Executor, Pool};
use prometheus::Registry;

use crate::support::{Scrape, app, builder_via, proxy, settle};

/// Both pools' `max_size`.
const MAX_SIZE: usize = 8;
/// One side's turn in a round.
const TURN: Duration = Duration::from_millis(1500);
const ROUNDS: usize = 3;
/// Long enough for two housekeeping ticks, which fold the estimate.
const FOLDED: Duration = Duration::from_millis(350);

/// Plain queries' time as their callers measured it.
#[derive(Debug, Default, Clone, Copy)]
struct Measured {
    queries: u64,
    seconds: f64,
}

impl Measured {
    fn add(&mut self, other: Measured) {
        self.queries += other.queries;
        self.seconds += other.seconds;
    }

    fn mean(self) -> f64 {
        self.seconds / self.queries.max(1) as f64
    }
}

/// One caller's requests until `until`: three queries at once (as the
/// example service's `GET /accounts/{id}`), or with `transactions` every
/// fifth request a transaction of one statement (`pool.begin()`).
async fn caller(pool: Pool, id: i64, until: Instant, transactions: bool) -> Measured {
    let mut measured = Measured::default();
    let mut i = 0i64;
    while Instant::now() < until {
        i += 1;
        if transactions && i % 5 == 0 {
            let tx = pool.begin().await.unwrap();
            tx.query_one("SELECT $1::int8", &[&id]).await.unwrap();
            tx.commit().await.unwrap();
            continue;
        }
        let timed = |k: i64| {
            let pool = &pool;
            async move {
                let value = id * 1_000_000_000 + i * 3 + k;
                let start = Instant::now();
                let row = pool.query_one("SELECT $1::int8", &[&value]).await.unwrap();
                let elapsed = start.elapsed();
                assert_eq!(row.get::<_, i64>(0), value);
                elapsed
            }
        };
        let (a, b, c) = tokio::join!(timed(0), timed(1), timed(2));
        measured.add(Measured {
            queries: 3,
            seconds: (a + b + c).as_secs_f64(),
        });
    }
    measured
}

async fn load(pool: &Pool, callers: usize, transactions: bool) -> Measured {
    let until = Instant::now() + TURN;
    let tasks: Vec<_> = (0..callers as i64)
        .map(|id| tokio::spawn(caller(pool.clone(), id, until, transactions)))
        .collect();
    let mut measured = Measured::default();
    for task in tasks {
        measured.add(task.await.unwrap());
    }
    measured
}

/// The pipelining pool's figures: latency saved (clamped at zero), the
/// time its queries would have taken without pipelining (absent before
/// issue #27), and the time they took.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    saved: f64,
    without: Option<f64>,
    taken: f64,
    queries: u64,
}

impl Figures {
    fn of(registry: &Registry) -> Figures {
        let scrape = Scrape::of(registry);
        let pipelined = [("mode", "pipelined")];
        Figures {
            saved: scrape.value("pgpipe_pipeline_latency_saved_seconds_total", &[]),
            without: scrape.try_value(
                "pgpipe_pipeline_latency_without_pipelining_seconds_total",
                &[],
            ),
            taken: scrape.value("pgpipe_query_duration_seconds", &pipelined),
            queries: scrape.histogram_count_of("pgpipe_query_duration_seconds", &pipelined),
        }
    }

    fn since(self, before: Figures) -> Figures {
        Figures {
            saved: self.saved - before.saved,
            without: self.without.zip(before.without).map(|(a, b)| a - b),
            taken: self.taken - before.taken,
            queries: self.queries - before.queries,
        }
    }

    fn add(&mut self, other: Figures) {
        self.saved += other.saved;
        self.without = other.without.map(|w| self.without.unwrap_or(0.0) + w);
        self.taken += other.taken;
        self.queries += other.queries;
    }
}

fn pool(proxy: &pgpipe_proxy::Proxy, pipelining: bool) -> (Pool, Registry) {
    let registry = Registry::new();
    let pool = builder_via(proxy, &app("saved"))
        .max_size(MAX_SIZE)
        .pipelining(pipelining)
        .registry(&registry)
        .build()
        .unwrap();
    (pool, registry)
}

/// The tolerance: 25% of the measured difference, or 0.2 ms where
/// it is below 1 ms.
fn within(estimate: f64, measured: f64) -> bool {
    let allowed = if measured.abs() < 1e-3 {
        0.2e-3
    } else {
        0.25 * measured.abs()
    };
    (estimate - measured).abs() <= allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_saved_agrees_with_an_on_off_run() {
    let _alone = crate::ALONE.lock().await;
    pgpipe_test_support::ahead_of_other_work();
    // 1 ms each way: a round trip of 2 ms and more, which the machine's
    // scheduling noise (tens of microseconds) does not drown.
    let proxy = proxy(Duration::from_millis(1));
    let (on, registry) = pool(&proxy, true);
    let (off, _) = pool(&proxy, false);
    // Warm up: connections open, statements prepared, round trips timed.
    for pool in [&on, &off] {
        load(pool, MAX_SIZE, false).await;
        load(pool, 1, false).await;
        settle(pool).await;
    }
    let mut failures = Vec::new();
    for (callers, transactions) in [(1, false), (8, false), (64, false), (16, true)] {
        let (mut with, mut without) = (Measured::default(), Measured::default());
        let mut figures = Figures::default();
        for round in 0..ROUNDS {
            // Alternate which side goes first, so a drift in the
            // machine's load falls on both.
            for pipelining in [round % 2 == 0, round % 2 != 0] {
                if pipelining {
                    let before = Figures::of(&registry);
                    with.add(load(&on, callers, transactions).await);
                    settle(&on).await;
                    tokio::time::sleep(FOLDED).await;
                    figures.add(Figures::of(&registry).since(before));
                } else {
                    without.add(load(&off, callers, transactions).await);
                    settle(&off).await;
                }
            }
        }
        let measured = without.mean() - with.mean();
        let per_query = |seconds: f64| seconds / figures.queries.max(1) as f64;
        let saved = per_query(figures.saved);
        let signed = figures.without.map(|w| per_query(w - figures.taken));
        let ms = |s: f64| s * 1e3;
        let case = format!(
            "{callers} callers{}: off {:.3} ms, on {:.3} ms a query ({} and {} queries): \
             saved {:.3} ms measured; estimated {:.3} ms (counter), {} (signed)",
            if transactions {
                ", every fifth request a transaction"
            } else {
                ""
            },
            ms(without.mean()),
            ms(with.mean()),
            without.queries,
            with.queries,
            ms(measured),
            ms(saved),
            signed.map_or("–".into(), |s| format!("{:.3} ms", ms(s))),
        );
        eprintln!("{case}");
        // The counter never goes down: where pipelining cost time, it
        // stays near zero.
        let counter_ok = within(saved, measured.max(0.0));
        let signed_ok = signed.is_none_or(|s| within(s, measured));
        if !counter_ok || !signed_ok {
            failures.push(case);
        }
    }
    assert!(failures.is_empty(), "out of tolerance: {failures:#?}");
}
