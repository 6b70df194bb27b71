//! One configured host: its lanes, and what the last check found of it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::conn::HostSignal;
use crate::lane::{Lane, LaneRecipe};
use crate::target::WriteToken;

/// One configured host.
#[derive(Debug)]
pub(crate) struct Host {
    /// `host:port` as configured: its `host` label.
    pub(crate) label: String,
    pub(crate) write: Arc<Lane>,
    /// Made at its first use: see [`Hosts::read_lane`].
    pub(super) read: OnceLock<Arc<Lane>>,
    pub(super) read_recipe: LaneRecipe,
    /// A standby within the lag bound, up at the last check.
    pub(super) in_rotation: AtomicBool,
    /// Known to be a standby at the last check.
    pub(super) standby: AtomicBool,
    /// Its replay position at the last check (standbys).
    pub(super) replay_lsn: AtomicU64,
    /// A replay position it must pass before it serves a read-your-writes
    /// token: just past where it was when the primary's timeline changed.
    /// A standby still on the old timeline (one that was ahead of the
    /// promoted one, and so diverged) never moves, so its old position,
    /// however high, never vouches for a write on the new timeline.
    pub(super) token_floor: AtomicU64,
    /// The timeline it receives WAL on, when the pool's role may read it
    /// (`pg_stat_wal_receiver.received_tli` needs `pg_read_all_stats`);
    /// 0 when unknown, and the floor above decides alone.
    pub(super) received_timeline: AtomicU32,
    /// What the last check found, for error messages.
    pub(super) last_seen: std::sync::Mutex<String>,
    /// What its connections tell the monitor; set when the hosts are made.
    pub(super) signal: OnceLock<Arc<HostSignal>>,
    /// [`HostSignal::losses`] when the last check that found it a standby
    /// started: while the count is still this, that check vouches for it.
    pub(super) vouched_losses: AtomicU64,
}

impl Host {
    pub(crate) fn new(label: String, write: Arc<Lane>, read: LaneRecipe) -> Host {
        Host {
            label,
            write,
            read: OnceLock::new(),
            read_recipe: read,
            in_rotation: AtomicBool::new(false),
            standby: AtomicBool::new(false),
            replay_lsn: AtomicU64::new(0),
            token_floor: AtomicU64::new(0),
            received_timeline: AtomicU32::new(0),
            last_seen: std::sync::Mutex::new("not checked yet".into()),
            signal: OnceLock::new(),
            vouched_losses: AtomicU64::new(0),
        }
    }

    /// What its connections tell the monitor.
    pub(crate) fn signal(&self) -> &Arc<HostSignal> {
        self.signal.get().expect("set when the hosts are made")
    }

    /// Whether no connection to it was lost since its last check began: a
    /// server that restarted (perhaps behind where it was checked) ended
    /// every connection to it first, so a loss leaves nothing the check
    /// found standing until the next one.
    pub(super) fn vouched(&self) -> bool {
        self.signal().losses() == self.vouched_losses.load(Ordering::Acquire)
    }

    /// Whether it is known to have replayed `token`: past its position, on
    /// its timeline when the standby's is known, else past the floor set
    /// when the primary's timeline changed or the standby appeared.
    pub(super) fn has_replayed(&self, token: WriteToken) -> bool {
        let replayed = self.replay_lsn.load(Ordering::Acquire);
        match self.received_timeline.load(Ordering::Acquire) {
            0 => replayed >= token.lsn.max(self.token_floor.load(Ordering::Acquire)),
            timeline => timeline == token.timeline && replayed >= token.lsn,
        }
    }

    /// Its read lane, if one was made.
    pub(crate) fn read_made(&self) -> Option<&Arc<Lane>> {
        self.read.get()
    }
}
