//! The built binaries as real processes: the service's start-up, its
//! shutdown on `SIGTERM` and Ctrl-C (sent with `kill`), its log, and the
//! load generator against it.
//!
//! Each service gets a schema of its own (through
//! `PGPIPE__SESSION_SETTINGS__SEARCH_PATH`) and an `application_name` of
//! its own, so that the tests can find its connections in
//! `pg_stat_activity` on a server others use too.

mod http;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{call, try_call};
use hyper::{Method, StatusCode};
use pgpipe_test_support::{admin, unique, url_with_app};

/// Everything a child wrote to stdout and stderr, line by line, as it
/// writes it.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<String>>);

impl Log {
    fn follow(&self, from: impl Read + Send + 'static) {
        let log = self.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines().map_while(Result::ok) {
                let mut text = log.0.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
    }

    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }

    /// Waits until a line contains `needle`, and returns that line.
    async fn wait_for(&self, needle: &str, child: &mut Child, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(line) = self.text().lines().find(|l| l.contains(needle)) {
                return line.to_string();
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("exited ({status}) before {needle:?}:\n{}", self.text());
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Sends `signal` (`TERM`, `INT`) to `child` with the `kill` command.
fn kill(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal}");
}

/// Waits for `child` to exit, for at most `within`.
async fn exit(child: &mut Child, within: Duration, log: &Log) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "still running after {within:?}:\n{}",
            log.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `web-service` binary, started against the test server.
struct Service {
    child: Child,
    log: Log,
    addr: SocketAddr,
    schema: String,
    app: String,
}

impl Service {
    /// Starts it with `env` (and no `RUST_LOG` or `SHUTDOWN_*` from the
    /// test's environment) and waits until it listens.
    async fn start(env: &[(&str, &str)]) -> Service {
        let schema = unique("bank_process");
        let app = unique("web_service");
        admin()
            .await
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_web-service"));
        command
            .env("DATABASE_URL", url_with_app(&app))
            .env("LISTEN_ADDR", "127.0.0.1:0")
            .env("PGPIPE__SESSION_SETTINGS__SEARCH_PATH", &schema)
            .env_remove("RUST_LOG")
            .env_remove("SHUTDOWN_DELAY")
            .env_remove("SHUTDOWN_TIMEOUT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap();
        let log = Log::default();
        log.follow(child.stdout.take().unwrap());
        log.follow(child.stderr.take().unwrap());
        let line = log
            .wait_for("listening on http://", &mut child, Duration::from_secs(60))
            .await;
        let addr = line
            .rsplit("http://")
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        Service {
            child,
            log,
            addr,
            schema,
            app,
        }
    }

    /// The service's connections open on the server now.
    async fn backends(&self) -> i64 {
        admin()
            .await
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&self.app],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Waits until the service has no connection open on the server.
    async fn wait_no_backends(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.backends().await > 0 {
            assert!(
                Instant::now() < deadline,
                "{} connections left open:\n{}",
                self.backends().await,
                self.log.text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Kills the service if it still runs, and drops its schema, also when the
/// test failed (on a runtime of its own: the test's may be unwinding).
impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let drop_schema = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async { admin().await.batch_execute(&drop_schema).await })
        })
        .join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_requests_in_flight_then_exits_0_with_its_connections_closed() {
    // Long enough for the checks during the delay on a busy machine.
    let delay = Duration::from_secs(3);
    let mut service = Service::start(&[("SHUTDOWN_DELAY", "3")]).await;
    let addr = service.addr;
    assert_eq!(
        call(addr, Method::GET, "/readyz", "").await.0,
        StatusCode::OK
    );
    assert!(
        service.backends().await > 0,
        "the pool has connections open"
    );

    // A transfer held in flight: another session locks its two accounts.
    let locker = admin().await;
    locker
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM {}.pgpipe_example_accounts WHERE id IN (1, 2) FOR UPDATE",
            service.schema
        ))
        .await
        .unwrap();
    let transfer = tokio::spawn(async move {
        call(
            addr,
            Method::POST,
            "/transfers",
            r#"{"from": 1, "to": 2, "amount": 5}"#,
        )
        .await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = admin()
            .await
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[&service.app],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the transfer never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let signalled = Instant::now();
    kill(&service.child, "TERM");
    // At once: not ready, so the balancer sends no more; but what still
    // comes is served.
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let Some((status, body)) = try_call(addr, Method::GET, "/readyz", "").await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            panic!(
                "no answer right after SIGTERM (exit: {:?}):\n{}",
                service.child.try_wait().unwrap(),
                service.log.text()
            );
        };
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(body, "draining");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {status} after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answer = try_call(addr, Method::GET, "/accounts/3", "").await;
    assert_eq!(
        answer.map(|(status, _)| status),
        Some(StatusCode::OK),
        "served while draining"
    );
    assert!(signalled.elapsed() < delay, "the checks took too long");

    // After the delay: no new connections, and the transfer still waits.
    tokio::time::sleep(delay.saturating_sub(signalled.elapsed()) + Duration::from_secs(1)).await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "still taking connections after the delay"
    );
    assert!(
        service.child.try_wait().unwrap().is_none(),
        "exited with a request in flight:\n{}",
        service.log.text()
    );
    assert!(!transfer.is_finished());

    // The lock goes: the transfer completes, and only then does it exit.
    locker.batch_execute("COMMIT").await.unwrap();
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), transfer)
        .await
        .expect("the transfer in flight is answered")
        .unwrap();
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let status = exit(&mut service.child, Duration::from_secs(10), &service.log).await;
    assert_eq!(status.code(), Some(0), "{}", service.log.text());
    let log = service.log.text();
    assert!(log.contains("signal=SIGTERM"), "{log}");
    assert!(log.contains("pool closed"), "{log}");
    service.wait_no_backends().await;
    let balance: i64 = admin()
        .await
        .query_one(
            &format!(
                "SELECT balance FROM {}.pgpipe_example_accounts WHERE id = 1",
                service.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(balance, 95, "the drained transfer committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_without_the_delay_and_logs_no_spans_by_default() {
    // A delay Ctrl-C must not wait for.
    let mut service = Service::start(&[("SHUTDOWN_DELAY", "30")]).await;
    let (status, _) = call(service.addr, Method::GET, "/accounts/1", "").await;
    assert_eq!(status, StatusCode::OK);
    kill(&service.child, "INT");
    let status = exit(&mut service.child, Duration::from_secs(5), &service.log).await;
    assert_eq!(status.code(), Some(0), "{}", service.log.text());
    let log = service.log.text();
    assert!(log.contains("signal=SIGINT"), "{log}");
    assert!(log.contains("pool closed"), "{log}");
    assert!(
        !log.contains("pgpipe.query"),
        "a line per query by default:\n{log}"
    );
    service.wait_no_backends().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_log_shows_pgpipes_spans_with_their_fields() {
    let mut service = Service::start(&[("RUST_LOG", "info,pgpipe=info")]).await;
    let (status, _) = call(service.addr, Method::GET, "/accounts/1", "").await;
    assert_eq!(status, StatusCode::OK);
    kill(&service.child, "INT");
    let status = exit(&mut service.child, Duration::from_secs(5), &service.log).await;
    assert_eq!(status.code(), Some(0), "{}", service.log.text());
    let log = service.log.text();
    // The request's three reads, each a span closing with its fields.
    let queries: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("pgpipe.query{") && l.contains("close time.busy"))
        .collect();
    assert!(queries.len() >= 3, "{log}");
    for line in &queries {
        for field in [
            "db.system.name=\"postgresql\"",
            "db.operation.name=\"SELECT\"",
            "pgpipe.pool=bank",
            "pgpipe.route=\"shared\"",
        ] {
            assert!(line.contains(field), "{field} in {line}");
        }
    }
    // The schema's set-up, on a connection of its own.
    assert!(log.contains("pgpipe.checkout{pgpipe.pool=bank}"), "{log}");
}

/// The value of the series `name{labels}` in a scrape.
fn series(scrape: &str, name: &str, labels: &str) -> f64 {
    scrape
        .lines()
        .find(|line| line.starts_with(name) && line.contains(labels))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_generator_moves_the_metrics_and_stops_on_sigterm() {
    let mut service = Service::start(&[("SHUTDOWN_DELAY", "0")]).await;
    let mut load = Command::new(env!("CARGO_BIN_EXE_load-generator"))
        .env("TARGET", service.addr.to_string())
        .env("CONCURRENCY", "8")
        .env("REPORT", "1")
        .env_remove("DURATION")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = Log::default();
    log.follow(load.stdout.take().unwrap());
    log.follow(load.stderr.take().unwrap());
    let report = log
        .wait_for("200 ", &mut load, Duration::from_secs(10))
        .await;
    log.wait_for("201 ", &mut load, Duration::from_secs(10))
        .await;
    assert!(!report.contains("no connection"), "{report}");

    let (status, scrape) = call(service.addr, Method::GET, "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    let ok = series(
        &scrape,
        "pgpipe_queries_total",
        r#"mode="pipelined",outcome="ok",pool="bank""#,
    );
    assert!(ok >= 100.0, "{ok} pipelined queries:\n{scrape}");

    kill(&load, "TERM");
    let status = exit(&mut load, Duration::from_secs(3), &log).await;
    assert_eq!(status.code(), Some(0), "{}", log.text());
    assert!(log.text().contains("SIGTERM: stopping"), "{}", log.text());

    kill(&service.child, "TERM");
    let status = exit(&mut service.child, Duration::from_secs(10), &service.log).await;
    assert_eq!(status.code(), Some(0), "{}", service.log.text());
}
