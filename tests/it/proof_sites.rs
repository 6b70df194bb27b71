//! The proof is complete by construction, checked against the server
//! (#43): every catalog column that can hold an expression (`pg_node_tree`)
//! or name a function (`regproc`, or an `oid` the catalog documents as a
//! reference to `pg_proc`) is one the proof's model classifies, on the
//! machine's PostgreSQL and on every other major installed (16, 17, 18 in
//! CI). A new major's new call site fails here instead of passing unseen;
//! at run time the catalog query answers it as unclassified, and the pool
//! proves nothing in that database.

use std::collections::BTreeSet;

use pgpipe_test_support::{Cluster, major_bin};
use tokio_postgres::Client;

/// The server's own list of call sites, as `table.column`.
const SITES_SQL: &str = "\
    SELECT c.relname::text || '.' || a.attname::text
      FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
     WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'r' AND a.attnum > 0
       AND a.atttypid IN ('pg_catalog.pg_node_tree'::regtype, 'pg_catalog.regproc'::regtype)
    UNION SELECT k.fktable::text || '.' || k.fkcols[1]::text
      FROM pg_catalog.pg_get_catalog_foreign_keys() k
     WHERE k.pktable = 'pg_catalog.pg_proc'::regclass";

/// A plain connection of the test's own.
async fn plain(url: &str) -> Client {
    pgpipe_test_support::connect(url)
        .await
        .expect("a plain connection")
}

/// The catalog query's rows, `(kind, name)`, as the pool reads them.
pub(crate) async fn catalog_rows(client: &Client) -> Vec<(String, String)> {
    let builtin: Option<Vec<i64>> = client
        .query_one(pgpipe::__proof::builtin_sql(), &[])
        .await
        .expect("the server's own edges are read")
        .get(0);
    let builtin = builtin.unwrap_or_default();
    client
        .query(pgpipe::__proof::catalog_sql(), &[&builtin])
        .await
        .expect("the catalog query runs")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Holds the model against one server.
async fn holds_on(client: &Client, label: &str) {
    let server: BTreeSet<String> = client
        .query(SITES_SQL, &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let model: BTreeSet<String> = pgpipe::__proof::call_sites().map(str::to_owned).collect();
    let unclassified: Vec<&String> = server.difference(&model).collect();
    assert!(
        unclassified.is_empty(),
        "{label}: catalog columns that can hold code and that the proof does not classify \
         (add each to protocol/catalog/sites.rs and follow it in proof.sql): {unclassified:?}"
    );
    assert!(server.len() > 50, "{label}: {} call sites?", server.len());
    // The catalog query agrees, and proves the built-ins of a fresh
    // database: no unclassified column, no hook that proves nothing.
    let rows = catalog_rows(client).await;
    let kinds = |kind: &str| rows.iter().filter(|(k, _)| k == kind).count();
    assert_eq!(kinds("u"), 0, "{label}: {rows:?}");
    assert_eq!(
        kinds("x"),
        0,
        "{label}: {:?}",
        rows.iter().filter(|(k, _)| k == "x").collect::<Vec<_>>()
    );
    assert!(kinds("p") > 1000, "{label}: {} proven names", kinds("p"));
    for (kind, name) in [
        ("p", "lower"),
        ("p", "now"),
        ("f", "set_config"),
        ("f", "setseed"),
    ] {
        assert!(
            rows.iter().any(|(k, n)| k == kind && n == name),
            "{label}: {kind} {name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_classifies_every_call_site_of_the_machines_server() {
    let admin = pgpipe_test_support::admin().await;
    holds_on(&admin, "the machine's server").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_classifies_every_call_site_of_every_major_installed() {
    for major in [16, 17, 18] {
        let Some(bin) = major_bin(major) else {
            continue;
        };
        let cluster = Cluster::builder().bin(bin).start().expect("cluster starts");
        let client = plain(&cluster.url()).await;
        holds_on(&client, &format!("PostgreSQL {major}")).await;
    }
}
