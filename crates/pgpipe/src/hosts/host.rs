//! One configured host: its lanes, and what the last check found of it.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;

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
    /// What the last check found of its replay (standbys), published
    /// whole: a reader never pairs one check's position with another's
    /// timeline or floor.
    pub(super) replay: ArcSwap<Replay>,
    /// What the last check found, for error messages.
    pub(super) last_seen: std::sync::Mutex<String>,
    /// What its connections tell the monitor; set when the hosts are made.
    pub(super) signal: OnceLock<Arc<HostSignal>>,
}

/// One check's view of a standby's replay; see [`Host::replay`].
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Replay {
    /// Its replay position.
    pub(super) lsn: u64,
    /// A replay position it must pass before it serves a read-your-writes
    /// token: just past where it was when the primary's timeline changed.
    /// A standby still on the old timeline (one that was ahead of the
    /// promoted one, and so diverged) never moves, so its old position,
    /// however high, never vouches for a write on the new timeline.
    pub(super) token_floor: u64,
    /// The timeline it receives WAL on, when the pool's role may read it
    /// (`pg_stat_wal_receiver.received_tli` needs `pg_read_all_stats`);
    /// 0 when unknown, and the floor above decides alone.
    pub(super) received_timeline: u32,
    /// [`HostSignal::losses`] when the check started: while the count is
    /// still this, that check vouches for it.
    pub(super) vouched_losses: u64,
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
            replay: ArcSwap::default(),
            last_seen: std::sync::Mutex::new("not checked yet".into()),
            signal: OnceLock::new(),
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
        self.signal().losses() == self.replay.load().vouched_losses
    }

    /// Whether it is known to have replayed `token`: past its position, on
    /// its timeline when the standby's is known, else past the floor set
    /// when the primary's timeline changed or the standby appeared.
    pub(super) fn has_replayed(&self, token: WriteToken) -> bool {
        let replay = self.replay.load();
        match replay.received_timeline {
            0 => replay.lsn >= token.lsn.max(replay.token_floor),
            timeline => timeline == token.timeline && replay.lsn >= token.lsn,
        }
    }

    /// Its read lane, if one was made.
    pub(crate) fn read_made(&self) -> Option<&Arc<Lane>> {
        self.read.get()
    }
}
