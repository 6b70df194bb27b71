//! The probe (`pgpipe-probe`) names the right `Pooler` for each set-up it
//! is meant to tell apart: PostgreSQL itself, PgBouncer 1.18 in session
//! and transaction mode, PgBouncer 1.24 in transaction mode with and
//! without `max_prepared_statements`, and pgpool-II; and it leaves no
//! setting or named statement behind.

use pgpipe::Pooler;
use pgpipe_probe::{Behind, Cancel, Findings};
use pgpipe_test_support::{Pgbouncer, Pgpool, database_url, newer_pgbouncer};
use tokio_postgres::SimpleQueryMessage;

use super::poolers::upstream;

async fn probe(url: &str) -> Findings {
    let findings = pgpipe_probe::probe(url).await.expect("the probe finishes");
    eprintln!("{findings}");
    findings
}

/// PgBouncer in `mode` with `servers` server connections, from `binary`
/// (Debian's 1.18 when `None`).
fn bouncer(binary: Option<String>, mode: &str, prepared: Option<&str>) -> Option<Pgbouncer> {
    let mut builder = Pgbouncer::builder(&upstream())
        .setting("pool_mode", mode)
        .setting("default_pool_size", "4");
    if let Some(binary) = binary {
        builder = builder.binary(binary);
    }
    if let Some(prepared) = prepared {
        builder = builder.setting("max_prepared_statements", prepared);
    }
    builder.start().expect("PgBouncer starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_itself() {
    let findings = probe(&database_url()).await;
    assert_eq!(findings.behind, Behind::Server);
    assert_eq!(findings.pooler(), Pooler::None);
    assert_eq!(findings.session_state_kept, Some(true));
    assert_eq!(findings.cancel, Cancel::Lands);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_1_18_in_session_mode() {
    let Some(bouncer) = bouncer(None, "session", None) else {
        return;
    };
    let findings = probe(&bouncer.url()).await;
    assert_eq!(findings.behind, Behind::SessionPooler);
    assert_eq!(findings.pooler(), Pooler::Session);
    // Sent as libpq sends one, a cancel lands through 1.18 too, and leaves
    // it running (the after-check connects again).
    assert_eq!(findings.cancel, Cancel::Lands);
    assert_no_statement_left(&bouncer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_1_18_in_transaction_mode() {
    let Some(bouncer) = bouncer(None, "transaction", None) else {
        return;
    };
    let findings = probe(&bouncer.url()).await;
    assert_eq!(findings.behind, Behind::TransactionPooler);
    assert_eq!(findings.pooler(), Pooler::pgbouncer_transaction((1, 18), 0));
    assert_eq!(findings.pooler(), Pooler::unknown_transaction());
    assert_eq!(findings.cancel, Cancel::Lands);
    assert_no_statement_left(&bouncer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_1_24_tracking_named_statements() {
    let Some(binary) = newer_pgbouncer("pgbouncer_1_24_tracking_named_statements") else {
        return;
    };
    let bouncer = bouncer(Some(binary), "transaction", Some("200")).expect("the binary given");
    let findings = probe(&bouncer.url()).await;
    assert_eq!(findings.behind, Behind::TransactionPooler);
    assert_eq!(
        findings.pooler(),
        Pooler::pgbouncer_transaction((1, 24), 200)
    );
    assert_eq!(findings.cancel, Cancel::Lands);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_1_24_without_named_statements() {
    let Some(binary) = newer_pgbouncer("pgbouncer_1_24_without_named_statements") else {
        return;
    };
    let bouncer = bouncer(Some(binary), "transaction", Some("0")).expect("the binary given");
    let findings = probe(&bouncer.url()).await;
    assert_eq!(findings.behind, Behind::TransactionPooler);
    assert_eq!(findings.pooler(), Pooler::pgbouncer_transaction((1, 24), 0));
    assert_no_statement_left(&bouncer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgpool_ii() {
    let Some(pgpool) = Pgpool::start(&upstream(), 8).expect("pgpool-II starts") else {
        return;
    };
    let findings = probe(&pgpool.url()).await;
    assert_eq!(findings.behind, Behind::SessionPooler);
    assert_eq!(findings.pooler(), Pooler::Session);
    assert_eq!(findings.cancel, Cancel::Lands);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_that_is_not_one_is_a_clear_error() {
    let error = pgpipe_probe::probe("postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
        .await
        .unwrap_err();
    assert!(!error.to_string().is_empty());
    let error = pgpipe_probe::probe("not a url at all").await.unwrap_err();
    assert!(
        error.to_string().contains("not a PostgreSQL URL"),
        "{error}"
    );
}

/// No server session behind `url` holds a named statement the probe
/// prepared (tokio-postgres names them `s` and a number): four client
/// connections each hold a transaction, so together they are on every one
/// of the bouncer's four servers, and each asks its server (in the simple
/// protocol, which prepares nothing).
async fn assert_no_statement_left(bouncer: &Pgbouncer) {
    // The bouncer is up: a refused connection here was once 1.18 ended by
    // the probe's own cancel request (pgbouncer#801).
    bouncer.assert_up("after the probe");
    // Through 1.18 in transaction mode, which the probe has just shown to
    // hand a server on with messages unanswered, a client right after it
    // once read "unexpected message from server": that is the pooler's
    // hazard the probe reports, not a statement left. Asked again on
    // connections of its own.
    let mut last = None;
    for _ in 0..3 {
        match statements_left(&bouncer.url()).await {
            Ok(left) => {
                assert_eq!(left, 0, "named statements left on the servers");
                return;
            }
            Err(e) => last = Some(e),
        }
    }
    panic!(
        "the servers could not be asked: {last:?}; the bouncer's log:\n{}",
        bouncer.log()
    );
}

async fn statements_left(url: &str) -> Result<i64, tokio_postgres::Error> {
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(pgpipe_test_support::connect(url).await?);
    }
    let mut left = 0;
    for client in &clients {
        client.batch_execute("BEGIN").await?;
        let rows = client
            .simple_query("SELECT count(*) FROM pg_prepared_statements WHERE name ~ '^s[0-9]+$'")
            .await?;
        let Some(row) = rows.iter().find_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        }) else {
            panic!("no row: {rows:?}");
        };
        left += row.get(0).unwrap().parse::<i64>().unwrap();
    }
    for client in &clients {
        client.batch_execute("COMMIT").await?;
    }
    Ok(left)
}
