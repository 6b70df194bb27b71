//! Shared sessions stay clean: state a query leaves in the session is never
//! seen by a query admitted after its answer came back, on the shared path
//! or on an exclusive checkout. Each case runs as the issue describes it: a
//! pool of one connection, task A runs the statement, task B runs a query
//! after A's answer came back, and C checks out the connection with `get()`.

use std::time::Duration;

use pgpipe::{ErrorKind, Pool};
use pgpipe_test_support::{admin, unique};

use crate::support::{app, builder, create_role, drop_role};

/// A schema of the test's own, with whatever `ddl` creates in it (`{s}`
/// stands for the schema's name); dropped by [`Schema::drop`].
struct Schema(String);

impl Schema {
    async fn new(ddl: &str) -> Schema {
        let name = unique("safety");
        let ddl = ddl.replace("{s}", &name);
        admin()
            .await
            .batch_execute(&format!("CREATE SCHEMA {name}; {ddl}"))
            .await
            .unwrap();
        Schema(name)
    }

    fn sql(&self, sql: &str) -> String {
        sql.replace("{s}", &self.0)
    }

    async fn drop(self) {
        admin()
            .await
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.0))
            .await
            .unwrap();
    }
}

fn one_connection(app: &str, pipelining: bool) -> Pool {
    builder(app)
        .max_size(1)
        .max_exclusive(1)
        .pipelining(pipelining)
        .build()
        .unwrap()
}

async fn show(pool: &Pool, setting: &str) -> String {
    pool.query_one(&format!("SHOW {setting}"), &[])
        .await
        .unwrap()
        .get(0)
}

async fn default_search_path() -> String {
    let row = admin()
        .await
        .query_one(
            "SELECT boot_val FROM pg_settings WHERE name = 'search_path'",
            &[],
        )
        .await
        .unwrap();
    row.get(0)
}

/// What B (shared) and C (`get()`) see of `setting` after A ran `sql`.
async fn seen_after(pool: &Pool, sql: &str, setting: &str) -> (String, String) {
    pool.query(sql, &[]).await.expect("A's statement runs");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b = show(pool, setting).await;
    let c = pool.get().await.unwrap();
    let c: String = c
        .query_one(&format!("SHOW {setting}"), &[])
        .await
        .unwrap()
        .get(0);
    (b, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_changed_inside_functions_and_do_blocks_do_not_leak() {
    let default = default_search_path().await;
    let schema = Schema::new(
        "CREATE FUNCTION {s}.set_path() RETURNS int LANGUAGE sql AS
             $$ SELECT set_config('search_path', 'pg_catalog', false); SELECT 1 $$;
         CREATE FUNCTION {s}.set_tenant(t text) RETURNS int LANGUAGE plpgsql AS
             $$ BEGIN PERFORM set_config('app.tenant', t, false); RETURN 1; END $$;",
    )
    .await;
    let pool = one_connection(&app("safety_set"), true);
    let do_block = "DO $$ BEGIN PERFORM set_config('search_path', 'pg_catalog', false); END $$";
    for sql in [do_block, &schema.sql("SELECT {s}.set_path()")] {
        let (b, c) = seen_after(&pool, sql, "search_path").await;
        assert_eq!(b, default, "B saw A's search_path after {sql}");
        assert_eq!(c, default, "get() saw A's search_path after {sql}");
    }
    // A custom setting, the row-level-security tenant pattern.
    pool.query(&schema.sql("SELECT {s}.set_tenant('7')"), &[])
        .await
        .unwrap();
    let tenant: Option<String> = pool
        .query_one("SELECT current_setting('app.tenant', true)", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        tenant.as_deref().is_none_or(str::is_empty),
        "B saw A's tenant: {tenant:?}"
    );
    drop(pool);
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_set_inside_a_do_block_does_not_leak() {
    // A superuser like the login role: `is_superuser` does not change, so
    // the server reports nothing and only the cleanup can catch it.
    let role = create_role("safety_role", "SUPERUSER").await;
    let pool = one_connection(&app("safety_role"), true);
    let login: String = pool
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap()
        .get(0);
    pool.query(&format!("DO $$ BEGIN SET ROLE {role}; END $$"), &[])
        .await
        .unwrap();
    let b: String = pool
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(b, login, "B ran as the role A set");
    drop(pool);
    drop_role(&role).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advisory_lock_taken_inside_a_function_is_released() {
    let schema = Schema::new(
        "CREATE FUNCTION {s}.take(k bigint) RETURNS int LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_advisory_lock(k); RETURN 1; END $$;",
    )
    .await;
    let key: i64 = 7_000_000 + i64::from(std::process::id() % 1_000_000);
    let pool = one_connection(&app("safety_lock"), true);
    pool.query(&schema.sql("SELECT {s}.take($1)"), &[&key])
        .await
        .unwrap();
    // Another session can take it: the shared session does not hold it.
    let other = admin().await;
    let taken: bool = other
        .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
        .await
        .unwrap()
        .get(0);
    assert!(taken, "the shared session still holds A's advisory lock");
    other
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await
        .unwrap();
    drop(pool);
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temp_objects_named_by_schema_are_refused() {
    let pool = one_connection(&app("safety_temp"), true);
    for sql in [
        "CREATE TABLE pg_temp.orders (id int)",
        "SELECT 1 AS a INTO pg_temp.x",
        "EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1",
        "CREATE TABLE pg_temp.pg_database (datname name)",
    ] {
        let error = pool.query(sql, &[]).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::NotAllowedOnShared, "{sql}");
    }
    // And a function that creates one anyway leaves nothing behind.
    let schema = Schema::new(
        "CREATE FUNCTION {s}.make_temp() RETURNS int LANGUAGE plpgsql AS
             $$ BEGIN CREATE TEMP TABLE shadow (a int); RETURN 1; END $$;",
    )
    .await;
    pool.query(&schema.sql("SELECT {s}.make_temp()"), &[])
        .await
        .unwrap();
    let temp: i64 = pool
        .query_one(
            "SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(temp, 0, "B found A's temp table");
    drop(pool);
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_pg_settings_are_refused() {
    let pool = one_connection(&app("safety_pg_settings"), true);
    let error = pool
        .query(
            "UPDATE pg_settings SET setting = 'pg_catalog' WHERE name = 'search_path'",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotAllowedOnShared);
    let error = pool
        .query("\u{b}SET search_path = x", &[])
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotAllowedOnShared);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_state_does_not_reach_the_next_user() {
    let schema = Schema::new("CREATE TABLE {s}.orders (id serial PRIMARY KEY, v int);").await;
    let pool = one_connection(&app("safety_seq"), true);
    let id: i32 = pool
        .query_one(
            &schema.sql("INSERT INTO {s}.orders (v) VALUES (1) RETURNING id"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(id > 0);
    let error = pool.query("SELECT lastval()", &[]).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotAllowedOnShared);
    // The connection goes back to the idle set, then to an exclusive user:
    // `lastval()` there must not return A's id.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let conn = pool.get().await.unwrap();
    let seen = conn.query_one("SELECT lastval()", &[]).await;
    assert!(
        seen.is_err(),
        "get() read A's sequence state: {:?}",
        seen.map(|r| r.get::<_, i64>(0))
    );
    drop(conn);
    drop(pool);
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_connection_is_reset_before_an_exclusive_checkout() {
    let schema = Schema::new(
        "CREATE FUNCTION {s}.rename(n text) RETURNS int LANGUAGE plpgsql AS
             $$ BEGIN PERFORM set_config('application_name', n, false);
                       PERFORM set_config('search_path', 'pg_catalog', false);
                       RETURN 1; END $$;",
    )
    .await;
    let app = app("safety_quarantine");
    let pool = one_connection(&app, true);
    let marker = unique("renamed");
    pool.query(&schema.sql("SELECT {s}.rename($1)"), &[&marker])
        .await
        .unwrap();
    let conn = pool.get().await.unwrap();
    let name: String = conn
        .query_one("SHOW application_name", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, app, "get() inherited the quarantined session");
    drop(conn);
    drop(pool);
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pipelining_a_checkout_never_hands_its_session_on() {
    let default = default_search_path().await;
    let pool = one_connection(&app("safety_off"), false);
    let conn = pool.get().await.unwrap();
    conn.batch_execute("SET search_path = pg_catalog")
        .await
        .unwrap();
    drop(conn);
    assert_eq!(show(&pool, "search_path").await, default);
    let conn = pool.get().await.unwrap();
    let seen: String = conn
        .query_one("SHOW search_path", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, default);
}

/// A table whose insert trigger runs `body`: code no lexer sees in an
/// `INSERT`.
async fn table_with_trigger(body: &str) -> Schema {
    Schema::new(&format!(
        "CREATE TABLE {{s}}.t (name text);
         CREATE FUNCTION {{s}}.trig() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN {body} RETURN NEW; END $$;
         CREATE TRIGGER trig BEFORE INSERT ON {{s}}.t FOR EACH ROW EXECUTE FUNCTION {{s}}.trig();"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_waiting_in_the_batch_window_do_not_go_out_on_a_quarantined_session() {
    // The trigger changes a reported setting: the wire sees it, the guard
    // does not (a plain INSERT), so nothing cleans up behind it.
    let schema = table_with_trigger(
        "PERFORM pg_sleep(0.05); PERFORM set_config('application_name', NEW.name, false);",
    )
    .await;
    let app = app("safety_window");
    let pool = builder(&app)
        .max_size(2)
        .max_exclusive(1)
        .pipelining(true)
        .batch_window(Duration::from_millis(300))
        .build()
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    let marker = unique("renamed");
    let a = {
        let sql = schema.sql("INSERT INTO {s}.t (name) VALUES ($1)");
        let (pool, marker) = (pool.clone(), marker.clone());
        tokio::spawn(async move { pool.execute(&sql, &[&marker]).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // B is admitted behind A (the connection is busy), waits in the window
    // while A's answer and its quarantine come back, then goes out.
    let b = show(&pool, "application_name").await;
    a.await.unwrap().unwrap();
    assert_ne!(b, marker, "B went out on the quarantined session");
    assert_eq!(b, app);
    drop(pool);
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleaning_behind_every_query_covers_triggers() {
    let default = default_search_path().await;
    let schema =
        table_with_trigger("PERFORM set_config('search_path', 'pg_catalog', false);").await;
    let pool = builder(&app("safety_every"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .session_cleanup(pgpipe::SessionCleanup::EveryQuery)
        .build()
        .unwrap();
    let insert = schema.sql("INSERT INTO {s}.t (name) VALUES ('x')");
    let (b, c) = seen_after(&pool, &insert, "search_path").await;
    assert_eq!(
        (b.as_str(), c.as_str()),
        (default.as_str(), default.as_str())
    );
    drop(pool);
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_setting_survives_every_reset_and_cleanup() {
    let pool = builder(&app("safety_setting"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .session_setting("search_path", "pg_catalog, public")
        .session_setting("app.tenant", "it's 7")
        .build()
        .unwrap();
    let expected = "pg_catalog, public";
    assert_eq!(show(&pool, "search_path").await, expected);
    // A cleanup behind unknown code resets to the start-up value.
    pool.query(
        "DO $$ BEGIN PERFORM set_config('search_path', 'public', false); END $$",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(show(&pool, "search_path").await, expected);
    // So does the reset after an exclusive user.
    let conn = pool.get().await.unwrap();
    conn.batch_execute("SET search_path = public")
        .await
        .unwrap();
    drop(conn);
    assert_eq!(show(&pool, "search_path").await, expected);
    let tenant: String = pool
        .query_one("SELECT current_setting('app.tenant')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tenant, "it's 7");
    let error = builder("x")
        .session_setting("search_path; DROP", "x")
        .build()
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_connect_sql_is_there_after_every_reset_and_cleanup() {
    let pool = builder(&app("safety_hook"))
        .max_size(1)
        .max_exclusive(1)
        .pipelining(true)
        .after_connect(
            "SET search_path = pg_catalog, public; SELECT set_config('app.hook', 'on', false)",
        )
        .build()
        .unwrap();
    let hook = |pool: Pool| async move {
        let row = pool
            .query_one(
                "SELECT current_setting('search_path'), current_setting('app.hook', true)",
                &[],
            )
            .await
            .unwrap();
        (row.get::<_, String>(0), row.get::<_, Option<String>>(1))
    };
    let expected = ("pg_catalog, public".to_string(), Some("on".to_string()));
    assert_eq!(hook(pool.clone()).await, expected);
    // A cleanup behind unknown code runs it again.
    pool.query(
        "DO $$ BEGIN PERFORM set_config('search_path', 'public', false); END $$",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(hook(pool.clone()).await, expected);
    // So does the reset after an exclusive user.
    let conn = pool.get().await.unwrap();
    conn.batch_execute("RESET ALL").await.unwrap();
    drop(conn);
    assert_eq!(hook(pool.clone()).await, expected);
}
