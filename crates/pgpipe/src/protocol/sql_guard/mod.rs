//! The guard that keeps session state off shared connections.
//!
//! Every task whose query runs on a shared connection shares its session. A
//! `BEGIN` would pull the other tasks' queries into one transaction, a `SET`
//! would change their settings, a session advisory lock would outlive the
//! query. So [`check`] refuses such SQL on the shared path, before anything
//! is sent, with [`ErrorKind::NotAllowedOnShared`].
//!
//! What is checked, after skipping comments (`--`, nested `/* */`), string
//! literals, quoted identifiers and dollar quotes, case-insensitively, in
//! every `;`-separated statement:
//!
//! - statements starting with `BEGIN`, `START`, `COMMIT`, `END`, `ROLLBACK`,
//!   `ABORT`, `SAVEPOINT`, `RELEASE`, `PREPARE`, `DEALLOCATE`, `DECLARE`,
//!   `FETCH`, `MOVE`, `CLOSE`, `COPY`, `LOCK`, `DISCARD`, `LISTEN`,
//!   `UNLISTEN`, `RESET`, and `SET` unless it is `SET LOCAL`;
//! - `CREATE [OR REPLACE] [GLOBAL|LOCAL] TEMP|TEMPORARY …`;
//! - `SELECT … INTO [GLOBAL|LOCAL] TEMP|TEMPORARY …` (and `WITH …`, `TABLE …`);
//! - calls of `set_config(…)` unless the third argument is `true`
//!   (transaction-local);
//! - calls of the session-level advisory lock functions `pg_advisory_lock`,
//!   `pg_advisory_lock_shared`, `pg_try_advisory_lock`,
//!   `pg_try_advisory_lock_shared` (the `_xact_` variants are fine).
//!
//! - statements that do not start with a keyword or `(` (a vertical tab, a
//!   stray character: PostgreSQL may read them differently than the guard);
//! - temporary objects named by schema (`pg_temp.orders`), and `EXPLAIN
//!   ANALYZE` of anything refused here (it runs the statement);
//! - `UPDATE pg_settings` (a `SET` in disguise);
//! - `lastval()` and `currval()`, which read a sequence state that another
//!   task sharing the session may have set.
//!
//! What the guard cannot read, it does not vouch for: `DO`, `CALL`, and calls
//! of functions that are not PostgreSQL's own ([`known_code`](super::known_code)).
//! [`check`] lets those through as [`Code::Unknown`], and the pool cleans the
//! session right behind them. The wire backs both: a shared connection whose
//! `ReadyForQuery` reports a transaction, or that receives a
//! `ParameterStatus` after start-up, is quarantined at once (see
//! [`watch`](super::watch), applied by the connection's tap, `conn::tap`).

mod contexts;
mod fast_path;
mod reads;
mod refusals;
mod verdicts;

pub(crate) use contexts::{
    check_in_atomic_batch, check_not_copy, check_through_transaction_pooler, sends_ddl,
    sends_lasting_state,
};
use fast_path::plainly_harmless;
pub(crate) use reads::reads_only;
use refusals::{TRANSACTION_CONTROL, is, keyword_name, refused};
pub(crate) use verdicts::Verdicts;

use super::catalog::Catalog;
use super::known_code::runs_unknown_code;
use super::lexer::{Lexer, Token};
use crate::error::{Error, ErrorKind};

/// What the guard can say of SQL it lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// Statements and built-in functions the guard reads: nothing else runs.
    Known,
    /// Code the guard cannot read runs (`DO`, `CALL`, a function that is
    /// not PostgreSQL's own): clean the session right behind it.
    Unknown,
}

/// Refuses SQL that would change session state; see the module docs.
///
/// What runs user code is a fact of the database: `catalog` says which
/// names reach it (see [`catalog`](super::catalog)); before it is known,
/// everything counts as code the guard cannot read.
pub(crate) fn check(sql: &str, catalog: &Catalog) -> Result<Code, Error> {
    scan(sql, refused, Some(catalog)).map_err(refusal)
}

/// [`check`], remembered in `verdicts` for the catalog of `generation`
/// (`catalog` is asked for it only when the verdict is not remembered).
#[inline]
pub(crate) fn check_remembered(
    sql: &str,
    catalog: impl FnOnce() -> std::sync::Arc<Catalog>,
    generation: u64,
    verdicts: &Verdicts,
) -> Result<Code, Error> {
    verdicts
        .get_or(sql, generation, || scan(sql, refused, Some(&catalog())))
        .map_err(refusal)
}

/// Whether a query may share a read group's transaction with its
/// neighbours (see [`coalesce`](super::coalesce)): code the guard reads,
/// with no transaction-scoped effect that a neighbour after it could see,
/// or that a neighbour's failure could undo after it was reported done
/// (`SET LOCAL`, `set_config(…, true)`, transaction-level advisory locks,
/// `NOTIFY`). Anything else keeps a transaction of its own. Conservative: a
/// word that merely looks like one of these (a column named `set`) keeps
/// its query out of groups, which costs a `Sync`, never correctness.
pub(crate) fn groupable(sql: &str, catalog: &Catalog) -> bool {
    const BREAKERS: [&str; 12] = [
        "set",
        "set_config",
        // The group's transaction id, seen by every later member.
        "txid_current",
        "txid_current_if_assigned",
        "pg_current_xact_id",
        "pg_current_xact_id_if_assigned",
        "notify",
        "pg_notify",
        "pg_advisory_xact_lock",
        "pg_advisory_xact_lock_shared",
        "pg_try_advisory_xact_lock",
        "pg_try_advisory_xact_lock_shared",
    ];
    if !matches!(check(sql, catalog), Ok(Code::Known)) {
        return false;
    }
    !lexers(sql).any(|mut tokens| {
        tokens.any(|token| match token {
            Token::Word(word) | Token::Quoted(word) => {
                BREAKERS.iter().any(|b| is(word, b)) || catalog.breaks_groups(word)
            }
            _ => false,
        })
    })
}

/// Each `;`-separated statement through `refuse`: the first refusal, or
/// whether any statement runs code the guard cannot read. SQL with a
/// backslash is read both ways a session may read its plain strings
/// (`standard_conforming_strings` on and off), and the stricter verdict
/// holds: the guard never needs to know the session's setting.
fn scan(
    sql: &str,
    refuse: fn(&[Token<'_>]) -> Option<&'static str>,
    catalog: Option<&Catalog>,
) -> Result<Code, &'static str> {
    if plainly_harmless(sql.as_bytes())
        && catalog.is_none_or(|c| {
            c.is_loaded()
                && c.nothing_proven().is_none()
                && !c.any_word_names_user_code(sql.as_bytes())
                && !c.mentions_user_operator(sql.as_bytes())
        })
    {
        return Ok(Code::Known);
    }
    let conforming = scan_with(Lexer::new(sql.as_bytes()), refuse, catalog)?;
    let code = if sql.as_bytes().contains(&b'\\') {
        match scan_with(Lexer::backslash_strings(sql.as_bytes()), refuse, catalog)? {
            Code::Known => conforming,
            Code::Unknown => Code::Unknown,
        }
    } else {
        conforming
    };
    // Not learned yet (or not readable), or nothing provable there: the
    // strict side.
    let unknown_by_catalog = catalog.is_some_and(|c| {
        !c.is_loaded() || c.nothing_proven().is_some() || c.mentions_user_operator(sql.as_bytes())
    });
    let code = if unknown_by_catalog {
        Code::Unknown
    } else {
        code
    };
    // Where unproven code may keep state that outlives every reset (a
    // language's globals, an extension's per-backend state), any of it
    // may: nothing would undo it for the next task.
    if code == Code::Unknown && catalog.is_some_and(|c| c.lasting_code().is_some()) {
        return Err(SESSION_GLOBALS);
    }
    Ok(code)
}

/// Why user code is refused where functions use session-wide globals.
pub(super) const SESSION_GLOBALS: &str = "code the guard cannot prove harmless, in a database \
     whose functions are written in a language with session-wide globals (PL/Perl's %_SHARED, \
     PL/Python's GD and SD, PL/Tcl's, plv8's) or with an extension not reviewed for the \
     per-backend state it keeps, which no reset undoes,";

/// The lexers a session could read `sql` with (see [`scan`]).
fn lexers(sql: &str) -> impl Iterator<Item = Lexer<'_>> {
    let backslashes = sql.as_bytes().contains(&b'\\');
    std::iter::once(Lexer::new(sql.as_bytes()))
        .chain(backslashes.then(|| Lexer::backslash_strings(sql.as_bytes())))
}

fn scan_with(
    tokens: Lexer<'_>,
    refuse: fn(&[Token<'_>]) -> Option<&'static str>,
    catalog: Option<&Catalog>,
) -> Result<Code, &'static str> {
    let mut statement: Vec<Token<'_>> = Vec::new();
    let mut code = Code::Known;
    for token in tokens.chain(std::iter::once(Token::Punct(b';'))) {
        if token == Token::Punct(b';') {
            if let Some(what) = refuse(&statement) {
                return Err(what);
            }
            let proven = |name: &[u8]| {
                is(name, SPELLED_LOCAL) || catalog.is_some_and(|c| c.proves_call(name))
            };
            if runs_unknown_code(&statement, proven)
                || !proven_kind(&statement)
                || catalog.is_some_and(|c| {
                    reaches_unproven(c, &statement)
                        || (c.event_triggers() && !plain_dml(&statement))
                })
            {
                code = Code::Unknown;
            }
            statement.clear();
        } else {
            statement.push(token);
        }
    }
    Ok(code)
}

/// A volatile built-in the catalog leaves unproven (stored code may call
/// it for the session), proven where a statement spells its call: the
/// refusals let it through only with a third argument of `true`, which
/// makes the setting end with the statement's own transaction.
const SPELLED_LOCAL: &str = "set_config";

/// Whether a statement names what may run unproven code (see
/// [`SPELLED_LOCAL`] for the one call the refusals prove).
fn reaches_unproven(catalog: &Catalog, statement: &[Token<'_>]) -> bool {
    statement.iter().enumerate().any(|(i, token)| match token {
        Token::Word(w) | Token::Quoted(w) => {
            catalog.names_user_code(w)
                && !(is(w, SPELLED_LOCAL) && statement.get(i + 1) == Some(&Token::Punct(b'(')))
        }
        _ => false,
    })
}

/// Whether a statement is of a kind whose own work is proven (what it
/// runs is checked by name): queries and DML, `EXPLAIN`, `SHOW`, `NOTIFY`
/// and `TRUNCATE`. Deny by default: every other kind (DDL, which may fire
/// event triggers, run a validator or a label provider, or evaluate
/// stored expressions under a name the statement does not give;
/// maintenance such as `VACUUM`, `ANALYZE`, `REINDEX` or `CLUSTER`, which
/// evaluates index and statistics expressions) counts as unproven code.
fn proven_kind(statement: &[Token<'_>]) -> bool {
    const KINDS: [&str; 12] = [
        "select", "insert", "update", "delete", "merge", "with", "values", "table", "explain",
        "show", "notify", "truncate",
    ];
    match statement.first() {
        None | Some(Token::Punct(b'(')) => true,
        Some(Token::Word(w)) => KINDS.iter().any(|k| is(w, k)),
        Some(_) => false,
    }
}

/// Whether `sql` changes the catalog where the pool can see it: a
/// statement that starts with `CREATE`, `ALTER`, `DROP` or `IMPORT`. What
/// user code does (a function that runs DDL) is seen when the catalog's
/// fingerprint moves (the lane's `catalog` module).
pub(crate) fn changes_catalog(sql: &str) -> bool {
    lexers(sql).any(|tokens| {
        let mut first = true;
        let mut found = false;
        for token in tokens {
            if token == Token::Punct(b';') {
                first = true;
                continue;
            }
            if std::mem::take(&mut first) {
                if let Token::Word(w) = token {
                    found |= ["create", "alter", "drop", "import"]
                        .iter()
                        .any(|k| is(w, k));
                }
            }
        }
        found
    })
}

/// Whether every statement in `sql` can run inside a transaction block,
/// and so in the block that carries the head-of-line budget behind a
/// transaction pooler: each is of a kind the guard proves (`VACUUM`,
/// `CREATE DATABASE`, `… CONCURRENTLY` and the rest refuse a block, and
/// none is of those kinds).
pub(crate) fn fits_a_block(sql: &str) -> bool {
    lexers(sql).all(|tokens| {
        let tokens: Vec<Token<'_>> = tokens.collect();
        tokens
            .split(|token| *token == Token::Punct(b';'))
            .all(proven_kind)
    })
}

/// Whether a statement is plain DML, which fires no event trigger: it
/// starts with `SELECT`, `WITH`, `VALUES` or `TABLE` and has no `INTO`
/// (`SELECT … INTO` creates a table), or with `INSERT`, `UPDATE`,
/// `DELETE` or `MERGE`.
fn plain_dml(statement: &[Token<'_>]) -> bool {
    let mut words = statement.iter().filter_map(|t| match t {
        Token::Word(w) => Some(*w),
        _ => None,
    });
    match words.next() {
        Some(w)
            if ["insert", "update", "delete", "merge"]
                .iter()
                .any(|k| is(w, k)) =>
        {
            true
        }
        Some(w)
            if ["select", "with", "values", "table"]
                .iter()
                .any(|k| is(w, k)) =>
        {
            !words.any(|w| is(w, "into"))
        }
        _ => false,
    }
}

fn refusal(what: &str) -> Error {
    Error::new(
        ErrorKind::NotAllowedOnShared,
        format!(
            "{what} changes session state, which would leak to every task sharing this \
             connection; run it on an exclusive connection from `pool.get().await?`"
        ),
    )
}

#[cfg(test)]
mod tests;
