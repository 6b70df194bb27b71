//! Transactions through a real PgBouncer 1.18 in transaction mode, where
//! statements are unnamed and their parameter types must be learned: inside
//! a transaction they are learned in it, so a transaction sees its own
//! tables, its own `SET LOCAL search_path` and its own locks; and
//! transaction-scoped `SET` forms run there.

use std::time::Duration;

use pgpipe::{ErrorKind, Executor, Pool, Pooler};
use pgpipe_test_support::{Pgbouncer, unique};

fn upstream() -> String {
    super::support::server_addr()
}

/// PgBouncer (transaction mode, two servers) and a pool through it.
fn rig() -> Option<(Pgbouncer, Pool)> {
    let bouncer = Pgbouncer::builder(&upstream())
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .start()
        .expect("PgBouncer starts")?;
    let pool = Pool::builder()
        .url(&bouncer.url())
        .max_size(4)
        .pipelining(true)
        .pooler(Pooler::pgbouncer_transaction((1, 18), 0))
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    Some((bouncer, pool))
}

/// Fails the test instead of hanging it.
async fn within<T>(what: &str, work: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(15), work)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_sees_the_table_it_created() {
    let Some((_bouncer, pool)) = rig() else {
        return;
    };
    let table = unique("pgpipe_tx_made");
    within("create then insert", async {
        let tx = pool.begin().await.unwrap();
        tx.execute(&format!("CREATE TABLE {table} (id int8)"), &[])
            .await
            .unwrap();
        tx.execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&7i64])
            .await
            .unwrap();
        let rows = tx
            .query(&format!("SELECT id FROM {table} WHERE id = $1"), &[&7i64])
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        tx.rollback().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_resolves_names_through_its_own_search_path() {
    let Some((_bouncer, pool)) = rig() else {
        return;
    };
    let schema = unique("pgpipe_tx_schema");
    let admin = pgpipe_test_support::admin().await;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; CREATE TABLE {schema}.only_here (id int8); \
             INSERT INTO {schema}.only_here VALUES (5)"
        ))
        .await
        .unwrap();
    within("a query after SET LOCAL search_path", async {
        let mut conn = pool.get().await.unwrap();
        let tx = conn.transaction().await.unwrap();
        tx.execute(&format!("SET LOCAL search_path TO {schema}"), &[])
            .await
            .unwrap();
        let rows = tx
            .query(
                "SELECT id FROM only_here WHERE id = $1 /* own path */",
                &[&5i64],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        tx.commit().await.unwrap();
    })
    .await;
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

/// A transaction holding a lock describes its next statement behind that
/// lock's back, and two transactions holding both of PgBouncer's servers
/// each run new SQL: nothing waits on a connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_holding_locks_and_every_server_run_new_sql() {
    let Some((_bouncer, pool)) = rig() else {
        return;
    };
    let table = unique("pgpipe_tx_locked");
    let admin = pgpipe_test_support::admin().await;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int8); INSERT INTO {table} VALUES (1), (2)"
        ))
        .await
        .unwrap();
    within("new SQL behind the transaction's own locks", async {
        let runs = (1..=2i64).map(|id| {
            let (pool, table) = (pool.clone(), table.clone());
            async move {
                let tx = pool.begin().await.unwrap();
                tx.execute(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"), &[])
                    .await
                    .ok();
                let sql = format!("SELECT id FROM {table} WHERE id = $1 /* task {id} */");
                let rows = tx.query(&sql, &[&id]).await;
                tx.rollback().await.unwrap();
                rows
            }
        });
        let results: Vec<_> = futures_join(runs).await;
        // One of the two waits for the other's lock, then runs: both end.
        for rows in results {
            assert_eq!(rows.unwrap().len(), 1);
        }
    })
    .await;
    admin
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

async fn futures_join<F: std::future::Future + Send + 'static>(
    runs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = runs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_scoped_set_forms_run_inside_a_transaction() {
    let Some((_bouncer, pool)) = rig() else {
        return;
    };
    within("SET TRANSACTION and SET CONSTRAINTS", async {
        let tx = pool.begin().await.unwrap();
        tx.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", &[])
            .await
            .unwrap();
        tx.execute("SET CONSTRAINTS ALL DEFERRED", &[])
            .await
            .unwrap();
        let rows = tx
            .query("SELECT current_setting('transaction_isolation')", &[])
            .await
            .unwrap();
        assert_eq!(rows[0].get::<_, String>(0), "serializable");
        tx.commit().await.unwrap();
    })
    .await;
    // A session-wide form still is not: there is no session to keep.
    let tx = pool.begin().await.unwrap();
    let err = tx
        .execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", &[])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotSupported, "{err}");
    tx.rollback().await.unwrap();
}

/// PgBouncer's `query_wait_timeout` (no server free in time) is a `Connect`
/// error (nothing ran) and is counted by kind; `server conn crashed?` (the
/// server's backend terminated under a query) is `ConnectionLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooler_errors_map_to_kinds_and_are_counted() {
    let Some(bouncer) = Pgbouncer::builder(&upstream())
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "1")
        .start()
        .expect("PgBouncer starts")
    else {
        return;
    };
    let registry = prometheus::Registry::new();
    let build = |registry: Option<&prometheus::Registry>| {
        let mut builder = Pool::builder()
            .url(&bouncer.url())
            .max_size(2)
            .pipelining(true)
            .pooler(Pooler::pgbouncer_transaction((1, 18), 0))
            .wait_timeout(Duration::from_secs(20));
        if let Some(registry) = registry {
            builder = builder.registry(registry);
        }
        builder.build().unwrap()
    };
    let (holder, pool) = (build(None), build(Some(&registry)));
    // The one server, held by a transaction.
    let held = holder.begin().await.unwrap();
    held.execute("SELECT 1", &[]).await.unwrap();
    let err = within("a query waiting for a server", pool.query("SELECT 2", &[]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect, "{err}");
    let counted = super::support::Scrape::of(&registry).value(
        "pgpipe_pooler_errors_total",
        &[("kind", "query_wait_timeout")],
    );
    assert_eq!(counted, 1.0);
    held.rollback().await.unwrap();

    // The backend terminated under a query: PgBouncer says so.
    let tx = pool.begin().await.unwrap();
    let pid: i32 = tx.query("SELECT pg_backend_pid()", &[]).await.unwrap()[0].get(0);
    let admin = pgpipe_test_support::admin().await;
    let sleeping = tx.query("SELECT pg_sleep(10)", &[]);
    let kill = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
    };
    let (slept, ()) = within("a query whose server died", async {
        tokio::join!(sleeping, kill)
    })
    .await;
    let err = slept.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionLost, "{err}");
    drop(tx);
    // The pool heals: the next query runs.
    let rows = within("a query after the crash", pool.query("SELECT 3", &[]))
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, i32>(0), 3);
}
