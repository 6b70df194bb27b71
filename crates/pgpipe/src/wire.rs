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
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Upper bounds of the batch-size buckets: 1, 2, 4 … 256 Syncs per write,
/// and a last bucket for anything larger.
pub(crate) const BATCH_BUCKETS: [u64; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

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
    /// Sync messages written.
    pub(crate) syncs: AtomicU64,
    /// ReadyForQuery messages read.
    pub(crate) readies: AtomicU64,
    /// Socket writes that carried at least one Sync.
    pub(crate) batches: AtomicU64,
    /// Histogram of Syncs per write, by [`BATCH_BUCKETS`].
    pub(crate) batch_hist: [AtomicU64; 10],
    /// Bytes written and read.
    pub(crate) bytes_out: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    /// Why the connection was quarantined, if it was.
    pub(crate) quarantined: AtomicU8,
}

/// Reasons for a quarantine, stored in [`ConnState::quarantined`].
pub(crate) const QUARANTINE_TX: u8 = 1;
pub(crate) const QUARANTINE_SESSION: u8 = 2;

impl ConnState {
    /// Queries written and not yet answered (Syncs minus ReadyForQuery).
    pub(crate) fn wire_depth(&self) -> u64 {
        let readies = self.readies.load(Ordering::Acquire);
        self.syncs.load(Ordering::Acquire).saturating_sub(readies)
    }

    /// Stops routing to this connection and marks it for a reset. Called from
    /// the read path when a shared connection shows session state.
    fn quarantine(&self, reason: u8) {
        if self.load.load(Ordering::Acquire) & SHARED == 0 {
            return; // exclusive connections may hold any state they like
        }
        self.needs_reset.store(true, Ordering::Release);
        let _ = self
            .quarantined
            .compare_exchange(0, reason, Ordering::AcqRel, Ordering::Acquire);
        self.load.fetch_or(CLOSED, Ordering::AcqRel);
    }

    fn record_batch(&self, syncs: u64) {
        self.syncs.fetch_add(syncs, Ordering::AcqRel);
        self.batches.fetch_add(1, Ordering::Relaxed);
        let bucket = BATCH_BUCKETS
            .iter()
            .position(|&upper| syncs <= upper)
            .unwrap_or(BATCH_BUCKETS.len());
        self.batch_hist[bucket].fetch_add(1, Ordering::Relaxed);
    }
}

/// Where a direction of the stream is in the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Frontend only: the untyped start-up packet (length, then a code).
    Startup,
    /// Typed messages: a type byte, then an i32 length that counts itself.
    Typed,
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
        while !bytes.is_empty() && self.phase != Phase::Opaque {
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
            self.phase = if code == SSL_REQUEST || code == GSSENC_REQUEST {
                Phase::Opaque
            } else {
                Phase::Typed
            };
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

/// A stream that reports what crosses it to a [`ConnState`].
#[derive(Debug)]
pub(crate) struct TappedStream<S> {
    inner: S,
    state: std::sync::Arc<ConnState>,
    outbound: Framer,
    inbound: Framer,
}

impl<S> TappedStream<S> {
    /// Wraps a plain (not yet TLS) stream whose first outbound bytes are the
    /// start-up packet.
    pub(crate) fn new(inner: S, state: std::sync::Arc<ConnState>) -> TappedStream<S> {
        TappedStream {
            inner,
            state,
            outbound: Framer::new(Phase::Startup),
            inbound: Framer::new(Phase::Typed),
        }
    }

    fn observe_read(&mut self, bytes: &[u8]) {
        let state = &self.state;
        state
            .bytes_in
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if self.outbound.phase == Phase::Opaque {
            self.inbound.phase = Phase::Opaque;
        }
        self.inbound.feed(bytes, |message| match message.kind {
            b'Z' => {
                let status = message.first.unwrap_or(b'I');
                state.tx_status.store(status, Ordering::Release);
                state.readies.fetch_add(1, Ordering::AcqRel);
                if status != b'I' {
                    state.quarantine(QUARANTINE_TX);
                }
            }
            // ParameterStatus before the first ReadyForQuery is start-up.
            b'S' if state.readies.load(Ordering::Acquire) > 0 => {
                state.quarantine(QUARANTINE_SESSION);
            }
            _ => {}
        });
    }

    fn observe_write(&mut self, bytes: &[u8]) {
        self.state
            .bytes_out
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let mut syncs = 0;
        self.outbound.feed(bytes, |message| {
            if message.kind == b'S' {
                syncs += 1;
            }
        });
        if syncs > 0 {
            self.state.record_batch(syncs);
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
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = result {
            self.observe_write(&buf[..n]);
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
    fn ssl_request_makes_the_stream_opaque() {
        let mut bytes = vec![0, 0, 0, 8];
        bytes.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        bytes.extend_from_slice(&[b'S', 0, 0, 0, 4]);
        let seen = messages(Phase::Startup, &[&bytes]);
        assert_eq!(seen.len(), 1, "nothing after the SSLRequest is parsed");
    }

    #[test]
    fn nonsense_length_stops_parsing_instead_of_panicking() {
        let seen = messages(Phase::Typed, &[&[b'D', 0xff, 0xff, 0xff, 0xff, 1, 2, 3]]);
        assert!(seen.is_empty());
        let seen = messages(Phase::Typed, &[&[b'D', 0, 0, 0, 2]]);
        assert!(seen.is_empty());
    }

    #[test]
    fn batch_histogram_buckets() {
        let state = ConnState::default();
        for syncs in [1, 2, 3, 256, 257] {
            state.record_batch(syncs);
        }
        let hist: Vec<u64> = state
            .batch_hist
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        assert_eq!(hist, vec![1, 1, 1, 0, 0, 0, 0, 0, 1, 1]);
        assert_eq!(state.syncs.load(Ordering::Relaxed), 519);
    }
}
