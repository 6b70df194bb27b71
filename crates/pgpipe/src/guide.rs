//! # The guide
//!
//! How pgpipe works and how to run it, one page per topic. The crate's
//! [front page](crate) has the set-up, the first program and when to use
//! which method; these pages have the rest. Each is a module with no code:
//! its documentation is the page (the markdown is in the crate's `guide/`
//! folder, and every Rust example in it is compiled as a doctest).
//!
//! How it works:
//!
//! - [Pipelining, batching and head-of-line routing](pipelining): how
//!   queries from many tasks share a connection, how they are batched into
//!   writes, and how slow queries are kept from holding up fast ones.
//! - [Read groups](read_groups): one `Sync` for the reads of one write,
//!   through [`Pool::read`](crate::Pool::read).
//! - [What runs on the shared path](shared_path): the SQL guard, the
//!   session cleanup behind code it cannot read, and what the wire shows.
//! - [Transactions, batches, LISTEN/NOTIFY and the executor
//!   trait](transactions): [`Executor`](crate::Executor),
//!   [`Pool::begin`](crate::Pool::begin) against
//!   [`Pool::get`](crate::Pool::get), isolated and atomic batches,
//!   [`Listener`](crate::Listener).
//!
//! Running it:
//!
//! - [Configuration, sizing and waiting](configuration): every setting and
//!   its default, settings as data, how `max_size` is shared, queueing.
//! - [Through a pooler](poolers): PgBouncer, pgpool-II and other
//!   server-side poolers, what each mode allows, and what it costs.
//! - [Replicas and failover](replicas): a primary and its standbys, roles,
//!   lag, read-your-writes, what is retried, Patroni and HAProxy, and what
//!   is not built yet.
//! - [Errors and when things break](errors): every error kind, whether it
//!   may have run, and what each fault does.
//! - [Metrics, tracing, OpenTelemetry names, dashboards and
//!   alerts](observability).
//! - [The example service](example_service): a web service on one
//!   pipelined pool, to copy.
//! - [Migrating from deadpool-postgres](migrating).
//! - [Benchmarks](benchmarks): the method and the latest results.

#[doc = include_str!("../guide/pipelining.md")]
pub mod pipelining {}

#[doc = include_str!("../guide/read_groups.md")]
pub mod read_groups {}

#[doc = include_str!("../guide/shared_path.md")]
pub mod shared_path {}

#[doc = include_str!("../guide/transactions.md")]
pub mod transactions {}

#[doc = include_str!("../guide/configuration.md")]
pub mod configuration {}

#[doc = include_str!("../guide/poolers.md")]
pub mod poolers {}

#[doc = include_str!("../guide/replicas.md")]
pub mod replicas {}

#[doc = include_str!("../guide/errors.md")]
pub mod errors {}

#[doc = include_str!("../guide/observability.md")]
pub mod observability {}

#[doc = include_str!("../guide/example_service.md")]
pub mod example_service {}

#[doc = include_str!("../guide/migrating.md")]
pub mod migrating {}

#[doc = include_str!("../guide/benchmarks.md")]
pub mod benchmarks {}
