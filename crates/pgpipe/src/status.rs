//! [`Status`]: a snapshot of a pool.

/// A snapshot of a [`Pool`](crate::Pool), from [`Pool::status`](crate::Pool::status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Status {
    /// Most connections the pool may open: `max_size` for each lane of each
    /// host (its write lane, and its read lane for [`Pool::read`](crate::Pool::read)).
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

/// Several lanes' snapshots as one: a pool of several hosts adds its
/// hosts' connections and queues.
impl std::iter::Sum for Status {
    fn sum<I: Iterator<Item = Status>>(iter: I) -> Status {
        iter.fold(Status::default(), |a, b| Status {
            max_size: a.max_size + b.max_size,
            size: a.size + b.size,
            idle: a.idle + b.idle,
            shared: a.shared + b.shared,
            exclusive: a.exclusive + b.exclusive,
            in_flight: a.in_flight + b.in_flight,
            waiting: a.waiting + b.waiting,
            exclusive_waiting: a.exclusive_waiting + b.exclusive_waiting,
        })
    }
}
