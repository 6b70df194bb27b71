//! One repository function, four places to run it: the pool (pipelined),
//! a slow-marked pool handle, an exclusive connection, a transaction.

use pgpipe::{Error, ErrorKind, Executor, Pool};
use pgpipe_test_support::{admin, unique};

use crate::support::{app, builder};

/// Written once against the trait.
async fn deposit(db: &impl Executor, table: &str, id: i64, amount: i64) -> Result<i64, Error> {
    db.execute(
        &format!("UPDATE {table} SET balance = balance + $2 WHERE id = $1"),
        &[&id, &amount],
    )
    .await?;
    let row = db
        .query_one(
            &format!("SELECT balance FROM {table} WHERE id = $1"),
            &[&id],
        )
        .await?;
    Ok(row.get(0))
}

async fn lookups(db: &impl Executor, table: &str) -> Result<(), Error> {
    let missing = db
        .query_opt(&format!("SELECT balance FROM {table} WHERE id = -1"), &[])
        .await?;
    assert!(missing.is_none());
    let many = db
        .query_opt(&format!("SELECT balance FROM {table}"), &[])
        .await
        .unwrap_err();
    assert_eq!(many.kind(), ErrorKind::RowCount);
    let all = db
        .query(&format!("SELECT id FROM {table} ORDER BY id"), &[])
        .await?;
    assert_eq!(all.len(), 2);
    Ok(())
}

async fn setup() -> (String, Pool) {
    let table = unique("exec");
    admin()
        .await
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int8 PRIMARY KEY, balance int8 NOT NULL);
             INSERT INTO {table} VALUES (1, 0), (2, 0)"
        ))
        .await
        .unwrap();
    let pool = builder(&app("executor"))
        .max_size(3)
        .pipelining(true)
        .build()
        .unwrap();
    (table, pool)
}

async fn teardown(table: &str) {
    admin()
        .await
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn the_pool_and_its_slow_handle_are_executors() {
    let (table, pool) = setup().await;
    assert_eq!(deposit(&pool, &table, 1, 5).await.unwrap(), 5);
    assert_eq!(deposit(&pool.slow(), &table, 1, 5).await.unwrap(), 10);
    // By value, through the blanket impl for references.
    let by_ref = &pool;
    assert_eq!(deposit(&by_ref, &table, 1, 1).await.unwrap(), 11);
    lookups(&pool, &table).await.unwrap();
    lookups(&pool.slow(), &table).await.unwrap();
    teardown(&table).await;
}

#[tokio::test]
async fn the_read_handle_is_an_executor_that_reads_and_refuses_writes() {
    let (table, pool) = setup().await;
    assert_eq!(deposit(&pool, &table, 1, 5).await.unwrap(), 5);
    lookups(&pool.read(), &table).await.unwrap();
    lookups(&pool.read().slow(), &table).await.unwrap();
    // One server, no standby: reads use its read-only connections, so a
    // write through the read handle fails as it would on a standby.
    let error = deposit(&pool.read(), &table, 1, 5).await.unwrap_err();
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION)
    );
    let (select, update) = (
        format!("SELECT balance FROM {table} WHERE id = 1"),
        format!("UPDATE {table} SET balance = 0"),
    );
    let mut batch = pool.read().batch();
    batch.query(&select, &[]);
    batch.execute(&update, &[]);
    let results = batch.run().await.unwrap();
    assert!(results[0].is_ok());
    assert_eq!(
        results[1].as_ref().unwrap_err().code(),
        Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION)
    );
    assert_eq!(
        deposit(&pool, &table, 1, 0).await.unwrap(),
        5,
        "nothing was written"
    );
    teardown(&table).await;
}

#[tokio::test]
async fn an_exclusive_connection_is_an_executor_and_caches_statements() {
    let (table, pool) = setup().await;
    let conn = pool.get().await.unwrap();
    for expected in [3, 6, 9] {
        assert_eq!(deposit(&conn, &table, 2, 3).await.unwrap(), expected);
    }
    lookups(&conn, &table).await.unwrap();
    // Each SQL text was prepared once on this connection.
    let prepared: i64 = conn
        .client()
        .query_one(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'UPDATE%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(prepared, 1);
    teardown(&table).await;
}

#[tokio::test]
async fn a_transaction_is_an_executor_that_commits_or_rolls_back() {
    let (table, pool) = setup().await;
    let mut conn = pool.get().await.unwrap();
    {
        let tx = conn.transaction().await.unwrap();
        assert_eq!(deposit(&tx, &table, 1, 100).await.unwrap(), 100);
        lookups(&tx, &table).await.unwrap();
        // Not visible outside until committed.
        assert_eq!(balance(&pool, &table, 1).await, 0);
        tx.commit().await.unwrap();
    }
    assert_eq!(balance(&pool, &table, 1).await, 100);
    {
        let mut tx = conn.transaction().await.unwrap();
        deposit(&tx, &table, 1, 1).await.unwrap();
        {
            let savepoint = tx.savepoint("nested").await.unwrap();
            assert_eq!(deposit(&savepoint, &table, 1, 1000).await.unwrap(), 1101);
            savepoint.rollback().await.unwrap();
        }
        assert_eq!(deposit(&tx, &table, 1, 0).await.unwrap(), 101);
        // Dropped without a commit: rolled back.
    }
    assert_eq!(balance(&pool, &table, 1).await, 100);
    // A failed statement inside is the server's error, and the
    // transaction is then aborted, as in tokio-postgres.
    {
        let tx = conn.transaction().await.unwrap();
        let e = tx.execute("SELECT 1 / 0", &[]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Db);
        let e = deposit(&tx, &table, 1, 1).await.unwrap_err();
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION)
        );
    }
    assert_eq!(deposit(&conn, &table, 1, 0).await.unwrap(), 100);
    teardown(&table).await;
}

async fn balance(pool: &Pool, table: &str, id: i64) -> i64 {
    pool.query_one(
        &format!("SELECT balance FROM {table} WHERE id = $1"),
        &[&id],
    )
    .await
    .unwrap()
    .get(0)
}
