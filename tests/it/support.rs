//! Helpers shared by the integration tests.

use std::time::Duration;

use pgpipe::{Pool, PoolBuilder};
use pgpipe_proxy::Proxy;
use pgpipe_test_support::{database_url, unique, url_with_app, with_param};

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
    let config: tokio_postgres::Config = database_url().parse().expect("DATABASE_URL parses");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    Proxy::builder(format!("{host}:{port}"))
        .delay(one_way)
        .start()
        .expect("proxy starts")
}

/// A pool builder whose connections go through `proxy`.
pub(crate) fn builder_via(proxy: &Proxy, app: &str) -> PoolBuilder {
    let config: tokio_postgres::Config = database_url().parse().expect("DATABASE_URL parses");
    let user = config.get_user().unwrap_or("postgres").to_string();
    let db = config.get_dbname().unwrap_or("postgres").to_string();
    let url = format!("postgres://{user}@{}/{db}", proxy.addr());
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
