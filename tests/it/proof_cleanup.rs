//! What the proof leaves to the cleanup, and how fresh its catalog is
//! (#43), each in a database of its own:
//!
//! - per-backend state an extension keeps (dblink's connections), reached
//!   by user code that does not spell it: the cleanup built from what is
//!   installed takes it back, on the shared path and on `get()`'s return;
//! - a library `LOAD`ed by user code: no reset unloads it; the server
//!   counts one more setting, and the connection is closed;
//! - an extension not reviewed for what it keeps: user code is refused on
//!   the shared path;
//! - DDL through the pool is seen at once; DDL from elsewhere within the
//!   fingerprint's second.

use std::time::Duration;

use pgpipe::{ErrorKind, Pool};
use pgpipe_test_support::{admin, server_url, unique};
use tokio_postgres::Client;

/// A plain connection of the test's own.
async fn plain(url: &str) -> Client {
    pgpipe_test_support::connect(url)
        .await
        .expect("a plain connection")
}

/// A database of the test's own, set up with `sql`; its URL (as the
/// superuser) and a connection to it.
struct Database {
    name: String,
    url: String,
}

impl Database {
    async fn new(sql: &str) -> (Database, Client) {
        let name = unique("pgpipe_proof");
        admin()
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let url = server_url(None, None, Some(&name));
        let client = plain(&url).await;
        client.batch_execute(sql).await.expect("set-up");
        (Database { name, url }, client)
    }

    /// One connection for every path, so that the next user meets the
    /// session the last one left.
    fn pool(&self) -> Pool {
        Pool::builder()
            .url(&self.url)
            .max_size(1)
            .max_exclusive(1)
            .pipelining(true)
            .build()
            .unwrap()
    }

    async fn drop(self, pool: Pool) {
        pool.close_and_wait(Duration::from_secs(5)).await;
        admin()
            .await
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await
            .unwrap();
    }
}

async fn links(client: &impl std::ops::Deref<Target = Client>) -> Option<Vec<String>> {
    client
        .query_one("SELECT dblink_get_connections()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dblink_connection_user_code_opened_is_closed_before_the_next_user() {
    let (db, setup) = Database::new(&format!(
        "CREATE EXTENSION dblink; \
         CREATE FUNCTION open_link() RETURNS text LANGUAGE plpgsql AS $$ \
         BEGIN RETURN dblink_connect('leak', '{}'); END $$",
        server_url(None, None, Some("postgres")).replace("postgres://", "postgresql://")
    ))
    .await;
    // The control: on a plain connection the link outlives the statement,
    // and DISCARD ALL keeps it.
    setup.batch_execute("SELECT open_link()").await.unwrap();
    setup.batch_execute("DISCARD ALL").await.unwrap();
    let kept: Option<Vec<String>> = setup
        .query_one("SELECT dblink_get_connections()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, Some(vec!["leak".to_owned()]), "control");
    let pool = db.pool();
    // The shared path: user code runs alone, cleaned behind.
    pool.query("SELECT open_link()", &[]).await.unwrap();
    assert_eq!(links(&pool.get().await.unwrap()).await, None, "shared path");
    // get(): the reset when it comes back.
    let held = pool.get().await.unwrap();
    held.query("SELECT open_link()", &[]).await.unwrap();
    drop(held);
    assert_eq!(links(&pool.get().await.unwrap()).await, None, "get()");
    db.drop(pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_user_code_loaded_closes_its_connection() {
    let (db, setup) = Database::new(
        "CREATE FUNCTION load_it() RETURNS int LANGUAGE plpgsql AS $$ \
         BEGIN EXECUTE 'LOAD ''auto_explain'''; RETURN 1; END $$",
    )
    .await;
    // The control: DISCARD ALL leaves the library's settings.
    let fresh: i64 = setup.query_one(FOREIGN_SETTINGS, &[]).await.unwrap().get(0);
    setup.batch_execute("SELECT load_it()").await.unwrap();
    setup.batch_execute("DISCARD ALL").await.unwrap();
    let loaded: i64 = setup.query_one(FOREIGN_SETTINGS, &[]).await.unwrap().get(0);
    assert!(
        loaded > fresh,
        "control: {loaded} settings after LOAD, {fresh} before"
    );
    let pool = db.pool();
    let count = |pool: Pool| async move {
        let conn = pool.get().await.unwrap();
        let pid: i32 = conn
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        let n: i64 = conn.query_one(FOREIGN_SETTINGS, &[]).await.unwrap().get(0);
        (pid, n)
    };
    let (before, n) = count(pool.clone()).await;
    assert_eq!(n, fresh);
    // get(): the reset counts the settings, and closes the connection.
    let held = pool.get().await.unwrap();
    held.query("SELECT load_it()", &[]).await.unwrap();
    drop(held);
    let (after, n) = count(pool.clone()).await;
    assert_eq!(n, fresh, "a session with the library loaded was handed on");
    assert_ne!(after, before, "the connection was reused");
    // The shared path: user code runs alone; its cleanup counts them too.
    pool.query("SELECT load_it()", &[]).await.unwrap();
    let (_, n) = count(pool.clone()).await;
    assert_eq!(n, fresh, "a session with the library loaded was handed on");
    db.drop(pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_code_is_refused_on_the_shared_path_beside_an_extension_not_reviewed() {
    let (db, _setup) = Database::new(
        "CREATE EXTENSION file_fdw; \
         CREATE FUNCTION answer() RETURNS int LANGUAGE sql AS 'SELECT 42'",
    )
    .await;
    let pool = db.pool();
    let e = pool.query("SELECT answer()", &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotAllowedOnShared, "{e}");
    assert!(e.to_string().contains("extension"), "{e}");
    // Proven SQL still runs; user code runs on an exclusive connection.
    pool.query("SELECT lower('A')", &[]).await.unwrap();
    let held = pool.get().await.unwrap();
    let row = held.query_one("SELECT answer()", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    drop(held);
    db.drop(pool).await;
}

/// Settings of libraries that are no installed extension's or language's
/// (what `LOAD` of a module such as auto_explain adds).
const FOREIGN_SETTINGS: &str = "SELECT count(*) FROM pg_settings WHERE name LIKE '%.%' \
     AND split_part(name, '.', 1) NOT IN (SELECT extname FROM pg_extension \
     UNION ALL SELECT lanname FROM pg_language)";

/// What a task sees of the planted setting.
async fn planted(pool: &Pool) -> String {
    pool.query_one(
        "SELECT coalesce(current_setting('pgpipe.fresh', true), '')",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

const VIEW: &str =
    "CREATE VIEW fresh AS SELECT pg_catalog.set_config('pgpipe.fresh', 'planted', false) AS x";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_through_the_pool_is_seen_at_once() {
    let (db, _setup) = Database::new("SELECT 1").await;
    let pool = db.pool();
    assert_eq!(planted(&pool).await, "");
    // Through get(), then at once a statement that names what it made.
    let held = pool.get().await.unwrap();
    held.batch_execute(VIEW).await.unwrap();
    drop(held);
    pool.query("SELECT x FROM fresh", &[]).await.unwrap();
    assert_eq!(planted(&pool).await, "", "a view made through get()");
    // Through the shared path (spelled, the call would be refused there:
    // the new view reaches it through the first).
    pool.execute("CREATE VIEW fresh2 AS SELECT x FROM fresh", &[])
        .await
        .unwrap();
    let reset = pool.get().await.unwrap();
    reset.batch_execute("RESET ALL").await.unwrap();
    drop(reset);
    pool.query("SELECT x FROM fresh2", &[]).await.unwrap();
    assert_eq!(planted(&pool).await, "", "a view made on the shared path");
    db.drop(pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_from_elsewhere_is_seen_within_the_fingerprints_second() {
    let (db, setup) = Database::new("SELECT 1").await;
    let pool = db.pool();
    assert_eq!(planted(&pool).await, "");
    setup.batch_execute(VIEW).await.unwrap();
    // The lane in use for a little over the fingerprint's second.
    for _ in 0..15 {
        pool.query("SELECT 1", &[]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pool.query("SELECT x FROM fresh", &[]).await.unwrap();
    assert_eq!(planted(&pool).await, "", "a view made elsewhere");
    db.drop(pool).await;
}

/// The cleanup and the reset name nothing a plain role may not run (the
/// server checks every function a statement names before it runs it, and
/// a cleanup that fails closes the connection): a role without privileges
/// keeps its connection across resets and behind code the guard cannot
/// prove.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_roles_connection_is_cleaned_and_kept() {
    let role = unique("pgpipe_plain");
    let (db, _setup) = Database::new(&format!(
        "CREATE ROLE {role} LOGIN; \
         CREATE FUNCTION mine() RETURNS int LANGUAGE sql AS 'SELECT 1'; \
         GRANT EXECUTE ON FUNCTION mine() TO {role}"
    ))
    .await;
    let url = db.url.replacen("postgres@", &format!("{role}@"), 1);
    let pool = Pool::builder()
        .url(&url)
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .build()
        .unwrap();
    let pid = |pool: Pool| async move {
        pool.query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get::<_, i32>(0)
    };
    let first = pid(pool.clone()).await;
    for _ in 0..3 {
        // Behind code the guard cannot prove, cleaned.
        pool.query("SELECT mine()", &[]).await.unwrap();
        // Through get(), reset.
        let held = pool.get().await.unwrap();
        held.batch_execute("SET work_mem = '7MB'").await.unwrap();
        drop(held);
    }
    assert_eq!(
        pid(pool.clone()).await,
        first,
        "the connection was replaced"
    );
    db.drop(pool).await;
    admin()
        .await
        .batch_execute(&format!("DROP ROLE {role}"))
        .await
        .unwrap();
}
