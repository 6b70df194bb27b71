//! Seeing the wire: a stream wrapper that watches every byte a connection
//! writes and reads.
//!
//! tokio-postgres takes any `AsyncRead + AsyncWrite` stream through
//! [`Config::connect_raw`](tokio_postgres::Config::connect_raw). The pool
//! hands it a [`TappedStream`], which walks the protocol's message frames
//! (see [`framer`](crate::protocol::framer)) and records:
//!
//! - how many requests each socket write carried (the `Sync`s: the real
//!   batch size of a pipeline, as the network sees it) and every
//!   `ReadyForQuery`, into the connection's
//!   [`WireCounts`](super::state::counts::WireCounts): the ground truth for
//!   the pipeline depth;
//! - each `ReadyForQuery`'s transaction-status byte (`I` idle, `T` in a
//!   transaction, `E` failed transaction), into its
//!   [`Session`](super::state::session::Session);
//! - the round trips of solitary queries, into the pool's RTT estimate.
//!
//! What an answer means for the session (a transaction left open, a
//! setting changed, a standby promoted) is
//! [`SessionWatch`]'s to decide, a
//! pure function of the messages the tap hands it; the tap applies its
//! verdicts at once, from inside the read: a shared connection is
//! quarantined and takes no new query. The tap writes the connection's
//! state and the pool's [`PoolWire`], nothing else.
//!
//! On a connection a caller holds, it counts every statement the server
//! answers for them, whichever method sent it ([`held`]).
//!
//! On a read lane's connection the tap also rewrites the wire for read
//! groups ([`groups`]); behind a pooler that needs it, it holds each write
//! to one request group on the wire at a time (the gate, below).

mod groups;
mod held;
mod reads;
mod writes;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::PoolWire;
use super::state::ConnState;
use crate::protocol::coalesce::Grouping;
use crate::protocol::framer::{Framer, Phase};
use crate::protocol::gate::Gate;
use crate::protocol::watch::{SessionWatch, Verdict};
use groups::Groups;
use held::HeldRequests;
use reads::ReadTally;
use writes::WriteTally;

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
    /// On a read lane's connection: the read-group rewriter and its
    /// buffers (see [`coalesce`](crate::protocol::coalesce)).
    groups: Option<Box<Groups>>,
    /// What the answers say about the session, and the atomic batches
    /// written while the connection was shared (boxed: the tap moves
    /// through every connect future, which queries may hold).
    watch: Box<SessionWatch>,
    /// Behind a pooler that cannot track a pipeline: one request group on
    /// the wire at a time (see [`gate`](crate::protocol::gate)), and the
    /// write waiting for the answer that opens it.
    gate: Option<Box<(Gate, Option<std::task::Waker>)>>,
    /// The requests a caller holding the connection wrote, for counting
    /// their statements.
    held: HeldRequests,
}

impl<S> TappedStream<S> {
    /// Wraps a plain (not yet TLS) stream whose first outbound bytes are the
    /// start-up packet.
    pub(crate) fn new(inner: S, state: Arc<ConnState>, pool: Arc<PoolWire>) -> TappedStream<S> {
        let watch = SessionWatch::new(state.traits.behind_transaction_pooler());
        TappedStream {
            inner,
            pool,
            outbound: Framer::new(Phase::Startup),
            inbound: Framer::new(Phase::Typed),
            probe: None,
            groups: match state.traits.read_groups() {
                Grouping::Off => None,
                grouping => Some(Box::new(Groups::new(grouping))),
            },
            watch: Box::new(watch),
            gate: state.traits.one_at_a_time().then(Box::default),
            held: HeldRequests::default(),
            state,
        }
    }

    /// The wrapped stream.
    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }

    fn observe_read(&mut self, mut bytes: &[u8]) {
        self.state.counts.progressed_if_moved(self.pool.ticks());
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
        let (state, pool) = (&self.state, &self.pool);
        let mut tally = ReadTally::new(state, pool, &mut self.held, &mut self.watch);
        self.inbound.feed(bytes, |message| tally.message(&message));
        let read = tally.finish();
        self.was_read(read);
    }

    /// Before a write: if the connection is idle (and no round trip is being
    /// timed), the time to time one from. Taken *before* the write, so that
    /// the thread being preempted between the system call and the clock
    /// read (milliseconds, on a busy host) can only make a sample longer,
    /// which the estimate ignores, never shorter, which it would believe.
    fn probe_start(&self) -> Option<Instant> {
        let idle = self.state.counts.is_idle();
        (idle && self.probe.is_none()).then(Instant::now)
    }

    fn observe_write(&mut self, bytes: &[u8], probe_start: Option<Instant>) {
        let shared = self.state.load.is_shared();
        self.outbound.capture_sql(!shared);
        let (state, pool) = (&self.state, &self.pool);
        let mut tally = WriteTally::new(state, pool, &mut self.held, &mut self.watch, shared);
        self.outbound.feed(bytes, |message| tally.message(&message));
        let written = tally.finish();
        self.wrote(written, probe_start);
    }

    /// What of `buf` may be written now: all of it, except behind a pooler
    /// that cannot track a pipeline, where a write stops at the end of its
    /// first request group and the next group waits for every answer owed
    /// (`None`: nothing yet; the task is woken at the next ReadyForQuery).
    /// Only past start-up and on the plaintext protocol: under TLS the tap
    /// above the encryption holds the gate.
    fn gate_if_active(&mut self) -> Option<&mut (Gate, Option<std::task::Waker>)> {
        let active = self.outbound.phase == Phase::Typed && self.state.counts.readies() > 0;
        self.gate.as_deref_mut().filter(|_| active)
    }

    fn gated<'b>(&mut self, cx: &mut Context<'_>, buf: &'b [u8]) -> Option<&'b [u8]> {
        if self.gate.is_none() {
            return Some(buf);
        }
        let state = Arc::clone(&self.state);
        let owed = || state.counts.depth() > 0 && !state.load.is_dead();
        let Some(gate) = self.gate_if_active() else {
            return Some(buf);
        };
        let allowed = gate.0.allowed(buf, owed());
        if allowed > 0 || buf.is_empty() {
            return Some(&buf[..allowed]);
        }
        gate.1 = Some(cx.waker().clone());
        // An answer may have come in meanwhile: look again.
        if owed() {
            return None;
        }
        gate.1 = None;
        Some(&buf[..gate.0.allowed(buf, false)])
    }
}

impl<S> TappedStream<S> {
    /// The socket ended (end of file, an error): a holder's requests
    /// still unanswered never will be.
    fn ended(&mut self) {
        if let Some(metrics) = &self.pool.metrics {
            self.held.lost(metrics);
        }
    }
}

impl<S> Drop for TappedStream<S> {
    /// The pool closed the connection (its I/O task ended) with a holder's
    /// requests unanswered.
    fn drop(&mut self) {
        self.ended();
    }
}

/// Applies what the watch decided about an answer.
fn apply(state: &ConnState, pool: &PoolWire, verdict: Verdict) {
    state.quarantine(verdict.reason());
    match verdict {
        // Something ran that the guard did not expect to: the catalog may
        // know more now.
        Verdict::Transaction | Verdict::SessionState => pool.suspect_catalog(),
        // The pool re-checks every host's role.
        Verdict::RoleChange => pool.role_changed(),
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TappedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.grouping() {
            return self.poll_read_grouped(cx, buf);
        }
        let (before, room) = (buf.filled().len(), buf.remaining() > 0);
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &result {
            Poll::Ready(Ok(())) if buf.filled().len() > before || !room => {
                self.observe_read(&buf.filled()[before..]);
                self.arm_groups();
            }
            Poll::Ready(_) => self.ended(),
            Poll::Pending => {}
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
        if self.grouping() {
            return self.poll_write_grouped(cx, buf);
        }
        let buf = match self.gated(cx, buf) {
            Some(buf) => buf,
            None => return Poll::Pending,
        };
        let probe_start = self.probe_start();
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = result {
            if let Some(gate) = self.gate_if_active() {
                gate.0.advance(&buf[..n]);
            }
            self.observe_write(&buf[..n], probe_start);
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
