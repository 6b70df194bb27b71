//! What runs user code is a fact of the database (#21, resolution by the
//! catalog). Each case hides a session change inside user code that the
//! SQL text does not name as a function of its own: an overload of a
//! builtin's name, an operator, a trigger, a view, a column default, a
//! domain check, a cast, a row-level-security policy, a rule. On a plain connection (the positive control) the
//! statement really moves `search_path`; on the shared path the pool
//! learned from the catalog that it reaches user code, cleans behind it,
//! and the next task finds the session as it was.

use std::time::Duration;

use pgpipe::Pool;
use pgpipe_test_support::{connect, database_url, server_url, unique, with_param};

use crate::support::search_path;

/// A schema of the test's own holding every piece, and the SQL that sets
/// them up; every function that changes the session moves `search_path`
/// to `pg_catalog` for good (`set_config(…, false)`).
fn setup(schema: &str) -> String {
    let evil = "PERFORM pg_catalog.set_config('search_path', 'pg_catalog', false)";
    format!(
        "CREATE SCHEMA {schema};
         CREATE FUNCTION {schema}.md5(integer) RETURNS text LANGUAGE plpgsql
             AS $$ BEGIN {evil}; RETURN 'x'; END $$;
         CREATE FUNCTION {schema}.evil_eq(integer, integer) RETURNS boolean LANGUAGE plpgsql
             AS $$ BEGIN {evil}; RETURN $1 = $2; END $$;
         CREATE OPERATOR {schema}.=== (LEFTARG = integer, RIGHTARG = integer,
             FUNCTION = {schema}.evil_eq);
         CREATE FUNCTION {schema}.evil_int() RETURNS integer LANGUAGE plpgsql
             AS $$ BEGIN {evil}; RETURN 1; END $$;
         CREATE FUNCTION {schema}.evil_trigger() RETURNS trigger LANGUAGE plpgsql
             AS $$ BEGIN {evil}; RETURN NEW; END $$;
         CREATE FUNCTION {schema}.evil_check(integer) RETURNS boolean LANGUAGE plpgsql
             AS $$ BEGIN {evil}; RETURN true; END $$;
         CREATE TABLE {schema}.audited (id integer);
         CREATE TRIGGER audit BEFORE INSERT ON {schema}.audited
             FOR EACH ROW EXECUTE FUNCTION {schema}.evil_trigger();
         CREATE VIEW {schema}.innocent AS SELECT {schema}.evil_int() AS id;
         CREATE TABLE {schema}.defaulted (id integer DEFAULT {schema}.evil_int());
         CREATE DOMAIN {schema}.checked AS integer CHECK ({schema}.evil_check(VALUE));
         CREATE TABLE {schema}.typed (id {schema}.checked);
         CREATE TABLE {schema}.ruled (id integer);
         CREATE RULE also AS ON INSERT TO {schema}.ruled DO ALSO SELECT {schema}.evil_int();
         CREATE TYPE {schema}.boxed AS (id integer);
         CREATE FUNCTION {schema}.evil_box(integer) RETURNS {schema}.boxed LANGUAGE plpgsql
             AS $$ BEGIN {evil}; RETURN ROW($1); END $$;
         CREATE CAST (integer AS {schema}.boxed) WITH FUNCTION {schema}.evil_box(integer);
         CREATE FUNCTION {schema}.evil_allow(integer) RETURNS boolean LANGUAGE plpgsql
             AS $$ BEGIN {evil}; RETURN true; END $$;
         CREATE TABLE {schema}.guarded (id integer);
         INSERT INTO {schema}.guarded VALUES (1);
         ALTER TABLE {schema}.guarded ENABLE ROW LEVEL SECURITY;
         ALTER TABLE {schema}.guarded FORCE ROW LEVEL SECURITY;
         CREATE POLICY allow ON {schema}.guarded USING ({schema}.evil_allow(id));
         CREATE ROLE {schema} LOGIN;
         GRANT USAGE ON SCHEMA {schema} TO {schema};
         GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA {schema} TO {schema};
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {schema};"
    )
}

/// The statements, each reaching the user code above without naming a
/// function of its own (the schema is on the session's `search_path`).
const CASES: [&str; 9] = [
    "SELECT md5(1)",
    "SELECT 1 === 1",
    "INSERT INTO audited VALUES (1)",
    "SELECT id FROM innocent",
    "INSERT INTO defaulted DEFAULT VALUES",
    "INSERT INTO typed VALUES (1)",
    "SELECT (1::boxed).id",
    "INSERT INTO ruled VALUES (1)",
    // As a role row-level security applies to (not the superuser).
    "SELECT id FROM guarded",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_code_reached_without_naming_it_is_cleaned_behind() {
    let schema = unique("pgpipe_catalog");
    let admin = pgpipe_test_support::admin().await;
    admin.batch_execute(&setup(&schema)).await.unwrap();
    // The schema first, as a role's or database's search_path would put it.
    let url = with_param(
        &server_url(Some(&schema), None, None),
        "options",
        &format!("-c search_path={schema},public"),
    );
    let pool = Pool::builder()
        .url(&url)
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    let path = |rows: Vec<pgpipe::tokio_postgres::Row>| rows[0].get::<_, String>(0);
    let before = path(pool.query("SHOW search_path", &[]).await.unwrap());
    assert!(before.starts_with(&schema), "{before}");
    let mut leaked = Vec::new();
    for sql in CASES {
        // The control: on a connection of its own it moves the path.
        let plain = connect(&url).await.unwrap();
        plain.batch_execute(sql).await.unwrap();
        assert_eq!(search_path(&plain).await, "pg_catalog", "control: {sql}");
        // Through the pool: it runs, and the next task's query (50 ms
        // later, as another request would) finds the path as it was.
        pool.execute(sql, &[]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let after = path(pool.query("SHOW search_path", &[]).await.unwrap());
        if after != before {
            leaked.push(sql);
            // Put it back for the next case.
            pool.get()
                .await
                .unwrap()
                .batch_execute("RESET search_path")
                .await
                .unwrap();
        }
    }
    assert!(
        leaked.is_empty(),
        "these left the session changed: {leaked:?}"
    );
    pool.close_and_wait(Duration::from_secs(5)).await;
    admin
        .batch_execute(&format!(
            "DROP SCHEMA {schema} CASCADE; DROP OWNED BY {schema}; DROP ROLE {schema}"
        ))
        .await
        .unwrap();
}

/// A transaction-local setting made by user code under a builtin's name
/// (`md5`, overloaded for `integer`) never reaches a neighbour in its read group: the catalog keeps
/// the statement out of groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_code_under_a_builtins_name_never_shares_a_read_group() {
    let schema = unique("pgpipe_catalog_group");
    let admin = pgpipe_test_support::admin().await;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema};
             CREATE FUNCTION {schema}.md5(integer) RETURNS text LANGUAGE plpgsql AS $$
                 BEGIN PERFORM pg_catalog.set_config('pgpipe.tenant', 'leak', true);
                 RETURN 'x'; END $$;"
        ))
        .await
        .unwrap();
    let url = with_param(
        &database_url(),
        "options",
        &format!("-c search_path={schema},public"),
    );
    let pool = Pool::builder()
        .url(&url)
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    pool.read().query("SELECT 1", &[]).await.unwrap();
    let mut leaked = 0;
    for _ in 0..40 {
        let tasks: Vec<_> = (0..30)
            .map(|i| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    if i % 10 == 0 {
                        pool.read()
                            .query("SELECT md5($1::int4)", &[&1i32])
                            .await
                            .map(|_| false)
                    } else {
                        pool.read()
                            .query_one("SELECT current_setting('pgpipe.tenant', true)", &[])
                            .await
                            .map(|row| row.get::<_, Option<String>>(0).as_deref() == Some("leak"))
                    }
                })
            })
            .collect();
        for task in tasks {
            leaked += u32::from(task.await.unwrap().unwrap());
        }
    }
    assert_eq!(leaked, 0, "a neighbour saw what user code set in its group");
    pool.close_and_wait(Duration::from_secs(5)).await;
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

/// Sequence state one task leaves in a shared session (`nextval`, a serial
/// default) never reaches another task's user code: a function that
/// returns `lastval()` finds none (on a plain connection, the control, it
/// returns the other statement's value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_code_never_sees_another_tasks_sequence_state() {
    let schema = unique("pgpipe_catalog_seq");
    let admin = pgpipe_test_support::admin().await;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema};
             CREATE SEQUENCE {schema}.ids;
             CREATE FUNCTION {schema}.last_id() RETURNS bigint LANGUAGE sql
                 AS 'SELECT pg_catalog.lastval()';"
        ))
        .await
        .unwrap();
    let next = format!("SELECT nextval('{schema}.ids')");
    let last = format!("SELECT {schema}.last_id()");
    // The control.
    let plain = connect(&database_url()).await.unwrap();
    let id: i64 = plain.query_one(&next, &[]).await.unwrap().get(0);
    let seen: i64 = plain.query_one(&last, &[]).await.unwrap().get(0);
    assert_eq!(seen, id, "control");
    let pool = Pool::builder()
        .url(&database_url())
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    for _ in 0..20 {
        pool.query(&next, &[]).await.unwrap();
        let err = pool.query(&last, &[]).await.unwrap_err();
        assert_eq!(
            err.code().map(|c| c.code()),
            Some("55000"),
            "lastval reached another task's sequence: {err}"
        );
    }
    pool.close_and_wait(Duration::from_secs(5)).await;
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

/// A verdict the guard remembered before user code appeared under a
/// statement's name (a function shadowing `md5(text)` through
/// `search_path`) is judged again once the catalog learns of it (its
/// generation changed): the statement then gets the cleanup behind it. The
/// guarantee's stated bound is the catalog's refresh (10 s); the test
/// allows 15.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_verdict_is_judged_again_when_user_code_appears() {
    let schema = unique("pgpipe_catalog_later");
    let admin = pgpipe_test_support::admin().await;
    admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let app = unique("later");
    let url = with_param(
        &with_param(&database_url(), "application_name", &app),
        "options",
        // Ahead of pg_catalog: a function of the schema shadows a builtin of the
        // same signature.
        &format!("-c search_path={schema},pg_catalog,public"),
    );
    let pool = Pool::builder()
        .url(&url)
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    let sql = "SELECT md5('x'::text)";
    let path = |rows: Vec<pgpipe::tokio_postgres::Row>| rows[0].get::<_, String>(0);
    let before = path(pool.query("SHOW search_path", &[]).await.unwrap());
    // Judged (and remembered) while md5(1) is PostgreSQL's own.
    pool.execute(sql, &[]).await.unwrap();
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION {schema}.md5(text) RETURNS text LANGUAGE plpgsql AS $$
                 BEGIN PERFORM pg_catalog.set_config('search_path', 'pg_catalog', false);
                 RETURN 'x'; END $$"
        ))
        .await
        .unwrap();
    // The pool's connection goes (its prepared statement still names the
    // builtin): the next one prepares the text anew, and it now resolves
    // to the schema's function, while the lane remembers the verdict.
    for pid in pgpipe_test_support::backend_pids(&admin, &app).await {
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
    }
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while pool.query("SELECT 1", &[]).await.is_err() {
        assert!(tokio::time::Instant::now() < until, "the pool never healed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The control: it moves the path now.
    let plain = connect(&url).await.unwrap();
    plain.batch_execute(sql).await.unwrap();
    assert_eq!(search_path(&plain).await, "pg_catalog", "control");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        pool.execute(sql, &[]).await.unwrap();
        let after = path(pool.query("SHOW search_path", &[]).await.unwrap());
        if after == before {
            break;
        }
        pool.get()
            .await
            .unwrap()
            .batch_execute("RESET search_path")
            .await
            .unwrap();
        assert!(
            tokio::time::Instant::now() < deadline,
            "the remembered verdict still let {sql} leave the session changed after 15 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    pool.close_and_wait(Duration::from_secs(5)).await;
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
