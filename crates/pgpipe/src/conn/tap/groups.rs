//! The tap's read-group path: on a read lane's connection, writes and
//! reads go through the [`Coalescer`] (see
//! [`coalesce`](crate::protocol::coalesce)), which drops the inner `Sync`s
//! of a write and gives tokio-postgres a `ReadyForQuery` per request. The
//! tap counts the messages tokio-postgres sees, before the rewrite on the
//! way out and after it on the way in, so the wire counts are those of
//! tokio-postgres' own requests; it reads them from the rewriter's walk of
//! the stream (each direction framed once, not twice).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::TappedStream;
use super::reads::ReadTally;
use super::writes::WriteTally;
use crate::protocol::coalesce::{Coalescer, Confused, Grouping, SHRINK_ABOVE};
use crate::protocol::framer::{Message, Phase};

/// What a connection that groups reads keeps between polls.
#[derive(Debug, Default)]
pub(super) struct Groups {
    rewriter: Coalescer,
    /// Rewritten bytes not yet written to the socket.
    out: Vec<u8>,
    out_pos: usize,
    /// Rewritten bytes not yet read by the client.
    input: Vec<u8>,
    in_pos: usize,
    /// The rewriter lost step: returned once what came before is read.
    failed: Option<Confused>,
    /// What the socket gives, before the rewrite: zeroed once, at the
    /// first read that needs it, not at every read (a fresh zeroed buffer
    /// per read cost 16 KB of `memset`, 2,000 instructions per query).
    chunk: Vec<u8>,
}

impl Groups {
    pub(super) fn new(grouping: Grouping) -> Groups {
        Groups {
            rewriter: Coalescer::new(grouping),
            ..Groups::default()
        }
    }
}

/// How much is read from the socket at once on a connection that groups
/// reads.
const READ_CHUNK: usize = 16 * 1024;

impl<S> TappedStream<S> {
    /// Whether this tap rewrites read groups now: a read lane's
    /// connection, past start-up, on the plaintext protocol (under TLS the
    /// tap above the encryption does it).
    pub(super) fn grouping(&self) -> bool {
        self.groups.as_ref().is_some_and(|g| g.rewriter.is_armed())
    }

    /// Arms the rewriter at the first ReadyForQuery: start-up is done and
    /// nothing else was written.
    pub(super) fn arm_groups(&mut self) {
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
        // Drained, not taken: the list keeps its room for the next groups.
        let sizes = groups.rewriter.groups.drain(..);
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

impl<S: AsyncRead + Unpin> TappedStream<S> {
    /// [`poll_read`](AsyncRead::poll_read) while [`grouping`](Self::grouping).
    /// The tap reads the answers from the rewriter's walk of them, as they
    /// leave it, whether they are copied out or go straight through.
    pub(super) fn poll_read_grouped(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            // Rewritten bytes first.
            let this = &mut *self;
            let groups = this.groups.as_mut().expect("grouping");
            if groups.in_pos < groups.input.len() {
                let from = groups.in_pos;
                let n = (groups.input.len() - from).min(buf.remaining());
                buf.put_slice(&groups.input[from..from + n]);
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
                this.state.counts.progressed_if_moved(this.pool.ticks());
                let (state, pool) = (&this.state, &this.pool);
                let mut tally = ReadTally::new(state, pool, &mut this.held, &mut this.watch);
                let groups = this.groups.as_mut().expect("grouping");
                let passed = groups.rewriter.pass_seen(filled, |m| tally.message(m));
                let read = tally.finish();
                this.was_read(read);
                if let Err((confused, at)) = passed {
                    // What came before the message it stumbled on is the
                    // client's; the error comes at the next read.
                    if at == 0 {
                        crate::trace::pool_warn!(error = %confused, "closing a connection");
                        return Poll::Ready(Err(io::Error::other(confused)));
                    }
                    buf.set_filled(before + at);
                    this.groups.as_mut().expect("grouping").failed = Some(confused);
                }
                return Poll::Ready(Ok(()));
            }
            if groups.chunk.is_empty() {
                groups.chunk = vec![0; READ_CHUNK];
            }
            let mut read = ReadBuf::new(&mut groups.chunk);
            std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let got = read.filled().len();
            if got == 0 {
                return Poll::Ready(Ok(())); // end of stream
            }
            // Bytes arrived: progress, for the stall watchdog, even while a
            // large message is still being gathered.
            let now = this.pool.ticks();
            this.state.counts.progressed(now);
            let (state, pool) = (&this.state, &this.pool);
            let mut tally = ReadTally::new(state, pool, &mut this.held, &mut this.watch);
            let Groups {
                rewriter,
                input,
                in_pos,
                failed,
                chunk,
                ..
            } = &mut **this.groups.as_mut().expect("grouping");
            input.clear();
            *in_pos = 0;
            let seen = |m: &Message<'_>| tally.message(m);
            if let Err(confused) = rewriter.inbound_seen(&chunk[..got], input, seen) {
                *failed = Some(confused);
            }
            let read = tally.finish();
            this.was_read(read);
        }
    }
}

impl<S: AsyncWrite + Unpin> TappedStream<S> {
    /// [`poll_write`](AsyncWrite::poll_write) while
    /// [`grouping`](Self::grouping).
    pub(super) fn poll_write_grouped(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // What the last write left goes first: backpressure.
        std::task::ready!(self.poll_drain(cx))?;
        let probe_start = self.probe_start();
        let shared = self.state.load.is_shared();
        let this = &mut *self;
        let (state, pool) = (&this.state, &this.pool);
        // The tap reads the write from the rewriter's walk of it.
        let mut tally = WriteTally::new(state, pool, &mut this.held, &mut this.watch, shared);
        let groups = this.groups.as_mut().expect("grouping");
        groups
            .rewriter
            .use_catalog(pool.catalog_generation(), || pool.catalog_full());
        let seen = |message: &Message<'_>| tally.message(message);
        groups
            .rewriter
            .outbound_seen(buf, shared, &mut groups.out, seen);
        let written = tally.finish();
        self.wrote(written, probe_start);
        self.count_groups();
        // Taken whole; written now as far as the socket takes it, the rest
        // by the next write or flush.
        if let Poll::Ready(Err(e)) = self.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    /// Writes what the rewriter left to write; `Pending` until all of it is
    /// out.
    pub(super) fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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
