//! Where work goes: the primary's write lane, a standby's read lane, or
//! the lane an exclusive checkout's target names. Reads the election from
//! atomics; waits on the monitor only when no primary is elected.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Hosts, SUSPECT_ROUND};
use crate::error::{Error, ErrorKind};
use crate::lane::Lane;
use crate::metrics::hosts::{FallbackReason, RouteLabel};
use crate::target::{Consistency, ReplicaFallback, TargetSessionAttrs, WriteToken};

/// Where a query goes: the lane, its host's index, and the route.
#[derive(Debug)]
pub(crate) struct Pick<'a> {
    pub(crate) lane: &'a Arc<Lane>,
    pub(crate) host: usize,
    pub(crate) route: RouteLabel,
}

impl Hosts {
    /// The write lane of the primary, waiting for one until `deadline`.
    pub(crate) async fn writer(
        self: &Arc<Self>,
        deadline: tokio::time::Instant,
    ) -> Result<Pick<'_>, Error> {
        self.ensure_monitor();
        let mut host = self.primary(deadline).await?;
        let suspect = self.suspect.load(Ordering::Acquire);
        if suspect >> 48 == host as u64 + 1 {
            self.round_after(suspect & SUSPECT_ROUND).await;
            host = self.primary(deadline).await?;
        }
        Ok(Pick {
            lane: &self.hosts[host].write,
            host,
            route: RouteLabel::Primary,
        })
    }

    /// A standby's read lane for a read of `consistency`, avoiding
    /// `exclude`; else, by the fallback, the primary's read lane.
    pub(crate) async fn reader(
        self: &Arc<Self>,
        consistency: Consistency,
        exclude: Option<usize>,
    ) -> Result<Pick<'_>, Error> {
        self.ensure_monitor();
        let (wanted, token) = match consistency {
            Consistency::Eventual => (true, None),
            Consistency::AtLeast(token) => (true, Some(token)),
            Consistency::Strong => (false, None),
        };
        let mut reason = FallbackReason::NoReplica;
        if wanted && self.discovering {
            self.first_round().await;
            let stale_token =
                token.is_some_and(|t| self.elected().is_none() || t.timeline != self.timeline());
            if !stale_token {
                match self.standby(exclude, token) {
                    Ok(host) => {
                        return Ok(Pick {
                            lane: self.read_lane(host),
                            host,
                            route: RouteLabel::Replica,
                        });
                    }
                    Err(why) => reason = why,
                }
            } else {
                reason = FallbackReason::Token;
            }
        }
        if wanted && token.is_none() && self.settings.fallback == ReplicaFallback::Fail {
            return Err(Error::new(
                ErrorKind::NoReplica,
                "no standby is up within max_replica_lag, and replica_fallback is Fail",
            )
            .unsent());
        }
        if let Some(metrics) = &self.metrics {
            if wanted {
                metrics.fallback(reason);
            }
        }
        let host = self.primary(self.failover_deadline()).await?;
        Ok(Pick {
            lane: self.read_lane(host),
            host,
            route: if wanted {
                RouteLabel::PrimaryFallback
            } else {
                RouteLabel::Primary
            },
        })
    }

    /// A standby in rotation (and known to have replayed `token`, if
    /// given), round robin.
    fn standby(
        &self,
        exclude: Option<usize>,
        token: Option<WriteToken>,
    ) -> Result<usize, FallbackReason> {
        let n = self.hosts.len();
        let start = self.next_read.fetch_add(1, Ordering::Relaxed);
        let mut reason = FallbackReason::NoReplica;
        for k in 0..n {
            let i = start.wrapping_add(k) % n;
            let host = &self.hosts[i];
            if Some(i) == exclude || !host.standby.load(Ordering::Acquire) {
                continue;
            }
            // A connection lost since its last check: what that check found
            // vouches for nothing (a recheck is under way).
            if !host.in_rotation.load(Ordering::Acquire) || !host.vouched() {
                reason = FallbackReason::Lag;
                continue;
            }
            if token.is_some_and(|token| !host.has_replayed(token)) {
                reason = FallbackReason::Token;
                continue;
            }
            return Ok(i);
        }
        Err(reason)
    }

    /// An exclusive connection's lane, by libpq's target.
    pub(crate) async fn lane_for(
        self: &Arc<Self>,
        target: TargetSessionAttrs,
    ) -> Result<&Arc<Lane>, Error> {
        use TargetSessionAttrs as T;
        if let Some(host) = self.single() {
            return Ok(match target {
                T::Standby => {
                    return Err(Error::new(
                        ErrorKind::NoReplica,
                        "target_session_attrs=standby, and the pool has one host",
                    )
                    .unsent());
                }
                T::ReadOnly => self.read_lane(0),
                _ => &host.write,
            });
        }
        self.first_round().await;
        match target {
            T::ReadWrite | T::Primary => Ok(self.writer(self.failover_deadline()).await?.lane),
            T::ReadOnly => Ok(self.reader(Consistency::Eventual, None).await?.lane),
            T::Standby => match self.standby(None, None) {
                Ok(i) => Ok(self.read_lane(i)),
                Err(_) => Err(Error::new(
                    ErrorKind::NoReplica,
                    "target_session_attrs=standby, and no standby is up within max_replica_lag",
                )
                .unsent()),
            },
            T::PreferStandby => match self.standby(None, None) {
                Ok(i) => Ok(self.read_lane(i)),
                Err(_) => Ok(self.writer(self.failover_deadline()).await?.lane),
            },
            T::Any | T::PreferPrimary => match self.elected() {
                Some(i) => Ok(&self.hosts[i].write),
                None => match self.standby(None, None) {
                    Ok(i) => Ok(self.read_lane(i)),
                    Err(_) => Ok(self.writer(self.failover_deadline()).await?.lane),
                },
            },
        }
    }
}
