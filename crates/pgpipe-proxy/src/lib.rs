//! A TCP proxy that stands in for a network between a client and
//! PostgreSQL.
//!
//! - **Delay.** Every chunk is held for a fixed one-way delay in each
//!   direction, in order and without limiting bandwidth: a chunk is stamped
//!   when it is read and written at stamp + delay, and a reader never waits
//!   for a writer. Sub-millisecond delays are precise (a `timerfd`, not
//!   tokio's millisecond timer).
//! - **Its own thread.** The proxy runs on a thread of its own with a
//!   single-threaded runtime, at real-time priority (`SCHED_FIFO`) where the
//!   system allows it, because a network does not queue behind the host's CPU
//!   load. [`Proxy::realtime`] says whether it got it; [`Proxy::cpu_time`]
//!   says what it cost.
//! - **Ground truth.** It counts what it forwards: chunks, bytes, and `Sync`
//!   (and simple `Query`) and `Parse` messages upstream and `ReadyForQuery`
//!   messages downstream.
//! - **Faults.** [`stall`](Proxy::stall) stops forwarding and keeps the
//!   sockets open, [`cut`](Proxy::cut) closes every connection, and
//!   [`reset_after`](Proxy::reset_after) resets one with a TCP RST after a
//!   number of downstream bytes (mid-result).
//!
//! ```no_run
//! use std::time::Duration;
//! # fn main() -> std::io::Result<()> {
//! let proxy = pgpipe_proxy::Proxy::builder("127.0.0.1:5432")
//!     .delay(Duration::from_micros(500)) // 1 ms round trip
//!     .start()?;
//! let url = format!("postgres://postgres@{}/postgres", proxy.addr());
//! # let _ = url;
//! # Ok(())
//! # }
//! ```

mod count;
mod forward;
mod timer;

use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use forward::Control;

/// Starts a [`Proxy`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `.start()`"]
pub struct ProxyBuilder {
    upstream: String,
    delay: Duration,
    realtime: bool,
    split: bool,
}

impl ProxyBuilder {
    /// The one-way delay added in each direction (a round trip gains twice
    /// this). Default: zero.
    pub fn delay(mut self, one_way: Duration) -> Self {
        self.delay = one_way;
        self
    }

    /// Whether upstream (client to server) bytes are written in two to four
    /// pieces split at random offsets, with a short pause between them, as
    /// a network may deliver them. Default: no.
    pub fn split_writes(mut self, on: bool) -> Self {
        self.split = on;
        self
    }

    /// Whether to ask for `SCHED_FIFO`. Default: yes.
    pub fn realtime(mut self, on: bool) -> Self {
        self.realtime = on;
        self
    }

    /// Binds `127.0.0.1:0` and starts forwarding to the upstream address.
    ///
    /// # Errors
    ///
    /// When the upstream address does not resolve or the listener cannot be
    /// bound.
    pub fn start(self) -> io::Result<Proxy> {
        let upstream =
            self.upstream.to_socket_addrs()?.next().ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, "upstream did not resolve")
            })?;
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let control = Arc::new(Control::new(self.delay, upstream));
        control.set_split(self.split);
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let thread_control = Arc::clone(&control);
        let realtime = self.realtime;
        let (started, wait_started) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("pgpipe-proxy".into())
            .spawn(move || {
                thread_control.started_on_this_thread(realtime);
                let _ = started.send(());
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime");
                runtime.block_on(forward::serve(listener, thread_control, shutdown_rx));
            })?;
        // So that `realtime()` and `cpu_time()` answer from the start.
        let _ = wait_started.recv();
        Ok(Proxy {
            addr,
            control,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }
}

/// A running proxy; stops when dropped. See the [crate docs](crate).
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    control: Arc<Control>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// What a proxy forwarded in one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DirectionStats {
    /// Reads that returned data.
    pub chunks: u64,
    /// Bytes forwarded.
    pub bytes: u64,
    /// Requests counted upstream (`Sync` and simple `Query`, each answered
    /// by one `ReadyForQuery`), and `ReadyForQuery` downstream.
    pub messages: u64,
    /// Chunks that carried at least one counted message.
    pub chunks_with_messages: u64,
    /// `Parse` messages (upstream only).
    pub parses: u64,
    /// Connections that have sent at least one `Parse` (upstream only): a
    /// pool's connection may prepare statements of its own with its first.
    pub connections_with_parses: u64,
    /// `Execute` messages (upstream only): the queries of the extended
    /// protocol, counted whether each has a `Sync` of its own or several
    /// share one.
    pub executes: u64,
    /// Chunks that carried at least one `Execute`.
    pub chunks_with_executes: u64,
}

/// What a proxy forwarded, from [`Proxy::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Client to server.
    pub upstream: DirectionStats,
    /// Server to client.
    pub downstream: DirectionStats,
    /// Connections accepted.
    pub connections: u64,
    /// Times a client sent a query (a Sync) while it was owed no answer:
    /// the round trips actually paid. Every other Sync rode along on a round
    /// trip already under way. Counted at the client's side of the delay:
    /// Syncs as they arrive, answers as they are delivered.
    pub busy_periods: u64,
    /// Request groups (everything up to a `Sync` or a simple `Query`) that
    /// a client began before every answer it was owed had been delivered
    /// to it: the wire observer for poolers that need one group in flight.
    /// Zero for a client that waits for each `ReadyForQuery`.
    pub early_groups: u64,
}

impl Proxy {
    /// A builder forwarding to `upstream` (`host:port`).
    pub fn builder(upstream: impl Into<String>) -> ProxyBuilder {
        ProxyBuilder {
            upstream: upstream.into(),
            delay: Duration::ZERO,
            realtime: true,
            split: false,
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes the one-way delay for chunks read from now on.
    pub fn set_delay(&self, one_way: Duration) {
        self.control.set_delay(one_way);
    }

    /// The one-way delay.
    pub fn delay(&self) -> Duration {
        self.control.delay()
    }

    /// Sends connections opened from now on to `upstream` (`host:port`);
    /// open ones stay where they are, as when a DNS name moves.
    ///
    /// # Errors
    ///
    /// When `upstream` does not resolve.
    pub fn set_upstream(&self, upstream: &str) -> io::Result<()> {
        let addr = upstream
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "upstream did not resolve"))?;
        self.control.set_upstream(addr);
        Ok(())
    }

    /// Stops forwarding in both directions; sockets stay open.
    pub fn stall(&self) {
        self.control.stall(true);
    }

    /// Forwards again after [`stall`](Proxy::stall).
    pub fn resume(&self) {
        self.control.stall(false);
    }

    /// Closes every open connection, both sides, at once.
    pub fn cut(&self) {
        self.control.cut();
    }

    /// Resets (TCP RST, both sides) the connection that forwards the
    /// `bytes`-th downstream byte from now on; `None` turns it off.
    pub fn reset_after(&self, bytes: Option<u64>) {
        self.control.reset_after(bytes);
    }

    /// What was forwarded so far.
    pub fn stats(&self) -> Stats {
        self.control.stats()
    }

    /// Whether the proxy thread runs at real-time priority.
    pub fn realtime(&self) -> bool {
        self.control.realtime.load(Ordering::Acquire)
    }

    /// CPU time the proxy thread has used, where `/proc` tells it.
    pub fn cpu_time(&self) -> Option<Duration> {
        let tid = self.control.thread_id.load(Ordering::Acquire);
        if tid == 0 {
            return None;
        }
        let schedstat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
        let nanos: u64 = schedstat.split_whitespace().next()?.parse().ok()?;
        Some(Duration::from_nanos(nanos))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        self.control.cut();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Per-direction counters, updated by the forwarding tasks.
#[derive(Debug, Default)]
struct DirectionCounters {
    chunks: AtomicU64,
    bytes: AtomicU64,
    messages: AtomicU64,
    chunks_with_messages: AtomicU64,
    parses: AtomicU64,
    connections_with_parses: AtomicU64,
    executes: AtomicU64,
    chunks_with_executes: AtomicU64,
}

impl DirectionCounters {
    /// One chunk read; `parses` counts from the connection's first when
    /// `first_parses` says these are its first.
    fn record(&self, bytes: usize, messages: u64, parses: u64, first_parses: bool, executes: u64) {
        if parses > 0 {
            self.parses.fetch_add(parses, Ordering::Relaxed);
            if first_parses {
                self.connections_with_parses.fetch_add(1, Ordering::Relaxed);
            }
        }
        if executes > 0 {
            self.executes.fetch_add(executes, Ordering::Relaxed);
            self.chunks_with_executes.fetch_add(1, Ordering::Relaxed);
        }
        self.chunks.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        if messages > 0 {
            self.messages.fetch_add(messages, Ordering::Relaxed);
            self.chunks_with_messages.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn snapshot(&self) -> DirectionStats {
        DirectionStats {
            chunks: self.chunks.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            messages: self.messages.load(Ordering::Relaxed),
            chunks_with_messages: self.chunks_with_messages.load(Ordering::Relaxed),
            parses: self.parses.load(Ordering::Relaxed),
            connections_with_parses: self.connections_with_parses.load(Ordering::Relaxed),
            executes: self.executes.load(Ordering::Relaxed),
            chunks_with_executes: self.chunks_with_executes.load(Ordering::Relaxed),
        }
    }
}

/// Whether the current thread may use `SCHED_FIFO`; asks for it.
fn go_realtime() -> bool {
    use thread_priority::{
        RealtimeThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_thread_priority_and_policy, thread_native_id,
    };
    let Ok(priority) = 10u8.try_into() else {
        return false;
    };
    set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Crossplatform(priority),
        ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo),
    )
    .is_ok()
}

/// Reads the kernel's id of the current thread, for `/proc` look-ups.
fn current_thread_id() -> u64 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|path| path.file_name()?.to_str()?.parse().ok())
        .unwrap_or(0)
}
