//! libpq's `sslmode=verify-ca`/`verify-full` with `sslrootcert` from the
//! URL, and TLS through a connector that is not rustls (`postgres-openssl`
//! through `tls_connector`), against a server of the test's own with a
//! throwaway authority. The server says whether a session is encrypted
//! (`pg_stat_ssl`); the client's word is not taken for it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use openssl::ssl::{SslConnector, SslMethod};
use openssl::x509::X509;
use pgpipe::{ErrorKind, Pool};
use prometheus::Registry;

use crate::support::{Scrape, assert_echoed, spawn_echoes};
use crate::tls::{authority, certificates, tls_cluster, trusting};

/// The process' rustls provider, which the URL's own connector uses
/// (pgpipe's `rustls` feature chooses none).
fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// `pem` in a file of its own under a directory for this test.
fn pem_file(test: &str, name: &str, pem: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pgpipe-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap();
    path
}

async fn encrypted(pool: &Pool) -> Result<bool, pgpipe::Error> {
    let row = pool
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_and_verify_ca_from_the_url_check_what_libpq_checks() {
    install_provider();
    let certs = certificates();
    let Some(cluster) = tls_cluster(&certs) else {
        return;
    };
    let port = cluster.port();
    let ca = pem_file("verify", "ca.pem", &certs.ca_pem);
    let (other, _) = authority("someone else");
    let other = pem_file("verify", "other.pem", &other.pem());
    let pool = |host: &str, mode: &str, root: &PathBuf| {
        Pool::builder()
            .url(&format!(
                "postgres://postgres@{host}:{port}/postgres?sslmode={mode}&sslrootcert={}",
                root.display()
            ))
            .max_size(1)
            .build()
            .unwrap()
    };

    // verify-full: the authority and the host name. The certificate names
    // `localhost` only.
    let right = pool("localhost", "verify-full", &ca);
    assert!(encrypted(&right).await.unwrap(), "the server says so");
    let e = pool("127.0.0.1", "verify-full", &ca)
        .query("SELECT 1", &[])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connect, "another host name: {e}");

    // verify-ca: the authority only, as libpq.
    let by_address = pool("127.0.0.1", "verify-ca", &ca);
    assert!(encrypted(&by_address).await.unwrap());
    for mode in ["verify-ca", "verify-full", "require"] {
        // `require` with a root certificate verifies as `verify-ca`.
        let e = pool("localhost", mode, &other)
            .query("SELECT 1", &[])
            .await
            .unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::Connect,
            "{mode}, another authority: {e}"
        );
    }

    // What cannot hold is a build error, never a weaker connection.
    let url = format!("postgres://postgres@localhost:{port}/postgres?sslmode=verify-full");
    let e = Pool::builder().url(&url).build().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "no authorities: {e}");
    let e = Pool::builder()
        .url(&format!("{url}&sslrootcert={}", ca.display()))
        .tls(trusting(&certs.ca))
        .build()
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::Config,
        "two sources of authorities: {e}"
    );
    let e = Pool::builder()
        .url(&format!("{url}&sslrootcert=/nonexistent/ca.pem"))
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "an unreadable file: {e}");
}

fn openssl_trusting(ca_pem: &str) -> postgres_openssl::MakeTlsConnector {
    let mut builder = SslConnector::builder(SslMethod::tls()).unwrap();
    builder
        .cert_store_mut()
        .add_cert(X509::from_pem(ca_pem.as_bytes()).unwrap())
        .unwrap();
    postgres_openssl::MakeTlsConnector::new(builder.build())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_connector_carries_the_pipeline_its_checks_and_the_cancels() {
    let certs = certificates();
    let Some(cluster) = tls_cluster(&certs) else {
        return;
    };
    let port = cluster.port();
    let url = |host: &str| {
        format!(
            "postgres://postgres@{host}:{port}/postgres?sslmode=require\
             &application_name=openssl_tls"
        )
    };
    let registry = Registry::new();
    let pool = Pool::builder()
        .url(&url("localhost"))
        .tls_connector(openssl_trusting(&certs.ca_pem))
        .pipelining(true)
        .max_size(2)
        .query_timeout(Duration::from_millis(300))
        .registry(&registry)
        .build()
        .unwrap();
    // Encrypted, and still pipelined and observed: the tap reads the
    // protocol above openssl's encryption.
    assert_echoed(spawn_echoes(&pool, 0..200i64)).await;
    assert!(encrypted(&pool).await.unwrap(), "the server says so");
    let scrape = Scrape::of(&registry);
    assert!(scrape.value("pgpipe_pipeline_round_trips_saved_total", &[]) > 0.0);

    // The connector's own checks hold: openssl checks the host name.
    let e = Pool::builder()
        .url(&url("127.0.0.1"))
        .tls_connector(openssl_trusting(&certs.ca_pem))
        .build()
        .unwrap()
        .query("SELECT 1", &[])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connect, "another host name: {e}");

    // A cancel goes through the same connector: the server stops sleeping
    // long before the 10 s are up.
    let start = Instant::now();
    let e = pool.query("SELECT pg_sleep(10)", &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueryTimeout, "{e}");
    let observer = Pool::builder()
        .url(&url("localhost").replace("openssl_tls", "openssl_observer"))
        .tls_connector(openssl_trusting(&certs.ca_pem))
        .build()
        .unwrap();
    let mut sleeping = 1;
    while sleeping > 0 && start.elapsed() < Duration::from_secs(5) {
        sleeping = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'openssl_tls' \
                 AND query LIKE 'SELECT pg_sleep%' AND state = 'active'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(sleeping, 0, "the cancel did not reach the server");
}
