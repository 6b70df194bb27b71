//! The builder's setters of the servers: the primary's URL or config, the
//! replicas, and how their roles are learned and used (rechecks, lag,
//! fallback, read groups, failover).

use std::time::Duration;

use super::PoolBuilder;
use super::tls::take_ssl;
use super::url::parse;
use crate::target::ReplicaFallback;
// For doc links only.
#[cfg(doc)]
use crate::{config::PoolConfig, pool::Pool};

impl PoolBuilder {
    /// The server, as a `postgres://` URL or a libpq `key=value` string. A
    /// string that does not parse is reported by [`build`](Self::build).
    ///
    /// A URL may name several hosts (`postgres://u@db1:5432,db2:5432/app`)
    /// and libpq's `target_session_attrs` (all six values): the pool then
    /// learns each host's role, as with [`replicas`](Self::replicas), and
    /// [`Pool::get`] reaches the kind of host the target names.
    pub fn url(mut self, url: &str) -> Self {
        match crate::target::take_target(url) {
            Ok((url, target)) => {
                self.server = Some(take_ssl(&url).and_then(|(url, ssl)| {
                    self.server_ssl = ssl;
                    parse(&url)
                }));
                self.target = target.map(Ok);
            }
            Err(e) => self.target = Some(Err(e.to_string())),
        }
        self
    }

    /// The primary (or a writer endpoint), as [`url`](Self::url) takes it.
    /// Where it points is a first guess: every host's role is learned from
    /// the server, and a promoted standby becomes the primary.
    pub fn primary(self, url: &str) -> Self {
        self.url(url)
    }

    /// Standbys that reads through [`Pool::read`] may use, each a URL.
    /// Their roles, too, are learned from the servers, and re-checked
    /// every [`host_recheck`](Self::host_recheck).
    ///
    /// ```
    /// # fn main() -> Result<(), pgpipe::Error> {
    /// let pool = pgpipe::Pool::builder()
    ///     .primary("postgres://app@writer:5432/app")
    ///     .replicas(["postgres://app@reader-1:5432/app", "postgres://app@reader-2:5432/app"])
    ///     .max_replica_lag(std::time::Duration::from_secs(1))
    ///     .pipelining(true)
    ///     .build()?;
    /// # let _ = pool;
    /// # Ok(())
    /// # }
    /// ```
    pub fn replicas<'u>(mut self, urls: impl IntoIterator<Item = &'u str>) -> Self {
        self.replicas = urls
            .into_iter()
            .map(|url| match crate::target::take_target(url) {
                Ok((url, None)) => {
                    let (url, ssl) = take_ssl(&url)?;
                    Ok((parse(&url)?, ssl))
                }
                Ok((_, Some(_))) => Err(
                    "target_session_attrs belongs to the primary's URL (or .url()), not to a \
                     replica's: the pool routes to replicas by role"
                        .to_owned(),
                ),
                Err(e) => Err(e.to_string()),
            })
            .collect();
        self
    }

    /// How often every host's role and lag are checked. Default: 2 s.
    pub fn host_recheck(mut self, every: Duration) -> Self {
        self.config.host_recheck = every;
        self
    }

    /// A standby further behind than this serves no reads until it catches
    /// up. Default: none.
    pub fn max_replica_lag(mut self, lag: impl Into<Option<Duration>>) -> Self {
        self.config.max_replica_lag = lag.into();
        self
    }

    /// Where a read goes when no standby fits. Default:
    /// [`ReplicaFallback::Primary`].
    pub fn replica_fallback(mut self, fallback: ReplicaFallback) -> Self {
        self.config.replica_fallback = fallback;
        self
    }

    /// Whether reads that go out together share one `Sync` (through
    /// [`Pool::read`], and plain reads through [`Pool::query`]); see
    /// [`PoolConfig::read_groups`]. Default: `true`.
    pub fn read_groups(mut self, on: bool) -> Self {
        self.config.read_groups = on;
        self
    }

    /// How long a write waits for a primary to be elected. Default: zero.
    pub fn failover_wait(mut self, wait: Duration) -> Self {
        self.config.failover_wait = wait;
        self
    }

    /// The server, as a tokio-postgres config.
    pub fn config(mut self, config: tokio_postgres::Config) -> Self {
        self.server = Some(Ok(config));
        self
    }
}
