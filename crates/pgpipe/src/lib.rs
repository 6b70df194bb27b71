#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// Layout, top down (docs/ARCHITECTURE.md walks a query, a read and a
// `begin()` through it; `tests/layering.rs` fails on an import that
// climbs):
//
// pool, builder, routed, slow, batch, executor, listener   the public
//              API: `Pool` and its handles, each method a short delegate to
//              hosts.
// hosts        the servers behind a pool: each one's write and read lanes,
//              the monitor and its election, and the one dispatcher that
//              picks a lane and runs again only what cannot have run.
// lane         one pool of connections to one server: `Lane`, one query on
//              a lane end to end, the retry budget, the atomic-batch quota,
//              housekeeping, the catalog view.
// exclusive    `Pool::get` and `Pool::begin`: permits, claims, deadlocks;
//              `Connection`, `Transaction`, `OwnedTransaction`.
// shared       the pipelined path: `Router` owns the shared connections,
//              admission, the wait queue, routing, opens, costs.
// conn         one connection, knowing nothing above it: `PgConn`, its
//              state, the socket tap, run one query, statement cache,
//              deadpool manager, connect, TLS.
// protocol     bytes and SQL, pure: framer, read groups' rewriter, session
//              watch, RTT filter, SQL guard and lexer.
// leaves       error, config, metrics, trace, answer, status, sync, target,
//              pooler, ordered, budget: anyone may import them.
// guide        the user guide's pages (docs only).

mod answer;
mod batch;
mod budget;
mod builder;
mod config;
mod conn;
mod error;
mod exclusive;
mod executor;
// The user's guide: documentation pages only, no code (`guide/*.md`).
pub mod guide;
mod hosts;
mod lane;
mod listener;
mod metrics;
mod ordered;
mod pool;
mod pooler;
mod protocol;
mod routed;
mod shared;
mod slow;
mod statement;
mod status;
mod sync;
mod target;
mod trace;
mod within;

pub use answer::Answer;
pub use batch::{Batch, BatchResults};
pub use builder::PoolBuilder;
pub use config::{PoolConfig, Routing, SessionCleanup};
pub use conn::hooks::{HookFuture, HookResult};
pub use conn::tls::TlsSocket;
pub use error::{Error, ErrorKind};
pub use exclusive::{
    Connection, OwnedTransaction, Transaction, TransactionBuilder, TransactionOptions,
};
pub use executor::{Executor, RowStream};
pub use listener::{Event, Gap, Listener};
pub use pool::Pool;
pub use pooler::{Pooler, Prepare};
pub use routed::Routed;
pub use slow::Slow;
pub use statement::{Statement, ToQuery};
pub use status::Status;
pub use target::{Consistency, ReplicaFallback, TargetSessionAttrs, WriteToken};
pub use tokio_postgres::IsolationLevel;
pub use within::Within;

/// tokio-postgres, re-exported so that its types (`Row`, `ToSql`, `Config`)
/// match the ones pgpipe was built with.
pub use tokio_postgres;

/// rustls, re-exported so that the `ClientConfig` given to
/// [`PoolBuilder::tls`] is of the version pgpipe was built with.
#[cfg(feature = "rustls")]
pub use rustls;

/// Not part of the API (no semver promise): what the integration tests
/// hold against a running server, the proof's catalog query and its model
/// of where a catalog keeps code.
#[doc(hidden)]
pub mod __proof {
    /// The catalog query the pool learns what statements can run from;
    /// its `$1` is [`builtin_sql`]'s one answer, an `int8[]`.
    pub fn catalog_sql() -> &'static str {
        &crate::protocol::catalog::CATALOG_SQL
    }

    /// The edges of the server's own stored expressions.
    pub fn builtin_sql() -> &'static str {
        &crate::protocol::catalog::BUILTIN_SQL
    }

    /// Every catalog column the proof classifies, as `table.column`.
    pub fn call_sites() -> impl Iterator<Item = &'static str> {
        crate::protocol::catalog::sites::CALL_SITES
            .iter()
            .map(|(site, _)| *site)
    }
}
