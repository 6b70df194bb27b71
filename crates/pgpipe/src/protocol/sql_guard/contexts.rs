//! The guard's checks for the places outside the shared path: items of an
//! atomic batch, connections behind a transaction pooler, the `Executor`
//! methods of an exclusive connection (no `COPY`), and what no reset
//! undoes there.

use super::super::catalog::Catalog;
use super::super::lasting::lasting;
use super::super::lexer::{Lexer, Token};
use super::{
    SESSION_GLOBALS, TRANSACTION_CONTROL, changes_catalog, is, keyword_name, lexers, refused, scan,
};
use crate::error::{Error, ErrorKind};

/// Refuses transaction control (`BEGIN`, `COMMIT`, `SAVEPOINT` …) in an
/// item of an atomic batch, which runs the transaction itself: a `COMMIT`
/// there would end it early and leave the rest of the batch outside it.
pub(crate) fn check_in_atomic_batch(sql: &str) -> Result<(), Error> {
    match scan(sql, refused_in_atomic_batch, None) {
        Err("COPY") => Err(Error::new(
            ErrorKind::NotAllowedInBatch,
            "COPY in an atomic batch: it streams data the batch does not carry; use \
             copy_in/copy_out on a connection from pool.get() (conn.client())",
        )),
        Err(what) => Err(Error::new(
            ErrorKind::NotAllowedInBatch,
            format!(
                "{what} in an atomic batch, which runs its own transaction; \
                 use pool.get() and a transaction for explicit control"
            ),
        )),
        Ok(_) => Ok(()),
    }
}

/// Refuses session state on a connection behind a transaction pooler,
/// where the next transaction may run on another server: what a statement
/// leaves in the session stays on a server that someone else gets, and is
/// missing from the one this connection gets next. Transaction control,
/// and what lives only as long as a transaction (row locks, cursors), are
/// allowed.
pub(crate) fn check_through_transaction_pooler(sql: &str) -> Result<(), Error> {
    match scan(sql, refused_without_session, None) {
        Ok(_) => Ok(()),
        Err(what) => Err(Error::new(
            ErrorKind::NotSupported,
            format!(
                "{what} changes session state, and through a transaction pooler there is no \
                 session: the next transaction may run on another server, and this one's \
                 state would reach whoever gets this server next; use SET LOCAL, \
                 set_config(…, true) or transaction-level advisory locks inside a \
                 transaction, or ALTER ROLE … SET; nothing was sent"
            ),
        )),
    }
}

/// What [`refused`] refuses, except what ends with the transaction.
fn refused_without_session(statement: &[Token<'_>]) -> Option<&'static str> {
    const TRANSACTION_SCOPED: &[&str] = &[
        "BEGIN",
        "START TRANSACTION",
        "COMMIT",
        "END",
        "ROLLBACK",
        "ABORT",
        "SAVEPOINT",
        "RELEASE SAVEPOINT",
        "DECLARE (a cursor)",
        "FETCH (from a cursor)",
        "MOVE (a cursor)",
        "CLOSE (a cursor)",
        "LOCK",
        "SET TRANSACTION",
        "SET CONSTRAINTS",
    ];
    refused(statement).filter(|what| !TRANSACTION_SCOPED.contains(what))
}

/// Whether a `Query` (`Q`) or `Parse` (`P`) message that went out with
/// `body` (whole, or cut short) leaves session state that no reset undoes:
/// [`leaves_lasting_state`] of its SQL, or, where `catalog` says user
/// functions use a language with session-wide globals, any user code. A
/// body cut short, or SQL that is not UTF-8, cannot be read, and counts as
/// leaving it.
pub(crate) fn sends_lasting_state(kind: u8, body: Result<&[u8], &[u8]>, catalog: &Catalog) -> bool {
    sql_of(kind, body).is_none_or(|sql| {
        leaves_lasting_state(sql)
            || (catalog.lasting_code().is_some()
                && scan(sql, |_| None, Some(catalog)) == Err(SESSION_GLOBALS))
    })
}

/// Whether a `Query` or `Parse` message that went out with `body` (whole,
/// or the start of it) sends DDL ([`changes_catalog`]): its statements'
/// first words tell.
pub(crate) fn sends_ddl(kind: u8, body: Result<&[u8], &[u8]>) -> bool {
    let start = body.unwrap_or_else(|cut| cut);
    let sql = match kind {
        b'P' => match start.iter().position(|&b| b == 0) {
            Some(end) => &start[end + 1..],
            None => return false,
        },
        _ => start,
    };
    let sql = sql
        .iter()
        .position(|&b| b == 0)
        .map_or(sql, |end| &sql[..end]);
    let readable = match std::str::from_utf8(sql) {
        Ok(sql) => sql,
        // Cut inside a character: what came before it.
        Err(e) => std::str::from_utf8(&sql[..e.valid_up_to()]).unwrap_or_default(),
    };
    changes_catalog(readable)
}

/// The SQL of a `Query` (`Q`) or `Parse` (`P`) message's `body`, if it
/// can be read: whole, UTF-8, and (for a `Parse`) with its name ended.
fn sql_of<'a>(kind: u8, body: Result<&'a [u8], &[u8]>) -> Option<&'a str> {
    let body = body.ok()?;
    let after_name = match kind {
        b'P' => &body[body.iter().position(|&b| b == 0)? + 1..],
        _ => body,
    };
    let sql = after_name
        .iter()
        .position(|&b| b == 0)
        .map_or(after_name, |end| &after_name[..end]);
    std::str::from_utf8(sql).ok()
}

/// Whether `sql` leaves session state that no reset undoes (see
/// [`lasting`](super::super::lasting)): on a connection checked out with `get()`
/// it runs, and the connection is closed when it comes back.
fn leaves_lasting_state(sql: &str) -> bool {
    lexers(sql).any(|tokens| {
        let mut statement = Vec::new();
        for token in tokens.chain(std::iter::once(Token::Punct(b';'))) {
            if token == Token::Punct(b';') {
                if lasting(&statement).is_some() {
                    return true;
                }
                statement.clear();
            } else {
                statement.push(token);
            }
        }
        false
    })
}

/// Refuses `COPY` where only queries can run (the [`Executor`](crate::Executor)
/// methods of an exclusive connection or a transaction): it streams data
/// through tokio-postgres' own `copy_in`/`copy_out`.
pub(crate) fn check_not_copy(sql: &str) -> Result<(), Error> {
    let first = Lexer::new(sql.as_bytes()).find_map(|t| match t {
        Token::Word(w) => Some(w),
        _ => None,
    });
    if first.is_some_and(|w| is(w, "copy")) {
        return Err(Error::new(
            ErrorKind::NotSupported,
            "COPY through a query method; use copy_in/copy_out on conn.client() \
             (tokio-postgres); nothing was sent",
        ));
    }
    Ok(())
}

fn refused_in_atomic_batch(statement: &[Token<'_>]) -> Option<&'static str> {
    let Some(Token::Word(first)) = statement.first() else {
        return None;
    };
    TRANSACTION_CONTROL
        .iter()
        .chain(&["copy"])
        .find(|w| is(first, w))
        .map(|w| keyword_name(w))
}
