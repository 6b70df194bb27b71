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

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::PoolWire;
use super::state::ConnState;
use super::state::held::POOL_OWN;
use crate::metrics::CloseReason;
use crate::protocol::coalesce::Grouping;
use crate::protocol::framer::{Framer, Phase};
use crate::protocol::gate::Gate;
use crate::protocol::sql_guard;
use crate::protocol::watch::{SessionWatch, Verdict};
use groups::Groups;
use held::HeldRequests;

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
        let state = &self.state;
        let watch = &mut self.watch;
        let pool = &self.pool;
        let answered_before = state.counts.readies();
        let (mut readies, mut copy_ins) = (0, 0);
        let held = &mut self.held;
        let counted = pool.metrics.as_deref().filter(|_| !held.is_empty());
        self.inbound.feed(bytes, |message| match message.kind {
            // COPY FROM STDIN over the extended protocol: the Sync sent
            // behind its Execute is ignored in copy-in mode, and the one
            // after CopyDone is answered. One request fewer than written.
            b'G' => {
                copy_ins += 1;
                held.copy_in(answered_before + readies + 1);
            }
            b'Z' => {
                let status = message.first.unwrap_or(b'I');
                state.session.set_tx_status(status);
                readies += 1;
                held.ready(answered_before + readies);
                if let Some(verdict) = watch.on_ready(status, answered_before + readies) {
                    apply(state, pool, verdict);
                }
            }
            b'C' | b'I' | b'E' => {
                if let Some(metrics) = counted {
                    held.answer(answered_before + readies + 1, message.kind, metrics);
                }
            }
            b'S' => {
                let name = message.parameter_name();
                if let Some(verdict) = watch.on_parameter(name, answered_before + readies) {
                    apply(state, pool, verdict);
                }
            }
            _ => {}
        });
        if copy_ins > 0 {
            state.counts.unanswered(copy_ins);
        }
        if readies > 0 {
            let answered = state.counts.answered(readies, self.pool.now_nanos());
            state.wake();
            if let Some(waker) = self.gate.as_mut().and_then(|gate| gate.1.take()) {
                waker.wake();
            }
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
        let idle = self.state.counts.is_idle();
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
        let written_before = self.state.counts.requests();
        let shared = self.state.load.is_shared();
        if !shared {
            self.watch.unshared();
        }
        // A holder's requests, counted as their answers come (see `held`).
        let holder =
            (!shared && self.pool.metrics.is_some() && self.state.held.is_on()).then(Instant::now);
        let held = &mut self.held;
        let watch = &mut self.watch;
        // An exclusive connection's SQL is read as it goes out, whoever
        // sends it (the pool's methods, or the raw client a checkout derefs
        // to): what no reset undoes closes the connection when it comes back.
        self.outbound.capture_sql(!shared);
        let mut lasting = false;
        let pool = &self.pool;
        // Loaded once per write, at its first SQL.
        let mut catalog = None;
        self.outbound.feed(bytes, |message| {
            if let Some(body) = message.body {
                let catalog = catalog.get_or_insert_with(|| pool.catalog_full());
                lasting |= sql_guard::sends_lasting_state(message.kind, body, catalog);
            }
            match message.kind {
                b'S' => syncs += 1,
                b'Q' if shared => {
                    others += 1;
                    let request = written_before + syncs + others;
                    watch.on_simple_query(message.parameter_name(), request);
                }
                0 | b'Q' | b'F' => others += 1,
                b'E' => return held.execute(),
                _ => return,
            }
            let request = written_before + syncs + others;
            match message.kind {
                // The pool's own simple queries are not the holder's.
                b'Q' if message.prefix.starts_with(POOL_OWN.as_bytes()) => {}
                b'Q' | b'S' => held.written(request, holder, message.kind == b'Q'),
                _ => {}
            }
        });
        if lasting {
            self.state.life.closing(CloseReason::ResetFailed);
        }
        if others > 0 {
            self.state.counts.wrote(others);
        }
        if syncs == 0 {
            return;
        }
        let before = self.state.counts.wrote(syncs);
        let idle = before == self.state.counts.readies();
        if let (true, Some(start)) = (idle, probe_start) {
            self.probe = Some((start, before + 1));
        }
        if idle {
            // Nothing was owed until now: the stall clock starts here.
            let now = self.pool.ticks();
            self.state.counts.woke(now, self.pool.now_nanos());
        }
        if let Some(metrics) = &self.pool.metrics {
            if self.state.load.is_shared() {
                // The first query written to an idle connection pays a round
                // trip; every other one rides along.
                let saved = if idle { syncs - 1 } else { syncs };
                metrics.wire.batch_size.observe(syncs as f64);
                metrics.wire.round_trips_saved.inc_by(saved);
            }
        }
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
