//! Through a real PgBouncer 1.18 (Debian's): transaction mode with the safe
//! settings never gives a wrong answer, even to two app instances sharing
//! two server connections; the same load with the settings for a direct
//! connection does go wrong there (the negative control that proves the
//! harness); refusals; session mode.

use std::time::{Duration, Instant};

use pgpipe::{ErrorKind, Executor, Pool, Pooler, Prepare};
use pgpipe_test_support::{Cluster, Pgbouncer, Pgpool, unique};

pub(super) fn upstream() -> String {
    super::support::server_addr()
}

/// A PgBouncer in `mode` with two server connections, or `None` (skipped,
/// outside CI) when it is not installed.
fn pgbouncer(mode: &str) -> Option<Pgbouncer> {
    // Session mode gives each client connection a server of its own: room
    // for the pool's four (and a describer's) there.
    let servers = if mode == "session" { "8" } else { "2" };
    Pgbouncer::builder(&upstream())
        .setting("pool_mode", mode)
        .setting("default_pool_size", servers)
        .start()
        .expect("PgBouncer starts")
}

pub(super) fn pool(url: &str, pooler: Pooler) -> Pool {
    Pool::builder()
        .url(url)
        .max_size(4)
        .pipelining(true)
        .pooler(pooler)
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// What one run of [`load`] saw.
#[derive(Debug, Default)]
pub(super) struct Report {
    ok: u64,
    /// Answers that were not the caller's own.
    wrong: u64,
    /// `division_by_zero`, asked for.
    expected_errors: u64,
    /// Anything else, with the first few messages.
    unexpected: u64,
    samples: Vec<String>,
}

impl Report {
    fn add(&mut self, other: Report) {
        self.ok += other.ok;
        self.wrong += other.wrong;
        self.expected_errors += other.expected_errors;
        self.unexpected += other.unexpected;
        self.samples.extend(other.samples);
        self.samples.truncate(5);
    }

    fn unexpected(&mut self, what: String) {
        self.unexpected += 1;
        if self.samples.len() < 5 {
            self.samples.push(what);
        }
    }

    /// Asserts that no answer went wrong, nothing failed unexpectedly, and
    /// all `answers` came back.
    pub(super) fn assert_all_right(&self, answers: u64) {
        assert_eq!(self.wrong + self.unexpected, 0, "{}", self.line());
        assert_eq!(
            self.ok + self.expected_errors,
            answers,
            "every query answered: {}",
            self.line()
        );
    }

    fn hazard(&self) -> bool {
        self.wrong + self.unexpected > 0
    }

    fn line(&self) -> String {
        format!(
            "REPORT ok={} wrong={} expected={} unexpected={} samples={:?}",
            self.ok, self.wrong, self.expected_errors, self.unexpected, self.samples
        )
    }

    fn parse(output: &str) -> Report {
        let line = output
            .lines()
            .find_map(|l| l.split_once("REPORT ").map(|(_, report)| report))
            .unwrap_or_else(|| panic!("no report in the worker's output:\n{output}"));
        let field = |name: &str| -> u64 {
            line.split(' ')
                .find_map(|f| f.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} in {line}"))
        };
        Report {
            ok: field("ok"),
            wrong: field("wrong"),
            expected_errors: field("expected"),
            unexpected: field("unexpected"),
            samples: vec![line.split("samples=").nth(1).unwrap_or("").to_string()],
        }
    }
}

/// `tasks` tasks, `total` queries between them: parameterised queries in
/// eight statement texts, parameters padded up to 64 KiB (so that a query
/// reaches PgBouncer in pieces), 5% failing with `division_by_zero`, and
/// every 40th an atomic batch of three. Each answer is checked against the
/// caller's own id. Stops early at `deadline` or, with `stop_at_hazard`, at
/// the first wrong answer or unexpected error.
pub(super) async fn load(
    pool: &Pool,
    instance: u64,
    tasks: u64,
    total: u64,
    deadline: Instant,
    stop_at_hazard: bool,
) -> Report {
    let hazard = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handles = Vec::new();
    for task in 0..tasks {
        let pool = pool.clone();
        let hazard = hazard.clone();
        handles.push(tokio::spawn(async move {
            let mut report = Report::default();
            let per_task = total / tasks;
            for i in 0..per_task {
                if Instant::now() > deadline
                    || (stop_at_hazard && hazard.load(std::sync::atomic::Ordering::Relaxed))
                {
                    break;
                }
                let id = (instance << 40 | task << 20 | i) as i64;
                if i % 40 == 39 {
                    atomic(&pool, id, &mut report).await;
                } else {
                    one(&pool, id, i, &mut report).await;
                }
                if report.hazard() {
                    hazard.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            report
        }));
    }
    let mut report = Report::default();
    for handle in handles {
        report.add(handle.await.unwrap());
    }
    report
}

async fn one(pool: &Pool, id: i64, i: u64, report: &mut Report) {
    let variant = id % 8;
    let sql = format!(
        "SELECT $1::int8 AS id, $2::int8 / $3::int8 AS q, length($4::text) AS n /* v{variant} */"
    );
    let divisor: i64 = if i % 20 == 7 { 0 } else { 1 };
    // Small, and every fourth 8–64 KiB.
    let pad = "x".repeat(if i % 4 == 3 {
        8192 * (1 + (id as usize % 8))
    } else {
        id as usize % 200
    });
    match pool.query_one(&sql, &[&id, &id, &divisor, &pad]).await {
        Ok(row) => {
            let (got, q, n): (i64, i64, i32) = (row.get(0), row.get(1), row.get(2));
            if got == id && q == id && n as usize == pad.len() {
                report.ok += 1;
            } else {
                report.wrong += 1;
                report
                    .samples
                    .push(format!("asked {id}/{}, got {got}/{n}", pad.len()));
            }
        }
        Err(e)
            if divisor == 0
                && e.code() == Some(&pgpipe::tokio_postgres::error::SqlState::DIVISION_BY_ZERO) =>
        {
            report.expected_errors += 1;
        }
        Err(e) => report.unexpected(e.to_string()),
    }
}

async fn atomic(pool: &Pool, id: i64, report: &mut Report) {
    let ids = [id, id + 1, id + 2];
    let mut batch = pool.atomic_batch();
    for id in &ids {
        batch.query("SELECT $1::int8 AS id /* batch */", &[id]);
    }
    match batch.run().await {
        Ok(results) => {
            for (result, id) in results.into_iter().zip(ids) {
                match result {
                    Ok(answer) => {
                        let rows = answer.into_rows();
                        if rows.len() == 1 && rows[0].get::<_, i64>(0) == id {
                            report.ok += 1;
                        } else {
                            report.wrong += 1;
                        }
                    }
                    Err(e) => report.unexpected(e.to_string()),
                }
            }
        }
        Err(e) => report.unexpected(e.to_string()),
    }
}

/// Which pooler a worker declares, by name.
fn pooler_named(name: &str) -> Pooler {
    match name {
        "none" => Pooler::None,
        "pgbouncer-1.18" => Pooler::pgbouncer_transaction((1, 18), 0),
        "pgbouncer-1.21-prepared" => Pooler::pgbouncer_transaction((1, 21), 200),
        other => panic!("unknown pooler {other}"),
    }
}

/// One app instance: run by [`instances`] in a process of its own, with
/// `PGPIPE_POOLER_WORKER=url|pooler|instance|seconds`. Without it, nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_worker() {
    let Ok(spec) = std::env::var("PGPIPE_POOLER_WORKER") else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let (url, pooler, instance, seconds) = (parts[0], parts[1], parts[2], parts[3]);
    let pool = pool(url, pooler_named(pooler));
    let deadline = Instant::now() + Duration::from_secs(seconds.parse().unwrap());
    let stop_at_hazard = pooler == "none";
    let report = load(
        &pool,
        instance.parse().unwrap(),
        32,
        20_000,
        deadline,
        stop_at_hazard,
    )
    .await;
    pool.close_and_wait(Duration::from_secs(5)).await;
    println!("{}", report.line());
}

/// Two app instances, each a process of its own (so their statement names
/// collide, as two deployments' do), running [`load`] against `bouncer`.
fn instances(bouncer: &Pgbouncer, pooler: &str, seconds: u64) -> Report {
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (1..=2)
        .map(|instance| {
            std::process::Command::new(&exe)
                .args([
                    "poolers::load_worker",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(
                    "PGPIPE_POOLER_WORKER",
                    format!("{}|{pooler}|{instance}|{seconds}", bouncer.url()),
                )
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut report = Report::default();
    for child in children {
        let output = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "worker failed:\n{text}");
        report.add(Report::parse(&text));
    }
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_through_transaction_mode_never_get_a_wrong_answer() {
    let Some(bouncer) = pgbouncer("transaction") else {
        return;
    };
    let started = Instant::now();
    let report = tokio::task::spawn_blocking(move || {
        let report = instances(&bouncer, "pgbouncer-1.18", 120);
        (report, bouncer)
    })
    .await
    .unwrap();
    let (report, bouncer) = report;
    eprintln!("{} in {:?}", report.line(), started.elapsed());
    // Per instance: 20,000 requests, of which 480 atomic batches of three.
    report.assert_all_right(2 * (20_000 + 2 * 480));
    assert!(report.expected_errors > 0);
    let log = bouncer.log();
    // Its own complaints; clients closing ("client unexpected eof" when a
    // worker process exits) are not.
    for complaint in [
        "crashed",
        "invalid",
        "protocol",
        "unexpected packet",
        "WARNING",
    ] {
        assert!(
            !log.contains(complaint),
            "PgBouncer's log: {complaint}\n{log}"
        );
    }
}

/// The negative control: the same load with the settings for a direct
/// connection (named statements, 64 queries in flight per connection) goes
/// wrong through the same PgBouncer. If it ever stops doing so, the test
/// above proves nothing, and this one says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_load_without_the_safe_settings_goes_wrong() {
    let Some(bouncer) = pgbouncer("transaction") else {
        return;
    };
    let report = tokio::task::spawn_blocking(move || instances(&bouncer, "none", 30))
        .await
        .unwrap();
    eprintln!("{}", report.line());
    assert!(
        report.hazard(),
        "no longer reproduces the hazard: no wrong answer and no 26000/42P05 in 30 s: {}",
        report.line()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_types_are_refused_up_front_and_everything_else_works() {
    let Some(bouncer) = pgbouncer("transaction") else {
        return;
    };
    let schema = unique("pooler_types");
    let admin = pgpipe_test_support::admin().await;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; CREATE TYPE {schema}.mood AS ENUM ('sad', 'ok', 'happy'); \
             CREATE TYPE {schema}.pair AS (a int8, b text); \
             CREATE TABLE {schema}.t (id int8, mood {schema}.mood); \
             INSERT INTO {schema}.t VALUES (1, 'happy'), (2, 'sad')"
        ))
        .await
        .unwrap();
    let pool = pool(&bouncer.url(), Pooler::pgbouncer_transaction((1, 18), 0));
    let enum_column = format!("SELECT mood FROM {schema}.t WHERE id = $1");
    let composite_param = format!("SELECT ($1::{schema}.pair).a");
    let as_text = format!("SELECT mood::text FROM {schema}.t WHERE id = $1");
    let mut handles = Vec::new();
    for task in 0..8i64 {
        let pool = pool.clone();
        let (enum_column, composite_param, as_text) = (
            enum_column.clone(),
            composite_param.clone(),
            as_text.clone(),
        );
        handles.push(tokio::spawn(async move {
            for i in 0..1250i64 {
                let id = (task + i) % 2 + 1;
                match i % 3 {
                    0 => {
                        let e = pool.query(&enum_column, &[&id]).await.unwrap_err();
                        assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
                        assert!(e.to_string().contains("mood"), "{e}");
                        assert!(!e.may_have_run());
                    }
                    1 => {
                        let e = pool.query(&composite_param, &[&"(1,x)"]).await.unwrap_err();
                        assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
                    }
                    _ => {
                        let row = pool.query_one(&as_text, &[&id]).await.unwrap();
                        let mood: String = row.get(0);
                        assert_eq!(mood, if id == 1 { "happy" } else { "sad" });
                    }
                }
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_state_and_named_statements_are_refused_on_exclusive_connections() {
    let Some(bouncer) = pgbouncer("transaction") else {
        return;
    };
    let pool = pool(&bouncer.url(), Pooler::pgbouncer_transaction((1, 18), 0));
    let mut conn = pool.get().await.unwrap();
    for sql in [
        "SET search_path = public",
        "LISTEN jobs",
        "CREATE TEMP TABLE t (x int)",
        "SELECT pg_advisory_lock(1)",
        "PREPARE p AS SELECT 1",
    ] {
        let e = conn.execute(sql, &[]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotSupported, "{sql}: {e}");
        assert!(e.to_string().contains("no session"), "{sql}: {e}");
    }
    let e = conn.prepare_cached("SELECT 1").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    // What lives as long as a transaction works, inside one.
    let tx = conn.transaction().await.unwrap();
    tx.execute("SET LOCAL statement_timeout = '5s'", &[])
        .await
        .unwrap();
    tx.query_one("SELECT pg_advisory_xact_lock(1)", &[])
        .await
        .unwrap();
    let row = tx
        .query_one("SELECT current_setting('statement_timeout')", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "5s");
    tx.commit().await.unwrap();
}

/// `pool.begin()` through a transaction pooler: a transaction like any
/// other, and no session reset behind its `COMMIT` (there is no session of
/// its own; a reset would land on whichever server the pooler linked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_through_a_transaction_pooler_sends_no_session_reset() {
    let Some(bouncer) = pgbouncer("transaction") else {
        return;
    };
    let pool = pool(&bouncer.url(), Pooler::pgbouncer_transaction((1, 18), 0));
    let admin = pgpipe_test_support::admin().await;
    let mut servers = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let tx = pool.begin().await.unwrap();
        let server: i32 = tx
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        servers.insert(server);
        tx.commit().await.unwrap();
    }
    // Each server's last statement (nothing else uses this PgBouncer): a
    // reset behind a COMMIT would be the last one a server ran.
    for server in servers {
        let last: String = admin
            .query_one(
                "SELECT query FROM pg_stat_activity WHERE pid = $1",
                &[&server],
            )
            .await
            .unwrap()
            .get(0);
        assert!(!last.contains("RESET ALL"), "server {server} ran {last:?}");
    }
}

#[test]
fn settings_that_cannot_work_through_a_transaction_pooler_are_refused_at_build() {
    let transaction = Pooler::pgbouncer_transaction((1, 18), 0);
    let base = || {
        Pool::builder()
            .url("postgres://app@127.0.0.1:6432/app")
            .pooler(transaction)
    };
    let cases = [
        (
            base().statement_timeout(Duration::from_secs(5)),
            "ALTER ROLE",
        ),
        (base().session_setting("search_path", "app"), "ALTER ROLE"),
        (base().after_connect("SET x.y = 1"), "no session"),
        (base().prepare(Prepare::Named), "max_prepared_statements"),
        (base().max_pipeline_depth(8), "session mode"),
        // The default's value, asked for explicitly, is still asked for.
        (base().max_pipeline_depth(64), "session mode"),
    ];
    for (builder, advice) in cases {
        let e = builder.build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        assert!(e.to_string().contains(advice), "{e}");
    }
    // One in flight is what it gets anyway.
    base().max_pipeline_depth(1).build().unwrap();
    // What a newer PgBouncer guarantees lifts the refusals it covers.
    let newer = Pooler::pgbouncer_transaction((1, 21), 200);
    Pool::builder()
        .url("postgres://app@127.0.0.1:6432/app")
        .pooler(newer)
        .prepare(Prepare::Named)
        .max_pipeline_depth(8)
        .build()
        .unwrap();
    assert_eq!(
        Pooler::pgbouncer_transaction((1, 21), 0),
        Pooler::Transaction {
            tracks_pipeline: true,
            tracks_prepared: false
        }
    );
    assert_eq!(Pooler::unknown_transaction(), transaction);
}

/// Session mode keeps one server per client connection: the pool's full
/// behaviour (named statements, 64 in flight) works through it. (What it
/// costs is the benchmark's to say: `pgpipe-bench --pgbouncer`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_pipelines_as_usual() {
    let Some(bouncer) = pgbouncer("session") else {
        return;
    };
    let through = pool(&bouncer.url(), Pooler::Session);
    let deadline = Instant::now() + Duration::from_secs(120);
    let report = load(&through, 1, 32, 20_000, deadline, false).await;
    report.assert_all_right(20_960);
}

/// The server behind PgBouncer stops: what was in flight fails at once with
/// `ConnectionLost`; new queries fail at `query_timeout` instead of waiting
/// for PgBouncer's `query_wait_timeout` (120 s by default); once PgBouncer
/// points at a new server, writes resume on the same pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_behind_pgbouncer_stops_and_another_takes_over() {
    let old = Cluster::start().expect("a throwaway server");
    let Some(bouncer) = Pgbouncer::builder(&format!("127.0.0.1:{}", old.port()))
        .database("postgres")
        .setting("server_login_retry", "1")
        .start()
        .expect("PgBouncer starts")
    else {
        return;
    };
    let registry = prometheus::Registry::new();
    let pool = Pool::builder()
        .url(&bouncer.url())
        .max_size(4)
        .pipelining(true)
        .pooler(Pooler::pgbouncer_transaction((1, 18), 0))
        .query_timeout(Duration::from_secs(2))
        .registry(&registry)
        .build()
        .unwrap();
    pool.execute("CREATE TABLE IF NOT EXISTS failover (x int8)", &[])
        .await
        .unwrap();
    let in_flight: Vec<_> = (0..2)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.query("SELECT pg_sleep(1.5)", &[]).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = Instant::now();
    old.stop("immediate").unwrap();
    for query in in_flight {
        let e = query.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionLost, "{e}");
        assert!(e.may_have_run());
    }
    let crashed = crate::support::Scrape::of(&registry).value(
        "pgpipe_pooler_errors_total",
        &[("kind", "server_conn_crashed")],
    );
    assert_eq!(crashed, 2.0, "PgBouncer's `server conn crashed?`, counted");
    assert!(
        stopped.elapsed() < Duration::from_secs(1),
        "in-flight queries failed after {:?}",
        stopped.elapsed()
    );
    // No server: a new query fails by its deadline, never hangs.
    let asked = Instant::now();
    let e = pool
        .execute("INSERT INTO failover VALUES (1)", &[])
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::QueryTimeout | ErrorKind::Connect),
        "{e}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "{:?}: {e}",
        asked.elapsed()
    );

    let new = Cluster::start().expect("a second throwaway server");
    bouncer
        .repoint(&format!("127.0.0.1:{}", new.port()))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match pool
            .execute("CREATE TABLE IF NOT EXISTS failover (x int8)", &[])
            .await
        {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "writes did not resume: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let written = pool
        .execute("INSERT INTO failover VALUES (2)", &[])
        .await
        .unwrap();
    assert_eq!(written, 1);
}

/// PgBouncer 1.21 and later track pipelines and, with
/// `max_prepared_statements`, named statements: the same two instances run
/// with 64 queries in flight per connection and named statements. Debian
/// 12 ships 1.18, so this runs when `PGPIPE_PGBOUNCER_1_21` names a newer
/// binary (CI: PgBouncer 1.24, from `.ci/install-pgbouncer-1.24`), and says
/// so when it is skipped (under `CI=true` it fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_pgbouncer_pipelines_with_named_statements() {
    let Some(binary) =
        pgpipe_test_support::newer_pgbouncer("a_newer_pgbouncer_pipelines_with_named_statements")
    else {
        return;
    };
    let bouncer = Pgbouncer::builder(&upstream())
        .binary(binary)
        .setting("max_prepared_statements", "200")
        .start()
        .expect("PgBouncer starts")
        .expect("the binary given");
    let report =
        tokio::task::spawn_blocking(move || instances(&bouncer, "pgbouncer-1.21-prepared", 120))
            .await
            .unwrap();
    eprintln!("{}", report.line());
    assert_eq!(report.wrong + report.unexpected, 0, "{}", report.line());
}

/// pgpool-II serves each client connection with a process and a server
/// session of its own: declared as a session pooler, the pool pipelines
/// with named statements through it, and every answer is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgpool_session_semantics_pipeline_as_usual() {
    let Some(pgpool) = Pgpool::start(&upstream(), 8).expect("pgpool-II starts") else {
        return;
    };
    let through = pool(&pgpool.url(), Pooler::Session);
    let started = Instant::now();
    let report = load(
        &through,
        1,
        32,
        20_000,
        started + Duration::from_secs(120),
        false,
    )
    .await;
    eprintln!("{} in {:?}", report.line(), started.elapsed());
    report.assert_all_right(20_960);
    through.close_and_wait(Duration::from_secs(5)).await;
}
