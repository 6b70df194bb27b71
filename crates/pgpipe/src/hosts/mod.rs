//! The hosts behind a pool and their roles: which one takes writes, which
//! take reads, and how that is learned from the servers themselves.
//!
//! Each configured host has two lanes, each a pool of its own (shared
//! path, exclusive checkouts, metrics): `write`, for the primary's work,
//! and `read`, whose connections open with `default_transaction_read_only
//! =on`, for reads (on a standby, or on the primary when no standby fits).
//!
//! With one host and no `target_session_attrs`, nothing is checked: the
//! host is the primary, as before this module existed. With more, a
//! monitor ([`check`]) asks every host its role and position on an interval
//! and at once on a trigger, and elects the primary: exactly one writable
//! server; with two (split brain) the higher timeline, and none on a tie.
//! Routing reads the election from atomics; it never waits on the monitor
//! unless there is no primary and `failover_wait` allows a wait.

mod build;
mod check;
pub(crate) mod dispatch;
mod election;
mod host;
mod lag;
mod pick;

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::config::deadline_after;
use crate::conn::HostSignal;
use crate::error::{Error, ErrorKind};
use crate::lane::Lane;
use crate::metrics::HostMetrics;
use crate::metrics::hosts::RetryReason;
use crate::sync::lock;
use crate::target::{ReplicaFallback, TargetSessionAttrs};

pub(crate) use build::Endpoint;
pub(crate) use check::start_monitor;
pub(crate) use host::Host;

/// No primary elected.
const NONE: usize = usize::MAX;

/// Settings of a pool of several hosts.
#[derive(Debug, Clone)]
pub(crate) struct HostSettings {
    pub(crate) recheck: Duration,
    pub(crate) max_lag: Option<Duration>,
    pub(crate) fallback: ReplicaFallback,
    pub(crate) failover_wait: Duration,
    /// Where `pool.query` and `pool.get` go.
    pub(crate) default_target: TargetSessionAttrs,
}

/// Every host of a pool, and the election.
#[derive(Debug)]
pub(crate) struct Hosts {
    pub(crate) hosts: Box<[Host]>,
    /// Whether roles are checked; false for one host and no target.
    discovering: bool,
    primary: AtomicUsize,
    timeline: AtomicU32,
    /// A write route's connection to this host broke: until a round of
    /// checks that started after that has finished, writes to it wait (the
    /// other connections to a host that died are likely dead too, and a
    /// write sent on one could only end in `ConnectionLost`). Packed:
    /// `(host + 1) << 48 | rounds started then`; 0 for none.
    suspect: AtomicU64,
    /// Check rounds started, and finished.
    started: AtomicU64,
    rounds: AtomicU64,
    /// Set by [`close`](Hosts::close); read lanes are made and closed under
    /// this lock, so none is made after `close` without being closed.
    closed: std::sync::Mutex<bool>,
    /// Whether the read lanes' sessions are read-only (not behind a
    /// transaction pooler): a read lost on one cannot have written.
    pub(crate) reads_enforced: bool,
    /// Wakes tasks waiting for a round (a primary, or a retry's answer),
    /// and those waiting for the pool to close ([`closed`](Hosts::closed)).
    round_done: Notify,
    /// Wakes the monitor for a round now.
    pub(crate) trigger: Arc<Notify>,
    next_read: AtomicUsize,
    monitor: AtomicBool,
    pub(crate) settings: HostSettings,
    pub(crate) metrics: Option<HostMetrics>,
}

/// The last pool clone is gone: the monitor wakes, finds no pool, and ends.
impl Drop for Hosts {
    fn drop(&mut self) {
        self.trigger.notify_one();
    }
}

impl Hosts {
    pub(crate) fn new(
        hosts: Vec<Host>,
        settings: HostSettings,
        metrics: Option<HostMetrics>,
        reads_enforced: bool,
    ) -> Hosts {
        let discovering = hosts.len() > 1 || settings.default_target != TargetSessionAttrs::Any;
        let trigger = Arc::new(Notify::new());
        for host in &hosts {
            let signal = host
                .signal
                .get_or_init(|| Arc::new(HostSignal::new(Arc::clone(&trigger))));
            host.write.wire().on_host(Arc::clone(signal));
        }
        Hosts {
            primary: AtomicUsize::new(if discovering { NONE } else { 0 }),
            hosts: hosts.into_boxed_slice(),
            discovering,
            timeline: AtomicU32::new(0),
            suspect: AtomicU64::new(0),
            started: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            closed: std::sync::Mutex::new(false),
            reads_enforced,
            round_done: Notify::new(),
            trigger,
            next_read: AtomicUsize::new(0),
            monitor: AtomicBool::new(false),
            settings,
            metrics,
        }
    }

    /// The read lane of host `i`, made at its first use (closed at once if
    /// the pool is closed).
    pub(crate) fn read_lane(&self, i: usize) -> &Arc<Lane> {
        let host = &self.hosts[i];
        if let Some(lane) = host.read.get() {
            return lane;
        }
        let closed = lock(&self.closed);
        let lane = host.read.get_or_init(|| {
            let lane = host.read_recipe.make_or_without_metrics();
            lane.wire().on_host(Arc::clone(host.signal()));
            lane
        });
        if *closed {
            lane.close();
        }
        lane
    }

    /// Closes every lane, wakes whoever waits for a round (they find the
    /// pool closed), and the monitor, which ends and closes its
    /// connections.
    pub(crate) fn close(&self) {
        let mut closed = lock(&self.closed);
        *closed = true;
        for host in self.hosts.iter() {
            host.write.close();
            if let Some(read) = host.read.get() {
                read.close();
            }
        }
        drop(closed);
        self.trigger.notify_one();
        self.round_done.notify_waiters();
    }

    /// The one host of a pool that checks no roles.
    pub(crate) fn single(&self) -> Option<&Host> {
        (!self.discovering).then(|| &self.hosts[0])
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.hosts[0].write.is_closed()
    }

    /// Resolves once the pool is closed: for a task that holds a connection
    /// while it waits for something else (a listener), so that it gives the
    /// connection back.
    pub(crate) async fn closed(&self) {
        loop {
            let woken = self.round_done.notified();
            if self.is_closed() {
                return;
            }
            woken.await;
        }
    }

    /// Asks the monitor for a round now.
    pub(crate) fn recheck(&self) {
        if self.discovering {
            self.trigger.notify_one();
        }
    }

    /// The monitor runs from the first use inside a runtime.
    fn ensure_monitor(self: &Arc<Self>) {
        if self.discovering
            && !self.monitor.load(Ordering::Relaxed)
            && !self.monitor.swap(true, Ordering::AcqRel)
        {
            start_monitor(self);
        }
    }

    fn elected(&self) -> Option<usize> {
        match self.primary.load(Ordering::Acquire) {
            NONE => None,
            i => Some(i),
        }
    }

    /// The primary's timeline, when one is elected.
    pub(crate) fn timeline(&self) -> u32 {
        self.timeline.load(Ordering::Acquire)
    }

    /// The primary's host, waiting until `deadline` for one (and for the
    /// first round of checks, whatever the deadline: that is start-up, not
    /// a failover).
    pub(crate) async fn primary(
        self: &Arc<Self>,
        deadline: tokio::time::Instant,
    ) -> Result<usize, Error> {
        if let Some(i) = self.elected() {
            return Ok(i);
        }
        self.first_round().await;
        loop {
            let notified = self.round_done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_closed() {
                return Err(Error::closed());
            }
            if let Some(i) = self.elected() {
                return Ok(i);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.elected().ok_or_else(|| self.no_primary());
            }
        }
    }

    /// When a write that starts now stops waiting for a primary.
    pub(crate) fn failover_deadline(&self) -> tokio::time::Instant {
        deadline_after(self.settings.failover_wait)
    }

    /// Before the first round of checks no role is known: waits for it (at
    /// most two check timeouts), so that the first reads of a new pool go
    /// to standbys rather than all to the primary.
    async fn first_round(self: &Arc<Self>) {
        if self.rounds.load(Ordering::Acquire) == 0 {
            self.ensure_monitor();
            self.round_after(0).await;
        }
    }

    /// Asks for a round of checks and waits (at most two check timeouts)
    /// until one that started after the asking has finished: a round
    /// already under way may have looked before whatever prompted this.
    pub(crate) async fn next_round(self: &Arc<Self>) {
        self.ensure_monitor();
        let fresh = self.started.load(Ordering::Acquire) + 1;
        self.recheck();
        self.round_after(fresh - 1).await;
    }

    /// Waits until more than `seen` rounds have finished, at most two check
    /// timeouts.
    async fn round_after(&self, seen: u64) {
        let deadline = tokio::time::Instant::now() + CHECK_TIMEOUT * 2;
        loop {
            let notified = self.round_done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.rounds.load(Ordering::Acquire) > seen
                || self.is_closed()
                || tokio::time::timeout_at(deadline, notified).await.is_err()
            {
                return;
            }
        }
    }

    /// After an attempt that could not start (no connection: nothing ran),
    /// perhaps because its host is gone: while `deadline` and
    /// [`MAX_FAILOVER_WAITS`] allow, waits for the next round of checks, and
    /// until `reopens_at` (when the lane tries to open a connection again:
    /// before then another attempt would fail without reaching any server,
    /// and a host the monitor still elects would spend every wait on that),
    /// and says to try again (counted as a `primary_down` retry); else asks
    /// for a round and says to give up.
    pub(crate) async fn wait_to_retry(
        self: &Arc<Self>,
        waits: &mut u32,
        deadline: tokio::time::Instant,
        reopens_at: Option<tokio::time::Instant>,
    ) -> bool {
        *waits += 1;
        if *waits > MAX_FAILOVER_WAITS || tokio::time::Instant::now() >= deadline {
            self.recheck();
            return false;
        }
        if let Some(metrics) = &self.metrics {
            metrics.retry(RetryReason::PrimaryDown);
        }
        self.next_round().await;
        if let Some(at) = reopens_at {
            tokio::time::sleep_until(at.min(deadline)).await;
        }
        true
    }

    /// A write route's connection to `host` broke: writes to it wait for a
    /// round of checks that starts now (see `suspect`).
    pub(crate) fn suspect(&self, host: usize) {
        let started = self.started.load(Ordering::Acquire) & SUSPECT_ROUND;
        self.suspect
            .store((host as u64 + 1) << 48 | started, Ordering::Release);
        self.recheck();
    }

    /// Whether `host` is the elected primary now.
    pub(crate) fn is_primary(&self, host: usize) -> bool {
        self.elected() == Some(host)
    }

    /// `NoPrimary`, naming what each host was last seen as.
    fn no_primary(&self) -> Error {
        let mut message = String::from("no primary elected within failover_wait; last seen:");
        for host in self.hosts.iter() {
            let _ = write!(message, " {} {};", host.label, lock(&host.last_seen));
        }
        message.pop();
        Error::new(ErrorKind::NoPrimary, message).unsent()
    }
}

/// Most rounds of checks a write that could not be sent waits through: a
/// primary that is up but refuses connections (authentication, a full
/// `max_connections`) fails it with its own error, not after
/// `failover_wait` of tries.
pub(crate) const MAX_FAILOVER_WAITS: u32 = 20;

/// The round bits of [`Hosts::suspect`].
const SUSPECT_ROUND: u64 = (1 << 48) - 1;

/// Longest a role check may take, connecting included.
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
