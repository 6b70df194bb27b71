//! Helpers shared by the integration tests.

use std::time::Duration;

use pgpipe::{Pool, PoolBuilder};
use pgpipe_proxy::Proxy;
pub(crate) use pgpipe_test_support::server_addr;
use pgpipe_test_support::{required_tool, server_url, unique, url_with_app, with_param};
use prometheus::Registry;
use prometheus::proto::{MetricFamily, MetricType};

/// Held by the test that measures this process's memory and by the test that
/// allocates a lot of it at once (a 1 GiB request), so that the first does
/// not count the second's: tests in one binary share the process.
pub(crate) static MEMORY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A role of the test's own, made with `options` (`SUPERUSER`, `LOGIN
/// CONNECTION LIMIT 1` …); dropped by [`drop_role`].
pub(crate) async fn create_role(name: &str, options: &str) -> String {
    let role = pgpipe_test_support::unique(name);
    pgpipe_test_support::admin()
        .await
        .batch_execute(&format!("CREATE ROLE {role} {options}"))
        .await
        .unwrap();
    role
}

pub(crate) async fn drop_role(role: &str) {
    pgpipe_test_support::admin()
        .await
        .batch_execute(&format!("DROP ROLE {role}"))
        .await
        .unwrap();
}

/// A fresh application name, to find this test's backends by.
pub(crate) fn app(test: &str) -> String {
    unique(test)
}

/// A pool builder on the test server, tagged with `app`.
pub(crate) fn builder(app: &str) -> PoolBuilder {
    Pool::builder()
        .url(&url_with_app(app))
        .wait_timeout(Duration::from_secs(20))
}

/// A latency proxy in front of the test server.
pub(crate) fn proxy(one_way: Duration) -> Proxy {
    Proxy::builder(server_addr())
        .delay(one_way)
        .start()
        .expect("proxy starts")
}

/// A pool builder whose connections go through `proxy`.
pub(crate) fn builder_via(proxy: &Proxy, app: &str) -> PoolBuilder {
    let url = server_url(None, Some(&proxy.addr().to_string()), None);
    Pool::builder()
        .url(&with_param(&url, "application_name", app))
        .wait_timeout(Duration::from_secs(20))
}

/// A small, seedable random number generator (xorshift64*), so tests need
/// no extra dependency and failures replay.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Waits (up to 5 s) until the pool reports nothing in flight.
pub(crate) async fn settle(pool: &Pool) {
    for _ in 0..500 {
        let status = pool.status();
        if status.in_flight == 0 && status.waiting == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("pool did not settle: {:?}", pool.status());
}

/// The families of one pool in a gathered registry.
pub(crate) struct Scrape(Vec<MetricFamily>);

impl Scrape {
    pub(crate) fn of(registry: &Registry) -> Scrape {
        Scrape(registry.gather())
    }

    fn family(&self, name: &str) -> Option<&MetricFamily> {
        self.0.iter().find(|f| f.name() == name)
    }

    /// The sum over the series of `name` whose labels include `labels`.
    pub(crate) fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let family = self
            .family(name)
            .unwrap_or_else(|| panic!("{name} is exported"));
        family
            .get_metric()
            .iter()
            .filter(|m| {
                labels.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                })
            })
            .map(|m| match family.get_field_type() {
                MetricType::COUNTER => m.get_counter().get_value(),
                MetricType::GAUGE => m.get_gauge().get_value(),
                MetricType::HISTOGRAM => m.get_histogram().get_sample_sum(),
                _ => f64::NAN,
            })
            .sum()
    }

    /// As [`value`](Scrape::value), or `None` when `name` is not exported.
    #[allow(dead_code)] // the truth tests'
    pub(crate) fn try_value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.family(name).map(|_| self.value(name, labels))
    }

    /// The number of observations in the histogram `name`, over the series
    /// whose labels include `labels`.
    #[allow(dead_code)] // the truth tests'
    pub(crate) fn histogram_count_of(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.family(name)
            .unwrap_or_else(|| panic!("{name} is exported"))
            .get_metric()
            .iter()
            .filter(|m| {
                labels.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                })
            })
            .map(|m| m.get_histogram().get_sample_count())
            .sum()
    }

    /// The number of observations in the histogram `name`, over all series.
    pub(crate) fn histogram_count(&self, name: &str) -> u64 {
        self.family(name)
            .unwrap_or_else(|| panic!("{name} is exported"))
            .get_metric()
            .iter()
            .map(|m| m.get_histogram().get_sample_count())
            .sum()
    }

    /// Observations of the histogram `name` at most `le`, over all series.
    pub(crate) fn histogram_at_most(&self, name: &str, le: f64) -> u64 {
        self.family(name)
            .unwrap_or_else(|| panic!("{name} is exported"))
            .get_metric()
            .iter()
            .filter_map(|m| {
                let buckets = m.get_histogram().get_bucket();
                let bucket = buckets.iter().find(|b| b.upper_bound() == le);
                bucket.map(|b| b.cumulative_count())
            })
            .sum()
    }
}

/// Mean observation of the histogram `name`: its sum over its count (0 when
/// it has none). For `pgpipe_pipeline_batch_size`, the mean queries per
/// write on the wire.
pub(crate) fn histogram_mean(scrape: &Scrape, name: &str) -> f64 {
    let count = scrape.histogram_count(name);
    if count == 0 {
        return 0.0;
    }
    scrape.value(name, &[]) / count as f64
}

/// The path of `promtool` (see [`required_tool`]).
pub(crate) fn promtool() -> Option<std::path::PathBuf> {
    required_tool("promtool", "Debian's prometheus package")
}

pub(crate) async fn echo_load(pool: &Pool, tasks: i64, per_task: i64) {
    let mut handles = Vec::new();
    for task in 0..tasks {
        let pool = pool.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                let id = task * 1_000_000 + i;
                let row = pool.query_one("SELECT $1::int8", &[&id]).await.unwrap();
                assert_eq!(row.get::<_, i64>(0), id);
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
}

/// Backends of `app` sitting idle inside a transaction: none should be, once
/// the pool is done with them.
pub(crate) async fn idle_in_transaction(app: &str) -> i64 {
    pgpipe_test_support::admin()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
             AND state LIKE 'idle in transaction%'",
            &[&app],
        )
        .await
        .expect("pg_stat_activity answers")
        .get(0)
}

/// Waits (up to 10 s) until a backend of `app` runs a statement containing
/// `like`: what a fixed sleep would guess, asked of the server.
pub(crate) async fn until_running(app: &str, like: &str) {
    let admin = pgpipe_test_support::admin().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let active: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                 AND state = 'active' AND query LIKE $2",
                &[&app, &format!("%{like}%")],
            )
            .await
            .expect("pg_stat_activity answers")
            .get(0);
        if active > 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{like} never ran for {app}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (up to 10 s) until `n` queries wait in the pool's queue.
pub(crate) async fn until_waiting(pool: &Pool, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pool.status().waiting < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} never waited: {:?}",
            pool.status()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `SELECT $1::int8` for every id in `ids`, each in a task of its own, all
/// in flight at once.
pub(crate) fn spawn_echoes(
    pool: &Pool,
    ids: std::ops::Range<i64>,
) -> Vec<tokio::task::JoinHandle<Result<tokio_postgres::Row, pgpipe::Error>>> {
    ids.map(|i| {
        let pool = pool.clone();
        tokio::spawn(async move { pool.query_one("SELECT $1::int8", &[&i]).await })
    })
    .collect()
}

/// Waits for echoes from [`spawn_echoes`] over `0..n`: each succeeded, and
/// each answer is its own caller's.
pub(crate) async fn assert_echoed(
    queries: Vec<tokio::task::JoinHandle<Result<tokio_postgres::Row, pgpipe::Error>>>,
) {
    for (i, query) in queries.into_iter().enumerate() {
        assert_eq!(query.await.unwrap().unwrap().get::<_, i64>(0), i as i64);
    }
}

/// The server process behind the connection `pool`'s next query uses.
pub(crate) async fn backend_pid(pool: &Pool) -> i32 {
    pool.query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pg_backend_pid() answers")
        .get(0)
}

/// A table of its own for one test (`CREATE TABLE <prefix>_… (columns)`).
pub(crate) async fn scratch_table(prefix: &str, columns: &str) -> String {
    let table = unique(prefix);
    pgpipe_test_support::admin()
        .await
        .batch_execute(&format!("CREATE TABLE {table} ({columns})"))
        .await
        .unwrap();
    table
}

pub(crate) async fn drop_table(table: &str) {
    pgpipe_test_support::admin()
        .await
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

/// `count(*)` of `table`, through `pool`.
pub(crate) async fn count_rows(pool: &Pool, table: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {table}");
    pool.query_one(&sql, &[]).await.unwrap().get(0)
}

/// `n` reads through `pool.read()`, one after another, each answered with
/// its own value: the pool is in step.
pub(crate) async fn assert_reads_in_step(pool: &Pool, n: i64) {
    for i in 0..n {
        let row = pool
            .read()
            .query_one("SELECT $1::int8", &[&i])
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), i);
    }
}

/// The session's `search_path`, on a plain client or a checkout.
pub(crate) async fn search_path(client: &pgpipe::tokio_postgres::Client) -> String {
    client
        .query_one("SHOW search_path", &[])
        .await
        .unwrap()
        .get(0)
}

/// The backend a plain client or a checkout talks to (a pool's next
/// query: [`backend_pid`]).
pub(crate) async fn session_pid(client: &pgpipe::tokio_postgres::Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}
