//! [`Status`]: a snapshot of a pool.

/// A snapshot of a [`Pool`](crate::Pool), from [`Pool::status`](crate::Pool::status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Status {
    /// Most connections the pool may open.
    pub max_size: usize,
    /// Connections open now, in any use.
    pub size: usize,
    /// Open connections that nobody is using.
    pub idle: usize,
    /// Connections on loan to the shared (pipelined) path.
    pub shared: usize,
    /// Connections checked out with [`Pool::get`](crate::Pool::get).
    pub exclusive: usize,
    /// Pipelined queries admitted to a shared connection and not finished.
    pub in_flight: usize,
    /// Pipelined queries waiting for room on a shared connection.
    pub waiting: usize,
    /// Tasks waiting in [`Pool::get`](crate::Pool::get).
    pub exclusive_waiting: usize,
}
