//! Which names reach user code in a database: learned from its catalog,
//! not from a list of spellings.
//!
//! A call of `md5(…)` runs PostgreSQL's own `md5` only while no function of
//! that name exists outside `pg_catalog`: a `public.md5(integer)` in
//! plpgsql is user code under a harmless name, reached by argument types or
//! `search_path`. And a statement that names no function at all runs user
//! code through what its relations carry: triggers, rules, row-level
//! security policies, column defaults, check constraints, index
//! expressions, views over such relations, and columns of types whose
//! input, output or checks are user functions. A [`Catalog`] holds, in
//! lower case, every name through which a statement could reach user code:
//!
//! - functions defined outside `pg_catalog` and `information_schema`, by
//!   name (so every builtin they overload or shadow is covered too);
//! - relations whose use runs user code, directly or through a view;
//! - types whose I/O, casts or domain checks run user code;
//! - user-defined operators, by symbol.
//!
//! The guard ([`sql_guard`](super::sql_guard)) reads a statement that
//! mentions any of them as code it cannot read: the session is cleaned
//! right behind it, and it never shares a read group. The pool learns the
//! catalog from the server ([`CATALOG_SQL`]) when a lane is first used and
//! every 10 s after (the lane's `catalog` module); until it has, or when the
//! query fails (a role that cannot read the catalog), every statement
//! except plain, call-free ones counts as unknown code.

use rustc_hash::FxHashSet;

use super::lexer::Token;

/// One query for everything a [`Catalog`] holds: rows of a kind (`f`
/// function, `r` relation, `t` type, `o` operator, `g` a language with
/// session-wide globals that user functions are written in) and a name. Only
/// catalog tables and built-in functions; cheap on a small schema
/// (measured in docs/benchmarks.md).
pub(crate) const CATALOG_SQL: &str = "\
WITH RECURSIVE
user_proc AS (
    SELECT p.oid, p.proname, p.prolang FROM pg_catalog.pg_proc p
     WHERE p.pronamespace <> 'pg_catalog'::pg_catalog.regnamespace
       AND p.pronamespace <> 'information_schema'::pg_catalog.regnamespace),
user_op AS (
    SELECT o.oid, o.oprname FROM pg_catalog.pg_operator o
     WHERE o.oprnamespace <> 'pg_catalog'::pg_catalog.regnamespace),
user_type AS (
    SELECT t.oid FROM pg_catalog.pg_type t
     WHERE t.typinput IN (SELECT oid FROM user_proc)
        OR t.typoutput IN (SELECT oid FROM user_proc)
        OR t.typreceive IN (SELECT oid FROM user_proc)
        OR t.typsend IN (SELECT oid FROM user_proc)
        OR t.oid IN (SELECT c.contypid FROM pg_catalog.pg_constraint c
                      JOIN pg_catalog.pg_depend d
                        ON d.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass
                       AND d.objid = c.oid
                     WHERE c.contypid <> 0 AND d.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass
                       AND d.refobjid IN (SELECT oid FROM user_proc))
    UNION
    SELECT k.castsource FROM pg_catalog.pg_cast k WHERE k.castfunc IN (SELECT oid FROM user_proc)
    UNION
    SELECT k.casttarget FROM pg_catalog.pg_cast k WHERE k.castfunc IN (SELECT oid FROM user_proc)),
code_dep AS (
    SELECT d.classid, d.objid FROM pg_catalog.pg_depend d
     WHERE (d.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass
            AND d.refobjid IN (SELECT oid FROM user_proc))
        OR (d.refclassid = 'pg_catalog.pg_operator'::pg_catalog.regclass
            AND d.refobjid IN (SELECT oid FROM user_op))
        OR (d.refclassid = 'pg_catalog.pg_type'::pg_catalog.regclass
            AND d.refobjid IN (SELECT oid FROM user_type))),
direct(rel) AS (
    SELECT t.tgrelid FROM pg_catalog.pg_trigger t WHERE NOT t.tgisinternal
    UNION SELECT r.ev_class FROM pg_catalog.pg_rewrite r
     WHERE r.rulename <> '_RETURN'
        OR r.oid IN (SELECT objid FROM code_dep
                      WHERE classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass)
    UNION SELECT p.polrelid FROM pg_catalog.pg_policy p
     WHERE p.oid IN (SELECT objid FROM code_dep
                      WHERE classid = 'pg_catalog.pg_policy'::pg_catalog.regclass)
    UNION SELECT a.adrelid FROM pg_catalog.pg_attrdef a
     WHERE a.oid IN (SELECT objid FROM code_dep
                      WHERE classid = 'pg_catalog.pg_attrdef'::pg_catalog.regclass)
    UNION SELECT c.conrelid FROM pg_catalog.pg_constraint c
     WHERE c.conrelid <> 0
       AND c.oid IN (SELECT objid FROM code_dep
                      WHERE classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass)
    UNION SELECT i.indrelid FROM pg_catalog.pg_index i
     WHERE i.indexrelid IN (SELECT objid FROM code_dep
                             WHERE classid = 'pg_catalog.pg_class'::pg_catalog.regclass)
    UNION SELECT a.attrelid FROM pg_catalog.pg_attribute a
     WHERE a.attnum > 0 AND NOT a.attisdropped
       AND a.atttypid IN (SELECT oid FROM user_type)),
rels(rel) AS (
    SELECT rel FROM direct
    UNION
    SELECT r.ev_class FROM pg_catalog.pg_depend d
      JOIN pg_catalog.pg_rewrite r
        ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND d.objid = r.oid
      JOIN rels ON d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
               AND d.refobjid = rels.rel)
SELECT 'f', pg_catalog.lower(proname) FROM user_proc
UNION SELECT 'g', l.lanname::text FROM pg_catalog.pg_language l
 WHERE l.oid IN (SELECT prolang FROM user_proc)
   AND l.lanname IN ('plperl', 'plperlu', 'plpythonu', 'plpython2u', 'plpython3u',
                     'pltcl', 'pltclu', 'plv8')
UNION SELECT 'o', oprname FROM user_op
UNION SELECT 't', pg_catalog.lower(t.typname::text) FROM pg_catalog.pg_type t
 WHERE t.oid IN (SELECT oid FROM user_type)
UNION SELECT 'r', pg_catalog.lower(c.relname::text) FROM pg_catalog.pg_class c
 WHERE c.oid IN (SELECT rel FROM rels)
   AND c.relnamespace <> 'pg_catalog'::pg_catalog.regnamespace
   AND c.relnamespace <> 'information_schema'::pg_catalog.regnamespace";

/// The names through which statements reach user code in one database
/// (see the module docs).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Catalog {
    /// Whether it was learned from the server. Until then every statement
    /// but plain, call-free ones counts as unknown code.
    loaded: bool,
    /// Functions, relations and types, in lower case.
    names: FxHashSet<Box<[u8]>>,
    /// User-defined operators' symbols.
    operators: Vec<Box<[u8]>>,
    /// Filters that let most words of a statement skip the set: bit `n`
    /// of `lengths` is set when a name is `n` bytes long (63 for longer),
    /// bit `b` of `firsts` when one starts with byte `b` (lower case).
    lengths: u64,
    firsts: [u64; 4],
    /// Bit `b` set when an operator starts with byte `b`.
    operator_firsts: [u64; 4],
    /// A language with session-wide globals that user functions here are
    /// written in (the first, by name), if any: see
    /// [`session_globals`](Catalog::session_globals).
    globals: Option<Box<str>>,
}

impl Catalog {
    /// A catalog from the rows of [`CATALOG_SQL`]: `(kind, name)`.
    pub(crate) fn from_rows<'a>(rows: impl IntoIterator<Item = (&'a str, &'a str)>) -> Catalog {
        let mut catalog = Catalog {
            loaded: true,
            ..Catalog::default()
        };
        for (kind, name) in rows {
            match kind {
                "o" => catalog.operators.push(name.as_bytes().into()),
                "g" => {
                    if catalog.globals.as_deref().is_none_or(|g| name < g) {
                        catalog.globals = Some(name.into());
                    }
                }
                _ => {
                    let name = name.to_ascii_lowercase().into_bytes();
                    if let Some(&first) = name.first() {
                        catalog.lengths |= 1 << name.len().min(63);
                        catalog.firsts[usize::from(first >> 6)] |= 1 << (first & 63);
                    }
                    catalog.names.insert(name.into());
                }
            }
        }
        catalog.operators.sort();
        catalog.operators.dedup();
        for op in &catalog.operators {
            if let Some(&first) = op.first() {
                catalog.operator_firsts[usize::from(first >> 6)] |= 1 << (first & 63);
            }
        }
        catalog
    }

    /// A catalog learned from a database with no user code in it.
    #[cfg(test)]
    pub(crate) fn empty() -> Catalog {
        Catalog::from_rows([])
    }

    /// Whether one statement's tokens name a function, relation or type
    /// through which user code runs.
    pub(crate) fn reaches_user_code(&self, statement: &[Token<'_>]) -> bool {
        !self.names.is_empty()
            && statement.iter().any(|token| match token {
                Token::Word(w) | Token::Quoted(w) => self.names_user_code(w),
                _ => false,
            })
    }

    /// A language with session-wide globals (PL/Perl's `%_SHARED`,
    /// PL/Python's `GD`/`SD`, PL/Tcl's global namespace, plv8's) that user
    /// functions in this database are written in. What a function calls is
    /// not in the catalog, so there any user code may keep state in them,
    /// which no reset undoes.
    pub(crate) fn session_globals(&self) -> Option<&str> {
        self.globals.as_deref()
    }

    /// Whether it was learned from the server.
    pub(crate) fn is_loaded(&self) -> bool {
        self.loaded
    }

    /// Whether nothing in the database reaches user code by name.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.loaded && self.names.is_empty() && self.operators.is_empty()
    }

    /// Whether `word` (a name in a statement, any case) may reach user code.
    pub(crate) fn names_user_code(&self, word: &[u8]) -> bool {
        let Some(&first) = word.first() else {
            return false;
        };
        let first = first.to_ascii_lowercase();
        if self.lengths & (1 << word.len().min(63)) == 0
            || self.firsts[usize::from(first >> 6)] & (1 << (first & 63)) == 0
        {
            return false;
        }
        let mut lower = [0u8; 64];
        match lower.get_mut(..word.len()) {
            Some(lower) => {
                lower.copy_from_slice(word);
                lower.make_ascii_lowercase();
                self.names.contains(&*lower)
            }
            // PostgreSQL truncates names to 63 bytes.
            None => {
                let mut truncated = word[..63].to_vec();
                truncated.make_ascii_lowercase();
                self.names.contains(truncated.as_slice())
            }
        }
    }

    /// Whether any identifier-like run of bytes in `sql` (in a literal or a
    /// comment too: erring one way only) names user code: the check for
    /// statements the guard's fast path passes, without lexing them.
    pub(crate) fn any_word_names_user_code(&self, sql: &[u8]) -> bool {
        if self.names.is_empty() {
            return false;
        }
        let (mut i, n) = (0, sql.len());
        while i < n {
            if !IDENT[usize::from(sql[i])] {
                i += 1;
                continue;
            }
            let start = i;
            while i < n && IDENT[usize::from(sql[i])] {
                i += 1;
            }
            if self.names_user_code(&sql[start..i]) {
                return true;
            }
        }
        false
    }

    /// Whether `sql` may use a user-defined operator: its symbol appears
    /// anywhere in the text (in a literal too: erring one way only).
    pub(crate) fn mentions_user_operator(&self, sql: &[u8]) -> bool {
        if self.operators.is_empty() {
            return false;
        }
        (0..sql.len()).any(|i| {
            let c = sql[i];
            self.operator_firsts[usize::from(c >> 6)] & (1 << (c & 63)) != 0
                && self.operators.iter().any(|op| sql[i..].starts_with(op))
        })
    }
}

/// Bytes that may stand in an identifier: letters, digits, `_`, and every
/// byte from 0x80 (PostgreSQL's `ident_cont` without `$`).
static IDENT: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        table[c] = b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80;
        c += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_matched_in_any_case_and_operators_anywhere() {
        let catalog = Catalog::from_rows([("f", "md5"), ("r", "Audited"), ("o", "===")]);
        assert!(catalog.names_user_code(b"MD5"));
        assert!(catalog.names_user_code(b"audited"));
        assert!(!catalog.names_user_code(b"sha256"));
        assert!(catalog.mentions_user_operator(b"SELECT a === b"));
        assert!(catalog.any_word_names_user_code(b"SELECT * FROM \"Audited\" -- x"));
        assert!(!catalog.any_word_names_user_code(b"SELECT $1::int8"));
        assert!(!catalog.mentions_user_operator(b"SELECT a == b"));
        assert!(catalog.is_loaded() && !catalog.is_empty());
        assert!(!Catalog::default().is_loaded());
        assert!(Catalog::from_rows([]).is_empty());
    }

    #[test]
    fn a_long_name_is_compared_as_the_server_truncates_it() {
        let name = "f".repeat(63);
        let catalog = Catalog::from_rows([("f", name.as_str())]);
        assert!(catalog.names_user_code("f".repeat(80).as_bytes()));
    }
}
