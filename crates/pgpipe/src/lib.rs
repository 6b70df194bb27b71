#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// Layout. One pipelined `pool.query` goes pool → query → shared (router)
// → conn (run on one connection, the tap on its socket) → protocol (the
// framer, the session watch) and back; `docs/ARCHITECTURE.md` walks it file by file.
//
// pool         `Pool`, the public API: every method a short delegate.
// query        one query end to end: guard, route or check out, window,
//              run, deadline, retry of unsent, learned cost, metrics.
// batch        `Batch`: isolated (pipelined) and atomic batches (pipelined
//              as one unit when the guard lets every item on the shared path).
// shared       the pipelined path: `Router` owns the shared connections,
//              admission, the wait queue, routing, opens, costs.
// exclusive    `Pool::get`: `Exclusive` owns permits, claims, deadlocks;
//              `Connection` and `Transaction`.
// conn         one connection, knowing nothing above it: `PgConn`, its
//              state in parts (load word, wire counts, session, lifecycle,
//              traits), the socket tap, deadpool manager, step-aside, run
//              one query, statement cache, connect, TLS.
// protocol     bytes and SQL, importing only leaves: framer, session watch,
//              read-group rewriter, RTT filter, SQL guard.
// metrics      event handles, and the scrape-time collector.
// housekeeping the 100 ms tick: clock, watchdog, lifetimes, idle.
// trace        `tracing` spans and events (the `tracing` feature).
// pooler       what a server-side pooler guarantees; how statements are
//              prepared through it.
// hosts        several hosts: each one's write and read lanes (each a pool
//              of the above), the monitor that learns their roles and
//              elects the primary, and dispatch with its few retries.
// target, routed  libpq's target_session_attrs, read consistency and
//              write tokens; the read handle `Pool::read` returns.
// answer, executor, slow, builder, config, error, status, sync: one
//              concept each, as named.

mod answer;
mod batch;
mod builder;
mod catalog;
mod config;
mod conn;
mod error;
mod exclusive;
mod executor;
mod hosts;
mod housekeeping;
mod metrics;
mod ordered;
mod pool;
mod pooler;
mod protocol;
mod query;
mod routed;
mod shared;
mod slow;
mod status;
mod sync;
mod target;
mod trace;

pub use answer::Answer;
pub use batch::{Batch, BatchResults};
pub use builder::PoolBuilder;
pub use config::{PoolConfig, Routing, SessionCleanup};
pub use error::{Error, ErrorKind};
pub use exclusive::{Connection, OwnedTransaction, Transaction};
pub use executor::Executor;
pub use pool::Pool;
pub use pooler::{Pooler, Prepare};
pub use routed::Routed;
pub use slow::Slow;
pub use status::Status;
pub use target::{Consistency, ReplicaFallback, TargetSessionAttrs, WriteToken};

/// tokio-postgres, re-exported so that its types (`Row`, `ToSql`, `Config`)
/// match the ones pgpipe was built with.
pub use tokio_postgres;

/// rustls, re-exported so that the `ClientConfig` given to
/// [`PoolBuilder::tls`] is of the version pgpipe was built with.
#[cfg(feature = "rustls")]
pub use rustls;
