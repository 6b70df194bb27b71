//! Settings as data: `PoolConfig` from the environment (with the `serde`
//! feature and the `config` crate, as deadpool-postgres users configure
//! theirs), with errors that name the key.

use std::collections::HashMap;
use std::time::Duration;

use pgpipe::{ErrorKind, Pool, PoolConfig, Routing};

fn from_env(vars: &[(&str, &str)]) -> Result<PoolConfig, config::ConfigError> {
    let env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    config::Config::builder()
        .add_source(
            config::Environment::with_prefix("PGPIPE")
                .separator("__")
                .try_parsing(true)
                .source(Some(env)),
        )
        .build()?
        .try_deserialize()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_come_from_the_environment_durations_in_human_form() {
    let settings = from_env(&[
        ("PGPIPE__MAX_SIZE", "3"),
        ("PGPIPE__PIPELINING", "true"),
        ("PGPIPE__WAIT_TIMEOUT", "250ms"),
        ("PGPIPE__QUERY_TIMEOUT", "2s"),
        ("PGPIPE__ROUTING", "spread"),
        ("PGPIPE__SESSION_SETTINGS__SEARCH_PATH", "pg_catalog"),
    ])
    .unwrap();
    assert_eq!(settings.max_size, 3);
    assert!(settings.pipelining);
    assert_eq!(settings.wait_timeout, Duration::from_millis(250));
    assert_eq!(settings.query_timeout, Some(Duration::from_secs(2)));
    assert_eq!(settings.routing, Routing::Spread);
    assert_eq!(
        settings.max_pipeline_depth,
        PoolConfig::default().max_pipeline_depth,
        "keys not given keep their defaults"
    );
    let pool = Pool::builder()
        .url(&pgpipe_test_support::database_url())
        .pool_config(settings)
        .build()
        .unwrap();
    let path: String = pool
        .query_one("SHOW search_path", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(path, "pg_catalog");
}

#[test]
fn a_bad_value_names_its_key() {
    let error = from_env(&[("PGPIPE__WAIT_TIMEOUT", "soon")]).unwrap_err();
    assert!(error.to_string().contains("wait_timeout"), "{error}");
    let error = from_env(&[("PGPIPE__MAX_SIZE", "many")]).unwrap_err();
    assert!(error.to_string().contains("max_size"), "{error}");
    let error = from_env(&[("PGPIPE__NO_SUCH_SETTING", "1")]).unwrap_err();
    assert!(error.to_string().contains("no_such_setting"), "{error}");
    // A combination that cannot work is the builder's Config error, named.
    let settings = from_env(&[("PGPIPE__MAX_SIZE", "2"), ("PGPIPE__MAX_EXCLUSIVE", "3")]).unwrap();
    let error = Pool::builder()
        .url(&pgpipe_test_support::database_url())
        .pool_config(settings)
        .build()
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(error.to_string().contains("max_exclusive"), "{error}");
}

/// The pooler and the prepare mode are settings like any other, and a
/// combination that cannot work through the pooler is refused at build.
#[test]
fn the_pooler_comes_from_the_environment_too() {
    let session = from_env(&[("PGPIPE__POOLER", "session")]).unwrap();
    assert_eq!(session.pooler, pgpipe::Pooler::Session);
    let transaction = from_env(&[
        ("PGPIPE__POOLER__TRANSACTION__TRACKS_PIPELINE", "false"),
        ("PGPIPE__POOLER__TRANSACTION__TRACKS_PREPARED", "false"),
        ("PGPIPE__PREPARE", "unnamed"),
    ])
    .unwrap();
    assert_eq!(transaction.pooler, pgpipe::Pooler::unknown_transaction());
    assert_eq!(transaction.prepare, Some(pgpipe::Prepare::Unnamed));
    let mut refused = transaction.clone();
    refused.statement_timeout = Some(Duration::from_secs(5));
    let error = Pool::builder()
        .url("postgres://app@127.0.0.1:6432/app")
        .pool_config(refused)
        .build()
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(error.to_string().contains("statement_timeout"), "{error}");
    Pool::builder()
        .url("postgres://app@127.0.0.1:6432/app")
        .pool_config(transaction)
        .build()
        .unwrap();
}
