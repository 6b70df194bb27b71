//! [`Held`]: whether a caller holds the connection (a checkout from
//! [`Pool::get`](crate::Pool::get) or [`Pool::begin`](crate::Pool::begin)),
//! so that the tap counts every statement the server answers for that
//! caller, whichever method sent it.
//!
//! Written by the exclusive side around a checkout; read by the tap, at the
//! write that carries each request. The pool's own requests on a held
//! connection (a session reset riding along with a `BEGIN` or a `COMMIT`)
//! start with [`POOL_OWN`], which the tap reads at the same write.

use std::sync::atomic::{AtomicBool, Ordering};

/// How the pool's own simple queries begin: a comment, which also shows
/// them as the pool's in `pg_stat_activity`.
pub(crate) const POOL_OWN: &str = "/* pgpipe */ ";

/// A caller's hold on a connection, as the tap reads it.
#[derive(Debug, Default)]
pub(crate) struct Held {
    on: AtomicBool,
}

impl Held {
    /// A caller has the connection from now on.
    pub(crate) fn begin(&self) {
        self.on.store(true, Ordering::Release);
    }

    /// The caller gave the connection back: requests written from now on
    /// are not theirs (what they wrote before is still counted as its
    /// answers arrive).
    pub(crate) fn end(&self) {
        self.on.store(false, Ordering::Release);
    }

    /// Whether a caller holds the connection.
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }
}
