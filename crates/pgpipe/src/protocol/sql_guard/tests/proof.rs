//! What the catalog's proof says of a statement.

use super::super::*;

/// Against a database with no user code in it.
fn check(sql: &str) -> Result<Code, Error> {
    super::super::check(sql, &Catalog::empty())
}

#[test]
fn what_the_catalog_says_reaches_user_code_is_unknown_code() {
    let catalog = Catalog::from_rows([
        ("f", "md5"),
        ("r", "audited"),
        ("t", "mood"),
        ("o", "@@@"),
        ("p", "sha256"),
    ]);
    for sql in [
        "SELECT md5(1)",
        "SELECT public.md5($1)",
        "INSERT INTO audited VALUES (1)",
        "SELECT * FROM \"Audited\"",
        "SELECT $1::mood",
        "SELECT a @@@ b FROM t",
    ] {
        assert_eq!(
            super::super::check(sql, &catalog).unwrap(),
            Code::Unknown,
            "{sql}"
        );
        assert!(!super::super::groupable(sql, &catalog), "{sql}");
    }
    assert_eq!(
        super::super::check("SELECT sha256($1)", &catalog).unwrap(),
        Code::Known
    );
    // Deny by default: a call the catalog does not prove (a function
    // created after it was read) is unproven.
    assert_eq!(
        super::super::check("SELECT sha512($1)", &catalog).unwrap(),
        Code::Unknown
    );
    // Not learned yet: everything is unknown code; refusals still hold.
    let unknown = Catalog::default();
    assert_eq!(
        super::super::check("SELECT 1", &unknown).unwrap(),
        Code::Unknown
    );
    assert!(super::super::check("SET search_path TO x", &unknown).is_err());
}

#[test]
fn what_the_proof_says_of_the_database_holds() {
    let proven = Catalog::from_rows([("p", "lower"), ("b", "tenant_view")]);
    // A relation that may leave transaction-scoped state keeps its
    // statement out of read groups, not off the shared path.
    assert_eq!(
        super::super::check("SELECT * FROM tenant_view", &proven).unwrap(),
        Code::Known
    );
    assert!(!super::super::groupable(
        "SELECT * FROM tenant_view",
        &proven
    ));
    assert!(super::super::groupable(
        "SELECT lower(name) FROM t",
        &proven
    ));
    // Where a hook no name leads to runs unproven code, nothing is
    // proven.
    let nothing = Catalog::from_rows([("p", "lower"), ("x", "a default conversion")]);
    for sql in ["SELECT 1", "SELECT lower(name) FROM t"] {
        assert_eq!(
            super::super::check(sql, &nothing).unwrap(),
            Code::Unknown,
            "{sql}"
        );
    }
    let unclassified = Catalog::from_rows([("u", "pg_new.hook")]);
    assert_eq!(
        super::super::check("SELECT 1", &unclassified).unwrap(),
        Code::Unknown
    );
    // An event trigger runs on DDL, and on SELECT … INTO.
    let triggered = Catalog::from_rows([("e", "an event trigger")]);
    assert_eq!(
        super::super::check("SELECT a FROM t", &triggered).unwrap(),
        Code::Known
    );
    assert_eq!(
        super::super::check("SELECT a INTO t2 FROM t", &triggered).unwrap_or(Code::Known),
        Code::Unknown
    );
    // `set_config(…, true)` spelled is proven local by the refusals;
    // reached through anything else, it is unproven.
    let config = Catalog::from_rows([("f", "set_config")]);
    assert_eq!(
        super::super::check("SELECT set_config('app.tenant', $1, true)", &config).unwrap(),
        Code::Known
    );
    assert_eq!(
        super::super::check("SELECT x.set_config FROM t x", &config).unwrap(),
        Code::Unknown
    );
}

#[test]
fn only_queries_and_dml_are_proven_kinds_of_statement() {
    for sql in [
        "CREATE TABLE t (a int)",
        "ALTER TABLE t ADD COLUMN b int",
        "DROP VIEW v",
        "VACUUM t",
        "ANALYZE t",
        "REINDEX INDEX i",
        "CLUSTER t",
        "REFRESH MATERIALIZED VIEW m",
        "COMMENT ON TABLE t IS 'x'",
        "SECURITY LABEL ON TABLE t IS 'x'",
    ] {
        assert_eq!(check(sql).unwrap(), Code::Unknown, "{sql}");
    }
    for sql in [
        "SELECT 1",
        "(SELECT 1)",
        "TRUNCATE t",
        "SHOW work_mem",
        "EXPLAIN SELECT 1",
        "NOTIFY jobs",
        "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE",
    ] {
        assert_eq!(check(sql).unwrap(), Code::Known, "{sql}");
    }
    assert!(changes_catalog("create view v as select 1"));
    assert!(changes_catalog("SELECT 1; DROP TABLE t"));
    assert!(!changes_catalog(
        "SELECT 'create table'; UPDATE t SET drop = 1"
    ));
}

#[test]
fn only_statements_that_run_inside_a_transaction_block_fit_the_budgets_block() {
    for sql in [
        "SELECT 1",
        "update t set v = 1 where id = $1",
        "WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x",
        "SHOW work_mem",
        "(SELECT 1)",
    ] {
        assert!(fits_a_block(sql), "{sql}");
    }
    for sql in [
        "VACUUM t",
        "CREATE INDEX CONCURRENTLY i ON t (v)",
        "create database d",
        "BEGIN",
        "COMMIT",
        "SELECT 1; VACUUM",
        "ALTER SYSTEM SET work_mem = '1MB'",
    ] {
        assert!(!fits_a_block(sql), "{sql}");
    }
}
