//! Bad input gets a clear error and costs nobody else anything.

use pgpipe::ErrorKind;
use tokio_postgres::error::SqlState;

use crate::support::{app, builder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_parameters_and_invalid_sql_are_clear_errors() {
    for pipelining in [true, false] {
        let pool = builder(&app("bad_params"))
            .max_size(1)
            .max_exclusive(1)
            .pipelining(pipelining)
            .build()
            .unwrap();
        let e = pool.query("SELECT $1::int8", &[]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Params, "{e}");
        assert!(e.to_string().contains("1 parameters but 0"), "{e}");

        let e = pool.query("SELECT $1::int8", &[&"text"]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Params, "{e}");

        let e = pool.query("SELECT FROM WHERE", &[]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Db, "{e}");
        assert_eq!(e.code(), Some(&SqlState::SYNTAX_ERROR));

        let e = pool
            .query_one("SELECT 1 WHERE false", &[])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RowCount, "{e}");
        let e = pool
            .query_opt("SELECT generate_series(1, 2)", &[])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RowCount, "{e}");

        let e = pool
            .query("SELECT $1::text", &[&"nul\0byte"])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Db, "{e}");

        // The one connection is still fine.
        let row = pool
            .query_one("SELECT $1::int8 + 1", &[&41i64])
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), 42);
        assert!(pool.status().size <= 1);
    }
}
