//! What a statement can run, proven from the database's own catalog.
//!
//! A call of `md5(…)` runs PostgreSQL's own `md5` only while no function of
//! that name exists outside `pg_catalog`; a statement that names no
//! function at all runs whatever its relations carry (triggers, rules,
//! policies, defaults, checks, index expressions, views, columns of types
//! with code of their own); and a built-in may change the session as well
//! as user code can (`set_config`, `setseed`, a session lock). The proof
//! ([`proof`], `proof.sql`) asks the server which functions are proven
//! harmless (built in, immutable or stable, or on the reviewed allow-list)
//! and follows every call site its catalog holds, from the server's own
//! parse trees. A [`Catalog`] holds the outcome as names, in lower case:
//!
//! - functions with any unproven overload, and the names of proven ones
//!   (a call of any other name is not proven: deny by default);
//! - relations and types whose use may run unproven code, and those that
//!   may leave transaction-scoped state (kept out of read groups);
//! - operators whose code is unproven, by symbol;
//! - languages, wrappers, access methods and conversions with unproven
//!   code, by name;
//! - and facts of the database: event triggers, what no name can guard
//!   (then nothing is proven), extensions whose per-backend state no
//!   cleanup takes back, the cleanup's undo for those it can, and how
//!   many settings a fresh session has.
//!
//! The guard ([`sql_guard`](super::sql_guard)) reads a statement that
//! mentions an unproven name as code it cannot prove: the session is
//! cleaned right behind it, and it never shares a read group. The pool
//! learns the catalog from the server ([`CATALOG_SQL`]) when a lane is
//! first used, when its fingerprint moves, and after DDL sent through the
//! pool (the lane's `catalog` module); until it has, or when the query
//! fails (a role that cannot read the catalog), every statement except
//! plain, call-free ones counts as unproven.

mod extensions;
pub(crate) mod proof;
pub(crate) mod sites;

use rustc_hash::FxHashSet;

pub(crate) use proof::{BUILTIN_SQL, CATALOG_SQL};

/// A set of names, lower case, with filters that let most words skip it:
/// bit `n` of `lengths` is set when a name is `n` bytes long (63 for
/// longer), bit `b` of `firsts` when one starts with byte `b`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Names {
    set: FxHashSet<Box<[u8]>>,
    lengths: u64,
    firsts: [u64; 4],
}

impl Names {
    fn insert(&mut self, name: &str) {
        let name = name.to_ascii_lowercase().into_bytes();
        if let Some(&first) = name.first() {
            self.lengths |= 1 << name.len().min(63);
            self.firsts[usize::from(first >> 6)] |= 1 << (first & 63);
        }
        self.set.insert(name.into());
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Whether `word` (any case) is one of the names.
    fn contains(&self, word: &[u8]) -> bool {
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
                self.set.contains(&*lower)
            }
            // PostgreSQL truncates names to 63 bytes.
            None => {
                let mut truncated = word[..63].to_vec();
                truncated.make_ascii_lowercase();
                self.set.contains(truncated.as_slice())
            }
        }
    }
}

/// What statements can run in one database (see the module docs).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Catalog {
    /// Whether it was learned from the server. Until then every statement
    /// but plain, call-free ones counts as unproven.
    loaded: bool,
    /// Unproven functions, relations, types, languages, wrappers, access
    /// methods and conversions.
    names: Names,
    /// Functions every overload of which is proven.
    proven: Names,
    /// Relations that may leave transaction-scoped state, and the proven
    /// functions that do.
    breaking: Names,
    /// Unproven operators' symbols.
    operators: Vec<Box<[u8]>>,
    /// Bit `b` set when an operator starts with byte `b`.
    operator_firsts: [u64; 4],
    /// A language with session-wide globals that user functions here are
    /// written in (the first, by name), if any: see
    /// [`lasting_code`](Catalog::lasting_code).
    globals: Option<Box<str>>,
    /// An installed extension not reviewed for per-backend state (the
    /// first, by name).
    unreviewed: Option<Box<str>>,
    /// Why no statement can be proven here, if none can.
    nothing_proven: Option<Box<str>>,
    /// An enabled event trigger runs unproven code on DDL.
    event_triggers: bool,
    /// What the cleanup runs for extensions' per-backend state.
    undo: Option<Box<str>>,
    /// Settings of libraries that are no installed extension's or
    /// language's, as a session sees them where the catalog was read.
    settings: Option<u64>,
}

impl Catalog {
    /// A catalog from the rows of [`CATALOG_SQL`]: `(kind, name)`.
    pub(crate) fn from_rows<'a>(rows: impl IntoIterator<Item = (&'a str, &'a str)>) -> Catalog {
        let mut catalog = Catalog {
            loaded: true,
            ..Catalog::default()
        };
        let first = |slot: &mut Option<Box<str>>, name: &str| {
            if slot.as_deref().is_none_or(|g| name < g) {
                *slot = Some(name.into());
            }
        };
        let mut undo: Vec<&str> = Vec::new();
        for (kind, name) in rows {
            match kind {
                "o" => catalog.operators.push(name.as_bytes().into()),
                "g" => first(&mut catalog.globals, name),
                "k" => first(&mut catalog.unreviewed, name),
                "x" | "u" => first(
                    &mut catalog.nothing_proven,
                    &if kind == "u" {
                        format!("a catalog column this pool does not know ({name})")
                    } else {
                        name.to_owned()
                    },
                ),
                "e" => catalog.event_triggers = true,
                "c" => undo.push(name),
                "s" => catalog.settings = name.parse().ok(),
                "p" => catalog.proven.insert(name),
                "b" => catalog.breaking.insert(name),
                _ => catalog.names.insert(name),
            }
        }
        undo.sort_unstable();
        catalog.undo = (!undo.is_empty()).then(|| undo.join("; ").into());
        catalog.operators.sort();
        catalog.operators.dedup();
        for op in &catalog.operators {
            if let Some(&first) = op.first() {
                catalog.operator_firsts[usize::from(first >> 6)] |= 1 << (first & 63);
            }
        }
        catalog
    }

    /// A catalog learned from a database with no user code in it, where
    /// the functions named are proven.
    #[cfg(test)]
    pub(crate) fn empty() -> Catalog {
        Catalog::from_rows(fixture::TEST_PROVEN.iter().map(|n| ("p", *n)))
    }

    /// Whether a call of `name` is proven: every function of that name is.
    pub(crate) fn proves_call(&self, name: &[u8]) -> bool {
        self.proven.contains(name)
    }

    /// Whether `word` names what may leave transaction-scoped state that a
    /// read group's later members would see.
    pub(crate) fn breaks_groups(&self, word: &[u8]) -> bool {
        self.breaking.contains(word)
    }

    /// Code whose state no cleanup takes back may run here whenever code
    /// the guard cannot prove does, and why: user functions written in a
    /// language with session-wide globals (PL/Perl's `%_SHARED`,
    /// PL/Python's `GD`/`SD`, PL/Tcl's global namespace, plv8's), or an
    /// installed extension not reviewed for per-backend state.
    pub(crate) fn lasting_code(&self) -> Option<&str> {
        self.globals.as_deref().or(self.unreviewed.as_deref())
    }

    /// Why nothing can be proven in this database, if nothing can: a hook
    /// no name leads to (a default conversion, a text search parser, a
    /// built-in type with unproven code), or a catalog column the proof
    /// does not know (a newer server's).
    pub(crate) fn nothing_proven(&self) -> Option<&str> {
        self.nothing_proven.as_deref()
    }

    /// Whether DDL runs unproven code (an enabled event trigger).
    pub(crate) fn event_triggers(&self) -> bool {
        self.event_triggers
    }

    /// SQL that takes back installed extensions' per-backend state.
    pub(crate) fn undo(&self) -> Option<&str> {
        self.undo.as_deref()
    }

    /// How many settings a session sees where the catalog was read.
    pub(crate) fn settings(&self) -> Option<u64> {
        self.settings
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

    /// Whether `word` (a name in a statement, any case) may reach unproven
    /// code.
    pub(crate) fn names_user_code(&self, word: &[u8]) -> bool {
        self.names.contains(word)
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

#[cfg(test)]
pub(crate) mod fixture;

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
