//! The guard's lexer against PostgreSQL's own scanner (libpg_query, the
//! `pg_query` crate, PostgreSQL 18's `scan.l`): on generated SQL with
//! comments of every kind and terminator, nested comments, quotes, `E''`,
//! `U&''`/`U&""` with `UESCAPE`, dollar tags with bytes past ASCII, numbers,
//! operators and every white space PostgreSQL accepts, in every position,
//! both must see the same words, quoted names and punctuation in the same
//! order: what the guard reads is what the server reads. SQL the server's
//! scanner refuses is skipped (the server refuses it too).
//!
//! Only with `--features pg-query-check` (libpg_query's build needs
//! libclang). 100,000 statements by default; `PGPIPE_LEXER_DIFF_CASES`
//! sets another count, for fuzzing longer, and `PGPIPE_LEXER_DIFF_SEED` a
//! seed.

use pg_query::protobuf::{KeywordKind, Token as PgToken};

use super::lexer::{Lexer, Token};

/// What both sides must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Word(String),
    Quoted(String),
    /// A `U&"…"` name: the guard reads it whole, decoded or not.
    Unicode,
    Punct(u8),
}

fn ours(sql: &str) -> Vec<Seen> {
    Lexer::new(sql.as_bytes())
        .filter_map(|token| match token {
            Token::Word(w) => Some(Seen::Word(String::from_utf8_lossy(w).to_lowercase())),
            Token::Quoted(q) => Some(Seen::Quoted(String::from_utf8_lossy(q).into_owned())),
            Token::Escaped => Some(Seen::Unicode),
            Token::Punct(p) => Some(Seen::Punct(p)),
            Token::Other => None,
        })
        .collect()
}

fn theirs(sql: &str) -> Option<Vec<Seen>> {
    let tokens = pg_query::scan_tokens(sql).ok()?;
    let mut seen = Vec::new();
    for token in tokens {
        let text = sql.get(token.start as usize..token.end as usize)?;
        let kind = PgToken::try_from(token.token).ok()?;
        let keyword = KeywordKind::try_from(token.keyword_kind).ok()?;
        match kind {
            PgToken::Uident => seen.push(Seen::Unicode),
            PgToken::Ident if text.starts_with('"') => {
                seen.push(Seen::Quoted(text[1..text.len() - 1].to_owned()))
            }
            PgToken::Ident => seen.push(Seen::Word(text.to_lowercase())),
            PgToken::Ascii40 => seen.push(Seen::Punct(b'(')),
            PgToken::Ascii41 => seen.push(Seen::Punct(b')')),
            PgToken::Ascii44 => seen.push(Seen::Punct(b',')),
            PgToken::Ascii46 => seen.push(Seen::Punct(b'.')),
            PgToken::Ascii59 => seen.push(Seen::Punct(b';')),
            // `..` is not written by the generator.
            PgToken::DotDot => return None,
            _ if keyword != KeywordKind::NoKeyword => seen.push(Seen::Word(text.to_lowercase())),
            _ => {}
        }
    }
    Some(seen)
}

const FRAGMENTS: &[&str] = &[
    // Words and names.
    "set",
    "SELECT",
    "search_path",
    "LOCAL",
    "to",
    "pg_catalog",
    "set_config",
    "x1",
    "café",
    "a$b",
    "_t",
    "e",
    "u",
    "n",
    "uescape",
    "from",
    "listen",
    // Quoted names.
    "\"Quoted\"",
    "\"a\"\"b\"",
    "\"-- not a comment\"",
    "U&\"pg\\005Fsettings\"",
    "U&\"plain\"",
    "U&\"d!0061t\" UESCAPE '!'",
    "u&\"x\"",
    // Strings.
    "'it''s'",
    "'a\\'",
    "E'\\''",
    "e'x\\\\'",
    "E'a''b'",
    "N'n'",
    "B'101'",
    "X'1F'",
    "U&'\\0041'",
    "'-- not a comment'",
    "'/* nor this */'",
    "'multi\nline'",
    // Dollar quotes and parameters.
    "$$ ; set x $$",
    "$tag$ -- $tag$",
    "$é$ ' $é$",
    "$a1$x$a1$",
    "$_$\r$_$",
    "$1",
    "$23",
    // Comments.
    "-- c\n",
    "-- c\r",
    "--\n",
    "/* a /* nested */ b */",
    "/**/",
    "/* ' \" $$ */",
    // Numbers.
    "1",
    "1.5",
    ".5",
    "1e10",
    "1.5e-3",
    "0x1F",
    "1_000",
    "0b101",
    // Punctuation and operators.
    "(",
    ")",
    ",",
    ";",
    ".",
    "+",
    "-",
    "*",
    "/",
    "::",
    "=",
    "<>",
    "[",
    "]",
    "!",
    "@",
    "#",
    "%",
    "^",
    "&",
    "|",
    "~",
    "?",
    ":",
];

/// What may stand between two fragments: every white space PostgreSQL
/// accepts, or nothing (adjacent fragments make new tokens: `-` `-`).
const SEPARATORS: &[&str] = &[" ", "\t", "\n", "\r", "\x0c", "\x0b", "", "", "  \r\n"];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.next() as usize % from.len()]
    }
}

fn generate(rng: &mut Rng) -> String {
    let mut sql = String::new();
    for _ in 0..(1 + rng.next() % 12) {
        sql.push_str(rng.pick(FRAGMENTS));
        sql.push_str(rng.pick(SEPARATORS));
    }
    sql
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn the_guard_reads_what_postgresql_reads() {
    let cases = env("PGPIPE_LEXER_DIFF_CASES", 100_000);
    let mut rng = Rng(env("PGPIPE_LEXER_DIFF_SEED", 0x9E37_79B9_7F4A_7C15) | 1);
    let (mut compared, mut mismatches) = (0u64, Vec::new());
    for _ in 0..cases {
        let sql = generate(&mut rng);
        let Some(server) = theirs(&sql) else {
            continue;
        };
        compared += 1;
        let guard = ours(&sql);
        if guard != server && mismatches.len() < 10 {
            mismatches.push(format!(
                "{sql:?}\n  guard:  {guard:?}\n  server: {server:?}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {compared} differ, e.g.:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    assert!(
        compared > cases / 4,
        "only {compared} of {cases} scanned: the generator makes mostly invalid SQL"
    );
}
