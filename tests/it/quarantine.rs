//! Wire quarantine: what the shared path's SQL guard cannot see is caught
//! on the wire. Code the guard cannot prove runs on a connection of its own
//! (#43), so what is left to catch is the catalog's freshness window: a
//! function created after the lane last read its catalog, under the name of
//! a proven built-in, runs on the shared path. The server reports what it
//! changes with a `ParameterStatus`; the connection is taken out of use at
//! once and reset before anyone uses it again, so no other task's query
//! sees the setting.

use pgpipe::Pool;
use pgpipe_test_support::{admin, unique};
use prometheus::Registry;

use crate::support::{Scrape, app, builder};

/// A schema of the test's own with a plpgsql function `f()` whose body is
/// `body` (it returns 1), dropped with the schema by the caller.
async fn function(body: &str) -> String {
    let schema = unique("quarantine");
    admin()
        .await
        .batch_execute(&format!(
            "CREATE SCHEMA {schema};
             CREATE FUNCTION {schema}.f() RETURNS int LANGUAGE plpgsql AS $f$
             BEGIN
                 {body}
                 RETURN 1;
             END
             $f$;"
        ))
        .await
        .unwrap();
    schema
}

async fn drop_schema(schema: &str) {
    admin()
        .await
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

fn quarantined(registry: &Registry, reason: &str) -> f64 {
    Scrape::of(registry).value("pgpipe_pipeline_quarantined_total", &[("reason", reason)])
}

async fn application_name(pool: &Pool) -> String {
    pool.query_one("SHOW application_name", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_that_changes_a_reported_setting_is_quarantined_on_the_wire() {
    let app = app("quarantine");
    // application_name is reported by the server (a ParameterStatus), and a
    // plain `SELECT f()` passes the guard: only the wire can tell.
    let marker = unique("changed");
    let schema = function(&format!(
        "PERFORM set_config('application_name', '{marker}', false);"
    ))
    .await;
    let registry = Registry::new();
    let pool = builder(&app)
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    assert_eq!(application_name(&pool).await, app);
    assert_eq!(quarantined(&registry, "session_state"), 0.0);

    // Named, the function is code the guard cannot prove: it runs on a
    // connection of its own, and the shared path never sees it.
    let rows = pool
        .query(&format!("SELECT {schema}.f()"), &[])
        .await
        .expect("the function runs");
    assert_eq!(rows[0].get::<_, i32>(0), 1);
    assert_eq!(application_name(&pool).await, app);
    assert_eq!(quarantined(&registry, "session_state"), 0.0);

    // Under a proven built-in's name, created after the lane's last check
    // of the catalog (a quiet lane checks no fingerprint: after a second
    // of quiet, none is under way), the guard judges it by the catalog it
    // has: proven, on the shared path. Only the wire can tell.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let overload = format!("{schema}_initcap");
    admin()
        .await
        .batch_execute(&format!(
            "CREATE FUNCTION public.initcap(integer) RETURNS int LANGUAGE plpgsql AS $f$
             BEGIN PERFORM set_config('application_name', '{marker}', false); RETURN 1; END
             $f$; COMMENT ON FUNCTION public.initcap(integer) IS '{overload}'"
        ))
        .await
        .unwrap();
    let rows = pool.query("SELECT initcap(1)", &[]).await;
    admin()
        .await
        .batch_execute("DROP FUNCTION public.initcap(integer)")
        .await
        .unwrap();
    assert_eq!(rows.expect("the overload runs")[0].get::<_, i32>(0), 1);

    // The ParameterStatus arrives before the function's answer, so the
    // quarantine is counted by the time the caller has its answer.
    assert_eq!(quarantined(&registry, "session_state"), 1.0);
    assert_eq!(quarantined(&registry, "transaction"), 0.0);
    // The next query on the shared path (the only connection there is was
    // reset, or replaced) does not see the changed setting.
    for _ in 0..3 {
        let seen = application_name(&pool).await;
        assert_ne!(seen, marker, "a shared query saw the function's setting");
        assert_eq!(seen, app);
    }
    // And nothing else was quarantined on the way.
    assert_eq!(quarantined(&registry, "session_state"), 1.0);
    drop(pool);
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_that_changes_nothing_reported_is_not_quarantined() {
    // The control: the same shape of function, touching no reported
    // setting (SET LOCAL-like: is_local = true ends with the transaction),
    // leaves the connection in use.
    let schema = function("PERFORM set_config('application_name', 'local_only', true);").await;
    let registry = Registry::new();
    let pool = builder(&app("quarantine_ctl"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    let rows = pool
        .query(&format!("SELECT {schema}.f()"), &[])
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, i32>(0), 1);
    pool.query("SELECT 1", &[]).await.unwrap();
    assert_eq!(quarantined(&registry, "session_state"), 0.0);
    assert_eq!(quarantined(&registry, "transaction"), 0.0);
    drop(pool);
    drop_schema(&schema).await;
}

/// Behind a transaction pooler a `ParameterStatus` comes from whichever
/// server the pooler linked (PgBouncer sets `application_name` on every
/// link), so it never quarantines a connection there. (Declared against
/// PostgreSQL itself here, so that the same function as above sends one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_a_changed_setting_does_not_quarantine() {
    let marker = unique("linked");
    let schema = function(&format!(
        "PERFORM set_config('application_name', '{marker}', false);"
    ))
    .await;
    let registry = Registry::new();
    let pool = builder(&app("quarantine_pooler"))
        .max_size(1)
        .pipelining(true)
        .pooler(pgpipe::Pooler::unknown_transaction())
        .registry(&registry)
        .build()
        .unwrap();
    pool.query(&format!("SELECT {schema}.f()"), &[])
        .await
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    assert_eq!(quarantined(&registry, "session_state"), 0.0);
    drop(pool);
    drop_schema(&schema).await;
}
