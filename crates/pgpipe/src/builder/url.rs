//! What the pool makes of a connection string: its parse, one endpoint per
//! host it names (with the read lane's read-only twin), the start-up
//! `options` escaping, and the pool's default name.

use std::str::FromStr;

use tokio_postgres::config::Host;

use crate::conn::tls::Tls;
use crate::error::Error;
use crate::hosts::Endpoint;

pub(super) fn parse(url: &str) -> Result<tokio_postgres::Config, String> {
    tokio_postgres::Config::from_str(url)
        .map_err(|e| format!("the connection string does not parse: {e}"))
}

/// A value for the start-up `options`, where spaces separate arguments and a
/// backslash escapes the next character.
pub(super) fn escape_option(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        if c == ' ' || c == '\\' {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// How a read lane's sessions are made read-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadOnly {
    /// `-c default_transaction_read_only=on` in the start-up `options`.
    Options,
    /// A `SET` after connecting: session poolers (PgBouncer refuses
    /// `options`) keep one server session per client connection.
    AfterConnect,
    /// Behind a transaction pooler no session outlives a transaction.
    NotEnforced,
}

/// One endpoint per host of `server` (a multi-host URL names several),
/// with its read-only twin.
pub(super) fn split_hosts(
    server: &tokio_postgres::Config,
    read_only: ReadOnly,
    tls: &Option<Tls>,
) -> Result<Vec<Endpoint>, Error> {
    let hosts = server.get_hosts();
    let addrs = server.get_hostaddrs();
    let ports = server.get_ports();
    let count = hosts.len().max(addrs.len());
    if ports.len() > 1 && ports.len() != count {
        return Err(Error::config(format!(
            "{} ports for {count} hosts: give one port for every host, or one for all",
            ports.len()
        )));
    }
    let mut endpoints = Vec::with_capacity(count);
    for i in 0..count {
        let mut one = without_hosts(server);
        let name = match (addrs.get(i), hosts.get(i)) {
            (Some(ip), host) => {
                one.hostaddr(*ip);
                if let Some(Host::Tcp(host)) = host {
                    one.host(host);
                }
                ip.to_string()
            }
            (None, Some(Host::Tcp(host))) => {
                one.host(host);
                host.clone()
            }
            #[cfg(unix)]
            (None, Some(Host::Unix(path))) => {
                one.host_path(path);
                path.display().to_string()
            }
            (None, None) => continue,
        };
        // libpq: one port for all hosts, or one per host.
        let port = match ports {
            [] => 5432,
            [only] => *only,
            many => *many.get(i).ok_or_else(|| {
                Error::config("give one port for every host, or one for all of them")
            })?,
        };
        one.port(port);
        let mut read = one.clone();
        if read_only == ReadOnly::Options {
            let mut options = read.get_options().unwrap_or_default().to_owned();
            if !options.is_empty() {
                options.push(' ');
            }
            options.push_str("-c default_transaction_read_only=on");
            read.options(&options);
        }
        endpoints.push(Endpoint {
            label: format!("{name}:{port}"),
            write: one,
            read,
            read_after_connect: read_only == ReadOnly::AfterConnect,
            read_only: read_only != ReadOnly::NotEnforced,
            tls: tls.clone(),
        });
    }
    Ok(endpoints)
}

/// `server`'s settings, with no host, address or port: tokio-postgres
/// offers no way to remove them from a config.
fn without_hosts(server: &tokio_postgres::Config) -> tokio_postgres::Config {
    let mut one = tokio_postgres::Config::new();
    if let Some(user) = server.get_user() {
        one.user(user);
    }
    if let Some(password) = server.get_password() {
        one.password(password);
    }
    if let Some(dbname) = server.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = server.get_options() {
        one.options(options);
    }
    if let Some(name) = server.get_application_name() {
        one.application_name(name);
    }
    if let Some(timeout) = server.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = server.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = server.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = server.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.ssl_mode(server.get_ssl_mode())
        .ssl_negotiation(server.get_ssl_negotiation())
        .keepalives(server.get_keepalives())
        .keepalives_idle(server.get_keepalives_idle())
        .channel_binding(server.get_channel_binding());
    one
}

/// `host:port/dbname`, from the first host.
pub(super) fn default_pool_name(server: &tokio_postgres::Config) -> String {
    let host = match (server.get_hostaddrs().first(), server.get_hosts().first()) {
        (Some(ip), _) => ip.to_string(),
        (None, Some(Host::Tcp(host))) => host.clone(),
        #[cfg(unix)]
        (None, Some(Host::Unix(path))) => path.display().to_string(),
        (None, None) => "unknown".into(),
    };
    let port = server.get_ports().first().copied().unwrap_or(5432);
    // Without a database name the server uses the user's; the label never
    // names the user, so it names no database then.
    match server.get_dbname() {
        Some(db) => format!("{host}:{port}/{db}"),
        None => format!("{host}:{port}"),
    }
}
