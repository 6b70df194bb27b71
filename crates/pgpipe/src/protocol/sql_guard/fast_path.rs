//! The guard's fast path: the common statement, judged without lexing.

use super::is;

/// The common case, without lexing (or allocating): one statement that
/// starts with a plain `SELECT`, `INSERT`, `UPDATE`, `DELETE`, `WITH`,
/// `VALUES` or `TABLE`, and where nothing the full check looks for (`INTO`,
/// `set_config`, `advisory_lock`, a `;`, a call's `(` …) appears anywhere.
pub(super) fn plainly_harmless(sql: &[u8]) -> bool {
    const STARTS: [&str; 7] = [
        "select", "insert", "update", "delete", "with", "values", "table",
    ];
    let sql = sql.trim_ascii_start();
    let word = sql
        .iter()
        .position(|c| !c.is_ascii_alphabetic())
        .map_or(sql, |end| &sql[..end]);
    let starts_plainly = STARTS.iter().any(|s| is(word, s))
        && sql
            .get(word.len())
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || *c == b'_' || *c == b'$'));
    starts_plainly && !mentions_anything_checked(sql)
}

/// Whether `sql` holds, anywhere and in any case, a `;`, a `(`, a `&` or a word
/// the full check looks for. One pass, comparing only where a word's first
/// letter stands: this runs for every query.
fn mentions_anything_checked(sql: &[u8]) -> bool {
    const WORDS: [&[u8]; 7] = [
        b"into",
        b"set_config",
        b"advisory_lock",
        b"pg_temp",
        b"pg_settings",
        b"lastval",
        b"currval",
    ];
    sql.iter()
        .enumerate()
        .any(|(i, &c)| match c.to_ascii_lowercase() {
            // `&`: a `U&"…"` name may spell any of the words below.
            b';' | b'(' | b'&' => true,
            first @ (b'i' | b's' | b'a' | b'p' | b'l' | b'c') => WORDS.iter().any(|word| {
                word[0] == first
                    && sql
                        .get(i..i + word.len())
                        .is_some_and(|here| here.eq_ignore_ascii_case(word))
            }),
            _ => false,
        })
}
