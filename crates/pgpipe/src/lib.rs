#![doc = include_str!("../../../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod batch;
mod builder;
mod config;
mod connect;
mod connection;
mod error;
mod exec;
mod executor;
mod gate;
mod hol;
mod manager;
mod metrics;
mod pool;
mod queue;
mod session;
mod shared;
mod statement_cache;
mod status;
mod tls;
mod transaction;
mod wire;

pub use batch::{Batch, BatchResults};
pub use builder::PoolBuilder;
pub use config::{PoolConfig, Routing};
pub use connection::Connection;
pub use error::{Error, ErrorKind};
pub use exec::Answer;
pub use executor::Executor;
pub use hol::Slow;
pub use pool::Pool;
pub use status::Status;
pub use transaction::Transaction;

/// tokio-postgres, re-exported so that its types (`Row`, `ToSql`, `Config`)
/// match the ones pgpipe was built with.
pub use tokio_postgres;

/// rustls, re-exported so that the `ClientConfig` given to
/// [`PoolBuilder::tls`] is of the version pgpipe was built with.
#[cfg(feature = "rustls")]
pub use rustls;
