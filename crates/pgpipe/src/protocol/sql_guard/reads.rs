//! Which SQL plainly only reads: what may share a read group on a session
//! that is not read-only of itself (the primary's shared connections),
//! behind the group's read-only head.
//!
//! The server enforces it (the group's transaction is read-only: a write
//! fails with 25006 and writes nothing), so this only has to keep what
//! would fail there, or read what the head changes, out of groups. It is
//! strict on purpose: what it turns away keeps a `Sync` of its own, as
//! before, and costs only the saving.

use super::lexers;
use super::refusals::is;
use crate::protocol::lexer::Token;

/// Words that keep a statement out: writes (also in a `WITH`), `SELECT …
/// INTO`, row locks (`FOR UPDATE`, and any `FOR`), sequence changes, and
/// the setting the head sets (a read of it would see the group's `on`).
const WRITES: [&str; 12] = [
    "insert",
    "update",
    "delete",
    "merge",
    "into",
    "for",
    "copy",
    "nextval",
    "setval",
    "transaction_read_only",
    "current_setting",
    "set_config",
];

/// Prefixes of the built-in functions that write or change the server
/// (large objects, replication slots and origins, `pg_*` administration):
/// none of them is a plain read.
const WRITING_PREFIXES: [&str; 2] = ["lo_", "pg_"];

/// Whether every statement of `sql` starts as a query does (`SELECT`,
/// `VALUES`, `TABLE`, `WITH`, `(`) and no word of it writes, locks or
/// reads the head's setting (see [`WRITES`]). Read every way a session may
/// read its strings.
pub(crate) fn reads_only(sql: &str) -> bool {
    lexers(sql).all(|tokens| {
        let mut first = true;
        for token in tokens {
            match token {
                Token::Punct(b';') => {
                    first = true;
                    continue;
                }
                Token::Word(word) | Token::Quoted(word) => {
                    let writes = WRITES.iter().any(|w| is(word, w))
                        || WRITING_PREFIXES
                            .iter()
                            .any(|p| word.len() >= p.len() && is(&word[..p.len()], p));
                    let opens = matches!(token, Token::Word(_))
                        && ["select", "values", "table", "with"]
                            .iter()
                            .any(|k| is(word, k));
                    if writes || (first && !opens) {
                        return false;
                    }
                }
                Token::Punct(b'(') if first => {}
                Token::Escaped => return false,
                _ if first => return false,
                _ => {}
            }
            first = false;
        }
        true
    })
}

#[cfg(test)]
mod tests {
    use super::reads_only;

    #[test]
    fn queries_read() {
        for sql in [
            "SELECT $1::int8",
            "select id, name from products where id = $1",
            "VALUES (1), (2)",
            "TABLE products",
            "WITH t AS (SELECT 1) SELECT * FROM t",
            "(SELECT 1) UNION (SELECT 2)",
            "SELECT now(), count(*) FROM orders; SELECT 2",
        ] {
            assert!(reads_only(sql), "{sql}");
        }
    }

    #[test]
    fn writes_locks_and_the_heads_setting_do_not() {
        for sql in [
            "INSERT INTO t VALUES (1)",
            "WITH w AS (INSERT INTO t VALUES (1) RETURNING *) SELECT * FROM w",
            "WITH w AS (DELETE FROM t RETURNING *) SELECT * FROM w",
            "SELECT * INTO t2 FROM t",
            "SELECT * FROM t FOR UPDATE",
            "SELECT * FROM t FOR KEY SHARE",
            "SELECT nextval('s')",
            "SELECT \"nextval\"('s')",
            "SELECT setval('s', 1)",
            "SELECT lo_create(0)",
            "SELECT pg_advisory_lock(1)",
            "SELECT pg_create_restore_point('x')",
            "SELECT current_setting('transaction_read_only')",
            "SHOW transaction_read_only",
            "UPDATE t SET x = 1",
            "EXPLAIN ANALYZE DELETE FROM t",
            "CREATE TABLE t (x int)",
            "SELECT 1; DELETE FROM t",
            "\"select\" 1",
            "SELECT U&\"\\0069nsert\"",
            "SELECT 'a\\'; DELETE FROM t; --'",
        ] {
            assert!(!reads_only(sql), "{sql}");
        }
    }
}
