//! What makes one statement session-changing on the shared path: the first
//! words, forms and calls the guard refuses, and the name it gives each.

use super::super::lasting::lasting;
use super::super::lexer::Token;

pub(super) const TRANSACTION_CONTROL: &[&str] = &[
    "begin",
    "start",
    "commit",
    "end",
    "rollback",
    "abort",
    "savepoint",
    "release",
    "prepare",
];

/// First words of session statements, besides transaction control.
const SESSION_FIRST_WORDS: &[&str] = &[
    "deallocate",
    "declare",
    "fetch",
    "move",
    "close",
    "copy",
    "lock",
    "discard",
    "listen",
    "unlisten",
    "reset",
];

const SESSION_LOCKS: &[&str] = &[
    "pg_advisory_lock",
    "pg_advisory_lock_shared",
    "pg_try_advisory_lock",
    "pg_try_advisory_lock_shared",
];

/// Names what makes one statement (without its `;`) session-changing.
pub(super) fn refused(statement: &[Token<'_>]) -> Option<&'static str> {
    let opening = statement.iter().find(|t| **t != Token::Punct(b'('));
    if !matches!(opening, None | Some(Token::Word(_))) {
        return Some("a statement that does not start with a keyword");
    }
    if let Some(what) = lasting(statement) {
        return Some(what);
    }
    if statement.contains(&Token::Escaped) {
        return Some("a Unicode-escaped identifier (U&\"…\"; write the name plainly)");
    }
    if let Some(analyzed) = explained(statement) {
        return refused(analyzed);
    }
    for (i, token) in statement.iter().enumerate() {
        let (Token::Word(w) | Token::Quoted(w)) = token else {
            continue;
        };
        if w.len() >= 7 && is(&w[..7], "pg_temp") {
            return Some("a temporary object (pg_temp)");
        }
        if is(w, "pg_settings")
            && statement[..i]
                .iter()
                .any(|t| matches!(t, Token::Word(u) if is(u, "update")))
        {
            return Some("UPDATE pg_settings (a SET in disguise)");
        }
        if (is(w, "lastval") || is(w, "currval")) && is_call(&statement[i + 1..]) {
            return Some("lastval()/currval() (a sequence's state in this session)");
        }
    }
    let words: Vec<&[u8]> = statement
        .iter()
        .skip_while(|t| **t == Token::Punct(b'('))
        .map_while(|t| match t {
            Token::Word(w) => Some(*w),
            _ => None,
        })
        .collect();
    let first = *words.first()?;
    let mut refused_first = TRANSACTION_CONTROL.iter().chain(SESSION_FIRST_WORDS);
    if let Some(word) = refused_first.find(|w| is(first, w)) {
        return Some(keyword_name(word));
    }
    if is(first, "set") {
        // Forms that last only as long as the transaction they run in.
        match words.get(1) {
            Some(w) if is(w, "local") => {}
            Some(w) if is(w, "transaction") => return Some("SET TRANSACTION"),
            Some(w) if is(w, "constraints") => return Some("SET CONSTRAINTS"),
            _ => return Some("SET (without LOCAL)"),
        }
    }
    if is(first, "create") && creates_temp(&words[1..]) {
        return Some("CREATE TEMP");
    }
    let selects = ["select", "with", "table"].iter().any(|w| is(first, w))
        || statement.first() == Some(&Token::Punct(b'('));
    for (i, token) in statement.iter().enumerate() {
        let rest = &statement[i + 1..];
        match token {
            Token::Word(w) if selects && is(w, "into") && into_temp(rest) => {
                return Some("SELECT … INTO TEMP");
            }
            Token::Word(w) | Token::Quoted(w) if is_call(rest) => {
                if is(w, "set_config") && !third_argument_is_true(rest) {
                    return Some("set_config(…, false)");
                }
                if SESSION_LOCKS.iter().any(|lock| is(w, lock)) {
                    return Some("a session-level advisory lock");
                }
            }
            _ => {}
        }
    }
    None
}

/// The statement an `EXPLAIN` runs (with `ANALYZE`) or plans, after its
/// options; `None` for anything but `EXPLAIN`.
fn explained<'s, 't>(statement: &'s [Token<'t>]) -> Option<&'s [Token<'t>]> {
    const OPTIONS: [&str; 3] = ["analyze", "analyse", "verbose"];
    let Some(Token::Word(first)) = statement.first() else {
        return None;
    };
    if !is(first, "explain") {
        return None;
    }
    let mut rest = &statement[1..];
    if rest.first() == Some(&Token::Punct(b'(')) {
        let close = rest.iter().position(|t| *t == Token::Punct(b')'))?;
        rest = &rest[close + 1..];
    }
    while let Some(Token::Word(w)) = rest.first() {
        if !OPTIONS.iter().any(|o| is(w, o)) {
            break;
        }
        rest = &rest[1..];
    }
    Some(rest)
}

pub(super) fn keyword_name(word: &str) -> &'static str {
    match word {
        "begin" => "BEGIN",
        "start" => "START TRANSACTION",
        "commit" => "COMMIT",
        "end" => "END",
        "rollback" => "ROLLBACK",
        "abort" => "ABORT",
        "savepoint" => "SAVEPOINT",
        "release" => "RELEASE SAVEPOINT",
        "prepare" => "PREPARE",
        "deallocate" => "DEALLOCATE",
        "declare" => "DECLARE (a cursor)",
        "fetch" => "FETCH (from a cursor)",
        "move" => "MOVE (a cursor)",
        "close" => "CLOSE (a cursor)",
        "copy" => "COPY",
        "lock" => "LOCK",
        "discard" => "DISCARD",
        "listen" => "LISTEN",
        "unlisten" => "UNLISTEN",
        _ => "RESET",
    }
}

fn creates_temp(words: &[&[u8]]) -> bool {
    let mut rest = words;
    if rest.len() >= 2 && is(rest[0], "or") && is(rest[1], "replace") {
        rest = &rest[2..];
    }
    if rest
        .first()
        .is_some_and(|w| is(w, "global") || is(w, "local"))
    {
        rest = &rest[1..];
    }
    rest.first()
        .is_some_and(|w| is(w, "temp") || is(w, "temporary"))
}

fn into_temp(rest: &[Token<'_>]) -> bool {
    let mut words = rest.iter().map_while(|t| match t {
        Token::Word(w) => Some(*w),
        _ => None,
    });
    match words.next() {
        Some(w) if is(w, "temp") || is(w, "temporary") => true,
        Some(w) if is(w, "global") || is(w, "local") => words
            .next()
            .is_some_and(|w| is(w, "temp") || is(w, "temporary")),
        _ => false,
    }
}

fn is_call(rest: &[Token<'_>]) -> bool {
    rest.first() == Some(&Token::Punct(b'('))
}

/// `rest` starts at the `(` of a call: is its third top-level argument the
/// single word `true`?
fn third_argument_is_true(rest: &[Token<'_>]) -> bool {
    let mut depth = 0usize;
    let mut argument = 0usize;
    let mut third: Vec<&Token<'_>> = Vec::new();
    for token in rest {
        match token {
            Token::Punct(b'(') => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            Token::Punct(b')') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Token::Punct(b',') if depth == 1 => {
                argument += 1;
                continue;
            }
            _ => {}
        }
        if argument == 2 {
            third.push(token);
        }
    }
    matches!(third.as_slice(), [Token::Word(w)] if is(w, "true"))
}

pub(super) fn is(word: &[u8], keyword: &str) -> bool {
    word.eq_ignore_ascii_case(keyword.as_bytes())
}
