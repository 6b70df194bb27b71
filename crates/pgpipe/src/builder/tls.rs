//! What a connection string says of TLS beyond what tokio-postgres reads:
//! libpq's `sslmode=verify-ca` and `verify-full`, and `sslrootcert`; and
//! which connector each server's connections then use.

use std::path::PathBuf;

use crate::conn::tls::{Tls, Verify};
use crate::target::take_param;

/// A server's TLS settings from its connection string.
#[derive(Debug, Clone, Default)]
pub(super) struct SslSettings {
    /// `verify-ca` or `verify-full` (tokio-postgres is shown `require`).
    verify: Option<Verify>,
    root_cert: Option<PathBuf>,
}

/// Takes `sslmode=verify-ca`/`verify-full` (leaving `require` for
/// tokio-postgres, which knows no more) and `sslrootcert` out of `url`.
pub(super) fn take_ssl(url: &str) -> Result<(String, SslSettings), String> {
    let (rest, mode) = take_param(url, "sslmode").map_err(|e| e.to_string())?;
    let (mut rest, root_cert) = take_param(&rest, "sslrootcert").map_err(|e| e.to_string())?;
    let verify = match mode.as_deref() {
        Some("verify-ca") => Some(Verify::Ca),
        Some("verify-full") => Some(Verify::Full),
        _ => None,
    };
    if let Some(mode) = mode {
        let mode = if verify.is_some() { "require" } else { &mode };
        rest = with_param(&rest, "sslmode", mode);
    }
    let root_cert = root_cert.map(PathBuf::from);
    Ok((rest, SslSettings { verify, root_cert }))
}

/// `url` with `key=value` added (a URL's query, or a `key=value` string).
fn with_param(url: &str, key: &str, value: &str) -> String {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    match (is_url, url.contains('?')) {
        (true, true) => format!("{url}&{key}={value}"),
        (true, false) => format!("{url}?{key}={value}"),
        (false, _) => format!("{url} {key}={value}"),
    }
}

/// The connector of one server's connections: `None` for the pool's (the
/// one given to the builder, or none), or one made from the server's
/// `sslrootcert` and `sslmode`; an error for settings that cannot hold.
pub(super) fn connector_for(pool: &Tls, ssl: &SslSettings) -> Result<Option<Tls>, String> {
    let Some(root_cert) = &ssl.root_cert else {
        if pool.is_configured() || ssl.verify.is_none() {
            // The connector given checks what it checks: the three
            // published ones verify the authority and the host name.
            return Ok(None);
        }
        return Err(
            "sslmode=verify-ca or verify-full needs sslrootcert=<file of trusted authorities> \
             (or a connector: .tls() or .tls_connector())"
                .to_owned(),
        );
    };
    if pool.is_configured() {
        return Err(format!(
            "sslrootcert={} is read by pgpipe's own rustls connector; with .tls() or \
             .tls_connector() your connector's authorities apply: give one or the other",
            root_cert.display()
        ));
    }
    // libpq: `require` with a root certificate verifies as `verify-ca`.
    let verify = ssl.verify.unwrap_or(Verify::Ca);
    #[cfg(feature = "rustls")]
    return crate::conn::tls::roots::connector(root_cert, verify).map(Some);
    #[cfg(not(feature = "rustls"))]
    {
        let _ = verify;
        Err(format!(
            "sslrootcert={} needs the `rustls` feature (or a connector of your own: \
             .tls_connector())",
            root_cert.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_modes_become_require_and_the_root_certificate_is_taken_out() {
        let (rest, ssl) =
            take_ssl("postgres://u@db/app?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem")
                .unwrap();
        assert_eq!(rest, "postgres://u@db/app?sslmode=require");
        assert_eq!(ssl.verify, Some(Verify::Full));
        assert_eq!(ssl.root_cert, Some(PathBuf::from("/tmp/ca.pem")));
        let (rest, ssl) =
            take_ssl("host=db sslmode = 'verify-ca' sslrootcert=/tmp/ca.pem user=u").unwrap();
        assert_eq!(rest, "host=db   user=u sslmode=require");
        assert_eq!(ssl.verify, Some(Verify::Ca));
        let (rest, ssl) = take_ssl("postgres://u@db/app?sslmode=prefer").unwrap();
        assert_eq!(rest, "postgres://u@db/app?sslmode=prefer");
        assert_eq!(ssl.verify, None);
    }

    #[test]
    fn verification_without_authorities_or_with_two_sources_of_them_is_refused() {
        let verify_only = SslSettings {
            verify: Some(Verify::Full),
            root_cert: None,
        };
        assert!(connector_for(&Tls::default(), &verify_only).is_err());
        let both = SslSettings {
            verify: Some(Verify::Full),
            root_cert: Some("/tmp/ca.pem".into()),
        };
        let given = Tls::new(tokio_postgres::NoTls, "test");
        assert!(connector_for(&given, &both).is_err());
        assert!(connector_for(&given, &verify_only).unwrap().is_none());
    }
}
