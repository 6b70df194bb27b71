//! TLS with rustls against a server of the test's own, with certificates
//! made at test time: `sslmode=require` works, the pool still sees the
//! protocol under the encryption, and a wrong authority or host name is
//! refused (fail closed).

use std::sync::Arc;

use pgpipe::rustls::pki_types::CertificateDer;
use pgpipe::rustls::{ClientConfig, RootCertStore};
use pgpipe::{ErrorKind, Pool};
use pgpipe_test_support::Cluster;
use prometheus::Registry;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

use crate::support::{Scrape, assert_echoed, spawn_echoes};

/// A certificate authority, and a server certificate it signed for
/// `localhost` only.
pub(crate) struct Certificates {
    pub(crate) ca: CertificateDer<'static>,
    pub(crate) ca_pem: String,
    server_pem: String,
    server_key_pem: String,
}

pub(crate) fn authority(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    (params.self_signed(&key).unwrap(), key)
}

pub(crate) fn certificates() -> Certificates {
    let (ca, ca_key) = authority("pgpipe test CA");
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let key = KeyPair::generate().unwrap();
    let server = params.signed_by(&key, &ca, &ca_key).unwrap();
    Certificates {
        ca: ca.der().clone(),
        ca_pem: ca.pem(),
        server_pem: server.pem(),
        server_key_pem: key.serialize_pem(),
    }
}

pub(crate) fn trusting(ca: &CertificateDer<'static>) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(pgpipe::rustls::crypto::ring::default_provider());
    ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

pub(crate) fn tls_cluster(certs: &Certificates) -> Option<Cluster> {
    match Cluster::builder()
        .setting("ssl", "on")
        .setting("ssl_cert_file", "server.crt")
        .setting("ssl_key_file", "server.key")
        .file("server.crt", certs.server_pem.clone())
        .file("server.key", certs.server_key_pem.clone())
        .start()
    {
        Ok(cluster) => Some(cluster),
        Err(e) => {
            // Under CI the server binaries are there: a skip would hide a
            // missing install step.
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{e}");
            eprintln!("no throwaway cluster here ({e}); skipping the TLS tests");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_works_and_checks_the_authority_and_the_host_name() {
    let certs = certificates();
    let Some(cluster) = tls_cluster(&certs) else {
        return;
    };
    let port = cluster.port();

    // The right authority and host name: encrypted, and still pipelined and
    // observed (the tap reads the protocol above the encryption).
    let registry = Registry::new();
    let pool = Pool::builder()
        .url(&format!(
            "postgres://postgres@localhost:{port}/postgres?sslmode=require"
        ))
        .tls(trusting(&certs.ca))
        .pipelining(true)
        .max_size(2)
        .registry(&registry)
        .build()
        .unwrap();
    let queries = spawn_echoes(&pool, 0..200i64);
    assert_echoed(queries).await;
    let encrypted: bool = pool
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(encrypted, "the session is encrypted");
    let scrape = Scrape::of(&registry);
    assert!(scrape.value("pgpipe_pipeline_round_trips_saved_total", &[]) > 0.0);
    assert!(scrape.histogram_count("pgpipe_pipeline_batch_size") > 0);

    // An authority the server's certificate does not come from: refused.
    let (other_ca, _) = authority("someone else");
    let wrong_ca = Pool::builder()
        .url(&format!(
            "postgres://postgres@localhost:{port}/postgres?sslmode=require"
        ))
        .tls(trusting(&other_ca.der().clone()))
        .build()
        .unwrap();
    let e = wrong_ca.query("SELECT 1", &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connect, "{e}");

    // The right authority, but a host name the certificate does not name.
    let wrong_host = Pool::builder()
        .url(&format!(
            "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=require"
        ))
        .tls(trusting(&certs.ca))
        .build()
        .unwrap();
    let e = wrong_host.query("SELECT 1", &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connect, "{e}");

    // `sslmode=require` without TLS configured is a build error, not a
    // silent plaintext connection.
    let e = Pool::builder()
        .url(&format!(
            "postgres://postgres@localhost:{port}/postgres?sslmode=require"
        ))
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_falls_back_to_plaintext_and_is_still_observed() {
    // A server without TLS: `sslmode=prefer` (the default) asks, hears
    // no, and goes on in plaintext, and the tap follows.
    let cluster = match Cluster::start() {
        Ok(cluster) => cluster,
        Err(e) => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{e}");
            eprintln!("no throwaway cluster here ({e}); skipping");
            return;
        }
    };
    let certs = certificates();
    let registry = Registry::new();
    let pool = Pool::builder()
        .url(&cluster.url())
        .tls(trusting(&certs.ca))
        .pipelining(true)
        .max_size(1)
        .max_exclusive(1)
        .registry(&registry)
        .build()
        .unwrap();
    let queries = spawn_echoes(&pool, 0..100i64);
    assert_echoed(queries).await;
    let scrape = Scrape::of(&registry);
    assert!(scrape.histogram_count("pgpipe_pipeline_batch_size") > 0);
    assert!(
        !scrape.value("pgpipe_pipeline_rtt_seconds", &[]).is_nan(),
        "round trips timed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_a_server_that_only_speaks_tls() {
    let certs = certificates();
    // Plaintext is refused outright: a cancel sent in the clear (with the
    // connection's secret key in it) never reaches the backend.
    let hba = "local all all trust\n\
               hostssl all all 127.0.0.1/32 trust\n\
               hostnossl all all 0.0.0.0/0 reject\n";
    let cluster = match Cluster::builder()
        .setting("ssl", "on")
        .setting("ssl_cert_file", "server.crt")
        .setting("ssl_key_file", "server.key")
        .file("server.crt", certs.server_pem.clone())
        .file("server.key", certs.server_key_pem.clone())
        .file("pg_hba.conf", hba)
        .start()
    {
        Ok(cluster) => cluster,
        Err(e) => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{e}");
            eprintln!("no throwaway cluster here ({e}); skipping");
            return;
        }
    };
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=require&application_name=tls_cancel",
        cluster.port()
    );
    let pool = Pool::builder()
        .url(&url)
        .tls(trusting(&certs.ca))
        .max_size(2)
        .query_timeout(std::time::Duration::from_millis(300))
        .build()
        .unwrap();
    let start = std::time::Instant::now();
    let e = pool.query("SELECT pg_sleep(10)", &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueryTimeout, "{e}");
    // The server stopped sleeping: the cancel got through (without it the
    // pool would wait out its grace and close the connection instead).
    assert!(
        start.elapsed() < std::time::Duration::from_secs(4),
        "the cancel did not reach the server: {:?}",
        start.elapsed()
    );
    let observer = Pool::builder()
        .url(&url.replace("tls_cancel", "tls_observer"))
        .tls(trusting(&certs.ca))
        .build()
        .unwrap();
    let active: i64 = observer
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = 'tls_cancel' AND state = 'active'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(active, 0, "the timed-out query still runs on the server");
}
