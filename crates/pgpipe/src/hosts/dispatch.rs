//! Sends work to a host's lane, and runs it again only where nothing can
//! have been written:
//!
//! - a write refused as read-only (25006, or 0A000 "… during recovery"):
//!   the host it reached is no primary. The statement ran in an implicit
//!   transaction that the error aborted, so it is run once more on the
//!   primary the next check elects;
//! - a read on a standby cancelled by a recovery conflict (40001), or whose
//!   connection to a standby broke: a standby writes nothing, so it runs
//!   once more on another host.
//!
//! - a write that was never sent (its connection could not be opened, or
//!   broke before it went out) while `failover_wait` lasts: it waits for
//!   the next primary.
//!
//! A write whose connection broke (`ConnectionLost`) may have committed and
//! is never run again; it only makes the monitor check every host now.

use std::sync::Arc;

use super::Hosts;
use crate::answer::{Answer, Op};
use crate::error::{Error, ErrorKind};
use crate::metrics::hosts::{RetryReason, RouteLabel};
use crate::pool::PoolInner;
use crate::query as one;
use crate::target::Consistency;
use tokio_postgres::types::ToSql;

/// One query to run wherever dispatch sends it.
#[derive(Clone, Copy)]
pub(crate) struct Query<'a> {
    pub(crate) sql: &'a str,
    pub(crate) params: &'a [&'a (dyn ToSql + Sync)],
    pub(crate) op: Op,
    pub(crate) slow: bool,
}

impl Query<'_> {
    async fn run(&self, lane: &Arc<PoolInner>) -> Result<Answer, Error> {
        one::run(lane, self.sql, self.params, self.op, self.slow).await
    }
}
use tokio_postgres::error::SqlState;

/// The role-related SQLSTATE of `error`, if it has one.
fn role_error(error: &Error) -> Option<&'static str> {
    let db = error.as_db_error()?;
    match db.code() {
        c if *c == SqlState::READ_ONLY_SQL_TRANSACTION => Some("25006"),
        c if *c == SqlState::FEATURE_NOT_SUPPORTED && db.message().contains("during recovery") => {
            Some("0A000")
        }
        c if *c == SqlState::T_R_SERIALIZATION_FAILURE
            && db.message().contains("conflict with recovery") =>
        {
            Some("40001")
        }
        _ => None,
    }
}

/// Runs `work` on the primary's write lane: once more on the next elected
/// primary if the host it reached turned out read-only.
pub(crate) async fn write(hosts: &Arc<Hosts>, query: Query<'_>) -> Result<Answer, Error> {
    let (mut retried, mut waits) = (false, 0);
    // One bound for the whole write, however many times it waits.
    let failover_deadline = hosts.failover_deadline();
    loop {
        let pick = hosts.writer(failover_deadline).await?;
        if let Some(metrics) = &hosts.metrics {
            metrics.routed(RouteLabel::Primary);
        }
        let result = query.run(pick.lane).await;
        if let Err(error) = &result {
            match role_error(error) {
                Some(code @ ("25006" | "0A000")) => {
                    if let Some(metrics) = &hosts.metrics {
                        metrics.role_error(code);
                    }
                    // Run again only once a round of checks that started
                    // after this error shows that the host is no longer the
                    // primary: a primary whose role or database defaults to
                    // read-only answers 25006 too, and that is the caller's.
                    hosts.next_round().await;
                    if !retried && !hosts.is_primary(pick.host) {
                        retried = true;
                        if let Some(metrics) = &hosts.metrics {
                            metrics.retry(RetryReason::ReadOnly);
                        }
                        continue;
                    }
                }
                // Nothing was sent: the primary may be gone. Within
                // `failover_wait`, wait for the next one.
                _ if error.kind() == ErrorKind::Connect || error.is_unsent() => {
                    let again = hosts.wait_to_retry(&mut waits, failover_deadline).await;
                    if again {
                        continue;
                    }
                }
                _ if error.kind() == ErrorKind::ConnectionLost => hosts.suspect(pick.host),
                _ => {}
            }
        }
        return result;
    }
}

/// What a batch's results tell the monitor: a role error or a lost
/// connection asks for a round of checks now (a batch is never run again).
pub(crate) fn observe_batch(hosts: &Hosts, results: &[Result<Answer, Error>]) {
    let suspicious = results.iter().any(|result| {
        result.as_ref().is_err_and(|e| {
            matches!(role_error(e), Some("25006" | "0A000"))
                || matches!(e.kind(), ErrorKind::ConnectionLost | ErrorKind::Connect)
        })
    });
    if suspicious {
        hosts.recheck();
    }
}

/// Runs `work` on a read lane fit for `consistency`: once more on another
/// host if a standby cancelled it for a recovery conflict or lost its
/// connection.
pub(crate) async fn read(
    hosts: &Arc<Hosts>,
    consistency: Consistency,
    query: Query<'_>,
) -> Result<Answer, Error> {
    let mut exclude = None;
    loop {
        let pick = hosts.reader(consistency, exclude).await?;
        if let Some(metrics) = &hosts.metrics {
            metrics.routed(pick.route);
        }
        let result = query.run(pick.lane).await;
        if let Err(error) = &result {
            let code = role_error(error);
            if let (Some(metrics), Some(code)) = (&hosts.metrics, code) {
                metrics.role_error(code);
            }
            // Decided by the route the read was sent on, not by what the
            // monitor says of the host by now (a standby that died is no
            // standby to it a moment later): a replica route runs on a read
            // lane, whose sessions are read-only by the server, so whatever
            // ran there wrote nothing.
            let on_replica = pick.route == RouteLabel::Replica;
            let read_only = on_replica && hosts.reads_enforced;
            let reason = match (code, error.kind()) {
                (Some("40001"), _) if read_only => Some(RetryReason::RecoveryConflict),
                (_, ErrorKind::ConnectionLost) if read_only => {
                    hosts.recheck();
                    Some(RetryReason::ReplicaLost)
                }
                // Nothing ran at all.
                (_, ErrorKind::Connect) if on_replica => {
                    hosts.recheck();
                    Some(RetryReason::ReplicaLost)
                }
                _ if on_replica && error.is_unsent() => Some(RetryReason::ReplicaLost),
                (_, ErrorKind::ConnectionLost | ErrorKind::Connect) => {
                    hosts.recheck();
                    None
                }
                _ => None,
            };
            if let (Some(reason), None) = (reason, exclude) {
                if let Some(metrics) = &hosts.metrics {
                    metrics.retry(reason);
                }
                exclude = Some(pick.host);
                continue;
            }
        }
        return result;
    }
}
