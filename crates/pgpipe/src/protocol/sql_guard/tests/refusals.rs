//! What the guard refuses, and what it lets through, against a database
//! with no user code in it.

use super::super::*;

/// Against a database with no user code in it.
fn check(sql: &str) -> Result<Code, Error> {
    super::super::check(sql, &Catalog::empty())
}

fn groupable(sql: &str) -> bool {
    super::super::groupable(sql, &Catalog::empty())
}

/// The guard and the server read the same statement: each of these
/// hides a session change from a lexer that differs from PostgreSQL's.
#[test]
fn lexical_disguises_are_seen_through() {
    for sql in [
        // A `--` comment ends at a carriage return.
        "-- note\rSET search_path TO pg_catalog",
        "SELECT 1; -- x\rSELECT set_config('app.tenant', 'a', false)",
        // With standard_conforming_strings off, `\'` does not end the
        // string, and the SET runs.
        "SELECT 'x\\''; SET search_path TO pg_catalog; --'",
        // U&"pg\005Fsettings" is pg_settings.
        "UPDATE U&\"pg\\005Fsettings\" SET setting = 'x' WHERE name = 'search_path'",
        "SELECT 1 FROM U&\"pg!005Ftemp\" UESCAPE '!'.t",
        // A dollar-quote tag with bytes past ASCII is one string.
        "SELECT $é$ x $é$; SET search_path TO pg_catalog",
        // Nothing the cleanup undoes.
        "SELECT setseed(0.5)",
        "LOAD 'auto_explain'",
    ] {
        assert!(refused(sql), "{sql:?}");
    }
    // And plain SQL with the same pieces still runs.
    for sql in [
        "SELECT $é$ ; SET search_path TO x $é$",
        "SELECT 'it''s' -- SET x\n",
        "SELECT U&\"d\\0061t\\+000061\" FROM t",
        "SELECT 1.5, .5e3, 0x1F, 1_000, t.x FROM t",
        "SELECT E'\\'; SET x TO y'",
    ] {
        if sql.contains("U&\"") {
            assert!(refused(sql), "escaped names are not decoded: {sql:?}");
        } else {
            assert!(!refused(sql), "{sql:?}");
        }
    }
}

#[test]
fn a_transaction_id_keeps_its_query_out_of_read_groups() {
    for sql in [
        "SELECT txid_current()",
        "SELECT pg_current_xact_id()",
        "SELECT pg_catalog.txid_current_if_assigned()",
    ] {
        assert!(!groupable(sql), "{sql}");
    }
    assert!(groupable("SELECT now(), id FROM t WHERE id = $1"));
}

#[test]
fn transaction_scoped_set_forms_pass_a_transaction_pooler_and_session_ones_do_not() {
    for sql in [
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "set transaction read only",
        "SET TRANSACTION SNAPSHOT '00000003-0000001B-1'",
        "SET CONSTRAINTS ALL DEFERRED",
        "SET LOCAL search_path TO app",
    ] {
        assert!(check_through_transaction_pooler(sql).is_ok(), "{sql}");
    }
    for sql in [
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        "SET search_path TO app",
        "SET SESSION statement_timeout = 0",
    ] {
        assert!(check_through_transaction_pooler(sql).is_err(), "{sql}");
    }
    // On the shared path every one of them stays refused.
    assert!(refused("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"));
    assert!(refused("SET CONSTRAINTS ALL DEFERRED"));
}

fn refused(sql: &str) -> bool {
    match check(sql) {
        Ok(_) => false,
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::NotAllowedOnShared);
            assert!(e.to_string().contains("pool.get()"), "{e}");
            true
        }
    }
}

#[test]
fn transaction_control_is_refused() {
    for sql in [
        "BEGIN",
        "begin isolation level serializable",
        "START TRANSACTION",
        "COMMIT",
        "end",
        "ROLLBACK",
        "abort",
        "SAVEPOINT a",
        "RELEASE SAVEPOINT a",
        "PREPARE TRANSACTION 'x'",
    ] {
        assert!(refused(sql), "{sql}");
    }
}

#[test]
fn session_statements_are_refused() {
    for sql in [
        "SET search_path = x",
        "set session timezone = 'UTC'",
        "SET TIME ZONE 'UTC'",
        "RESET ALL",
        "LISTEN chan",
        "UNLISTEN *",
        "PREPARE p AS SELECT 1",
        "DEALLOCATE ALL",
        "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
        "FETCH 10 FROM c",
        "COPY t FROM STDIN",
        "LOCK TABLE t",
        "DISCARD ALL",
        "CREATE TEMP TABLE t (a int)",
        "create temporary table t as select 1",
        "CREATE GLOBAL TEMPORARY TABLE t (a int)",
        "CREATE OR REPLACE TEMP VIEW v AS SELECT 1",
        "SELECT 1 INTO TEMP t",
        "select * into temporary table t from x",
        "WITH a AS (SELECT 1) SELECT * INTO LOCAL TEMP t FROM a",
        "SELECT set_config('search_path', 'x', false)",
        "select SET_CONFIG('a.b', $1, $2)",
        "SELECT pg_advisory_lock(1)",
        "SELECT pg_try_advisory_lock_shared(1, 2)",
        "SELECT \"pg_advisory_lock\"(1)",
    ] {
        assert!(refused(sql), "{sql}");
    }
}

#[test]
fn comments_case_and_parentheses_do_not_fool_it() {
    for sql in [
        "  -- a comment\n  BEGIN",
        "/* outer /* nested */ still comment */ SeT x = 1",
        "/**/begin",
        "(SELECT 1 INTO TEMP t)",
        "SELECT 1; BEGIN",
        "\n\t\tLiStEn x",
    ] {
        assert!(refused(sql), "{sql}");
    }
}

#[test]
fn ordinary_queries_pass() {
    for sql in [
        "SELECT $1::int8",
        "INSERT INTO t (a) VALUES ($1) RETURNING a",
        "UPDATE t SET a = 1 WHERE b = 2",
        "DELETE FROM t",
        "SET LOCAL statement_timeout = 100",
        "SELECT set_config('a.b', 'c', true)",
        "SELECT pg_advisory_xact_lock(1)",
        "SELECT pg_advisory_unlock_all()",
        "SELECT 'BEGIN; SET x = 1'",
        "SELECT $$ BEGIN $$, $tag$ set_config('a','b',false) $tag$",
        "SELECT E'it\\'s; BEGIN'",
        "SELECT \"begin\" FROM t",
        "-- BEGIN\nSELECT 1",
        "/* SET x = 1 */ SELECT 1",
        "CREATE TABLE temp_things (a int)",
        "CREATE UNLOGGED TABLE u (a int)",
        "INSERT INTO t SELECT * FROM u",
        "SELECT a INTO STRICT FROM t",
        "NOTIFY chan",
        "SHOW search_path",
        "",
    ] {
        assert!(!refused(sql), "{sql}");
    }
}

#[test]
fn the_fast_path_only_passes_what_the_full_check_passes() {
    for sql in [
        "SELECT $1::int8",
        "select * from t where a = $1",
        "INSERT INTO t VALUES (1)",
        "SELECT 1 INTO TEMP t",
        "SELECT pg_advisory_lock(1)",
        "SELECT set_config('a', 'b', false)",
        "SELECT 1; BEGIN",
        "selectx",
        "WITH a AS (SELECT 1) SELECT * FROM a",
    ] {
        if plainly_harmless(sql.as_bytes()) {
            assert!(!refused(sql), "{sql}");
        }
    }
    assert!(plainly_harmless(b"  SELECT $1::int8"));
    assert!(!plainly_harmless(b"/* c */ SELECT 1"));
    assert!(!plainly_harmless(b"SELECT 1 INTO TEMP t"));
}

#[test]
fn atomic_batches_refuse_transaction_control_only() {
    for sql in [
        "COMMIT",
        "  begin",
        "/* x */ SAVEPOINT a",
        "SELECT 1; ROLLBACK",
    ] {
        assert!(check_in_atomic_batch(sql).is_err(), "{sql}");
    }
    for sql in [
        "SET LOCAL work_mem = '8MB'",
        "SELECT pg_advisory_xact_lock(1)",
        "SET x = 1",
    ] {
        assert!(check_in_atomic_batch(sql).is_ok(), "{sql}");
    }
}

#[test]
fn unterminated_literals_do_not_panic() {
    for sql in [
        "SELECT 'abc",
        "SELECT \"abc",
        "SELECT $$abc",
        "SELECT /* abc",
        "$",
        "$1",
    ] {
        let _ = check(sql);
    }
}

#[test]
fn session_state_in_disguise_is_refused() {
    for sql in [
        "\u{b}SET search_path = x",
        "\u{b}\u{b}BEGIN",
        "+SET search_path = x",
        "UPDATE pg_settings SET setting = 'pg_catalog' WHERE name = 'search_path'",
        "update pg_catalog.pg_settings set setting = 'x' where name = 'role'",
        "CREATE TABLE pg_temp.orders (id int)",
        "SELECT 1 AS a INTO pg_temp.x",
        "INSERT INTO \"pg_temp\".t VALUES (1)",
        "EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1",
        "explain (analyze, buffers) select 1 into temp t",
        "SELECT lastval()",
        "select currval('orders_id_seq')",
        "SELECT pg_catalog.lastval()",
    ] {
        assert!(refused(sql), "{sql:?}");
    }
}

#[test]
fn code_the_guard_cannot_read_is_let_through_as_unknown() {
    let code = |sql| check(sql).unwrap();
    assert_eq!(code("SELECT $1::int8"), Code::Known);
    assert_eq!(
        code("SELECT count(*) FROM t WHERE a IN (1, 2)"),
        Code::Known
    );
    assert_eq!(code("SELECT * FROM pg_settings"), Code::Known);
    assert_eq!(code("SELECT set_tenant($1)"), Code::Unknown);
    assert_eq!(code("DO $$ BEGIN PERFORM 1; END $$"), Code::Unknown);
    assert_eq!(code("CALL p()"), Code::Unknown);
    assert_eq!(code("SELECT 1; SELECT f()"), Code::Unknown);
}

#[test]
fn copy_is_refused_in_atomic_batches_and_query_methods() {
    let e = check_in_atomic_batch("COPY t FROM STDIN").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotAllowedInBatch);
    let e = check_not_copy("  copy (delete from t returning *) to stdout").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported);
    assert!(check_not_copy("SELECT 1").is_ok());
}
