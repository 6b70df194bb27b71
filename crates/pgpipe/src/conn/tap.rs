//! Seeing the wire: a stream wrapper that watches every byte a connection
//! writes and reads.
//!
//! tokio-postgres takes any `AsyncRead + AsyncWrite` stream through
//! [`Config::connect_raw`](tokio_postgres::Config::connect_raw). The pool
//! hands it a [`TappedStream`], which walks the protocol's message frames
//! (see [`framer`](crate::protocol::framer)) and records:
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
//! inside the read: its [`ConnState`] takes no new query. The tap reports
//! into the connection's state and the pool's [`PoolWire`], nothing else.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::PoolWire;
use super::state::ConnState;
use crate::metrics::QuarantineReason;
use crate::protocol::coalesce::{self, Coalescer, SHRINK_ABOVE};
use crate::protocol::framer::{Framer, Phase};
use crate::protocol::gate::Gate;
use crate::protocol::sql_guard;

/// Reported settings that describe the server, not a session: no session
/// can change them (`in_hot_standby` turns off when a standby is promoted).
const SERVER_STATE: [&[u8]; 4] = [
    b"in_hot_standby",
    b"server_version",
    b"server_encoding",
    b"integer_datetimes",
];

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
    /// Atomic batches written while the connection was shared (boxed: the
    /// tap moves through every connect future, which queries may hold).
    units: Box<Units>,
    /// Behind a pooler that cannot track a pipeline: one request group on
    /// the wire at a time (see [`gate`](crate::protocol::gate)), and the write waiting
    /// for the answer that opens it.
    gate: Option<Box<(Gate, Option<std::task::Waker>)>>,
}

/// The atomic batches a shared connection carries, as the numbers of the
/// requests that open and close them (`BEGIN`, and `COMMIT` or `ROLLBACK`,
/// as simple queries: on a shared connection only the pool sends those,
/// since the guard refuses transaction control there). The answers between
/// them may show a transaction (`T`, or `E` after a failed item), and the
/// `ParameterStatus` a `SET LOCAL` inside sends (and its `COMMIT` undoes);
/// any other answer that shows a transaction quarantines the connection,
/// as does a `COMMIT` that leaves one open. Forgotten at the first write
/// while the connection is not shared: a batch whose close went out then
/// was never seen closing, and must not cover what comes after.
#[derive(Debug, Default)]
struct Units(std::collections::VecDeque<(u64, u64)>);

impl Units {
    /// Request number `request` is the simple query `sql` (its first bytes).
    fn note(&mut self, sql: &[u8], request: u64) {
        match sql {
            b"BEGIN" => self.0.push_back((request, u64::MAX)),
            b"COMMIT" | b"ROLLBACK" => {
                if let Some(open) = self.0.back_mut().filter(|(_, end)| *end == u64::MAX) {
                    open.1 = request;
                }
            }
            _ => {}
        }
    }

    /// Whether the answer to request number `request` may show an open
    /// transaction: it is a batch's `BEGIN` or one of its items. Answers
    /// come in request order, so batches answered in full are forgotten.
    fn inside(&mut self, request: u64) -> bool {
        self.front_for(request)
            .is_some_and(|(begin, end)| (begin..end).contains(&request))
    }

    /// Whether request number `request` belongs to a batch, its `COMMIT`
    /// included.
    fn covers(&mut self, request: u64) -> bool {
        self.front_for(request)
            .is_some_and(|(begin, end)| (begin..=end).contains(&request))
    }

    fn front_for(&mut self, request: u64) -> Option<(u64, u64)> {
        while self.0.front().is_some_and(|(_, end)| *end < request) {
            self.0.pop_front();
        }
        self.0.front().copied()
    }
}

/// What a connection that groups reads keeps between polls.
#[derive(Debug, Default)]
struct Groups {
    rewriter: Coalescer,
    /// Rewritten bytes not yet written to the socket.
    out: Vec<u8>,
    out_pos: usize,
    /// Rewritten bytes not yet read by the client.
    input: Vec<u8>,
    in_pos: usize,
    /// The rewriter lost step: returned once what came before is read.
    failed: Option<coalesce::Confused>,
}

/// How much is read from the socket at once on a connection that groups
/// reads.
const READ_CHUNK: usize = 16 * 1024;

impl<S> TappedStream<S> {
    /// Wraps a plain (not yet TLS) stream whose first outbound bytes are the
    /// start-up packet.
    pub(crate) fn new(inner: S, state: Arc<ConnState>, pool: Arc<PoolWire>) -> TappedStream<S> {
        TappedStream {
            inner,
            pool,
            outbound: Framer::new(Phase::Startup),
            inbound: Framer::new(Phase::Typed),
            probe: None,
            groups: state.traits.read_groups().then(Box::default),
            units: Box::default(),
            gate: state.traits.one_at_a_time().then(Box::default),
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
        let units = &mut self.units;
        let pool = &self.pool;
        let answered_before = state.counts.readies();
        let (mut readies, mut copy_ins) = (0, 0);
        self.inbound.feed(bytes, |message| match message.kind {
            // COPY FROM STDIN over the extended protocol: the Sync sent
            // behind its Execute is ignored in copy-in mode, and the one
            // after CopyDone is answered. One request fewer than written.
            b'G' => copy_ins += 1,
            b'Z' => {
                let status = message.first.unwrap_or(b'I');
                state.session.set_tx_status(status);
                readies += 1;
                let in_batch = units.inside(answered_before + readies);
                if status != b'I' && !in_batch {
                    state.quarantine(QuarantineReason::Transaction);
                    // Something ran that the guard did not expect to: the
                    // catalog may know more now.
                    pool.suspect_catalog();
                }
            }
            // ParameterStatus before the first ReadyForQuery is start-up;
            // a change of the server's own state (a standby promoted) is no
            // session's doing; behind a transaction pooler it comes from
            // whichever server is linked.
            // A standby promoted under a connection: its host's role
            // changed. The connection finishes what it carries and takes
            // nothing new; the pool re-checks every host's role.
            b'S' if state.counts.readies() + readies > 0
                && message.parameter_name() == b"in_hot_standby"
                && !state.traits.behind_transaction_pooler() =>
            {
                state.quarantine(QuarantineReason::RoleChange);
                self.pool.role_changed();
            }
            b'S' if state.counts.readies() + readies > 0
                && !SERVER_STATE.contains(&message.parameter_name())
                && !state.traits.behind_transaction_pooler()
                && !units.covers(answered_before + readies + 1) =>
            {
                state.quarantine(QuarantineReason::SessionState);
                pool.suspect_catalog();
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
        if !shared && !self.units.0.is_empty() {
            self.units.0.clear();
        }
        let units = &mut self.units;
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
                    units.note(message.parameter_name(), written_before + syncs + others);
                }
                0 | b'Q' | b'F' => others += 1,
                _ => {}
            }
        });
        if lasting {
            self.state
                .life
                .closing(crate::metrics::CloseReason::ResetFailed);
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

impl<S> TappedStream<S> {
    /// Whether this tap rewrites read groups now: a read lane's
    /// connection, past start-up, on the plaintext protocol (under TLS the
    /// tap above the encryption does it).
    fn grouping(&self) -> bool {
        self.groups.as_ref().is_some_and(|g| g.rewriter.is_armed())
    }

    /// Arms the rewriter at the first ReadyForQuery: start-up is done and
    /// nothing else was written.
    fn arm_groups(&mut self) {
        let ready = self.outbound.phase == Phase::Typed
            && self.inbound.at_boundary()
            && self.state.counts.readies() > 0;
        if let Some(groups) = self.groups.as_mut() {
            if ready && !groups.rewriter.is_armed() {
                groups.rewriter.arm();
            }
        }
    }

    /// Counts what the rewriter saved since the last call.
    fn count_groups(&mut self) {
        let Some(groups) = self.groups.as_mut() else {
            return;
        };
        let saved = std::mem::take(&mut groups.rewriter.saved);
        let sizes = std::mem::take(&mut groups.rewriter.groups);
        if let Some(metrics) = &self.pool.metrics {
            if saved > 0 {
                metrics.wire.syncs_saved.inc_by(saved);
            }
            for size in sizes {
                metrics.wire.group_size.observe(size as f64);
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
        if !self.grouping() {
            let before = buf.filled().len();
            let result = Pin::new(&mut self.inner).poll_read(cx, buf);
            if let Poll::Ready(Ok(())) = result {
                let filled = &buf.filled()[before..];
                if !filled.is_empty() {
                    self.observe_read(filled);
                    self.arm_groups();
                }
            }
            return result;
        }
        loop {
            // Rewritten bytes first.
            let this = &mut *self;
            let groups = this.groups.as_mut().expect("grouping");
            if groups.in_pos < groups.input.len() {
                let input = std::mem::take(&mut groups.input);
                let from = groups.in_pos;
                let n = (input.len() - from).min(buf.remaining());
                buf.put_slice(&input[from..from + n]);
                this.observe_read(&input[from..from + n]);
                let groups = this.groups.as_mut().expect("grouping");
                groups.input = input;
                groups.in_pos = from + n;
                return Poll::Ready(Ok(()));
            }
            if groups.input.capacity() > SHRINK_ABOVE {
                groups.input = Vec::new();
            }
            if let Some(confused) = groups.failed.take() {
                crate::trace::pool_warn!(error = %confused, "closing a connection");
                return Poll::Ready(Err(io::Error::other(confused)));
            }
            // Nothing to rewrite in what comes next: straight into the
            // client's buffer, no copy.
            if groups.rewriter.passes_through() {
                let before = buf.filled().len();
                std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                let filled = &buf.filled()[before..];
                if filled.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                let groups = this.groups.as_mut().expect("grouping");
                if let Err(confused) = groups.rewriter.pass(filled) {
                    crate::trace::pool_warn!(error = %confused, "closing a connection");
                    return Poll::Ready(Err(io::Error::other(confused)));
                }
                this.observe_read(&buf.filled()[before..]);
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                return Poll::Ready(Ok(())); // end of stream
            }
            // Bytes arrived: progress, for the stall watchdog, even while a
            // large message is still being gathered.
            let now = this.pool.ticks();
            this.state.counts.progressed(now);
            let groups = this.groups.as_mut().expect("grouping");
            groups.input.clear();
            groups.in_pos = 0;
            if let Err(confused) = groups.rewriter.inbound(read.filled(), &mut groups.input) {
                groups.failed = Some(confused);
            }
        }
    }
}

impl<S> TappedStream<S> {
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

impl<S: AsyncWrite + Unpin> TappedStream<S> {
    /// Writes what the rewriter left to write; `Pending` until all of it is
    /// out.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(groups) = self.groups.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        while groups.out_pos < groups.out.len() {
            let n = std::task::ready!(
                Pin::new(&mut self.inner).poll_write(cx, &groups.out[groups.out_pos..])
            )?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            groups.out_pos += n;
        }
        groups.out.clear();
        groups.out_pos = 0;
        if groups.out.capacity() > SHRINK_ABOVE {
            groups.out = Vec::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TappedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if !self.grouping() {
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
            return result;
        }
        // What the last write left goes first: backpressure.
        std::task::ready!(self.poll_drain(cx))?;
        let probe_start = self.probe_start();
        self.observe_write(buf, probe_start);
        let shared = self.state.load.is_shared();
        let this = &mut *self;
        let groups = this.groups.as_mut().expect("grouping");
        let pool = &this.pool;
        groups
            .rewriter
            .use_catalog(pool.catalog_generation(), || pool.catalog_full());
        groups.rewriter.outbound(buf, shared, &mut groups.out);
        self.count_groups();
        // Taken whole; written now as far as the socket takes it, the rest
        // by the next write or flush.
        if let Poll::Ready(Err(e)) = self.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
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
mod tests {
    use super::*;
    use crate::protocol::framer::SSL_REQUEST;

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
        let counts = (state.counts.requests(), state.counts.readies());
        assert_eq!(counts, (1, 1));
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
        assert_eq!(state.counts.requests(), 0, "ciphertext is not parsed");
    }

    fn simple_query(sql: &str) -> Vec<u8> {
        let mut message = vec![b'Q'];
        message.extend_from_slice(&(sql.len() as i32 + 5).to_be_bytes());
        message.extend_from_slice(sql.as_bytes());
        message.push(0);
        message
    }

    const SYNC: [u8; 5] = [b'S', 0, 0, 0, 4];

    fn ready(status: u8) -> [u8; 6] {
        [b'Z', 0, 0, 0, 5, status]
    }

    /// A tap on a shared connection, past start-up.
    fn shared_tap() -> (Arc<ConnState>, TappedStream<()>) {
        let state = Arc::new(ConnState::default());
        state.load.share();
        let mut tap = TappedStream::new((), Arc::clone(&state), Arc::new(PoolWire::default()));
        tap.observe_write(&[0, 0, 0, 9, 0, 3, 0, 0, 0], None);
        tap.observe_read(&ready(b'I')); // start-up is over
        (state, tap)
    }

    /// A shared connection carrying one atomic batch (BEGIN, two items,
    /// COMMIT) between two plain queries: only the batch's own answers may
    /// show its transaction.
    #[test]
    fn only_an_atomic_batchs_own_answers_may_show_its_transaction() {
        let shared = || {
            let (state, mut tap) = shared_tap();
            let write = [
                &SYNC[..],
                &simple_query("BEGIN"),
                &SYNC,
                &SYNC,
                &simple_query("COMMIT"),
                &SYNC,
            ]
            .concat();
            tap.observe_write(&write, None);
            (state, tap)
        };
        // The batch's answers show it, the rest do not: nothing happens.
        let (state, mut tap) = shared();
        for status in [b'I', b'T', b'T', b'E', b'I', b'I'] {
            tap.observe_read(&ready(status));
        }
        assert!(!state.session.is_quarantined());
        // The query before it in a transaction: quarantined.
        let (state, mut tap) = shared();
        tap.observe_read(&ready(b'T'));
        assert!(state.session.is_quarantined());
        // A COMMIT that leaves one open: quarantined.
        let (state, mut tap) = shared();
        for status in [b'I', b'T', b'T', b'T', b'T'] {
            tap.observe_read(&ready(status));
        }
        assert!(state.session.is_quarantined());
        // The query after it in a transaction: quarantined.
        let (state, mut tap) = shared();
        for status in [b'I', b'T', b'T', b'T', b'I', b'T'] {
            tap.observe_read(&ready(status));
        }
        assert!(state.session.is_quarantined());
        // BEGIN written (and answered) before the rest of its batch: the
        // batch still covers the rest.
        let (state, mut tap) = shared_tap();
        tap.observe_write(&simple_query("BEGIN"), None);
        tap.observe_read(&ready(b'T'));
        tap.observe_write(&[&SYNC[..], &simple_query("COMMIT")].concat(), None);
        for status in [b'T', b'I'] {
            tap.observe_read(&ready(status));
        }
        assert!(!state.session.is_quarantined());
        // Its COMMIT written once the connection was no longer shared: the
        // batch is forgotten, and covers nothing after.
        let (state, mut tap) = shared_tap();
        tap.observe_write(&simple_query("BEGIN"), None);
        state.load.unshare();
        tap.observe_write(&simple_query("COMMIT"), None);
        state.load.share();
        tap.observe_write(&SYNC, None);
        for status in [b'T', b'I', b'T'] {
            tap.observe_read(&ready(status));
        }
        assert!(state.session.is_quarantined());
        // Written while the connection was exclusive: no batch is known.
        let state = Arc::new(ConnState::default());
        let mut tap = TappedStream::new((), Arc::clone(&state), Arc::new(PoolWire::default()));
        tap.observe_write(&[0, 0, 0, 9, 0, 3, 0, 0, 0], None);
        tap.observe_read(&ready(b'I'));
        tap.observe_write(&[&simple_query("BEGIN")[..], &SYNC].concat(), None);
        state.load.share();
        tap.observe_read(&ready(b'T'));
        assert!(state.session.is_quarantined());
    }

    fn parameter_status(name: &str, value: &str) -> Vec<u8> {
        let body = [name.as_bytes(), b"\0", value.as_bytes(), b"\0"].concat();
        let mut message = vec![b'S'];
        message.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        message.extend_from_slice(&body);
        message
    }

    #[test]
    fn a_changed_session_setting_quarantines_and_a_promotion_is_a_role_change() {
        let tapped = || {
            let state = Arc::new(ConnState::default());
            state.load.share();
            let wire = Arc::new(PoolWire::default());
            let signal = Arc::new(tokio::sync::Notify::new());
            wire.on_host(Arc::new(crate::conn::HostSignal::new(Arc::clone(&signal))));
            let mut tap = TappedStream::new((), Arc::clone(&state), wire);
            tap.observe_read(&[b'Z', 0, 0, 0, 5, b'I']); // start-up is over
            (state, tap, signal)
        };
        let (state, mut tap, signal) = tapped();
        tap.observe_read(&parameter_status("in_hot_standby", "off"));
        assert_eq!(
            state.session.quarantine_reason(),
            Some(QuarantineReason::RoleChange),
            "a promotion retires the connection as a role change, not session state"
        );
        let woken = signal.notified();
        tokio::pin!(woken);
        assert!(
            woken.as_mut().enable(),
            "the pool's monitor is told at once"
        );
        let (state, mut tap, _) = tapped();
        tap.observe_read(&parameter_status("server_version", "16"));
        assert!(
            !state.session.is_quarantined(),
            "server state is no session's doing"
        );
        tap.observe_read(&parameter_status("application_name", "x"));
        assert_eq!(
            state.session.quarantine_reason(),
            Some(QuarantineReason::SessionState)
        );
    }
}
