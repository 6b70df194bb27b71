//! How a pool's hosts are made from its configured servers: each host's
//! write lane at once, its read lane's recipe for its first use.

use super::{Host, HostSettings, Hosts};
use crate::config::PoolConfig;
use crate::conn::tls::Tls;
use crate::error::Error;
use crate::lane::{LaneRecipe, Setup};
use crate::metrics::{HostMetrics, Labels};
use crate::target::TargetSessionAttrs;

/// One configured server: its `host:port` label and how to reach it.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    pub(crate) label: String,
    pub(crate) write: tokio_postgres::Config,
    /// The same, opened read-only.
    pub(crate) read: tokio_postgres::Config,
    /// Whether the read lane's sessions are made read-only with a `SET`
    /// (through a session pooler, which refuses start-up `options`).
    pub(crate) read_after_connect: bool,
    /// Whether the read lane's sessions are read-only at all (not behind a
    /// transaction pooler).
    pub(crate) read_only: bool,
    /// Its own TLS connector (made from its URL's `sslrootcert`), or
    /// `None` for the pool's.
    pub(crate) tls: Option<Tls>,
}

impl Hosts {
    /// Makes every host's write lane (their read lanes wait for their
    /// first use) and the hosts' metrics.
    pub(crate) fn build(
        endpoints: Vec<Endpoint>,
        config: PoolConfig,
        setup: Setup,
        settings: HostSettings,
    ) -> Result<Hosts, Error> {
        let several = endpoints.len() > 1;
        let reads_enforced = endpoints.iter().all(|e| e.read_only);
        let mut hosts = Vec::with_capacity(endpoints.len());
        for (i, endpoint) in endpoints.into_iter().enumerate() {
            let recipe = |server, config, lane: &'static str| LaneRecipe {
                server,
                config,
                labels: Labels {
                    pool: setup.name.clone(),
                    host: several.then(|| endpoint.label.clone()),
                    lane: Some(lane),
                },
                registry: setup.registry.clone(),
                tls: endpoint.tls.clone().unwrap_or_else(|| setup.tls.clone()),
                build_info: i == 0 && lane == "write",
            };
            let mut write_config = config.clone();
            // With several hosts, connections open on demand: idle ones
            // kept on every host would mostly wait on standbys' write lanes.
            if several {
                write_config.min_idle = 0;
            }
            let mut read_config = config.clone();
            read_config.min_idle = 0;
            if endpoint.read_after_connect {
                let set = "SET default_transaction_read_only = on";
                read_config.after_connect = Some(match &config.after_connect {
                    Some(sql) => format!("{set}; {sql}"),
                    None => set.to_owned(),
                });
            }
            let write = recipe(endpoint.write, write_config, "write").make()?;
            let read = recipe(endpoint.read, read_config, "read");
            hosts.push(Host::new(endpoint.label, write, read));
        }
        let registry = setup.registry.as_ref();
        let metrics = match registry {
            Some(registry) if several || settings.default_target != TargetSessionAttrs::Any => {
                let labels: Vec<&str> = hosts.iter().map(|h| h.label.as_str()).collect();
                Some(HostMetrics::register(registry, &setup.name, &labels)?)
            }
            _ => None,
        };
        Ok(Hosts::new(hosts, settings, metrics, reads_enforced))
    }
}
