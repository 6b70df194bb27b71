//! The tap's reading of a write, message by message: the requests it
//! carries (`Sync`s, simple queries, the start-up packet), the simple
//! queries that open or close an atomic batch, a holder's requests, and
//! whether an exclusive connection's SQL leaves what no reset undoes.
//!
//! The messages come from whichever walk frames the write: the tap's own
//! framer, or, on a connection that groups reads, the rewriter's, which
//! frames the same bytes anyway (one walk instead of two).

use std::sync::Arc;
use std::time::Instant;

use super::TappedStream;
use super::held::HeldRequests;
use crate::conn::PoolWire;
use crate::conn::state::ConnState;
use crate::conn::state::held::POOL_OWN;
use crate::metrics::CloseReason;
use crate::protocol::catalog::Catalog;
use crate::protocol::framer::Message;
use crate::protocol::sql_guard;
use crate::protocol::watch::SessionWatch;

/// One write being read: what its messages add up to.
pub(super) struct WriteTally<'a> {
    shared: bool,
    written_before: u64,
    /// When a holder's requests went out (see `held`), if they are counted.
    holder: Option<Instant>,
    syncs: u64,
    others: u64,
    lasting: bool,
    /// DDL went out in it.
    ddl: bool,
    /// Loaded once per write, at its first SQL.
    catalog: Option<Arc<Catalog>>,
    pool: &'a PoolWire,
    held: &'a mut HeldRequests,
    watch: &'a mut SessionWatch,
}

/// What a write carried, once read.
pub(super) struct Written {
    syncs: u64,
    others: u64,
    lasting: bool,
    ddl: bool,
}

impl<'a> WriteTally<'a> {
    /// Starts reading a write on a connection that is `shared` or not.
    pub(super) fn new(
        state: &ConnState,
        pool: &'a PoolWire,
        held: &'a mut HeldRequests,
        watch: &'a mut SessionWatch,
        shared: bool,
    ) -> WriteTally<'a> {
        if !shared {
            watch.unshared();
        }
        // A holder's requests, counted as their answers come (see `held`).
        let holder = (!shared && pool.metrics.is_some() && state.held.is_on()).then(Instant::now);
        WriteTally {
            shared,
            written_before: state.counts.requests(),
            holder,
            syncs: 0,
            others: 0,
            lasting: false,
            ddl: false,
            catalog: None,
            pool,
            held,
            watch,
        }
    }

    /// One message of the write. Requests are what the server answers
    /// with one ReadyForQuery each: a Sync ends an extended-protocol
    /// request (the pipelined queries); a simple Query (a
    /// `batch_execute`, the pool's own session reset) and the untyped
    /// start-up packet are requests too, but take no part in batching.
    #[inline(always)]
    pub(super) fn message(&mut self, message: &Message<'_>) {
        // An exclusive connection's SQL is read as it goes out, whoever
        // sends it (the pool's methods, or the raw client a checkout derefs
        // to): what no reset undoes closes the connection when it comes back.
        // The pool's own (its resets and cleanups) are not read.
        let own = message.kind == b'Q' && message.prefix.starts_with(POOL_OWN.as_bytes());
        if let Some(body) = message.body.filter(|_| !self.shared && !own) {
            let pool = self.pool;
            let catalog = self.catalog.get_or_insert_with(|| pool.catalog_full());
            self.lasting |= sql_guard::sends_lasting_state(message.kind, body, catalog);
            if sql_guard::sends_ddl(message.kind, body) {
                pool.catalog_changed();
                self.ddl = true;
            }
        }
        match message.kind {
            b'S' => self.syncs += 1,
            b'Q' if self.shared => {
                self.others += 1;
                let request = self.written_before + self.syncs + self.others;
                self.watch
                    .on_simple_query(message.parameter_name(), request);
            }
            0 | b'Q' | b'F' => self.others += 1,
            b'E' => return self.held.execute(),
            _ => return,
        }
        let request = self.written_before + self.syncs + self.others;
        match message.kind {
            // The pool's own simple queries are not the holder's.
            b'Q' if message.prefix.starts_with(POOL_OWN.as_bytes()) => {}
            b'Q' | b'S' => self
                .held
                .written(request, self.holder, message.kind == b'Q'),
            _ => {}
        }
    }

    pub(super) fn finish(self) -> Written {
        Written {
            syncs: self.syncs,
            others: self.others,
            lasting: self.lasting,
            ddl: self.ddl,
        }
    }
}

impl<S> TappedStream<S> {
    /// Counts what a write carried into the connection's state and the
    /// pool's metrics. `probe_start`: see `probe_start`.
    pub(super) fn wrote(&mut self, written: Written, probe_start: Option<Instant>) {
        let Written {
            syncs,
            others,
            lasting,
            ddl,
        } = written;
        if lasting {
            self.state.life.closing(CloseReason::ResetFailed);
        }
        if ddl {
            self.state.session.sent_ddl();
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
}
