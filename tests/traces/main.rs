//! With the `tracing` feature: a span per query carrying the database
//! conventions' fields and never a parameter or SQL text, and events for
//! what the pool does by itself.
//!
//! A binary of its own: tracing caches, per call site, whether anyone
//! listens, and other tests' spans on other threads race with this test's
//! subscriber when they share a process.

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::format::FmtSpan;

/// Everything the subscriber writes, to read back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn queries_have_spans_and_quarantines_are_events() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_span_events(FmtSpan::CLOSE)
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let pool = pgpipe::Pool::builder()
        .url(&pgpipe_test_support::url_with_app(
            &pgpipe_test_support::unique("traced"),
        ))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .pool_name("traced")
        // Far above what a quick query takes on a busy machine (a first
        // query there once took 166 ms and was logged as slow too).
        .log_slow_statements(std::time::Duration::from_secs(1))
        .build()
        .unwrap();
    let secret = "sentinel-parameter-value";
    let row = pool
        .query_one("SELECT $1::text AS sentinel_sql_text", &[&secret])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), secret);
    // A function that changes a reported setting, on the shared path:
    // quarantined, an event. Code the guard cannot prove runs alone, so it
    // gets there as an overload of a proven built-in created after the
    // lane's last look at its catalog (a quiet second: no look under way).
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let admin = pgpipe_test_support::admin().await;
    admin
        .batch_execute(
            "CREATE FUNCTION public.initcap(integer) RETURNS int LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM set_config('application_name', 'changed', false); RETURN 1; END $$",
        )
        .await
        .unwrap();
    let overload = pool.query("SELECT initcap(1)", &[]).await;
    admin
        .batch_execute("DROP FUNCTION public.initcap(integer)")
        .await
        .unwrap();
    overload.unwrap();
    // A failure is on its span, as OpenTelemetry's database conventions
    // name it; a query past log_slow_statements is an event.
    let e = pool.query("SELECT 1 / 0", &[]).await.unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("22012"));
    pool.query("SELECT pg_sleep(1.2)", &[]).await.unwrap();
    pool.query("SELECT 2", &[]).await.unwrap();
    drop(pool);

    let text = captured.text();
    assert!(text.contains("error.type=\"22012\""), "{text}");
    assert!(text.contains("db.response.status_code=\"22012\""), "{text}");
    assert!(text.contains("otel.status_code=\"ERROR\""), "{text}");
    let slow: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("slow statement"))
        .collect();
    assert_eq!(slow.len(), 1, "only the sleep was slow: {text}");
    assert!(slow[0].contains("pgpipe::slow"), "{}", slow[0]);
    assert!(slow[0].contains("outcome=\"ok\""), "{}", slow[0]);
    assert!(text.contains("pgpipe.query"), "{text}");
    assert!(text.contains("db.system.name=\"postgresql\""), "{text}");
    assert!(text.contains("db.operation.name=\"SELECT\""), "{text}");
    assert!(text.contains("pgpipe.pool=traced"), "{text}");
    assert!(text.contains("pgpipe.route=\"shared\""), "{text}");
    assert!(text.contains("quarantined"), "{text}");
    assert!(!text.contains(secret), "a parameter reached the trace");
    assert!(
        !text.contains("sentinel_sql_text"),
        "SQL text reached the trace"
    );
}
