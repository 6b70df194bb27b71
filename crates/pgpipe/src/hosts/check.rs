//! The monitor: asks every host its role and WAL position, on one
//! connection of its own per host (never queued behind user work), every
//! `host_recheck`, and at once when something suggests a role changed (a
//! write route's connection broke, a write met a read-only host, a standby
//! was promoted under a connection). Then it elects the primary and sets
//! each standby's lag.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::lag::Samples;
use super::{CHECK_TIMEOUT, Hosts, NONE};
use crate::conn::{Manager, PgConn, PoolWire};
use crate::metrics::hosts::RoleLabel;
use crate::sync::lock;
use tokio_postgres::error::SqlState;

/// One query answers everything: in recovery or not; the timeline (on a
/// primary: its WAL file name starts with it; `pg_walfile_name` refuses to
/// run in recovery); the position (a primary's flushed WAL, a standby's
/// replayed WAL); who the server is, so that two configured names for one
/// server (a writer endpoint and the instance behind it) are not taken for
/// split brain; and on a standby, the WAL it has received and on which
/// timeline (`received_tli` reads NULL without `pg_read_all_stats`). Every
/// other function here works for a role without privileges.
const CHECK_SQL: &str = "SELECT pg_is_in_recovery()::text, \
     CASE WHEN pg_is_in_recovery() THEN 0 \
          ELSE ('x' || substr(pg_walfile_name(pg_current_wal_flush_lsn()), 1, 8))::bit(32)::int \
     END::text, \
     ((CASE WHEN pg_is_in_recovery() THEN coalesce(pg_last_wal_replay_lsn(), '0/0') \
            ELSE pg_current_wal_flush_lsn() END) - '0/0')::int8::text, \
     coalesce(inet_server_port(), 0)::text || '@' || pg_postmaster_start_time()::text, \
     ((CASE WHEN pg_is_in_recovery() THEN coalesce(pg_last_wal_receive_lsn(), '0/0') \
            ELSE '0/0' END) - '0/0')::int8::text, \
     coalesce((SELECT received_tli FROM pg_stat_wal_receiver), 0)::text";

/// Rounds a primary's checks may time out, or find it up but full
/// (`max_connections` for the monitor's own connection), before it is no
/// longer the primary, while no other host is writable: one slow answer
/// must not fail every write with `NoPrimary`. A refused or broken
/// connection ends its role at once.
const PRIMARY_GRACE: u32 = 3;

/// Fastest and slowest re-check while there is no primary.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(25), Duration::from_millis(500));

/// What one check found.
#[derive(Debug, Clone)]
struct Seen {
    recovery: bool,
    timeline: u32,
    lsn: u64,
    server: String,
    received: u64,
    received_timeline: u32,
}

/// Why a check found nothing.
#[derive(Debug)]
struct Failure {
    message: String,
    /// A timeout, or a server that is up but full: the host may still hold
    /// its role (see [`PRIMARY_GRACE`]). Otherwise (refused, broken) it is
    /// down.
    transient: bool,
}

impl Failure {
    fn down(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            transient: false,
        }
    }

    fn transient(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            transient: true,
        }
    }
}

/// Starts the monitor task; it ends when the pool is dropped or closed.
pub(crate) fn start_monitor(hosts: &Arc<Hosts>) {
    let managers: Vec<Manager> = hosts
        .hosts
        .iter()
        .map(|host| {
            let lane = host.write.manager();
            // Its connections are nobody's queries: not in the metrics. Its
            // connection lost counts as one of the host's.
            let wire = PoolWire::new(None);
            wire.on_host(Arc::clone(host.signal()));
            Manager {
                wire: Arc::new(wire),
                after_connect: None,
                descriptions: None,
                read_groups: false,
                ..lane.clone()
            }
        })
        .collect();
    tokio::spawn(monitor(Arc::downgrade(hosts), managers));
}

async fn monitor(hosts: Weak<Hosts>, managers: Vec<Manager>) {
    let mut conns: Vec<Option<PgConn>> = managers.iter().map(|_| None).collect();
    let mut election = Election::default();
    let mut backoff = BACKOFF.0;
    loop {
        let trigger = {
            let Some(hosts) = hosts.upgrade() else { return };
            if hosts.is_closed() {
                return;
            }
            hosts.started.fetch_add(1, Ordering::AcqRel);
            // Taken before any check: a loss from now on is after them.
            let losses: Vec<u64> = hosts.hosts.iter().map(|h| h.signal().losses()).collect();
            let seen = check_all(&managers, &mut conns).await;
            election.apply(&hosts, seen, &losses);
            hosts.rounds.fetch_add(1, Ordering::AcqRel);
            hosts.round_done.notify_waiters();
            Arc::clone(&hosts.trigger)
        };
        let wait = match hosts.upgrade() {
            Some(hosts) if hosts.elected().is_none() => {
                let wait = backoff;
                backoff = (backoff * 2).min(BACKOFF.1);
                wait
            }
            Some(hosts) => {
                backoff = BACKOFF.0;
                hosts.settings.recheck
            }
            None => return,
        };
        let _ = tokio::time::timeout(wait, trigger.notified()).await;
    }
}

/// Checks every host at once, each within [`CHECK_TIMEOUT`].
async fn check_all(
    managers: &[Manager],
    conns: &mut [Option<PgConn>],
) -> Vec<Result<Seen, Failure>> {
    let mut checks = JoinSet::new();
    for (i, (manager, conn)) in managers.iter().zip(conns.iter_mut()).enumerate() {
        let (manager, conn) = (manager.clone(), conn.take());
        checks.spawn(async move {
            let checked = tokio::time::timeout(CHECK_TIMEOUT, check(&manager, conn)).await;
            let (conn, seen) = match checked {
                Ok((conn, seen)) => (conn, seen),
                Err(_) => (None, Err(Failure::transient("the check timed out"))),
            };
            (i, conn, seen)
        });
    }
    let mut seen: Vec<Result<Seen, Failure>> = (0..managers.len())
        .map(|_| Err(Failure::down("the check did not finish")))
        .collect();
    while let Some(done) = checks.join_next().await {
        if let Ok((i, conn, result)) = done {
            conns[i] = conn;
            seen[i] = result;
        }
    }
    seen
}

/// One host's check, on its kept connection or a new one.
async fn check(manager: &Manager, conn: Option<PgConn>) -> (Option<PgConn>, Result<Seen, Failure>) {
    let conn = match conn {
        Some(conn) if !conn.is_dead() => conn,
        _ => match manager.open().await {
            Ok(conn) => conn,
            // Up but full, or starting: no sign that it lost its role.
            Err(e)
                if e.code().is_some_and(|c| {
                    *c == SqlState::TOO_MANY_CONNECTIONS || *c == SqlState::CANNOT_CONNECT_NOW
                }) =>
            {
                return (None, Err(Failure::transient(e.to_string())));
            }
            Err(e) => return (None, Err(Failure::down(e.to_string()))),
        },
    };
    let rows = match conn.client.simple_query(CHECK_SQL).await {
        Ok(rows) => rows,
        Err(e) => return (None, Err(Failure::down(e.to_string()))),
    };
    let row = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    let parsed = row.and_then(|row| {
        Some(Seen {
            recovery: row.get(0)? == "true",
            timeline: row.get(1)?.parse().ok()?,
            lsn: u64::try_from(row.get(2)?.parse::<i64>().ok()?).ok()?,
            server: row.get(3)?.to_owned(),
            received: u64::try_from(row.get(4)?.parse::<i64>().ok()?).ok()?,
            received_timeline: row.get(5)?.parse().ok()?,
        })
    });
    match parsed {
        Some(seen) => (Some(conn), Ok(seen)),
        None => (
            None,
            Err(Failure::down("the role check answered nothing readable")),
        ),
    }
}

/// What the monitor remembers between rounds.
#[derive(Debug, Default)]
struct Election {
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
}

impl Election {
    /// `losses`: each host's lost connections when the round began.
    fn apply(&mut self, hosts: &Hosts, seen: Vec<Result<Seen, Failure>>, losses: &[u64]) {
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
        let top = writable.iter().map(|(_, s)| s.timeline).max().unwrap_or(0);
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
        let on_top: Vec<usize> = writable
            .iter()
            .filter(|(_, s)| s.timeline == top && top >= self.highest)
            .map(|(i, _)| *i)
            .collect();
        let mut primary = match on_top.as_slice() {
            [only] => Some(*only),
            _ => None,
        };
        // The primary whose check failed keeps its role for a few rounds,
        // unless another server is writable.
        if primary.is_none() && writable.is_empty() {
            if let Some(last) = self.last.filter(|&l| hosts.is_primary(l)) {
                let transient = seen[last].as_ref().is_err_and(|e| e.transient);
                if transient && self.failures[last] < PRIMARY_GRACE {
                    primary = Some(last);
                }
            }
        }
        let primary_seen = primary.and_then(|i| seen[i].as_ref().ok());
        let new_timeline = primary_seen.is_some_and(|p| p.timeline != self.timeline);
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
                // A standby that just appeared (at start, back from down,
                // promoted elsewhere, another server behind the same name)
                // or that lived through a change of timeline vouches for no
                // write until it has replayed past all it had received.
                let known = matches!(&self.servers[i], Some((server, true)) if *server == s.server);
                if new_timeline || !known {
                    let floor = s.received.max(s.lsn) + 1;
                    host.token_floor.store(floor, Ordering::Release);
                }
                host.received_timeline
                    .store(s.received_timeline, Ordering::Release);
                host.replay_lsn.store(s.lsn, Ordering::Release);
                host.vouched_losses.store(losses[i], Ordering::Release);
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
                if self.last.is_some_and(|last| last != i) {
                    if let Some(metrics) = metrics {
                        metrics.primary_changes.inc();
                    }
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
