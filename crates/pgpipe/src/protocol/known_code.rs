//! Whether a statement runs code the guard cannot read: `DO`, `CALL`, or a
//! call of a function that is not one of PostgreSQL's own that the guard
//! knows. Such a statement may change the session however its code likes,
//! so the pool cleans the session right behind it (see the README's "What
//! runs on the shared path").
//!
//! The list errs one way only: a name missing from it costs a cleanup, never
//! a leak. Words before `(` that are SQL syntax rather than calls (`IN (`,
//! `VALUES (`, `numeric(10, 2)`, `INSERT INTO t (a, b)`, `AS t (a, b)`) are
//! recognised as such.

use super::lexer::Token;

/// Built-in functions (in `pg_catalog`) that change no session state.
/// Sorted, lower case: looked up by binary search.
const BUILTINS: &[&str] = &[
    "abs",
    "age",
    "array_agg",
    "array_append",
    "array_cat",
    "array_dims",
    "array_fill",
    "array_length",
    "array_lower",
    "array_position",
    "array_positions",
    "array_prepend",
    "array_remove",
    "array_replace",
    "array_to_json",
    "array_to_string",
    "array_upper",
    "ascii",
    "avg",
    "bit_and",
    "bit_length",
    "bit_or",
    "bool_and",
    "bool_or",
    "btrim",
    "cardinality",
    "cbrt",
    "ceil",
    "ceiling",
    "char_length",
    "character_length",
    "chr",
    "clock_timestamp",
    "concat",
    "concat_ws",
    "corr",
    "count",
    "covar_pop",
    "covar_samp",
    "cume_dist",
    "current_database",
    "current_schema",
    "current_schemas",
    "current_setting",
    "date_bin",
    "date_part",
    "date_trunc",
    "decode",
    "degrees",
    "dense_rank",
    "div",
    "encode",
    "every",
    "exp",
    "first_value",
    "floor",
    "format",
    "gen_random_uuid",
    "generate_series",
    "generate_subscripts",
    "host",
    "initcap",
    "isfinite",
    "json_agg",
    "json_array_elements",
    "json_array_elements_text",
    "json_array_length",
    "json_build_array",
    "json_build_object",
    "json_each",
    "json_each_text",
    "json_extract_path",
    "json_extract_path_text",
    "json_object",
    "json_object_agg",
    "json_object_keys",
    "json_populate_record",
    "json_populate_recordset",
    "json_strip_nulls",
    "json_to_record",
    "json_to_recordset",
    "json_typeof",
    "jsonb_agg",
    "jsonb_array_elements",
    "jsonb_array_elements_text",
    "jsonb_array_length",
    "jsonb_build_array",
    "jsonb_build_object",
    "jsonb_each",
    "jsonb_each_text",
    "jsonb_extract_path",
    "jsonb_extract_path_text",
    "jsonb_insert",
    "jsonb_object",
    "jsonb_object_agg",
    "jsonb_object_keys",
    "jsonb_path_exists",
    "jsonb_path_match",
    "jsonb_path_query",
    "jsonb_path_query_array",
    "jsonb_path_query_first",
    "jsonb_populate_record",
    "jsonb_populate_recordset",
    "jsonb_pretty",
    "jsonb_set",
    "jsonb_strip_nulls",
    "jsonb_to_record",
    "jsonb_to_recordset",
    "jsonb_typeof",
    "justify_days",
    "justify_hours",
    "justify_interval",
    "lag",
    "last_value",
    "lead",
    "left",
    "length",
    "ln",
    "log",
    "lower",
    "lpad",
    "ltrim",
    "make_date",
    "make_interval",
    "make_time",
    "make_timestamp",
    "make_timestamptz",
    "max",
    "md5",
    "min",
    "mod",
    "mode",
    "nextval",
    "now",
    "nth_value",
    "ntile",
    "num_nonnulls",
    "num_nulls",
    "octet_length",
    "percent_rank",
    "percentile_cont",
    "percentile_disc",
    "pg_advisory_xact_lock",
    "pg_advisory_xact_lock_shared",
    "pg_backend_pid",
    "pg_column_size",
    "pg_current_wal_lsn",
    "pg_current_xact_id",
    "pg_is_in_recovery",
    "pg_last_wal_replay_lsn",
    "pg_notify",
    "pg_relation_size",
    "pg_size_pretty",
    "pg_sleep",
    "pg_total_relation_size",
    "pg_try_advisory_xact_lock",
    "pg_try_advisory_xact_lock_shared",
    "pg_typeof",
    "pi",
    "plainto_tsquery",
    "power",
    "quote_ident",
    "quote_literal",
    "quote_nullable",
    "radians",
    "random",
    "rank",
    "regexp_count",
    "regexp_instr",
    "regexp_like",
    "regexp_match",
    "regexp_matches",
    "regexp_replace",
    "regexp_split_to_array",
    "regexp_split_to_table",
    "repeat",
    "replace",
    "reverse",
    "right",
    "round",
    "row_number",
    "row_to_json",
    "rpad",
    "rtrim",
    "set_config",
    "setval",
    "setweight",
    "sha224",
    "sha256",
    "sha384",
    "sha512",
    "sign",
    "split_part",
    "sqrt",
    "starts_with",
    "statement_timestamp",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "string_agg",
    "string_to_array",
    "strpos",
    "substr",
    "sum",
    "timeofday",
    "timezone",
    "to_char",
    "to_date",
    "to_hex",
    "to_json",
    "to_jsonb",
    "to_number",
    "to_timestamp",
    "to_tsquery",
    "to_tsvector",
    "transaction_timestamp",
    "translate",
    "trunc",
    "ts_headline",
    "ts_rank",
    "ts_rank_cd",
    "txid_current",
    "unnest",
    "upper",
    "var_pop",
    "var_samp",
    "variance",
    "version",
    "websearch_to_tsquery",
    "width_bucket",
];

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
/// code the guard cannot read.
pub(crate) fn runs_unknown_code(statement: &[Token<'_>]) -> bool {
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
                (Some(Token::Word(s)), _) if is(s, "pg_catalog") => !known(name, BUILTINS),
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
            return !known(name, BUILTINS);
        }
        !(known(name, BUILTINS) || known(name, SYNTAX))
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
    use crate::protocol::lexer::Lexer;

    fn unknown(sql: &str) -> bool {
        let tokens: Vec<Token<'_>> = Lexer::new(sql.as_bytes()).collect();
        runs_unknown_code(&tokens)
    }

    #[test]
    fn the_lists_are_sorted_for_binary_search() {
        for list in [BUILTINS, SYNTAX] {
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
