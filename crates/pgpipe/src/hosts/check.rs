//! The monitor: asks every host its role and WAL position, on one
//! connection of its own per host (never queued behind user work), every
//! `host_recheck`, and at once when something suggests a role changed (a
//! write route's connection broke, a write met a read-only host, a standby
//! was promoted under a connection). Then the [`Election`] elects the
//! primary and sets each standby's lag.

use crate::protocol::coalesce::Grouping;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::task::JoinSet;

use super::election::Election;
use super::{CHECK_TIMEOUT, Hosts};
use crate::conn::hooks::Hooks;
use crate::conn::{Manager, PgConn, PoolWire};
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

/// Fastest and slowest re-check while there is no primary, or a host is
/// down.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(25), Duration::from_millis(500));

/// What one check found.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) recovery: bool,
    pub(super) timeline: u32,
    pub(super) lsn: u64,
    pub(super) server: String,
    pub(super) received: u64,
    pub(super) received_timeline: u32,
}

/// Why a check found nothing.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) message: String,
    /// A timeout, or a server that is up but full: the host may still hold
    /// its role (see [`PRIMARY_GRACE`]). Otherwise (refused, broken) it is
    /// down.
    pub(super) transient: bool,
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
                hooks: Hooks::default(),
                descriptions: None,
                read_groups: Grouping::Off,
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
        let (trigger, some_down) = {
            let Some(hosts) = hosts.upgrade() else { return };
            if hosts.is_closed() {
                return;
            }
            hosts.started.fetch_add(1, Ordering::AcqRel);
            // Taken before any check: a loss from now on is after them.
            let losses: Vec<u64> = hosts.hosts.iter().map(|h| h.signal().losses()).collect();
            let seen = check_all(&managers, &mut conns, hosts.timeline()).await;
            let some_down = seen.iter().any(Result::is_err);
            election.apply(&hosts, seen, &losses);
            hosts.rounds.fetch_add(1, Ordering::AcqRel);
            hosts.round_done.notify_waiters();
            (Arc::clone(&hosts.trigger), some_down)
        };
        // With no primary, or a host that did not answer, the next round
        // comes soon: a server back from down (a restarted standby, the
        // primary's successor) is found within the backoff, not at the
        // next `host_recheck`.
        let wait = match hosts.upgrade() {
            Some(hosts) if hosts.elected().is_none() || some_down => {
                let wait = backoff.min(hosts.settings.recheck);
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
///
/// The round ends early when a host answers that it is writable on a
/// timeline above `top` (the highest the pool has seen, 0 before any): a
/// standby was promoted, and no host still to answer can outrank it (a
/// host below the highest timeline is never elected again). So a frozen
/// old primary, whose check only times out, does not hold the election
/// for [`CHECK_TIMEOUT`] (issue #47); the hosts that had not answered
/// count as a transient failure this round, and are checked again on new
/// connections in the next.
async fn check_all(
    managers: &[Manager],
    conns: &mut [Option<PgConn>],
    top: u32,
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
    let mut answered = vec![false; managers.len()];
    let mut cut_short = false;
    while let Some(done) = checks.join_next().await {
        if let Ok((i, conn, result)) = done {
            let promoted = top > 0
                && result
                    .as_ref()
                    .is_ok_and(|s| !s.recovery && s.timeline > top);
            conns[i] = conn;
            seen[i] = result;
            answered[i] = true;
            if promoted {
                cut_short = true;
                break;
            }
        }
    }
    let unanswered = seen
        .iter_mut()
        .zip(&answered)
        .filter(|(_, a)| cut_short && !**a);
    for (seen, _) in unanswered {
        *seen = Err(Failure::transient(
            "its check had not answered when a newer primary was seen",
        ));
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
