//! The tap's reading of what the server sent, message by message: every
//! `ReadyForQuery` and its transaction status, copy-in, a holder's
//! statements answered, and the settings the server reports.
//!
//! As with the writes (see `writes`), the messages come from whichever
//! walk frames them: the tap's own framer, or, on a connection that groups
//! reads, the rewriter's, which hands on each message as the client will
//! read it (its own inserted `ReadyForQuery`s and skip errors included,
//! its group heads' answers not).

use super::TappedStream;
use super::apply;
use super::held::HeldRequests;
use crate::conn::PoolWire;
use crate::conn::state::ConnState;
use crate::metrics::Metrics;
use crate::protocol::framer::Message;
use crate::protocol::watch::SessionWatch;

/// One read being followed: what its messages add up to.
pub(super) struct ReadTally<'a> {
    answered_before: u64,
    readies: u64,
    copy_ins: u64,
    /// The metrics, while a holder's statements await their answers.
    counted: Option<&'a Metrics>,
    state: &'a ConnState,
    pool: &'a PoolWire,
    held: &'a mut HeldRequests,
    watch: &'a mut SessionWatch,
}

/// What a read carried, once followed.
pub(super) struct Read {
    readies: u64,
    copy_ins: u64,
}

impl<'a> ReadTally<'a> {
    pub(super) fn new(
        state: &'a ConnState,
        pool: &'a PoolWire,
        held: &'a mut HeldRequests,
        watch: &'a mut SessionWatch,
    ) -> ReadTally<'a> {
        let counted = pool.metrics.as_deref().filter(|_| !held.is_empty());
        ReadTally {
            answered_before: state.counts.readies(),
            readies: 0,
            copy_ins: 0,
            counted,
            state,
            pool,
            held,
            watch,
        }
    }

    /// One message from the server.
    #[inline(always)]
    pub(super) fn message(&mut self, message: &Message<'_>) {
        let answered = self.answered_before + self.readies;
        match message.kind {
            // COPY FROM STDIN over the extended protocol: the Sync sent
            // behind its Execute is ignored in copy-in mode, and the one
            // after CopyDone is answered. One request fewer than written.
            b'G' => {
                self.copy_ins += 1;
                self.held.copy_in(answered + 1);
            }
            b'Z' => {
                let status = message.first.unwrap_or(b'I');
                self.state.session.set_tx_status(status);
                self.readies += 1;
                self.held.ready(answered + 1);
                if let Some(verdict) = self.watch.on_ready(status, answered + 1) {
                    apply(self.state, self.pool, verdict);
                }
            }
            b'C' | b'I' | b'E' => {
                if let Some(metrics) = self.counted {
                    self.held.answer(answered + 1, message.kind, metrics);
                }
            }
            b'S' => {
                let name = message.parameter_name();
                if let Some(verdict) = self.watch.on_parameter(name, answered) {
                    apply(self.state, self.pool, verdict);
                }
            }
            _ => {}
        }
    }

    pub(super) fn finish(self) -> Read {
        Read {
            readies: self.readies,
            copy_ins: self.copy_ins,
        }
    }
}

impl<S> TappedStream<S> {
    /// Counts what a read carried into the connection's state: answers
    /// owed no more, tasks to wake, a round trip timed.
    pub(super) fn was_read(&mut self, read: Read) {
        let Read { readies, copy_ins } = read;
        let state = &self.state;
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
}
