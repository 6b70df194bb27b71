//! What no reset undoes: state a statement leaves in a session that neither
//! the pool's cleanup nor `DISCARD ALL` (nor `get()`'s reset, which is
//! built from the same statements) takes back.
//!
//! `DISCARD ALL` is `CLOSE ALL`, `SET SESSION AUTHORIZATION DEFAULT`,
//! `RESET ALL`, `DEALLOCATE ALL`, `UNLISTEN *`, `pg_advisory_unlock_all()`,
//! `DISCARD PLANS`, `DISCARD TEMP` and `DISCARD SEQUENCES` (the same on
//! PostgreSQL 15 to 18). What it leaves, reachable from SQL:
//!
//! - the random sequence `setseed()` starts (the next user's `random()` is
//!   predictable);
//! - libraries `LOAD` brought in, and the settings they define;
//! - a session's replication origin (`pg_replication_origin_session_setup`);
//! - `dblink` connections (`dblink_connect`, `dblink_connect_u`), which an
//!   extension keeps for the session.
//!
//! - globals of procedural languages (PL/Perl's `%_SHARED`, PL/Python's
//!   `GD`/`SD`, PL/Tcl's, plv8's): what a function calls is not in the
//!   catalog, so in a database whose user functions use such a language
//!   ([`Catalog::session_globals`](super::catalog::Catalog::session_globals))
//!   any user code may set them.
//!
//! On the shared path these are refused; on a connection checked out with
//! `get()`, or an atomic batch's, they run, and the connection is closed
//! when it comes back instead of reset: its tap reads the SQL of every
//! `Query` and `Parse` it sends, whoever sends it.

use super::lexer::Token;

/// Functions whose effect outlives every reset.
const LASTING_CALLS: [(&str, &str); 4] = [
    (
        "setseed",
        "setseed() (the session's random() sequence; no reset undoes it)",
    ),
    (
        "pg_replication_origin_session_setup",
        "pg_replication_origin_session_setup() (a session's replication origin; no reset undoes it)",
    ),
    (
        "dblink_connect",
        "dblink_connect() (a dblink connection lives as long as the session; no reset undoes it)",
    ),
    (
        "dblink_connect_u",
        "dblink_connect_u() (a dblink connection lives as long as the session; no reset undoes it)",
    ),
];

/// What in one statement (its tokens, without the `;`) leaves state no
/// reset undoes, named for an error message.
pub(crate) fn lasting(statement: &[Token<'_>]) -> Option<&'static str> {
    let first = statement.iter().find_map(|t| match t {
        Token::Word(w) => Some(*w),
        _ => None,
    });
    if first.is_some_and(|w| w.eq_ignore_ascii_case(b"load")) {
        return Some("LOAD (a library stays loaded for every later user; no reset undoes it)");
    }
    statement.windows(2).find_map(|pair| match pair {
        [Token::Word(w) | Token::Quoted(w), Token::Punct(b'(')] => LASTING_CALLS
            .iter()
            .find(|(name, _)| w.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, what)| *what),
        _ => None,
    })
}
