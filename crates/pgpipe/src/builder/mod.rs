//! [`PoolBuilder`]: the one way to make a [`Pool`].
//!
//! Here the builder and [`build`](PoolBuilder::build): the settings checked
//! together, the servers' configs completed, the pool made. Its setters are
//! in `servers` (the primary, the replicas, their roles) and `settings`
//! (everything else); `url` has what is made of a connection string (its
//! parse, one endpoint per host, the pool's default name).

mod servers;
mod settings;
mod tls;
mod url;

use tokio_postgres::config::SslMode;

use crate::config::PoolConfig;
use crate::conn::tls::Tls;
use crate::error::{Error, ErrorKind};
use crate::hosts::Endpoint;
use crate::hosts::HostSettings;
use crate::lane::Setup;
use crate::pool::Pool;
use crate::pooler::Pooler;
use crate::target::TargetSessionAttrs;
use tls::{SslSettings, connector_for};
use url::{ReadOnly, default_pool_name, escape_option, split_hosts};

/// Builds a [`Pool`]; start with [`Pool::builder`].
///
/// ```
/// # fn main() -> Result<(), pgpipe::Error> {
/// let pool = pgpipe::Pool::builder()
///     .url("postgres://postgres@127.0.0.1:5432/postgres")
///     .max_size(4)
///     .pipelining(true)
///     .build()?; // does not connect yet
/// # let _ = pool;
/// # Ok(())
/// # }
/// ```
#[must_use = "builder does nothing itself, use `.build()` to build it"]
#[derive(Debug, Default)]
pub struct PoolBuilder {
    server: Option<Result<tokio_postgres::Config, String>>,
    /// What the server's URL says of TLS beyond what tokio-postgres reads.
    server_ssl: SslSettings,
    config: PoolConfig,
    registry: Option<prometheus::Registry>,
    tls: Tls,
    /// Whether `max_pipeline_depth` was set, not left at its default: a
    /// depth above 1 asked for through a pooler that cannot track a
    /// pipeline is refused, not quietly lowered.
    depth_given: bool,
    /// Standbys (or any further hosts), as given to [`replicas`](Self::replicas).
    replicas: Vec<Result<(tokio_postgres::Config, SslSettings), String>>,
    /// `target_session_attrs` from the URL, which tokio-postgres is never
    /// shown.
    target: Option<Result<TargetSessionAttrs, String>>,
}

impl PoolBuilder {
    /// Checks the settings and makes the pool. Connects lazily: no
    /// connection is opened until the first query or [`Pool::get`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] when no server was given, the connection
    /// string does not parse, or the settings do not fit together (see
    /// [`PoolConfig`]).
    pub fn build(self) -> Result<Pool, Error> {
        if let Some(Err(message)) = &self.target {
            return Err(Error::config(message.clone()));
        }
        let mut server = match self.server {
            None => return Err(Error::config("no server given: call .url() or .config()")),
            Some(Err(message)) => return Err(Error::new(ErrorKind::Config, message)),
            Some(Ok(server)) => server,
        };
        if server.get_hosts().is_empty() && server.get_hostaddrs().is_empty() {
            return Err(Error::config("the connection config names no host"));
        }
        let server_tls = connector_for(&self.tls, &self.server_ssl).map_err(Error::config)?;
        if server.get_ssl_mode() == SslMode::Require
            && !self.tls.is_configured()
            && server_tls.is_none()
        {
            return Err(Error::config(NEEDS_TLS));
        }
        self.config.validate().map_err(Error::config)?;
        if self.depth_given && self.config.max_pipeline_depth > 1 {
            self.config
                .check_depth_through_pooler()
                .map_err(Error::config)?;
        }
        if server.get_connect_timeout().is_none() {
            server.connect_timeout(self.config.connect_timeout);
        }
        // So that the pool's backends can be told apart in
        // `pg_stat_activity`; the URL's own `application_name` wins.
        if server.get_application_name().is_none() {
            server.application_name(DEFAULT_APPLICATION_NAME);
        }
        // Set in the start-up packet: session defaults, not `SET`s that a
        // reset would undo.
        let mut startup: Vec<(String, String)> =
            self.config.session_settings.clone().into_iter().collect();
        if let Some(timeout) = self.config.statement_timeout {
            let millis = timeout.as_millis().max(1).to_string();
            startup.push(("statement_timeout".into(), millis));
        }
        if !startup.is_empty() {
            let mut options = server.get_options().unwrap_or_default().to_owned();
            for (name, value) in &startup {
                if !options.is_empty() {
                    options.push(' ');
                }
                options.push_str(&format!("-c {name}={}", escape_option(value)));
            }
            server.options(&options);
        }
        let name = self
            .config
            .pool_name
            .clone()
            .unwrap_or_else(|| default_pool_name(&server));
        let target = match self.target {
            None => None,
            Some(Ok(target)) => Some(target),
            Some(Err(message)) => return Err(Error::config(message)),
        };
        let mut servers = vec![(server.clone(), server_tls)];
        for replica in self.replicas {
            let (mut replica, ssl) = replica.map_err(Error::config)?;
            let replica_tls = connector_for(&self.tls, &ssl).map_err(Error::config)?;
            if replica.get_hosts().is_empty() && replica.get_hostaddrs().is_empty() {
                return Err(Error::config("a replica's connection string names no host"));
            }
            if replica.get_ssl_mode() == SslMode::Require
                && !self.tls.is_configured()
                && replica_tls.is_none()
            {
                return Err(Error::config(format!("a replica's {NEEDS_TLS}")));
            }
            if replica.get_connect_timeout().is_none() {
                replica.connect_timeout(self.config.connect_timeout);
            }
            if replica.get_application_name().is_none() {
                replica.application_name(DEFAULT_APPLICATION_NAME);
            }
            if !startup.is_empty() {
                replica.options(server.get_options().unwrap_or_default());
            }
            servers.push((replica, replica_tls));
        }
        let read_only = match self.config.pooler {
            Pooler::None => ReadOnly::Options,
            Pooler::Session => ReadOnly::AfterConnect,
            _ => ReadOnly::NotEnforced,
        };
        let mut endpoints: Vec<Endpoint> = Vec::new();
        for (server, tls) in &servers {
            for endpoint in split_hosts(server, read_only, tls)? {
                if endpoints.iter().any(|e| e.label == endpoint.label) {
                    return Err(Error::config(format!(
                        "{} is listed twice; give each host once",
                        endpoint.label
                    )));
                }
                endpoints.push(endpoint);
            }
        }
        // Where `get()` and `begin()` go when the URL names no target: the
        // primary, waiting for one within `failover_wait` as a write does
        // (libpq's `any` would take a standby while none is elected, and a
        // transaction's writes would fail there with 25006).
        let default_target = match target {
            Some(target) => target,
            None if endpoints.len() > 1 => TargetSessionAttrs::Primary,
            None => TargetSessionAttrs::Any,
        };
        let settings = HostSettings {
            recheck: self.config.host_recheck,
            max_lag: self.config.max_replica_lag,
            fallback: self.config.replica_fallback,
            failover_wait: self.config.failover_wait,
            default_target,
        };
        let setup = Setup {
            registry: self.registry,
            name,
            tls: self.tls,
        };
        Pool::new(endpoints, self.config.effective(), setup, settings)
    }
}

/// Why a server's `sslmode=require` cannot be met.
const NEEDS_TLS: &str = "sslmode=require needs TLS: give the builder a connector with \
     .tls_connector() (or a rustls ClientConfig with .tls(), feature `rustls`), or an \
     sslrootcert=<file> in the URL (feature `rustls`)";

/// The `application_name` of the pool's connections when the URL names none.
pub(crate) const DEFAULT_APPLICATION_NAME: &str = "pgpipe";

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn build(builder: PoolBuilder) -> Result<Pool, Error> {
        builder.url("postgres://u:sentinel-pw@127.0.0.1/db").build()
    }

    #[test]
    fn invalid_settings_are_build_errors() {
        let cases: Vec<PoolBuilder> = vec![
            Pool::builder().max_size(0),
            Pool::builder().max_pipeline_depth(0),
            Pool::builder().max_batch(0),
            Pool::builder().statement_cache_capacity(0),
            Pool::builder().batch_window(Duration::from_millis(1)),
            Pool::builder()
                .pipelining(true)
                .batch_window(Duration::from_secs(2)),
            Pool::builder().max_size(2).max_exclusive(3),
            Pool::builder().max_exclusive(0),
            Pool::builder().connect_timeout(Duration::ZERO),
        ];
        for builder in cases {
            let debug = format!("{builder:?}");
            let error = build(builder).expect_err(&debug);
            assert_eq!(error.kind(), ErrorKind::Config, "{debug}");
        }
    }

    #[test]
    fn missing_or_broken_server_is_a_build_error() {
        let error = Pool::builder().build().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Config);
        let error = Pool::builder().url("postgres://[::1").build().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Config);
        let error = Pool::builder()
            .url("postgres://u:sentinel-pw@127.0.0.1/db?sslmode=require")
            .build()
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Config);
        assert!(!error.to_string().contains("sentinel-pw"));
    }

    #[test]
    fn replica_settings_are_checked_at_build() {
        let url = "postgres://u@127.0.0.1/db";
        let cases: Vec<PoolBuilder> = vec![
            Pool::builder()
                .url(url)
                .replicas(["postgres://u@127.0.0.2/db?target_session_attrs=standby"]),
            Pool::builder().url(url).replicas(["postgres:///db"]),
            Pool::builder()
                .url(url)
                .replicas(["postgres://u@127.0.0.2/db?sslmode=require"]),
            Pool::builder()
                .url(url)
                .replicas(["postgres://u@127.0.0.1/db"]),
            Pool::builder()
                .url(url)
                .host_recheck(Duration::from_millis(1)),
            Pool::builder().url("postgres://u@a,b/db?target_session_attrs=nope"),
            Pool::builder().url("postgres://u@a:1,b:2,c:3/db?port=1,2"),
        ];
        for builder in cases {
            let debug = format!("{builder:?}");
            let error = builder.build().expect_err(&debug);
            assert_eq!(error.kind(), ErrorKind::Config, "{debug}: {error}");
        }
        let error = Pool::builder()
            .url("postgres://u@a/db?target_session_attrs=nope")
            .build()
            .unwrap_err();
        assert!(error.to_string().contains("nope"), "{error}");
        Pool::builder()
            .url("postgres://u@a:1,b:2/db?target_session_attrs=prefer-standby")
            .replicas(["postgres://u@c:3/db"])
            .build()
            .unwrap();
    }

    #[test]
    fn debug_output_hides_the_password() {
        let builder = Pool::builder().url("postgres://u:sentinel-pw@127.0.0.1/db");
        assert!(!format!("{builder:?}").contains("sentinel-pw"));
        let pool = builder.build().unwrap();
        assert!(!format!("{pool:?}").contains("sentinel-pw"));
    }

    #[test]
    fn defaults_build() {
        let pool = build(Pool::builder().pipelining(true)).unwrap();
        let status = pool.status();
        assert_eq!(status.size, 0, "lazy: nothing is opened by build()");
    }
}
