//! Code written for deadpool-postgres' `GenericClient` ports: prepared
//! statements (pgpipe's, which run anywhere, and tokio-postgres' own, which
//! run on the connection they were prepared on), `query_raw` with an
//! iterator of parameters and a stream of rows, `query_typed` with the
//! types beside the values; on the pool, a checkout, a transaction, and
//! `begin()`'s transaction alike.

use futures_util::TryStreamExt;
use pgpipe::tokio_postgres::types::{ToSql, Type};
use pgpipe::{Error, ErrorKind, Executor, Statement};
use prometheus::Registry;

use crate::support::{Scrape, app, builder};

/// A data-access function as deadpool-postgres code has it: prepare once,
/// run the statement, stream a raw query, run a typed one.
async fn handler(db: &impl Executor) -> Result<(i64, Vec<String>, String), Error> {
    let statement: Statement = db.prepare_cached("SELECT $1::int8 * 2").await?;
    assert_eq!(statement.params(), &[Type::INT8]);
    assert_eq!(statement.columns()[0].type_(), &Type::INT8);
    let doubled: i64 = db.query_one(&statement, &[&21i64]).await?.get(0);

    let names = vec!["ann".to_owned(), "bob".to_owned()];
    let rows: Vec<_> = db
        .query_raw("SELECT unnest(ARRAY[$1, $2]::text[])", names)
        .await?
        .try_collect()
        .await?;
    let names = rows.iter().map(|row| row.get(0)).collect();

    // The types given, not inferred: `$1` alone would be `text` anyway,
    // but here the caller says so, and no statement is prepared.
    let typed = db
        .query_typed("SELECT $1 || '!'", &[(&"hi", Type::TEXT)])
        .await?;
    Ok((doubled, names, typed[0].get(0)))
}

fn expected() -> (i64, Vec<String>, String) {
    (42, vec!["ann".into(), "bob".into()], "hi!".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_client_handler_runs_on_every_executor() {
    let pool = builder(&app("porting"))
        .max_size(3)
        .pipelining(true)
        .build()
        .unwrap();
    assert_eq!(handler(&pool).await.unwrap(), expected());
    assert_eq!(handler(&pool.read()).await.unwrap(), expected());
    assert_eq!(handler(&pool.slow()).await.unwrap(), expected());
    let mut conn = pool.get().await.unwrap();
    assert_eq!(handler(&conn).await.unwrap(), expected());
    {
        let tx = conn.transaction().await.unwrap();
        assert_eq!(handler(&tx).await.unwrap(), expected());
        tx.commit().await.unwrap();
    }
    drop(conn);
    let tx = pool.begin().await.unwrap();
    assert_eq!(handler(&tx).await.unwrap(), expected());
    tx.commit().await.unwrap();
}

/// A statement prepared on the pool runs by its SQL on any connection; one
/// prepared on a checkout through tokio-postgres runs there, with pgpipe's
/// errors, and the pool refuses it before running anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_run_where_they_can() {
    let registry = Registry::new();
    let pool = builder(&app("porting_statements"))
        .max_size(2)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    let statement = pool.prepare("SELECT $1::int8 + 1").await.unwrap();
    assert_eq!(statement.sql(), "SELECT $1::int8 + 1");
    let (pool_ref, statement_ref) = (&pool, &statement);
    let answers: Vec<i64> = futures_util::future::try_join_all((0..20i64).map(|i| async move {
        let row = pool_ref.query_one(statement_ref, &[&i]).await?;
        Ok::<i64, Error>(row.get(0))
    }))
    .await
    .unwrap();
    assert_eq!(answers, (1..21).collect::<Vec<i64>>());
    // The pool's own method takes it too, and a reference to a reference.
    let sql = "SELECT 1::int8";
    assert_eq!(pool.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0), 1);

    let conn = pool.get().await.unwrap();
    let raw = conn.client().prepare("SELECT $1::int8 * 3").await.unwrap();
    let row = conn.query_one(&raw, &[&5i64]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 15);
    let e = conn.query_one(&raw, &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Params, "{e}");
    let e = conn.execute(&raw, &[&"five"]).await.unwrap_err();
    assert!(!e.may_have_run(), "{e}");
    // Counted at the connection, as every statement on a checkout is.
    let exclusive = Scrape::of(&registry).value(
        "pgpipe_queries_total",
        &[("mode", "checkout"), ("outcome", "ok")],
    );
    assert_eq!(exclusive, 1.0);

    let e = pool.query(&raw, &[&5i64]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Params, "{e}");
    assert!(!e.may_have_run());
    drop(conn);
}

/// `query_typed` sends the caller's types, which may differ from what the
/// server would infer: on the pool it runs on a connection of its own
/// (counted there), never pipelined with a plan of other types.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_typed_sends_the_callers_types() {
    let registry = Registry::new();
    let pool = builder(&app("porting_typed"))
        .max_size(2)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();
    // Inferred, `$1` here is int4; given as int8 it takes an i64.
    let big = 5_000_000_000i64;
    let params: &[(&(dyn ToSql + Sync), Type)] = &[(&big, Type::INT8)];
    let rows = pool
        .query_typed("SELECT pg_typeof($1 + 1)::text, $1 + 1", params)
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, String>(0), "bigint");
    assert_eq!(rows[0].get::<_, i64>(1), big + 1);
    let counted = Scrape::of(&registry).value(
        "pgpipe_queries_total",
        &[("mode", "checkout"), ("outcome", "ok")],
    );
    assert_eq!(counted, 1.0);
    // Prepared as the server infers it, the same SQL refuses the i64.
    let e = pool.query("SELECT $1 + 1", &[&big]).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Params | ErrorKind::Db), "{e}");
}
