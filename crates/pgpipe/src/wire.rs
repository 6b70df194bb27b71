//! Seeing the wire: a stream wrapper that watches every byte a connection
//! writes and reads.
//!
//! tokio-postgres takes any `AsyncRead + AsyncWrite` stream through
//! [`Config::connect_raw`](tokio_postgres::Config::connect_raw). The pool
//! hands it a [`TappedStream`], which walks the protocol's message frames (a
//! type byte and a length, never the payload) and records:
//!
//! - how many `Sync` messages each socket write carried: the real batch size
//!   of a pipeline, as the network sees it;
//! - every `ReadyForQuery` and its transaction-status byte (`I` idle, `T` in a
//!   transaction, `E` failed transaction): the ground truth for the pipeline
//!   depth and for catching a shared connection that slipped into a
//!   transaction;
//! - `ParameterStatus` messages after start-up, which the server sends when a
//!   reported setting (`TimeZone`, `application_name` …) changes: session
//!   state that must not appear on a shared connection.
//!
//! A shared connection that shows either sign is quarantined at once, from
//! inside the read: no new query is routed to it.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::task::AbortHandle;

use crate::metrics::{CloseReason, Metrics};

/// Bit layout of [`ConnState::load`]: the low 32 bits count queries in flight
/// on a shared connection; the high bits are flags. One word, so that
/// "admit a query if the connection is open and below its depth limit" is a
/// single compare-and-swap.
pub(crate) const LOAD_MASK: u64 = 0xffff_ffff;
/// The connection is used by the shared (pipelined) path.
pub(crate) const SHARED: u64 = 1 << 61;
/// The connection takes no new work (retiring, quarantined or dead).
pub(crate) const CLOSED: u64 = 1 << 62;
/// The connection's I/O task has ended.
pub(crate) const DEAD: u64 = 1 << 63;

/// Per-connection state shared by the tap, the router and the pool.
#[derive(Debug, Default)]
pub(crate) struct ConnState {
    /// In-flight count and flags; see [`LOAD_MASK`], [`SHARED`], [`CLOSED`].
    pub(crate) load: AtomicU64,
    /// Transaction status from the last ReadyForQuery.
    pub(crate) tx_status: AtomicU8,
    /// The session may carry state from an exclusive user or a quarantine;
    /// reset it before the connection is shared again.
    pub(crate) needs_reset: AtomicBool,
    /// Requests written: Sync, simple Query and the start-up packet, each
    /// answered by one ReadyForQuery.
    pub(crate) syncs: AtomicU64,
    /// ReadyForQuery messages read.
    pub(crate) readies: AtomicU64,
    /// Why the connection was quarantined, if it was.
    pub(crate) quarantined: AtomicU8,
    /// The pool clock at the last sign of progress: a read, or a write to
    /// an idle connection (for the stall watchdog).
    pub(crate) last_read: AtomicU64,
    /// The pool clock when it last went back to the idle set.
    pub(crate) idle_since: AtomicU64,
    /// [`PoolWire::now_nanos`] at the last ReadyForQuery read, or at a write
    /// to an idle connection: a connection that owes answers and has not
    /// moved for long is held up by something slow at its head.
    pub(crate) progress: AtomicU64,
    /// Why the pool closes it, once decided ([`CloseReason`] + 1).
    close_reason: AtomicU8,
    /// Ends the connection's I/O task.
    io: OnceLock<AbortHandle>,
    /// Checked out with `get()`: its user's business, whatever it waits for.
    pub(crate) exclusive: AtomicBool,
    /// Whether `connections_closed_total` counted it already.
    close_counted: AtomicBool,
}

/// Reasons for a quarantine, stored in [`ConnState::quarantined`].
pub(crate) const QUARANTINE_TX: u8 = 1;
pub(crate) const QUARANTINE_SESSION: u8 = 2;

impl ConnState {
    pub(crate) fn is_dead(&self) -> bool {
        self.load.load(Ordering::Acquire) & DEAD != 0
    }

    pub(crate) fn set_io(&self, io: AbortHandle) {
        let _ = self.io.set(io);
    }

    /// Ends the connection now: its I/O task stops, the socket closes, and
    /// every query in flight fails with `ConnectionLost`.
    pub(crate) fn kill(&self, reason: CloseReason, metrics: Option<&Metrics>) {
        self.closing(reason);
        self.load.fetch_or(DEAD | CLOSED, Ordering::AcqRel);
        if let Some(io) = self.io.get() {
            io.abort();
        }
        self.count_close(metrics, reason);
    }

    /// Counts the connection as closed, once, whoever notices first (the
    /// watchdog that kills it, or the drop that ends it).
    pub(crate) fn count_close(&self, metrics: Option<&Metrics>, reason: CloseReason) {
        if let Some(metrics) = metrics {
            if !self.close_counted.swap(true, Ordering::AcqRel) {
                metrics.closed(reason);
            }
        }
    }

    pub(crate) fn closing(&self, reason: CloseReason) {
        let _ = self.close_reason.compare_exchange(
            0,
            reason as u8 + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    pub(crate) fn close_reason(&self) -> Option<CloseReason> {
        CloseReason::from_u8(self.close_reason.load(Ordering::Acquire).checked_sub(1)?)
    }

    /// Queries written and not yet answered (Syncs minus ReadyForQuery).
    pub(crate) fn wire_depth(&self) -> u64 {
        let readies = self.readies.load(Ordering::Acquire);
        self.syncs.load(Ordering::Acquire).saturating_sub(readies)
    }

    fn is_shared(&self) -> bool {
        self.load.load(Ordering::Relaxed) & SHARED != 0
    }

    /// Stops routing to this connection and marks it for a reset. Called from
    /// the read path when a shared connection shows session state; returns
    /// whether this call quarantined it.
    fn quarantine(&self, reason: u8) -> bool {
        if !self.is_shared() {
            return false; // exclusive connections may hold any state they like
        }
        self.needs_reset.store(true, Ordering::Release);
        self.load.fetch_or(CLOSED, Ordering::AcqRel);
        self.quarantined
            .compare_exchange(0, reason, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// What every connection's tap reports to the pool, and the pool's clock.
#[derive(Debug, Default)]
pub(crate) struct PoolWire {
    pub(crate) rtt: RttFilter,
    pub(crate) metrics: Option<Arc<Metrics>>,
    /// Ticks of the pool's housekeeping: a clock that the hot path can read
    /// without a system call.
    pub(crate) clock: AtomicU64,
    /// Every connection opened and not yet dropped, for the stall watchdog.
    states: std::sync::Mutex<Vec<std::sync::Weak<ConnState>>>,
    /// Where [`now_nanos`](PoolWire::now_nanos) counts from.
    epoch: Epoch,
}

#[derive(Debug)]
struct Epoch(Instant);

impl Default for Epoch {
    fn default() -> Epoch {
        Epoch(Instant::now())
    }
}

impl PoolWire {
    pub(crate) fn new(metrics: Option<Arc<Metrics>>) -> PoolWire {
        PoolWire {
            metrics,
            ..PoolWire::default()
        }
    }

    /// A fine clock for the hot path: nanoseconds since the pool was made.
    pub(crate) fn now_nanos(&self) -> u64 {
        self.epoch.0.elapsed().as_nanos() as u64
    }

    pub(crate) fn register(&self, state: &Arc<ConnState>) {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        states.retain(|s| s.strong_count() > 0);
        states.push(Arc::downgrade(state));
    }

    /// The connections still alive.
    pub(crate) fn states(&self) -> Vec<Arc<ConnState>> {
        let states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        states.iter().filter_map(std::sync::Weak::upgrade).collect()
    }
}

/// The round-trip estimate from solitary round trips (a write to an idle
/// connection until its first answer): it drops at once to a smaller sample
/// and rises by an eighth of the difference (an EWMA) on a larger one, and
/// ignores samples over 1.5 times the smallest of the last 5 to 10 s, so
/// that a slow query sent alone, or an answer read late by a busy client,
/// does not count as a slow network.
#[derive(Debug)]
pub(crate) struct RttFilter {
    /// Windowed minimum: the current window and the one before.
    current: AtomicU64,
    previous: AtomicU64,
    /// The smoothed estimate, in nanoseconds.
    smoothed: AtomicU64,
}

const NO_SAMPLE: u64 = u64::MAX;

impl Default for RttFilter {
    fn default() -> RttFilter {
        RttFilter {
            current: AtomicU64::new(NO_SAMPLE),
            previous: AtomicU64::new(NO_SAMPLE),
            smoothed: AtomicU64::new(NO_SAMPLE),
        }
    }
}

impl RttFilter {
    pub(crate) fn sample(&self, rtt: Duration) {
        let nanos = u64::try_from(rtt.as_nanos()).unwrap_or(NO_SAMPLE - 1);
        self.current.fetch_min(nanos, Ordering::AcqRel);
        let floor = self.floor_nanos();
        if nanos > floor.saturating_add(floor / 2) {
            return; // a slow query or a busy client, not a slow network
        }
        let _ = self
            .smoothed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                Some(if old == NO_SAMPLE || nanos <= old {
                    nanos
                } else {
                    old + (nanos - old) / 8
                })
            });
    }

    /// Starts a new window of the minimum. With no sample in the last one,
    /// it stays what it was.
    pub(crate) fn rotate(&self) {
        let last = self.current.swap(NO_SAMPLE, Ordering::AcqRel);
        if last != NO_SAMPLE {
            self.previous.store(last, Ordering::Release);
        }
    }

    fn floor_nanos(&self) -> u64 {
        self.current
            .load(Ordering::Acquire)
            .min(self.previous.load(Ordering::Acquire))
    }

    /// The smoothed estimate, once there is a sample.
    pub(crate) fn estimate(&self) -> Option<Duration> {
        let nanos = self.smoothed.load(Ordering::Acquire);
        (nanos != NO_SAMPLE).then(|| Duration::from_nanos(nanos))
    }
}

/// Where a direction of the stream is in the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Frontend only: the untyped start-up packet (length, then a code).
    Startup,
    /// Typed messages: a type byte, then an i32 length that counts itself.
    Typed,
    /// Frontend only: an SSLRequest went out; the server's one-byte answer
    /// decides between TLS (opaque) and plaintext (a start-up packet next).
    Negotiating,
    /// TLS or anything unparseable follows: count bytes only.
    Opaque,
}

/// Walks message boundaries in one direction of the stream.
#[derive(Debug)]
struct Framer {
    phase: Phase,
    header: [u8; 8],
    header_len: usize,
    /// Body bytes of the current message still to come.
    body_left: usize,
    kind: u8,
    /// The first body byte of the current message (ReadyForQuery's status).
    first: Option<u8>,
}

/// One complete message seen by a [`Framer`].
#[derive(Debug, Clone, Copy)]
struct Message {
    kind: u8,
    first: Option<u8>,
}

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

impl Framer {
    fn new(phase: Phase) -> Framer {
        Framer {
            phase,
            header: [0; 8],
            header_len: 0,
            body_left: 0,
            kind: 0,
            first: None,
        }
    }

    fn header_size(&self) -> usize {
        if self.phase == Phase::Startup { 8 } else { 5 }
    }

    /// Feeds bytes that went over the wire, calling `on_message` for each
    /// message that completes.
    fn feed(&mut self, mut bytes: &[u8], mut on_message: impl FnMut(Message)) {
        while !bytes.is_empty() && !matches!(self.phase, Phase::Opaque | Phase::Negotiating) {
            if self.body_left > 0 {
                let take = self.body_left.min(bytes.len());
                if self.first.is_none() {
                    self.first = Some(bytes[0]);
                }
                self.body_left -= take;
                bytes = &bytes[take..];
                if self.body_left == 0 {
                    self.finish(&mut on_message);
                }
                continue;
            }
            let need = self.header_size() - self.header_len;
            let take = need.min(bytes.len());
            self.header[self.header_len..self.header_len + take].copy_from_slice(&bytes[..take]);
            self.header_len += take;
            bytes = &bytes[take..];
            if self.header_len == self.header_size() {
                self.start_body(&mut on_message);
            }
        }
    }

    fn start_body(&mut self, on_message: &mut impl FnMut(Message)) {
        self.header_len = 0;
        self.first = None;
        let (kind, len_bytes, counted) = match self.phase {
            Phase::Startup => (0, &self.header[0..4], 8),
            _ => (self.header[0], &self.header[1..5], 4),
        };
        let len = i32::from_be_bytes(len_bytes.try_into().expect("4 bytes"));
        if len < counted as i32 {
            // Not a frame this parser understands: stop parsing, keep counting.
            self.phase = Phase::Opaque;
            return;
        }
        if self.phase == Phase::Startup {
            let code = u32::from_be_bytes(self.header[4..8].try_into().expect("4 bytes"));
            if code == SSL_REQUEST || code == GSSENC_REQUEST {
                // Not a request the server answers with ReadyForQuery: a
                // one-byte yes or no to encryption, which the reader sees.
                self.phase = Phase::Negotiating;
                return;
            }
            self.phase = Phase::Typed;
        }
        self.kind = kind;
        self.body_left = len as usize - counted;
        if self.body_left == 0 {
            self.finish(on_message);
        }
    }

    fn finish(&mut self, on_message: &mut impl FnMut(Message)) {
        on_message(Message {
            kind: self.kind,
            first: self.first.take(),
        });
    }
}

/// A stream that reports what crosses it to its [`ConnState`] and the
/// pool's [`PoolWire`].
#[derive(Debug)]
pub(crate) struct TappedStream<S> {
    inner: S,
    state: Arc<ConnState>,
    pool: Arc<PoolWire>,
    outbound: Framer,
    inbound: Framer,
    /// A round trip being timed: when a write found the connection idle,
    /// and the count of ReadyForQuery that answers its first query.
    probe: Option<(Instant, u64)>,
}

impl<S> TappedStream<S> {
    /// Wraps a plain (not yet TLS) stream whose first outbound bytes are the
    /// start-up packet.
    pub(crate) fn new(inner: S, state: Arc<ConnState>, pool: Arc<PoolWire>) -> TappedStream<S> {
        TappedStream {
            inner,
            state,
            pool,
            outbound: Framer::new(Phase::Startup),
            inbound: Framer::new(Phase::Typed),
            probe: None,
        }
    }

    /// The wrapped stream.
    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }

    fn observe_read(&mut self, mut bytes: &[u8]) {
        let now = self.pool.clock.load(Ordering::Relaxed);
        if self.state.last_read.load(Ordering::Relaxed) != now {
            self.state.last_read.store(now, Ordering::Relaxed);
        }
        match (self.outbound.phase, bytes.first()) {
            // The server's answer to an SSLRequest: `S` (or `G`), encryption
            // follows and a tap above it sees the protocol; `N`, plaintext.
            (Phase::Negotiating, Some(b'N')) => {
                self.outbound.phase = Phase::Startup;
                bytes = &bytes[1..];
            }
            (Phase::Negotiating, Some(_)) | (Phase::Opaque, _) => {
                self.outbound.phase = Phase::Opaque;
                self.inbound.phase = Phase::Opaque;
            }
            _ => {}
        }
        let (state, metrics) = (&self.state, &self.pool.metrics);
        let quarantine = |reason: u8| {
            if state.quarantine(reason) {
                if let Some(metrics) = metrics {
                    metrics.wire.quarantined[usize::from(reason - 1)].inc();
                }
            }
        };
        let mut readies = 0;
        self.inbound.feed(bytes, |message| match message.kind {
            b'Z' => {
                let status = message.first.unwrap_or(b'I');
                state.tx_status.store(status, Ordering::Release);
                readies += 1;
                if status != b'I' {
                    quarantine(QUARANTINE_TX);
                }
            }
            // ParameterStatus before the first ReadyForQuery is start-up.
            b'S' if state.readies.load(Ordering::Acquire) + readies > 0 => {
                quarantine(QUARANTINE_SESSION);
            }
            _ => {}
        });
        if readies > 0 {
            state
                .progress
                .store(self.pool.now_nanos(), Ordering::Relaxed);
            let answered = state.readies.fetch_add(readies, Ordering::AcqRel) + readies;
            if let Some((sent, awaited)) = self.probe {
                if answered >= awaited {
                    self.pool.rtt.sample(sent.elapsed());
                    self.probe = None;
                }
            }
        }
    }

    /// Before a write: if the connection is idle (and no round trip is being
    /// timed), the time to time one from. Taken *before* the write, so that
    /// the thread being preempted between the system call and the clock
    /// read (milliseconds, on a busy host) can only make a sample longer,
    /// which the estimate ignores, never shorter, which it would believe.
    fn probe_start(&self) -> Option<Instant> {
        let idle =
            self.state.syncs.load(Ordering::Acquire) == self.state.readies.load(Ordering::Acquire);
        (idle && self.probe.is_none()).then(Instant::now)
    }

    fn observe_write(&mut self, bytes: &[u8], probe_start: Option<Instant>) {
        // Requests are what the server answers with one ReadyForQuery
        // each: a Sync ends an extended-protocol request (the pipelined
        // queries); a simple Query (a `batch_execute`, the pool's own
        // session reset) and the untyped start-up packet are requests too,
        // but take no part in batching, and the start-up (several round
        // trips of authentication) is no round-trip sample.
        let (mut syncs, mut others) = (0, 0);
        self.outbound.feed(bytes, |message| match message.kind {
            b'S' => syncs += 1,
            0 | b'Q' | b'F' => others += 1,
            _ => {}
        });
        if others > 0 {
            self.state.syncs.fetch_add(others, Ordering::AcqRel);
        }
        if syncs == 0 {
            return;
        }
        let before = self.state.syncs.fetch_add(syncs, Ordering::AcqRel);
        let idle = before == self.state.readies.load(Ordering::Acquire);
        if let (true, Some(start)) = (idle, probe_start) {
            self.probe = Some((start, before + 1));
        }
        if idle {
            // Nothing was owed until now: the stall clock starts here.
            let now = self.pool.clock.load(Ordering::Relaxed);
            self.state.last_read.store(now, Ordering::Relaxed);
            self.state
                .progress
                .store(self.pool.now_nanos(), Ordering::Relaxed);
        }
        if let Some(metrics) = &self.pool.metrics {
            if self.state.is_shared() {
                // The first query written to an idle connection pays a round
                // trip; every other one rides along.
                let saved = if idle { syncs - 1 } else { syncs };
                metrics.wire.batch_size.observe(syncs as f64);
                metrics.wire.round_trips_saved.inc_by(saved);
                if let Some(rtt) = self.pool.rtt.estimate() {
                    metrics
                        .wire
                        .latency_saved
                        .inc_by(saved as f64 * rtt.as_secs_f64());
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TappedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = result {
            let filled = &buf.filled()[before..];
            if !filled.is_empty() {
                self.observe_read(filled);
            }
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TappedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let probe_start = self.probe_start();
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = result {
            self.observe_write(&buf[..n], probe_start);
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(phase: Phase, chunks: &[&[u8]]) -> Vec<(u8, Option<u8>)> {
        let mut framer = Framer::new(phase);
        let mut seen = Vec::new();
        for chunk in chunks {
            framer.feed(chunk, |m| seen.push((m.kind, m.first)));
        }
        seen
    }

    #[test]
    fn counts_syncs_across_split_writes() {
        // Bind(empty body) + Sync + Sync, split inside a header.
        let bytes: &[u8] = &[b'B', 0, 0, 0, 5, 9, b'S', 0, 0, 0, 4, b'S', 0, 0, 0, 4];
        for split in 0..bytes.len() {
            let (a, b) = bytes.split_at(split);
            let seen = messages(Phase::Typed, &[a, b]);
            let syncs = seen.iter().filter(|(k, _)| *k == b'S').count();
            assert_eq!(syncs, 2, "split at {split}");
        }
    }

    #[test]
    fn random_streams_split_anywhere_are_counted_exactly() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let mut stream = Vec::new();
            let mut syncs = 0;
            for _ in 0..(next() % 50) {
                let kind = [b'B', b'E', b'S', b'P', b'D', b'C'][(next() % 6) as usize];
                let body = if kind == b'S' {
                    0
                } else {
                    (next() % 300) as usize
                };
                syncs += usize::from(kind == b'S');
                stream.push(kind);
                stream.extend_from_slice(&((body + 4) as i32).to_be_bytes());
                stream.extend((0..body).map(|_| (next() % 256) as u8));
            }
            let mut framer = Framer::new(Phase::Typed);
            let mut seen = 0;
            let mut rest = stream.as_slice();
            while !rest.is_empty() {
                let n = 1 + (next() as usize % rest.len().min(97));
                framer.feed(&rest[..n], |m| seen += usize::from(m.kind == b'S'));
                rest = &rest[n..];
            }
            assert_eq!(seen, syncs);
            assert_eq!(framer.phase, Phase::Typed);
        }
    }

    #[test]
    fn reads_ready_for_query_status_byte_split_from_header() {
        let seen = messages(Phase::Typed, &[&[b'Z', 0, 0, 0, 5], b"T"]);
        assert_eq!(seen, vec![(b'Z', Some(b'T'))]);
    }

    #[test]
    fn startup_packet_then_typed_messages() {
        let mut startup = vec![0, 0, 0, 9, 0, 3, 0, 0, 0];
        startup.extend_from_slice(&[b'S', 0, 0, 0, 4]);
        let seen = messages(Phase::Startup, &[&startup]);
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1].0, b'S');
    }

    #[test]
    fn an_ssl_request_is_not_a_request_and_waits_for_the_answer() {
        let mut bytes = vec![0, 0, 0, 8];
        bytes.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        bytes.extend_from_slice(&[b'S', 0, 0, 0, 4]);
        let seen = messages(Phase::Startup, &[&bytes]);
        assert!(
            seen.is_empty(),
            "neither the SSLRequest nor what follows it"
        );
    }

    #[test]
    fn a_refused_ssl_request_falls_back_to_plaintext() {
        let state = Arc::new(ConnState::default());
        let mut tap = TappedStream::new((), Arc::clone(&state), Arc::new(PoolWire::default()));
        let mut ssl = vec![0, 0, 0, 8];
        ssl.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        tap.observe_write(&ssl, None);
        tap.observe_read(b"N");
        let startup = [0, 0, 0, 9, 0, 3, 0, 0, 0];
        tap.observe_write(&startup, None);
        tap.observe_read(&[b'Z', 0, 0, 0, 5, b'I']);
        let requests = state.syncs.load(Ordering::Relaxed);
        assert_eq!((requests, state.readies.load(Ordering::Relaxed)), (1, 1));
    }

    #[test]
    fn an_accepted_ssl_request_makes_the_raw_stream_opaque() {
        let state = Arc::new(ConnState::default());
        let mut tap = TappedStream::new((), Arc::clone(&state), Arc::new(PoolWire::default()));
        let mut ssl = vec![0, 0, 0, 8];
        ssl.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        tap.observe_write(&ssl, None);
        tap.observe_read(b"S\x16\x03\x03");
        tap.observe_write(&[b'S', 0, 0, 0, 4], None);
        assert_eq!(
            state.syncs.load(Ordering::Relaxed),
            0,
            "ciphertext is not parsed"
        );
    }

    #[test]
    fn nonsense_length_stops_parsing_instead_of_panicking() {
        let seen = messages(Phase::Typed, &[&[b'D', 0xff, 0xff, 0xff, 0xff, 1, 2, 3]]);
        assert!(seen.is_empty());
        let seen = messages(Phase::Typed, &[&[b'D', 0, 0, 0, 2]]);
        assert!(seen.is_empty());
    }

    #[test]
    fn rtt_filter_smooths_and_ignores_slow_queries() {
        let filter = RttFilter::default();
        assert_eq!(filter.estimate(), None);
        filter.sample(Duration::from_micros(1000));
        assert_eq!(filter.estimate(), Some(Duration::from_micros(1000)));
        filter.sample(Duration::from_micros(1400));
        assert_eq!(filter.estimate(), Some(Duration::from_micros(1050)));
        filter.sample(Duration::from_micros(1800));
        assert_eq!(
            filter.estimate(),
            Some(Duration::from_micros(1050)),
            "too slow to count"
        );
        filter.sample(Duration::from_micros(1010));
        assert_eq!(
            filter.estimate(),
            Some(Duration::from_micros(1010)),
            "drops at once"
        );
        filter.sample(Duration::from_micros(1050));
        assert_eq!(filter.estimate(), Some(Duration::from_micros(1015)));
        // A 20 ms query sent alone is not a 20 ms network.
        filter.sample(Duration::from_millis(20));
        assert_eq!(filter.estimate(), Some(Duration::from_micros(1015)));
        // When the network really slows down, the old minimum ages out
        // (two windows later) and the estimate follows.
        for _ in 0..2 {
            filter.rotate();
            filter.sample(Duration::from_millis(5));
        }
        for _ in 0..40 {
            filter.sample(Duration::from_millis(5));
        }
        let estimate = filter.estimate().unwrap();
        assert!(estimate > Duration::from_millis(4), "{estimate:?}");
    }
}
