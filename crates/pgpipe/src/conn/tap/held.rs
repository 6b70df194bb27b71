//! Counting a holder's statements at the wire: every statement the server
//! answers in a request its holder wrote (through pgpipe's methods or the
//! raw tokio-postgres client a checkout dereferences to), as
//! `pgpipe_queries_total{mode="checkout"}` and its duration, from the write
//! that carried the request to the statement's answer.
//!
//! A statement ends with `CommandComplete` or `EmptyQueryResponse` (`ok`),
//! or `ErrorResponse` (`db_error`); a simple query of several statements
//! counts each. A request still unanswered when the socket ends counts as
//! `connection_lost`, unless a statement of it was counted already (the
//! server's error as it ended the session). A request written after the holder gave the
//! connection back, or one of the pool's own (see
//! [`Held`](crate::conn::state::held::Held)), is not theirs.

use std::collections::VecDeque;
use std::time::Instant;

use crate::metrics::{Metrics, Mode};

/// The holder's requests written and not yet answered, oldest first.
#[derive(Debug, Default)]
pub(super) struct HeldRequests {
    pending: VecDeque<Pending>,
    /// Whether the request being written has an `Execute`: one with only
    /// `Parse`, `Describe` or `Close` runs no statement.
    runs: bool,
}

/// A holder's request awaiting its `ReadyForQuery`.
#[derive(Debug)]
struct Pending {
    /// Its number, as [`WireCounts`](crate::conn::state::counts::WireCounts)
    /// numbers requests (from 1).
    n: u64,
    /// When it was written.
    at: Instant,
    /// Whether a statement of it was counted already: lost afterwards
    /// (the server sends its error, then closes), it is not counted again.
    counted: bool,
}

impl HeldRequests {
    /// The request being written has an `Execute`.
    pub(super) fn execute(&mut self) {
        self.runs = true;
    }

    /// Request number `request` was written (its `Sync`, or a `simple`
    /// query), `at` when a caller holds the connection: it is theirs to
    /// count, if it runs a statement. A number already pending is a
    /// copy-in's closing `Sync` (see [`copy_in`](HeldRequests::copy_in)),
    /// part of that request.
    pub(super) fn written(&mut self, request: u64, at: Option<Instant>, simple: bool) {
        let runs = std::mem::take(&mut self.runs) || simple;
        let Some(at) = at.filter(|_| runs) else {
            return;
        };
        if self.pending.back().is_some_and(|p| p.n >= request) {
            return;
        }
        self.pending.push_back(Pending {
            n: request,
            at,
            counted: false,
        });
    }

    /// A message of the answer to request `request` arrived: counts the
    /// statement it ends, if it ends one of the holder's.
    pub(super) fn answer(&mut self, request: u64, kind: u8, metrics: &Metrics) {
        let Some(front) = self.pending.front_mut().filter(|p| p.n == request) else {
            return;
        };
        let ok = match kind {
            b'C' | b'I' => true,
            b'E' => false,
            _ => return,
        };
        front.counted = true;
        metrics.statement(Mode::Checkout, front.at.elapsed(), ok);
    }

    /// Request `request` has its `ReadyForQuery`: it is done.
    pub(super) fn ready(&mut self, request: u64) {
        while self.pending.front().is_some_and(|p| p.n <= request) {
            self.pending.pop_front();
        }
    }

    /// Request `request` entered copy-in mode: the `Sync` behind its
    /// `Execute` is ignored and the one after `CopyDone` answers it, so the
    /// wire's count (see the tap's `copy_ins`) numbers later requests one
    /// lower, and that `Sync` gets this request's number (see `written`).
    pub(super) fn copy_in(&mut self, request: u64) {
        if self.pending.front().is_some_and(|p| p.n == request) {
            for later in self.pending.iter_mut().skip(1) {
                later.n -= 1;
            }
        }
    }

    /// The socket ended: whatever is unanswered never will be.
    pub(super) fn lost(&mut self, metrics: &Metrics) {
        for pending in self.pending.drain(..).filter(|p| !p.counted) {
            metrics.statement_lost(Mode::Checkout, pending.at.elapsed());
        }
    }

    /// Whether none of the holder's requests awaits its answer.
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}
