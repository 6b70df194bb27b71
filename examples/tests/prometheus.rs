//! A real Prometheus scrapes the example service under load. Every dashboard
//! expression returns data of the right sign and unit, every rule evaluates,
//! no alert fires in normal running, and stopping the database fires the one
//! alert that should fire and no other.
//!
//! The rules run with every window and `for:` divided by [`SPEED_UP`], so
//! what takes minutes in production takes seconds here.

mod http;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::call;
use hyper::{Method, StatusCode};
use pgpipe_examples::{AppState, router};
use pgpipe_test_support::{Cluster, required_tool, unique};

/// Rule windows and `for:` durations are divided by this.
const SPEED_UP: u64 = 15;
/// What Grafana's `$__rate_interval` becomes: four scrapes and more.
const RATE_INTERVAL: &str = "15s";
const JOB: &str = "bank-service";
/// One test at a time: the on/off comparison times the service, and the
/// other loads the machine.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

/// `5m` → `20s`: a Prometheus duration divided by [`SPEED_UP`].
fn scaled(duration: &str) -> String {
    let (number, unit) = duration.split_at(duration.len() - 1);
    let seconds: u64 = number.parse().unwrap_or_else(|_| panic!("{duration}"));
    let seconds = match unit {
        "s" => seconds,
        "m" => seconds * 60,
        "h" => seconds * 3600,
        _ => panic!("unexpected duration {duration}"),
    };
    format!("{}s", (seconds / SPEED_UP).max(1))
}

/// `alerts.yml` with every range (`[5m]`) and `for:` sped up.
fn scaled_rules() -> String {
    let text = std::fs::read_to_string(repo_file("dashboards/alerts.yml")).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        if let Some(duration) = line.trim().strip_prefix("for: ") {
            let indent = &line[..line.len() - line.trim_start().len()];
            out.push_str(&format!("{indent}for: {}\n", scaled(duration)));
            continue;
        }
        let mut rest = line;
        while let Some(open) = rest.find('[') {
            let close = open + rest[open..].find(']').unwrap();
            out.push_str(&rest[..=open]);
            out.push_str(&scaled(&rest[open + 1..close]));
            rest = &rest[close..];
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

/// Every dashboard expression, with its panel's title and unit, and the
/// template variables filled in for this run.
fn dashboard_queries() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(repo_file("dashboards/pgpipe.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        // The row for pools with replicas: the example service has one
        // server (tests/it/dashboards.rs checks that its series exist).
        if panel["type"] == "row" && panel["title"].as_str().unwrap_or("").starts_with("Hosts") {
            break;
        }
        let unit = panel["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .unwrap_or_default();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", RATE_INTERVAL)
                .replace("$job", JOB)
                .replace("$instance", ".*")
                .replace("$pool", "bank");
            queries.push((
                panel["title"].as_str().unwrap().to_string(),
                unit.to_string(),
                expr,
            ));
        }
    }
    queries
}

/// A Prometheus server of the test's own, in a temporary directory.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    fn start(binary: &Path, targets: &[SocketAddr]) -> Prometheus {
        let dir = std::env::temp_dir().join(unique("pgpipe-prometheus"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rules.yml"), scaled_rules()).unwrap();
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: [rules.yml]\n\
             scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      \
             - targets: [{}]\n",
            targets.join(", ")
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Prometheus { child, addr, dir }
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if tokio::net::TcpStream::connect(self.addr).await.is_ok()
                && call(self.addr, Method::GET, "/-/ready", "").await.0 == StatusCode::OK
            {
                return;
            }
            assert!(Instant::now() < deadline, "not ready:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    async fn api(&self, path: &str) -> serde_json::Value {
        let (status, body) = call(self.addr, Method::GET, path, "").await;
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert_eq!(value["status"], "success", "{path}: {body}");
        value["data"].clone()
    }

    /// An instant query: each series' labels and value.
    async fn query(&self, expr: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        self.query_at(expr, None).await
    }

    /// An instant query at `at` (Unix seconds), or now.
    async fn query_at(&self, expr: &str, at: Option<f64>) -> Vec<(BTreeMap<String, String>, f64)> {
        let time = at.map_or(String::new(), |t| format!("&time={t:.3}"));
        let data = self
            .api(&format!("/api/v1/query?query={}{time}", encode(expr)))
            .await;
        let number = |pair: &serde_json::Value| -> f64 {
            let text = pair[1].as_str().unwrap();
            text.parse()
                .unwrap_or_else(|_| panic!("{expr}: value {text}"))
        };
        match data["resultType"].as_str().unwrap() {
            "scalar" => vec![(BTreeMap::new(), number(&data["result"]))],
            "vector" => data["result"]
                .as_array()
                .unwrap()
                .iter()
                .map(|sample| {
                    let labels = serde_json::from_value(sample["metric"].clone()).unwrap();
                    (labels, number(&sample["value"]))
                })
                .collect(),
            other => panic!("{expr}: a {other}"),
        }
    }

    /// The alerts firing now.
    async fn firing(&self) -> BTreeSet<String> {
        let data = self.api("/api/v1/alerts").await;
        data["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|alert| alert["state"] == "firing")
            .map(|alert| alert["labels"]["alertname"].as_str().unwrap().to_string())
            .collect()
    }

    /// Every rule and whether its last evaluation succeeded.
    async fn rule_health(&self) -> Vec<(String, String)> {
        let data = self.api("/api/v1/rules").await;
        data["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|group| group["rules"].as_array().unwrap().iter())
            .map(|rule| {
                let health = rule["health"].as_str().unwrap().to_string();
                let error = rule["lastError"].as_str().unwrap_or_default();
                (rule["name"].as_str().unwrap().to_string(), health + error)
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Requests from `tasks` loops until `stop`: reads, and every tenth a
/// transfer. Answers are not checked here (the web service test does that);
/// during the outage they are errors.
fn load(addr: SocketAddr, tasks: i64, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
    (0..tasks)
        .map(|task| {
            let stop = Arc::clone(stop);
            tokio::spawn(async move {
                let mut i = task;
                while !stop.load(Ordering::Relaxed) {
                    let id = i % 50 + 1;
                    if i % 10 == 0 {
                        let body =
                            format!(r#"{{"from": {id}, "to": {}, "amount": 1}}"#, id % 50 + 1);
                        call(addr, Method::POST, "/transfers", &body).await;
                    } else {
                        call(addr, Method::GET, &format!("/accounts/{id}"), "").await;
                    }
                    i += tasks;
                }
            })
        })
        .collect()
}

/// As [`load`], each task on one kept-alive connection: the service runs
/// its requests one after another in one task, as behind an HTTP client
/// that keeps its connections (a connection per request would put each
/// request in a task of its own).
fn kept_alive_load(
    addr: SocketAddr,
    tasks: i64,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    (0..tasks)
        .map(|task| {
            let stop = Arc::clone(stop);
            tokio::spawn(async move {
                let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                let io = hyper_util::rt::TokioIo::new(stream);
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(io).await.unwrap();
                tokio::spawn(connection);
                let mut i = task;
                while !stop.load(Ordering::Relaxed) {
                    let id = i % 50 + 1;
                    let (method, path, body) = if i % 10 == 0 {
                        let body =
                            format!(r#"{{"from": {id}, "to": {}, "amount": 1}}"#, id % 50 + 1);
                        (Method::POST, "/transfers".to_string(), body)
                    } else {
                        (Method::GET, format!("/accounts/{id}"), String::new())
                    };
                    let request = hyper::Request::builder()
                        .method(method)
                        .uri(path)
                        .header("host", "localhost")
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(body)))
                        .unwrap();
                    let response = sender.send_request(request).await.unwrap();
                    // A transfer the balance does not cover is a 409.
                    assert!(
                        !response.status().is_server_error(),
                        "{}",
                        response.status()
                    );
                    response.into_body().collect().await.unwrap();
                    i += tasks;
                }
            })
        })
        .collect()
}

/// Checks one dashboard value against its panel's unit.
fn check_value(title: &str, unit: &str, expr: &str, value: f64) {
    if value.is_nan() {
        // A quantile of a histogram that saw nothing in the window (the
        // batch window's wait, with no batch window set) has no value.
        assert!(
            expr.starts_with("histogram_quantile"),
            "{title}: {expr} is NaN"
        );
        return;
    }
    assert!(value.is_finite(), "{title}: {expr} = {value}");
    assert!(value >= 0.0, "{title}: {expr} = {value}, negative");
    match unit {
        "percentunit" => assert!(value <= 1.0, "{title}: {expr} = {value}, not a ratio"),
        "s" => assert!(value < 60.0, "{title}: {expr} = {value} s"),
        "reqps" | "ops" | "short" => {}
        other => panic!("{title}: unit {other} is not checked here"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_evaluates_the_dashboard_and_the_alerts() {
    let Some(binary) = required_tool("prometheus", "Debian's prometheus package") else {
        return;
    };
    let _alone = ALONE.lock().await;
    // A database of the test's own, so that stopping it harms no one else.
    let cluster = Cluster::start().expect("a throwaway PostgreSQL cluster");
    let registry = prometheus::Registry::new();
    let pool = pgpipe::Pool::builder()
        .url(&cluster.url())
        .max_size(4)
        .pipelining(true)
        .connect_timeout(Duration::from_secs(1))
        .wait_timeout(Duration::from_secs(1))
        .registry(&registry)
        .pool_name("bank")
        .build()
        .unwrap();
    let state = AppState::new(pool.clone(), registry, &unique("bank"));
    state.create_schema(50).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service = listener.local_addr().unwrap();
    let server = tokio::spawn(axum::serve(listener, router(state)).into_future());

    let prometheus = Prometheus::start(&binary, &[service]);
    prometheus.wait_ready().await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = load(service, 16, &stop);

    // Normal running: twenty seconds of scrapes under load.
    let deadline = Instant::now() + Duration::from_secs(30);
    let throughput = format!("sum(rate(pgpipe_queries_total{{job=\"{JOB}\"}}[{RATE_INTERVAL}]))");
    while prometheus
        .query(&throughput)
        .await
        .first()
        .is_none_or(|(_, v)| *v <= 0.0)
    {
        assert!(Instant::now() < deadline, "no throughput seen");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(20)).await;

    let queries = dashboard_queries();
    assert!(queries.len() >= 30, "{} expressions", queries.len());
    let mut nan = Vec::new();
    for (title, unit, expr) in &queries {
        let samples = prometheus.query(expr).await;
        assert!(!samples.is_empty(), "{title}: {expr} returned no data");
        for (_, value) in &samples {
            check_value(title, unit, expr, *value);
            if value.is_nan() {
                nan.push(title.clone());
            }
        }
    }
    // The numbers at a glance all have a value under load, and the ones
    // that must move do.
    for (title, _, expr) in queries.iter().take(6) {
        let value = prometheus.query(expr).await[0].1;
        assert!(!value.is_nan(), "{title}: no value under load");
        if [
            "Throughput",
            "p99 latency",
            "Connections in use",
            "Round trips avoided",
        ]
        .contains(&title.as_str())
        {
            assert!(value > 0.0, "{title}: {expr} = {value} under load");
        }
    }
    for (rule, health) in prometheus.rule_health().await {
        assert_eq!(health, "ok", "rule {rule}");
    }
    assert_eq!(
        prometheus.firing().await,
        BTreeSet::new(),
        "no alert in normal running"
    );

    // The fault: the database stops. Every alert's longest window and wait
    // (10m + 10m, sped up) passes while the load goes on.
    let stopped = Instant::now();
    tokio::task::spawn_blocking(move || cluster.stop("immediate").unwrap());
    let mut seen = BTreeSet::new();
    let mut unreachable_after = None;
    while stopped.elapsed() < Duration::from_secs(50) {
        let firing = prometheus.firing().await;
        if unreachable_after.is_none() && firing.contains("PgpipeDatabaseUnreachable") {
            unreachable_after = Some(stopped.elapsed());
        }
        seen.extend(firing);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    server.abort();
    for (rule, health) in prometheus.rule_health().await {
        assert_eq!(health, "ok", "rule {rule}");
    }
    assert!(
        unreachable_after.is_some(),
        "PgpipeDatabaseUnreachable never fired; firing: {seen:?}"
    );
    assert_eq!(
        seen,
        BTreeSet::from(["PgpipeDatabaseUnreachable".to_string()]),
        "a stopped database fires its alert and no other"
    );
    eprintln!(
        "unreachable fired after {:?}; quantiles without data: {nan:?}",
        unreachable_after.unwrap()
    );
}

/// Latency saved, as the dashboard shows it, against an on/off run of the
/// example service: two instances through the same 1 ms (each way) latency
/// proxy, one pipelining and one not (`max_size` 8, the service's
/// default), scraped by one Prometheus, the same HTTP load on each in
/// alternating phases. Per phase, the dashboard's "latency saved per
/// pipelined query" on the pipelining instance against the difference in
/// the two instances' mean query time (both from their own histograms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_saved_on_the_example_service_agrees_with_an_on_off_run() {
    let Some(binary) = required_tool("prometheus", "Debian's prometheus package") else {
        return;
    };
    let _alone = ALONE.lock().await;
    pgpipe_test_support::ahead_of_other_work();
    let proxy = pgpipe_proxy::Proxy::builder(pgpipe_test_support::server_addr())
        .delay(Duration::from_millis(1))
        .start()
        .unwrap();
    let url = pgpipe_test_support::server_url(None, Some(&proxy.addr().to_string()), None);
    let mut services = Vec::new();
    for pipelining in [true, false] {
        let registry = prometheus::Registry::new();
        let pool = pgpipe::Pool::builder()
            .url(&url)
            .max_size(8)
            .pipelining(pipelining)
            .wait_timeout(Duration::from_secs(20))
            .registry(&registry)
            .pool_name("bank")
            .build()
            .unwrap();
        let state = AppState::new(pool, registry, &unique("saved"));
        state.create_schema(50).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(axum::serve(listener, router(state.clone())).into_future());
        services.push((addr, server, state));
    }
    let (on, off) = (services[0].0, services[1].0);
    let prometheus = Prometheus::start(&binary, &[on, off]);
    prometheus.wait_ready().await;

    const PHASE: u64 = 8;
    let window = format!("{}s", PHASE - 2);
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let mut failures = Vec::new();
    for tasks in [1, 64] {
        // Each phase's end, for the pipelining instance and for the other.
        let mut ends: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for round in 0..2 {
            for side in [round % 2, 1 - round % 2] {
                let stop = Arc::new(AtomicBool::new(false));
                let load = kept_alive_load(services[side].0, tasks, &stop);
                tokio::time::sleep(Duration::from_secs(PHASE)).await;
                ends[side].push(unix());
                stop.store(true, Ordering::Relaxed);
                for task in load {
                    task.await.unwrap();
                }
                // Two scrapes past the phase's end, before the next.
                tokio::time::sleep(Duration::from_millis(2500)).await;
            }
        }
        let selector = |addr: SocketAddr, mode: &str| {
            format!("{{job=\"{JOB}\",instance=\"{addr}\",pool=\"bank\",mode=\"{mode}\"}}")
        };
        // Summed over each side's phases: the windows end with the phases
        // (the load runs to the end of each) and leave out their first
        // seconds.
        let mut sums = [[0.0f64; 2]; 2];
        // Each phase's mean query time, per side: how far two phases of
        // the same instance differ is how far the machine moved the
        // measurement (see the tolerance below).
        let mut phase_means: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for (side, (addr, mode)) in [(on, "pipelined"), (off, "exclusive")]
            .into_iter()
            .enumerate()
        {
            for &end in &ends[side] {
                let mut phase = [0.0f64; 2];
                for (i, part) in ["sum", "count"].into_iter().enumerate() {
                    let expr = format!(
                        "increase(pgpipe_query_duration_seconds_{part}{}[{window}])",
                        selector(addr, mode)
                    );
                    phase[i] = prometheus.query_at(&expr, Some(end)).await[0].1;
                    sums[side][i] += phase[i];
                }
                phase_means[side].push(phase[0] / phase[1]);
            }
        }
        let mean = |side: usize| sums[side][0] / sums[side][1];
        let measured = mean(1) - mean(0);
        // The dashboard's own expression, at the end of each pipelining
        // phase, weighted by its queries.
        let (_, _, expr) = dashboard_queries()
            .into_iter()
            .find(|(title, _, _)| title == "Latency saved per pipelined query")
            .expect("the dashboard shows latency saved per query");
        let expr = expr
            .replace(RATE_INTERVAL, &window)
            .replace("instance=~\".*\"", &format!("instance=\"{on}\""));
        let mut estimated = 0.0;
        for &end in &ends[0] {
            let count_expr = format!(
                "increase(pgpipe_query_duration_seconds_count{}[{window}])",
                selector(on, "pipelined")
            );
            let count = prometheus.query_at(&count_expr, Some(end)).await[0].1;
            estimated += prometheus.query_at(&expr, Some(end)).await[0].1 * count;
        }
        estimated /= sums[0][1];
        let phase_seconds = (PHASE - 2) as f64 * ends[0].len() as f64;
        // The measured saving is a difference of two means, each of phases
        // that differ by the machine's other work: its uncertainty is the
        // half-spread of each side's phases, added in quadrature.
        let half_spread = |side: usize| {
            let means = &phase_means[side];
            let (low, high) = means
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &m| (l.min(m), h.max(m)));
            (high - low) / 2.0
        };
        let noise = half_spread(0).hypot(half_spread(1));
        let case = format!(
            "{tasks} workers: a query took {:.3} ms off, {:.3} ms on ({:.0} and {:.0} queries/s, \
             {:.1} and {:.1} in the pool): {:.3} ms saved, {:.3} ms estimated, \
             phases within {:.3} ms",
            mean(1) * 1e3,
            mean(0) * 1e3,
            sums[1][1] / phase_seconds,
            sums[0][1] / phase_seconds,
            sums[1][0] / phase_seconds,
            sums[0][0] / phase_seconds,
            measured * 1e3,
            estimated * 1e3,
            noise * 1e3
        );
        eprintln!("{case}");
        // A quarter of the saving, or where it is small a tenth of a
        // pipelined query's own time (a machine twice as slow stretches
        // both); never tighter than the phases themselves agree.
        let allowed = (0.25 * measured.abs()).max(0.1 * mean(0)).max(3.0 * noise);
        if (estimated - measured).abs() > allowed {
            failures.push(case);
        }
    }
    for (_, server, state) in services {
        server.abort();
        let _ = state.drop_schema().await;
    }
    assert!(failures.is_empty(), "out of tolerance: {failures:#?}");
}
