//! Secrets never leak: no `Debug`, `Display`, error or metric carries the
//! password.

use std::time::Duration;

use pgpipe::Pool;
use prometheus::{Registry, TextEncoder};

const SENTINEL: &str = "s3ntinel-Pa55word";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_appears_nowhere() {
    // A port nothing listens on, so every connection attempt fails.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://someone:{SENTINEL}@127.0.0.1:{port}/db");
    let registry = Registry::new();
    let builder = Pool::builder()
        .url(&url)
        .pipelining(true)
        .registry(&registry)
        .wait_timeout(Duration::from_secs(1));
    let mut seen = vec![format!("{builder:?}")];
    let pool = builder.build().unwrap();
    seen.push(format!("{pool:?}"));
    for pipelining_error in [
        pool.query("SELECT 1", &[]).await,
        pool.query("SELECT 1", &[]).await,
    ] {
        let e = pipelining_error.unwrap_err();
        seen.push(format!("{e}"));
        seen.push(format!("{e:?}"));
    }
    let e = pool.get().await.unwrap_err();
    seen.extend([format!("{e}"), format!("{e:?}")]);
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    config.password(SENTINEL);
    let from_config = Pool::builder().config(config).build().unwrap();
    seen.push(format!("{from_config:?}"));
    seen.push(
        TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap(),
    );
    let broken = Pool::builder()
        .url(&format!(
            "postgres://someone:{SENTINEL}@127.0.0.1:notaport/db"
        ))
        .build()
        .unwrap_err();
    seen.extend([format!("{broken}"), format!("{broken:?}")]);
    for text in &seen {
        assert!(!text.contains(SENTINEL), "the password leaked: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_carry_an_application_name_unless_the_url_names_one() {
    let unnamed = pgpipe::Pool::builder()
        .url(&pgpipe_test_support::database_url())
        .build()
        .unwrap();
    let name: String = unnamed
        .query_one("SHOW application_name", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, "pgpipe");
    let app = crate::support::app("named");
    let named = crate::support::builder(&app).build().unwrap();
    let name: String = named
        .query_one("SHOW application_name", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, app);
}
