//! Bytes and SQL text: what the pool reads of the PostgreSQL protocol, and
//! of the SQL it is given. Nothing here knows of the router or the pool.
//!
//! - [`framer`]: message boundaries, one direction at a time.
//! - [`gate`]: one request group on the wire at a time, behind poolers
//!   that need it.
//! - [`coalesce`]: read groups, one `Sync` for the reads of one write on a
//!   read lane's shared connection, rewritten inside the connection's tap
//!   (`conn::tap`).
//! - [`rtt`]: the round-trip estimate from solitary round trips.
//! - [`catalog`]: which names reach user code in a database, learned from
//!   its catalog.
//! - [`sql_guard`]: the lexer-based guard that refuses session SQL on the
//!   shared path.
//! - [`watch`]: what a connection's answers say about its session (a
//!   transaction left open, a setting changed, a standby promoted), as
//!   verdicts the tap applies.

pub(crate) mod catalog;
pub(crate) mod coalesce;
pub(crate) mod framer;
pub(crate) mod gate;
mod known_code;
mod lasting;
mod lexer;
#[cfg(all(test, feature = "pg-query-check"))]
mod lexer_diff;
pub(crate) mod rtt;
pub(crate) mod sql_guard;
pub(crate) mod watch;
