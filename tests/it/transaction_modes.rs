//! A transaction's modes (isolation level, read-only, deferrable), as a
//! deadpool-postgres user sets them: `conn.build_transaction()` and
//! `pool.begin_options(..)`. The server says which modes a transaction
//! has (`current_setting`); a write in a read-only one fails there.

use pgpipe::{Executor, IsolationLevel, TransactionOptions};
use prometheus::Registry;
use tokio_postgres::error::SqlState;

use crate::support::{Scrape, app, builder};

const MODES: &str = "SELECT current_setting('transaction_isolation'), \
     current_setting('transaction_read_only'), current_setting('transaction_deferrable')";

async fn modes(db: &impl Executor) -> (String, String, String) {
    let row = db.query_one(MODES, &[]).await.unwrap();
    (row.get(0), row.get(1), row.get(2))
}

fn strings(modes: [&str; 3]) -> (String, String, String) {
    let [a, b, c] = modes.map(str::to_owned);
    (a, b, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modes_reach_the_server_and_end_with_their_transaction() {
    let registry = Registry::new();
    let pool = builder(&app("tx_modes"))
        .max_size(2)
        .pipelining(true)
        .registry(&registry)
        .build()
        .unwrap();

    // pool.begin_options: the BEGIN names the modes. Its statements are
    // counted as the checkout's are.
    let exclusive_ok = || {
        Scrape::of(&registry).value(
            "pgpipe_queries_total",
            &[("mode", "checkout"), ("outcome", "ok")],
        )
    };
    let counted = exclusive_ok();
    let tx = pool
        .begin_options(
            TransactionOptions::new()
                .isolation_level(IsolationLevel::Serializable)
                .read_only(true)
                .deferrable(true),
        )
        .await
        .unwrap();
    assert_eq!(modes(&tx).await, strings(["serializable", "on", "on"]));
    assert!(exclusive_ok() > counted, "begin()'s statements are counted");
    let e = tx
        .execute("CREATE TEMP TABLE tx_modes_write (x int)", &[])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(&SqlState::READ_ONLY_SQL_TRANSACTION), "{e}");
    tx.rollback().await.unwrap();

    // conn.build_transaction, as tokio-postgres' and deadpool's: pgpipe's
    // Transaction, whose queries are counted.
    let mut conn = pool.get().await.unwrap();
    let before = Scrape::of(&registry).value(
        "pgpipe_queries_total",
        &[("mode", "checkout"), ("outcome", "ok")],
    );
    let tx = conn
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(false)
        .start()
        .await
        .unwrap();
    assert_eq!(modes(&tx).await, strings(["repeatable read", "off", "off"]));
    tx.commit().await.unwrap();
    let after = Scrape::of(&registry).value(
        "pgpipe_queries_total",
        &[("mode", "checkout"), ("outcome", "ok")],
    );
    assert!(after > before, "the transaction's query was counted");
    drop(conn);

    // The modes ended with their transactions: the next ones have the
    // session's defaults, on whichever connection they get.
    for _ in 0..3 {
        let tx = pool.begin().await.unwrap();
        assert_eq!(modes(&tx).await, strings(["read committed", "off", "off"]));
        tx.commit().await.unwrap();
    }

    // A read-only transaction from the connection's builder refuses a
    // write, on the server.
    let mut conn = pool.get().await.unwrap();
    let tx = conn
        .build_transaction()
        .read_only(true)
        .start()
        .await
        .unwrap();
    let e = tx
        .execute("CREATE TEMP TABLE tx_modes_write (x int)", &[])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(&SqlState::READ_ONLY_SQL_TRANSACTION), "{e}");
}
