//! The one dispatcher: every piece of work that needs a host (a query, a
//! batch, a checkout, and so `begin()`) picks its lane here and runs again
//! here, only where nothing can have been written:
//!
//! - a write refused as read-only (25006, or 0A000 "… during recovery"):
//!   the host it reached is no primary. The statement ran in an implicit
//!   transaction that the error aborted, so a query is run once more on
//!   the primary the next check elects;
//! - a read on a standby cancelled by a recovery conflict (40001), or whose
//!   connection to a standby broke: a standby writes nothing, so a query
//!   runs once more on another host;
//! - work that was never sent (its connection could not be opened, or
//!   broke before it went out) while `failover_wait` lasts: it waits for
//!   the next primary. A checkout waits only when no connection could be
//!   opened (its own timeout is its caller's).
//!
//! A write whose connection broke (`ConnectionLost`) may have committed and
//! is never run again; it only makes the monitor check every host now.
//! Within one lane, [`retry`](crate::lane::retry) decides what runs again on
//! another connection; this module decides what runs again on another host.

use std::future::Future;
use std::sync::Arc;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::Hosts;
use crate::answer::{Answer, Op, Reply};
use crate::error::{Error, ErrorKind};
use crate::lane::Lane;
use crate::lane::query as one;
use crate::lane::settings::How;
use crate::metrics::hosts::{RetryReason, RouteLabel};
use crate::target::{Consistency, TargetSessionAttrs};

/// What is dispatched, which decides what may run again on another host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// One query: counted by route, run again as the module doc says.
    Query,
    /// A batch: a write batch waits for the next primary when nothing was
    /// sent; a batch is never run again once sent, and a read batch never
    /// runs again.
    Batch,
}

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

/// Runs `work` on the primary's write lane (with one host, its only lane),
/// and again where the module doc says; returns the result and the lane it
/// ran on last, if any.
pub(crate) async fn on_writer<'h, T, F, Fut>(
    hosts: &'h Arc<Hosts>,
    kind: Work,
    mut work: F,
) -> (Result<T, Error>, Option<&'h Arc<Lane>>)
where
    F: FnMut(&'h Arc<Lane>) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    if let Some(host) = hosts.single() {
        return (work(&host.write).await, Some(&host.write));
    }
    let (mut retried, mut waits) = (false, 0);
    // One bound for the whole write, however many times it waits.
    let failover_deadline = hosts.failover_deadline();
    loop {
        let pick = match hosts.writer(failover_deadline).await {
            Ok(pick) => pick,
            Err(e) => return (Err(e), None),
        };
        if let (Some(metrics), Work::Query) = (&hosts.metrics, kind) {
            metrics.routed(RouteLabel::Primary);
        }
        let result = work(pick.lane).await;
        if let Err(error) = &result {
            match role_error(error) {
                Some(code @ ("25006" | "0A000")) if kind == Work::Query => {
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
                // It waited for a primary that another host replaced:
                // never sent, and the new one is elected already.
                _ if error.kind() == ErrorKind::NoPrimary
                    && error.is_unsent()
                    && waits < super::MAX_FAILOVER_WAITS =>
                {
                    waits += 1;
                    if let Some(metrics) = &hosts.metrics {
                        metrics.retry(RetryReason::PrimaryMoved);
                    }
                    continue;
                }
                // Nothing was sent: the primary may be gone. Within
                // `failover_wait`, wait for the next one.
                _ if error.kind() == ErrorKind::Connect || error.is_unsent() => {
                    let reopens_at = pick.lane.router().reopens_at();
                    let again = hosts
                        .wait_to_retry(&mut waits, failover_deadline, reopens_at)
                        .await;
                    if again {
                        continue;
                    }
                }
                _ if kind == Work::Query && error.kind() == ErrorKind::ConnectionLost => {
                    hosts.suspect(pick.host);
                }
                _ => {}
            }
        }
        return (result, Some(pick.lane));
    }
}

/// Runs `work` on a read lane fit for `consistency`: a query once more on
/// another host if a standby cancelled it for a recovery conflict or lost
/// its connection; returns the result and the lane it ran on last, if any.
pub(crate) async fn on_reader<'h, T, F, Fut>(
    hosts: &'h Arc<Hosts>,
    consistency: Consistency,
    kind: Work,
    mut work: F,
) -> (Result<T, Error>, Option<&'h Arc<Lane>>)
where
    F: FnMut(&'h Arc<Lane>) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut exclude = None;
    loop {
        let pick = match hosts.reader(consistency, exclude).await {
            Ok(pick) => pick,
            Err(e) => return (Err(e), None),
        };
        if kind == Work::Batch {
            return (work(pick.lane).await, Some(pick.lane));
        }
        if let Some(metrics) = &hosts.metrics {
            metrics.routed(pick.route);
        }
        let result = work(pick.lane).await;
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
        return (result, Some(pick.lane));
    }
}

/// Runs `work` (a checkout) on the lane `target` names: with several
/// hosts, when no connection could be opened there (the host may be gone),
/// again after a round of checks within `failover_wait`; when another host
/// was elected primary while it waited, at once on the new one.
pub(crate) async fn on_target<'h, T, F, Fut>(
    hosts: &'h Arc<Hosts>,
    target: TargetSessionAttrs,
    mut work: F,
) -> Result<T, Error>
where
    F: FnMut(&'h Arc<Lane>) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let deadline = hosts.failover_deadline();
    let mut waits = 0;
    loop {
        let (result, checked_out) = match hosts.lane_for(target).await {
            Ok(lane) => (work(lane).await, true),
            Err(e) => (Err(e), false),
        };
        let error = result.as_ref().err();
        // Its checkout waited on a primary another host replaced: never
        // sent, and the new one is elected already.
        let moved =
            checked_out && error.is_some_and(|e| e.kind() == ErrorKind::NoPrimary && e.is_unsent());
        if moved && waits < super::MAX_FAILOVER_WAITS {
            waits += 1;
            if let Some(metrics) = &hosts.metrics {
                metrics.retry(RetryReason::PrimaryMoved);
            }
            continue;
        }
        let refused = error.is_some_and(|e| e.kind() == ErrorKind::Connect);
        if refused
            && hosts.single().is_none()
            && hosts.wait_to_retry(&mut waits, deadline, None).await
        {
            continue;
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

impl Hosts {
    /// Runs one query on the primary, as `how` asks. With one host the
    /// query goes straight to its lane: the query future carries nothing
    /// of the dispatcher.
    pub(crate) async fn run(
        self: &Arc<Self>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        op: Op,
        how: How,
    ) -> Result<Reply, Error> {
        if let Some(host) = self.single() {
            return one::run(&host.write, sql, params, op, how).await;
        }
        let run = |lane| one::run(lane, sql, params, op, how);
        on_writer(self, Work::Query, run).await.0
    }

    /// Runs one query on the primary, or as a read of `read`.
    pub(crate) async fn run_as(
        self: &Arc<Self>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        op: Op,
        how: How,
        read: Option<Consistency>,
    ) -> Result<Reply, Error> {
        match read {
            None => self.run(sql, params, op, how).await,
            Some(consistency) => {
                let run = |lane| one::run(lane, sql, params, op, how);
                on_reader(self, consistency, Work::Query, run).await.0
            }
        }
    }
}
