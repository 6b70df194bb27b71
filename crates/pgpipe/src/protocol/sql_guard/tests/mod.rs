//! The guard's unit tests, against databases described by hand: what
//! the proof says of a database (`proof`), and what is refused (`refusals`).

mod proof;
mod refusals;

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
