//! The proxy's event loop: accepting, and forwarding each connection in
//! both directions with a delay, counting and faults.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use socket2::SockRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, oneshot, watch};

use crate::count::MessageCounter;
use crate::timer::PreciseTimer;
use crate::{DirectionCounters, Stats};

/// Settings and counters shared between the [`Proxy`](crate::Proxy) handle
/// and its thread.
#[derive(Debug)]
pub(crate) struct Control {
    delay_nanos: AtomicU64,
    stalled: AtomicBool,
    resumed: Notify,
    cuts: watch::Sender<u64>,
    /// Downstream bytes left before a reset; `u64::MAX` when off.
    reset_budget: AtomicU64,
    upstream: DirectionCounters,
    downstream: DirectionCounters,
    connections: AtomicU64,
    busy_periods: AtomicU64,
    early_groups: AtomicU64,
    /// Upstream chunks are written in pieces split at random offsets.
    split: AtomicBool,
    pub(crate) realtime: AtomicBool,
    pub(crate) thread_id: AtomicU64,
    /// Where new connections go; [`Proxy::set_upstream`](crate::Proxy::set_upstream)
    /// changes it, as a DNS name that moves would.
    upstream_addr: std::sync::Mutex<SocketAddr>,
}

impl Control {
    pub(crate) fn new(delay: Duration, upstream: SocketAddr) -> Control {
        Control {
            upstream_addr: std::sync::Mutex::new(upstream),
            delay_nanos: AtomicU64::new(delay.as_nanos() as u64),
            stalled: AtomicBool::new(false),
            resumed: Notify::new(),
            cuts: watch::Sender::new(0),
            reset_budget: AtomicU64::new(u64::MAX),
            upstream: DirectionCounters::default(),
            downstream: DirectionCounters::default(),
            connections: AtomicU64::new(0),
            busy_periods: AtomicU64::new(0),
            early_groups: AtomicU64::new(0),
            split: AtomicBool::new(false),
            realtime: AtomicBool::new(false),
            thread_id: AtomicU64::new(0),
        }
    }

    /// Sends new connections to `upstream`; open ones stay where they are.
    pub(crate) fn set_upstream(&self, upstream: SocketAddr) {
        *self
            .upstream_addr
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = upstream;
    }

    fn upstream_addr(&self) -> SocketAddr {
        *self
            .upstream_addr
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn started_on_this_thread(&self, realtime: bool) {
        self.thread_id
            .store(crate::current_thread_id(), Ordering::Release);
        let got = realtime && crate::go_realtime();
        self.realtime.store(got, Ordering::Release);
    }

    pub(crate) fn set_split(&self, on: bool) {
        self.split.store(on, Ordering::Release);
    }

    pub(crate) fn set_delay(&self, delay: Duration) {
        self.delay_nanos
            .store(delay.as_nanos() as u64, Ordering::Release);
    }

    pub(crate) fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::Acquire))
    }

    pub(crate) fn stall(&self, on: bool) {
        self.stalled.store(on, Ordering::Release);
        if !on {
            self.resumed.notify_waiters();
        }
    }

    pub(crate) fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    pub(crate) fn reset_after(&self, bytes: Option<u64>) {
        self.reset_budget
            .store(bytes.unwrap_or(u64::MAX), Ordering::Release);
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            upstream: self.upstream.snapshot(),
            downstream: self.downstream.snapshot(),
            connections: self.connections.load(Ordering::Relaxed),
            busy_periods: self.busy_periods.load(Ordering::Relaxed),
            early_groups: self.early_groups.load(Ordering::Relaxed),
        }
    }

    async fn while_stalled(&self) {
        while self.stalled.load(Ordering::Acquire) {
            let resumed = self.resumed.notified();
            tokio::pin!(resumed);
            resumed.as_mut().enable();
            if !self.stalled.load(Ordering::Acquire) {
                return;
            }
            resumed.await;
        }
    }

    /// Takes `len` bytes from the reset budget; returns how many may still be
    /// written before the reset, if one is due within them.
    fn spend(&self, len: usize) -> Option<usize> {
        let len = len as u64;
        let mut budget = self.reset_budget.load(Ordering::Acquire);
        loop {
            if budget == u64::MAX {
                return None;
            }
            let left = budget.saturating_sub(len);
            match self.reset_budget.compare_exchange(
                budget,
                left,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) if budget <= len => {
                    self.reset_budget.store(u64::MAX, Ordering::Release);
                    return Some(budget as usize);
                }
                Ok(_) => return None,
                Err(actual) => budget = actual,
            }
        }
    }
}

/// Accepts connections until `shutdown` fires.
pub(crate) async fn serve(
    listener: std::net::TcpListener,
    control: Arc<Control>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    control.connections.fetch_add(1, Ordering::Relaxed);
                    let upstream = control.upstream_addr();
                    tokio::spawn(connection(client, upstream, Arc::clone(&control)));
                }
            }
            _ = &mut shutdown => return,
        }
    }
}

/// Which way bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Upstream,
    Downstream,
}

async fn connection(client: TcpStream, upstream: SocketAddr, control: Arc<Control>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return; // dropping the client closes it, as a refused connection would
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut cuts = control.cuts.subscribe();
    cuts.mark_unchanged();
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let reset = Notify::new();
    // Queries the server owes an answer, as this proxy sees them: Syncs read
    // from the client minus ReadyForQuery read from the server. Start-up
    // counts as one (it ends with a ReadyForQuery but has no Sync).
    let owed = AtomicI64::new(1);
    // Start-up is over (a ReadyForQuery was delivered): from then on
    // upstream writes may be split. PgBouncer refuses a start-up packet that
    // arrives in parts.
    let started = AtomicBool::new(false);
    let shared = Shared {
        control: &control,
        reset: &reset,
        owed: &owed,
        started: &started,
    };
    let up = pipe(client_read, server_write, Direction::Upstream, shared);
    let down = pipe(server_read, client_write, Direction::Downstream, shared);
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = cuts.changed() => {}
        _ = reset.notified() => {}
    }
    // Dropping the halves closes both sockets.
}

/// What both directions of one connection share.
#[derive(Clone, Copy)]
struct Shared<'a> {
    control: &'a Control,
    reset: &'a Notify,
    owed: &'a AtomicI64,
    started: &'a AtomicBool,
}

async fn pipe(
    mut reader: OwnedReadHalf,
    mut writer: OwnedWriteHalf,
    direction: Direction,
    shared: Shared<'_>,
) {
    let Shared {
        control,
        reset,
        owed,
        started,
    } = shared;
    // Each chunk travels with when it was read and how many counted
    // messages it carries.
    let (chunks, mut queued) = mpsc::unbounded_channel::<(Instant, Vec<u8>, i64)>();
    let counters = match direction {
        Direction::Upstream => &control.upstream,
        Direction::Downstream => &control.downstream,
    };
    let read = async move {
        let mut counter = match direction {
            Direction::Upstream => MessageCounter::upstream(),
            Direction::Downstream => MessageCounter::downstream(),
        };
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            control.while_stalled().await;
            let n = match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let stamp = Instant::now();
            let (parses_before, executes_before) = (counter.seconds(), counter.executes());
            let early_before = counter.early_groups();
            let messages = counter.feed_owing(&buf[..n], owed.load(Ordering::Acquire));
            if counter.early_groups() > early_before {
                control
                    .early_groups
                    .fetch_add(counter.early_groups() - early_before, Ordering::Relaxed);
            }
            counters.record(
                n,
                messages,
                counter.seconds() - parses_before,
                parses_before == 0,
                counter.executes() - executes_before,
            );
            let messages = messages as i64;
            // A Sync from a client that was owed nothing starts a round trip
            // of its own; the others ride along. Counted at the client's
            // side of the delay: Syncs as they arrive, answers as they are
            // delivered (below).
            if direction == Direction::Upstream
                && messages > 0
                && owed.fetch_add(messages, Ordering::AcqRel) <= 0
            {
                control.busy_periods.fetch_add(1, Ordering::Relaxed);
            }
            if chunks.send((stamp, buf[..n].to_vec(), messages)).is_err() {
                return;
            }
        }
    };
    let write = async {
        let Ok(timer) = PreciseTimer::new() else {
            return;
        };
        let mut seed = split_seed();
        while let Some((stamp, chunk, messages)) = queued.recv().await {
            if timer.sleep_until(stamp + control.delay()).await.is_err() {
                return;
            }

            control.while_stalled().await;
            let due = match direction {
                Direction::Downstream => control.spend(chunk.len()),
                Direction::Upstream => None,
            };
            if let Some(allowed) = due {
                let _ = writer.write_all(&chunk[..allowed]).await;
                let _ = SockRef::from(writer.as_ref()).set_linger(Some(Duration::ZERO));
                reset.notify_waiters();
                return;
            }
            let written = if direction == Direction::Upstream
                && control.split.load(Ordering::Acquire)
                && started.load(Ordering::Acquire)
            {
                write_in_pieces(&mut writer, &chunk, &timer, &mut seed).await
            } else {
                writer.write_all(&chunk).await
            };
            if written.is_err() {
                return;
            }
            if direction == Direction::Downstream && messages > 0 {
                owed.fetch_sub(messages, Ordering::AcqRel);
                started.store(true, Ordering::Release);
            }
        }
        let _ = writer.shutdown().await;
    };
    tokio::join!(read, write);
}

/// Writes `chunk` in two to four pieces split at random offsets, with a
/// pause of 50-500 µs between them: a network that delivers a message in
/// parts, each of which the peer may act on before the rest arrives.
async fn write_in_pieces(
    writer: &mut OwnedWriteHalf,
    chunk: &[u8],
    timer: &PreciseTimer,
    seed: &mut u64,
) -> std::io::Result<()> {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let pieces = 2 + next() % 3;
    let mut rest = chunk;
    for _ in 1..pieces {
        if rest.len() < 2 {
            break;
        }
        let at = 1 + (next() as usize % (rest.len() - 1));
        writer.write_all(&rest[..at]).await?;
        rest = &rest[at..];
        let pause = Duration::from_micros(50 + next() % 450);
        if timer.sleep_until(Instant::now() + pause).await.is_err() {
            break;
        }
    }
    writer.write_all(rest).await
}

/// A different nonzero seed for each connection's pieces.
fn split_seed() -> u64 {
    static CONNECTIONS: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (now ^ CONNECTIONS
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15))
        | 1
}
