//! The guard's unit tests, against databases described by hand.

mod groupable {
    use super::super::Catalog;

    /// Against a database with no user code in it.
    fn groupable(sql: &str) -> bool {
        super::super::groupable(sql, &Catalog::empty())
    }

    #[test]
    fn only_plain_reads_share_a_group() {
        for sql in [
            "SELECT $1::int8",
            "SELECT id, name FROM products WHERE id = $1",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "SELECT now(), pg_sleep(0)",
        ] {
            assert!(groupable(sql), "{sql}");
        }
        for sql in [
            "SET LOCAL statement_timeout = 1",
            "SELECT set_config('app.tenant', '42', true)",
            "SELECT pg_advisory_xact_lock(1)",
            "NOTIFY jobs",
            "SELECT pg_notify('jobs', 'x')",
            "UPDATE t SET x = 1",
            "SELECT my_function(1)",
            "DO $$ BEGIN END $$",
            "SELECT \"set_config\"('a.b', 'c', true)",
        ] {
            assert!(!groupable(sql), "{sql}");
        }
    }
}

mod guard {
    use super::super::*;

    /// Against a database with no user code in it.
    fn check(sql: &str) -> Result<Code, Error> {
        super::super::check(sql, &Catalog::empty())
    }

    fn groupable(sql: &str) -> bool {
        super::super::groupable(sql, &Catalog::empty())
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
}
