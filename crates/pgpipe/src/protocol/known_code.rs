//! Whether a statement runs code the guard cannot prove: `DO`, `CALL`, or
//! a call of a name the database's catalog does not prove (see
//! [`catalog`](super::catalog): every function of that name is built in
//! and harmless). Deny by default: a name the catalog has not seen (a
//! function created a moment ago) is unproven too. Such a statement may
//! change the session however its code likes, so the pool cleans the
//! session right behind it (see the guide's "What runs on the shared
//! path").
//!
//! Words before `(` that are SQL syntax rather than calls (`IN (`,
//! `VALUES (`, `numeric(10, 2)`, `INSERT INTO t (a, b)`, `AS t (a, b)`) are
//! recognised as such.

use super::lexer::Token;

/// Words that may stand before `(` without being a call: SQL syntax,
/// function-like keywords PostgreSQL evaluates itself, and type names with
/// modifiers. Sorted, lower case.
const SYNTAX: &[&str] = &[
    "all",
    "and",
    "any",
    "array",
    "as",
    "between",
    "bit",
    "by",
    "case",
    "cast",
    "char",
    "character",
    "coalesce",
    "conflict",
    "cube",
    "decimal",
    "distinct",
    "else",
    "except",
    "exists",
    "extract",
    "filter",
    "float",
    "from",
    "greatest",
    "group",
    "grouping",
    "having",
    "in",
    "intersect",
    "interval",
    "is",
    "join",
    "key",
    "lateral",
    "least",
    "like",
    "limit",
    "materialized",
    "not",
    "nullif",
    "numeric",
    "offset",
    "on",
    "or",
    "over",
    "overlay",
    "position",
    "precision",
    "returning",
    "rollup",
    "row",
    "select",
    "sets",
    "some",
    "substring",
    "table",
    "then",
    "time",
    "timestamp",
    "trim",
    "union",
    "using",
    "values",
    "varchar",
    "varying",
    "when",
    "where",
    "with",
    "within",
];

/// Whether `statement` (one statement's tokens, without its `;`) may run
/// code the guard cannot prove, where `proven` says which called names are
/// proven.
pub(crate) fn runs_unknown_code(statement: &[Token<'_>], proven: impl Fn(&[u8]) -> bool) -> bool {
    let first = statement.iter().find_map(|t| match t {
        Token::Word(w) => Some(*w),
        _ => None,
    });
    if first.is_some_and(|w| is(w, "do") || is(w, "call")) {
        return true;
    }
    statement.iter().enumerate().any(|(i, token)| {
        let name = match token {
            Token::Word(w) | Token::Quoted(w) => *w,
            _ => return false,
        };
        if statement.get(i + 1) != Some(&Token::Punct(b'(')) {
            return false;
        }
        let before = i.checked_sub(1).map(|j| &statement[j]);
        if before == Some(&Token::Punct(b'.')) {
            // `schema.name(`: only PostgreSQL's own schema is known, and a
            // qualified table after INTO or a column list is no call.
            let schema = i.checked_sub(2).map(|j| &statement[j]);
            let ahead = i.checked_sub(3).map(|j| &statement[j]);
            return match (schema, ahead) {
                (_, Some(Token::Word(w))) if is(w, "into") || is(w, "table") => false,
                (Some(Token::Word(s)), _) if is(s, "pg_catalog") => !proven(name),
                _ => true,
            };
        }
        // `INSERT INTO t (a, b)`, `CREATE TABLE t (…)`, `REFERENCES t (id)`:
        // a relation's column list, not a call.
        if let Some(Token::Word(w)) = before {
            if is(w, "into") || is(w, "table") || is(w, "references") || is(w, "as") {
                return false;
            }
        }
        if matches!(token, Token::Quoted(_)) {
            return !proven(name);
        }
        !(proven(name) || known(name, SYNTAX))
    })
}

/// Whether `word` is in `list` (sorted, lower case), ignoring case.
fn known(word: &[u8], list: &[&str]) -> bool {
    let mut lower = [0u8; 64];
    let Some(lower) = lower.get_mut(..word.len()) else {
        return false; // longer than any name listed
    };
    lower.copy_from_slice(word);
    lower.make_ascii_lowercase();
    list.binary_search_by(|probe| probe.as_bytes().cmp(lower))
        .is_ok()
}

fn is(word: &[u8], keyword: &str) -> bool {
    word.eq_ignore_ascii_case(keyword.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::catalog::fixture::TEST_PROVEN;
    use crate::protocol::lexer::Lexer;

    fn unknown(sql: &str) -> bool {
        let tokens: Vec<Token<'_>> = Lexer::new(sql.as_bytes()).collect();
        runs_unknown_code(&tokens, |n| known(n, TEST_PROVEN))
    }

    #[test]
    fn the_lists_are_sorted_for_binary_search() {
        for list in [TEST_PROVEN, SYNTAX] {
            assert!(
                list.windows(2).all(|w| w[0] < w[1]),
                "{:?}",
                list.windows(2).find(|w| w[0] >= w[1])
            );
        }
    }

    #[test]
    fn plain_sql_and_builtin_calls_are_known() {
        for sql in [
            "SELECT $1::int8",
            "SELECT count(*), max(a) FROM t WHERE b IN (1, 2) AND EXISTS (SELECT 1)",
            "INSERT INTO orders (a, b) VALUES ($1, $2) RETURNING id",
            "insert into public.orders (a) values (now())",
            "SELECT CAST(a AS numeric(10, 2)), COALESCE(b, 0) FROM t",
            "SELECT row_number() OVER (PARTITION BY a ORDER BY b) FROM t",
            "WITH x AS (SELECT 1) SELECT * FROM x JOIN y USING (id)",
            "SELECT pg_catalog.lower('A'), \"lower\"('B')",
            "SELECT * FROM generate_series(1, 10) AS g (n)",
            "INSERT INTO t (id) VALUES (1) ON CONFLICT (id) DO NOTHING",
        ] {
            assert!(!unknown(sql), "{sql}");
        }
    }

    #[test]
    fn user_functions_do_and_call_are_unknown() {
        for sql in [
            "SELECT my_func($1)",
            "SELECT app.set_tenant(1)",
            "SELECT \"MyFunc\"()",
            "SELECT * FROM t WHERE a = tenant_id()",
            "DO $$ BEGIN PERFORM 1; END $$",
            "CALL do_things()",
            "SELECT pg_catalog.some_new_function()",
        ] {
            assert!(unknown(sql), "{sql}");
        }
    }
}
