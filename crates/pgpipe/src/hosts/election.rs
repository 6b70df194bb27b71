//! The election: from what one round of checks found, which host is the
//! primary, and which standbys are in rotation and vouch for what.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::check::{Failure, Seen};
use super::lag::Samples;
use super::{Hosts, NONE};
use crate::metrics::hosts::RoleLabel;
use crate::sync::lock;

/// Rounds a primary's checks may time out, or find it up but full
/// (`max_connections` for the monitor's own connection), before it is no
/// longer the primary, while no other host is writable: one slow answer
/// must not fail every write with `NoPrimary`. A refused or broken
/// connection ends its role at once.
const PRIMARY_GRACE: u32 = 3;

/// What the monitor remembers between rounds.
#[derive(Debug, Default)]
pub(super) struct Election {
    /// The primary of the last round that had one.
    last: Option<usize>,
    /// Since when there has been no primary.
    none_since: Option<Instant>,
    samples: Samples,
    /// The timeline of the last primary elected, and the highest ever: no
    /// host on a lower one is ever elected again (split brain, whether or
    /// not the higher one answers this round).
    timeline: u32,
    highest: u32,
    /// Per host: failed checks in a row, and the server last seen there
    /// (with whether it was a standby).
    failures: Vec<u32>,
    servers: Vec<Option<(String, bool)>>,
    /// Per host: a standby that lived through a change of primary and has
    /// not yet shown that it follows the new timeline (see `apply`).
    unproven: Vec<bool>,
    /// Per host: the timeline it was last seen writable on (0: never). A
    /// lower timeline is reinstated only once every host here above it
    /// follows it (see [`reinstated`]).
    writable_on: Vec<u32>,
}

impl Election {
    /// `losses`: each host's lost connections when the round began.
    pub(super) fn apply(
        &mut self,
        hosts: &Hosts,
        seen: Vec<Result<Seen, Failure>>,
        losses: &[u64],
    ) {
        let now = Instant::now();
        let metrics = hosts.metrics.as_ref();
        self.failures.resize(seen.len(), 0);
        self.servers.resize(seen.len(), None);
        // The writable servers, each once (two names may reach one server;
        // the first configured name stands for it).
        let mut writable: Vec<(usize, &Seen)> = Vec::new();
        for (i, result) in seen.iter().enumerate() {
            let host = &hosts.hosts[i];
            if let Some(metrics) = metrics {
                metrics.checked(&host.label, result.is_ok());
            }
            let (role, text) = match result {
                Ok(s) if s.recovery => (RoleLabel::Standby, "a standby".to_string()),
                Ok(s) => (
                    RoleLabel::Primary,
                    format!("writable on timeline {}", s.timeline),
                ),
                Err(e) => (RoleLabel::Down, format!("down ({})", e.message)),
            };
            *lock(&host.last_seen) = text;
            if let Some(metrics) = metrics {
                metrics.role(&host.label, role);
            }
            match result {
                Ok(s) => {
                    self.failures[i] = 0;
                    if !s.recovery && !writable.iter().any(|(_, w)| w.server == s.server) {
                        writable.push((i, s));
                    }
                }
                Err(_) => self.failures[i] += 1,
            }
        }
        let timelines: Vec<(usize, u32)> = writable.iter().map(|(i, s)| (*i, s.timeline)).collect();
        self.writable_on.resize(seen.len(), 0);
        for &(i, timeline) in &timelines {
            self.writable_on[i] = timeline;
        }
        let following: Vec<Option<u32>> = seen
            .iter()
            .map(|r| match r {
                Ok(s) if s.recovery => Some(s.received_timeline),
                _ => None,
            })
            .collect();
        if let Some(lower) = reinstated(&timelines, self.highest, &self.writable_on, &following) {
            // Every server that was writable above it now streams from it
            // (rewound or rebuilt by an HA manager): the lower timeline is
            // all that is left, and refusing it would leave no primary.
            for on in &mut self.writable_on {
                if *on > lower {
                    *on = 0;
                }
            }
            crate::trace::pool_warn!(
                timeline = lower,
                highest = self.highest,
                "a primary on a lower timeline is reinstated: every server seen writable above \
                 it is now a standby receiving its timeline"
            );
            self.highest = lower;
        }
        let top = top_timeline(&timelines);
        if writable.len() > 1 || (top > 0 && top < self.highest) {
            if let Some(metrics) = metrics {
                metrics.conflicts.inc();
            }
            crate::trace::pool_warn!(
                writable = writable.len(),
                timeline = top,
                highest = self.highest,
                "a writable server below the highest timeline, or more than one (split \
                 brain): writes go only to the highest timeline, and nowhere on a tie"
            );
        }
        // The last primary, while it is still the elected one, and how its
        // check went.
        let holding = self
            .last
            .filter(|&l| hosts.is_primary(l))
            .map(|last| Holding {
                host: last,
                transient: seen[last].as_ref().is_err_and(|e| e.transient),
                failures: self.failures[last],
            });
        let primary = choose_primary(&timelines, self.highest, holding);
        let primary_seen = primary.and_then(|i| seen[i].as_ref().ok());
        let new_timeline = primary_seen.is_some_and(|p| p.timeline != self.timeline);
        // Not the first primary this pool has seen.
        let changed_primary = self.timeline != 0;
        self.unproven.resize(seen.len(), false);
        if let Some(p) = primary_seen {
            if new_timeline {
                // Positions from before a new timeline say nothing.
                self.samples.clear();
                self.timeline = p.timeline;
                self.highest = self.highest.max(p.timeline);
            }
            self.samples.push(now, p.lsn);
        }
        // Standbys: in rotation when up and within the lag bound (kept in
        // rotation while there is no primary to measure against: reads
        // carry on from standbys).
        for (i, result) in seen.iter().enumerate() {
            let host = &hosts.hosts[i];
            let standby = matches!(result, Ok(s) if s.recovery);
            let mut in_rotation = standby;
            if let Some(s) = result.as_ref().ok().filter(|s| s.recovery) {
                // This check's view, published whole below.
                let mut replay = **host.replay.load();
                // A standby that just appeared (at start, back from down,
                // promoted elsewhere, another server behind the same name)
                // or that lived through a change of timeline vouches for no
                // write until it has replayed past all it had received.
                let known = matches!(&self.servers[i], Some((server, true)) if *server == s.server);
                if new_timeline || !known {
                    let floor = s.received.max(s.lsn) + 1;
                    replay.token_floor = floor;
                    // Through a change of primary it must show it follows
                    // the new timeline before it serves any read (a restart
                    // proves nothing: only replaying past the floor does).
                    if new_timeline && changed_primary {
                        self.unproven[i] = true;
                    }
                }
                // A standby on another timeline than the primary's (left
                // behind on the old one, diverged) replays nothing the
                // primary writes, whatever its position says: by bytes and
                // seconds it may even look ahead. Its own timeline decides
                // where the pool's role may read it; else, after a change
                // of primary, replaying past the floor (WAL received since)
                // proves it follows.
                if s.lsn >= replay.token_floor {
                    self.unproven[i] = false;
                }
                let off_timeline = match s.received_timeline {
                    0 => self.unproven[i],
                    timeline => primary_seen.is_some() && timeline != self.timeline,
                };
                replay.received_timeline = s.received_timeline;
                replay.lsn = s.lsn;
                replay.vouched_losses = losses[i];
                host.replay.store(Arc::new(replay));
                if let Some(lag) = primary_seen.and_then(|_| self.samples.lag(s.lsn, now)) {
                    if let Some(metrics) = metrics {
                        metrics.lag(&host.label, lag.seconds, lag.bytes);
                    }
                    if let Some(max) = hosts.settings.max_lag {
                        // A lag that is only a lower bound (a new pool, the
                        // first check after a failover) vouches for nothing.
                        in_rotation = lag.known && lag.seconds <= max.as_secs_f64();
                    }
                }
                if off_timeline {
                    in_rotation = false;
                }
            }
            if let Ok(s) = result {
                self.servers[i] = Some((s.server.clone(), s.recovery));
            }
            host.standby.store(standby, Ordering::Release);
            host.in_rotation.store(in_rotation, Ordering::Release);
            if let Some(metrics) = metrics {
                if !standby {
                    metrics.no_lag(&host.label);
                }
                metrics.in_rotation(&host.label, in_rotation);
            }
        }
        // The election itself.
        match primary {
            Some(i) => {
                if let Some(p) = primary_seen {
                    hosts.timeline.store(p.timeline, Ordering::Release);
                }
                hosts.primary.store(i, Ordering::Release);
                if let Some(since) = self.none_since.take() {
                    if let Some(metrics) = metrics {
                        metrics.discovery.observe(since.elapsed().as_secs_f64());
                    }
                }
                if let Some(last) = self.last.filter(|&last| last != i) {
                    if let Some(metrics) = metrics {
                        metrics.primary_changes.inc();
                    }
                    // What still waits for a place on the old primary, a
                    // shared one or a connection of its own (`get()`,
                    // `begin()`, an atomic batch), was never sent: it goes
                    // to the new one now, not at its wait_timeout (a
                    // frozen primary answers nothing).
                    hosts.hosts[last].write.primary_moved();
                    crate::trace::pool_warn!(
                        host = hosts.hosts[i].label.as_str(),
                        "a new primary was elected"
                    );
                }
                self.last = Some(i);
            }
            None => {
                hosts.primary.store(NONE, Ordering::Release);
                if self.last.is_some() && self.none_since.is_none() {
                    self.none_since = Some(now);
                }
            }
        }
    }
}

/// The last primary, as [`choose_primary`] weighs it.
#[derive(Debug, Clone, Copy)]
struct Holding {
    host: usize,
    /// Whether its check this round failed in a way that may pass (a
    /// timeout, a full server) rather than a refused or broken connection.
    transient: bool,
    /// Its failed checks in a row, this one included.
    failures: u32,
}

/// The highest timeline among the writable servers (0 for none).
fn top_timeline(writable: &[(usize, u32)]) -> u32 {
    writable.iter().map(|&(_, t)| t).max().unwrap_or(0)
}

/// The lower timeline the one writable server may be elected on although
/// a higher one was seen, when that is all the servers say is left: every
/// host seen writable above it (`writable_on`) now answers as a standby
/// receiving WAL on exactly its timeline (`following`: per host, this
/// round's received timeline when in recovery), as a server rewound or
/// rebuilt to follow it does. A host above it that is down, still
/// writable, or in recovery without a known received timeline (reading it
/// takes `pg_read_all_stats`) may still be a writable primary somewhere:
/// no reinstatement.
fn reinstated(
    writable: &[(usize, u32)],
    highest: u32,
    writable_on: &[u32],
    following: &[Option<u32>],
) -> Option<u32> {
    let &[(candidate, lower)] = writable else {
        return None;
    };
    if lower == 0 || lower >= highest {
        return None;
    }
    let mut above = writable_on
        .iter()
        .enumerate()
        .filter(|&(i, &on)| i != candidate && on > lower)
        .peekable();
    above.peek()?;
    above
        .all(|(i, _)| following.get(i).copied().flatten() == Some(lower))
        .then_some(lower)
}

/// The election, pure: from the writable servers of one round (host,
/// timeline; each server once), the highest timeline any primary ever had,
/// and the last primary: exactly one writable server on the top timeline,
/// never below the highest ever (two there is split brain: none); with no
/// server writable at all, the last primary through [`PRIMARY_GRACE`]
/// transient failures.
fn choose_primary(
    writable: &[(usize, u32)],
    highest: u32,
    holding: Option<Holding>,
) -> Option<usize> {
    let top = top_timeline(writable);
    let mut on_top = writable
        .iter()
        .filter(|&&(_, t)| t == top && top >= highest);
    let primary = match (on_top.next(), on_top.next()) {
        (Some(&(i, _)), None) => Some(i),
        _ => None,
    };
    if primary.is_none() && writable.is_empty() {
        if let Some(last) = holding {
            if last.transient && last.failures < PRIMARY_GRACE {
                return Some(last.host);
            }
        }
    }
    primary
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(transient: bool, failures: u32) -> Option<Holding> {
        Some(Holding {
            host: 0,
            transient,
            failures,
        })
    }

    #[test]
    fn the_one_writable_server_is_elected() {
        assert_eq!(choose_primary(&[(2, 1)], 0, None), Some(2));
        assert_eq!(choose_primary(&[(2, 3)], 3, None), Some(2));
    }

    #[test]
    fn two_writable_servers_on_one_timeline_elect_none() {
        assert_eq!(choose_primary(&[(0, 2), (1, 2)], 0, None), None);
    }

    #[test]
    fn of_two_writable_servers_the_higher_timeline_wins() {
        assert_eq!(choose_primary(&[(0, 2), (1, 3)], 2, None), Some(1));
    }

    #[test]
    fn a_server_below_the_highest_timeline_ever_is_never_elected() {
        // The promoted server does not answer; the old primary is writable
        // on the old timeline: split brain, and no primary.
        assert_eq!(choose_primary(&[(0, 2)], 3, None), None);
    }

    #[test]
    fn a_lower_timeline_is_reinstated_only_once_every_server_above_follows_it() {
        // Host 1 was primary on timeline 3; host 0 is writable on 2.
        let on = [2, 3, 0];
        // Host 1 down, still writable elsewhere, or a standby of unknown
        // or other timeline: refused.
        assert_eq!(reinstated(&[(0, 2)], 3, &on, &[None, None, Some(2)]), None);
        assert_eq!(reinstated(&[(0, 2)], 3, &on, &[None, Some(0), None]), None);
        assert_eq!(reinstated(&[(0, 2)], 3, &on, &[None, Some(3), None]), None);
        assert_eq!(
            reinstated(&[(0, 2), (1, 3)], 3, &on, &[None, None, None]),
            None
        );
        // Host 1 rewound to follow timeline 2: reinstated.
        assert_eq!(
            reinstated(&[(0, 2)], 3, &on, &[None, Some(2), Some(2)]),
            Some(2)
        );
        // Nothing to reinstate on the highest timeline itself.
        assert_eq!(reinstated(&[(1, 3)], 3, &on, &[Some(3), None, None]), None);
    }

    #[test]
    fn the_last_primary_holds_through_a_few_transient_failures() {
        assert_eq!(choose_primary(&[], 2, holding(true, 1)), Some(0));
        assert_eq!(
            choose_primary(&[], 2, holding(true, PRIMARY_GRACE - 1)),
            Some(0)
        );
        assert_eq!(choose_primary(&[], 2, holding(true, PRIMARY_GRACE)), None);
    }

    #[test]
    fn a_refused_connection_ends_the_role_at_once() {
        assert_eq!(choose_primary(&[], 2, holding(false, 1)), None);
    }

    #[test]
    fn another_writable_server_ends_the_grace() {
        // A writable server below the highest timeline is no primary, and
        // the last one does not hold while any server is writable.
        assert_eq!(choose_primary(&[(1, 1)], 2, holding(true, 1)), None);
    }
}
