//! Read groups: the reads of one write on a read lane's shared connection
//! share one Sync. Every answer still reaches its own caller, a failing
//! read fails alone (the reads the server skipped behind it run again), a
//! write through the read handle fails with 25006 and writes nothing, a
//! lost connection fails what it carried, and the proxy counts fewer Syncs
//! than queries.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use pgpipe::{ErrorKind, Pool};
use pgpipe_test_support::{admin, backend_pids, unique};
use prometheus::Registry;

use crate::support::{
    Rng, Scrape, app, assert_reads_in_step, builder, builder_via, drop_table, proxy, scratch_table,
};

/// What a load saw.
#[derive(Debug, Default)]
struct Seen {
    ok: AtomicU64,
    wrong: AtomicU64,
    expected_errors: AtomicU64,
    unexpected: AtomicU64,
    dropped: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_share_syncs_and_every_answer_and_error_stays_with_its_caller() {
    let proxy = proxy(Duration::from_micros(250));
    let registry = Registry::new();
    let pool = builder_via(&proxy, &app("groups"))
        .max_size(2)
        .pipelining(true)
        .registry(&registry)
        .pool_name(unique("groups"))
        .build()
        .unwrap();
    pool.read().query("SELECT 1", &[]).await.unwrap();
    let before = proxy.stats();
    let scraped = Scrape::of(&registry);
    let written_before = scraped.value("pgpipe_pipeline_batch_size", &[]);
    let saved_before = scraped.value("pgpipe_read_group_syncs_saved_total", &[]);
    let seen = Arc::new(Seen::default());
    let mut tasks = Vec::new();
    for task in 0..512u64 {
        let (pool, seen) = (pool.clone(), Arc::clone(&seen));
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(task + 1);
            for i in 0..200i64 {
                let id = (task as i64) << 32 | i;
                let roll = rng.below(100);
                let read = pool.read();
                if roll == 0 {
                    // 1% fail: division by zero, alone.
                    match read.query_one("SELECT $1::int8 / 0", &[&id]).await {
                        Err(e) if e.code().map(|c| c.code()) == Some("22012") => {
                            seen.expected_errors.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {
                            seen.unexpected.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    continue;
                }
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&id, &"pad"];
                let query = read.query_one("SELECT $1::int8, $2::text", &params);
                if roll < 6 {
                    // 5% are dropped before their answer.
                    let _ =
                        tokio::time::timeout(Duration::from_micros(rng.below(500)), query).await;
                    seen.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                match query.await {
                    Ok(row) if row.get::<_, i64>(0) == id => {
                        seen.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        seen.wrong.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        seen.unexpected.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let after = proxy.stats();
    let syncs = after.upstream.messages - before.upstream.messages;
    let scrape = Scrape::of(&registry);
    let saved = scrape.value("pgpipe_read_group_syncs_saved_total", &[]) - saved_before;
    let resent = scrape.value("pgpipe_read_group_resent_total", &[]);
    // The metrics against the proxy's own count: every Sync tokio-postgres
    // wrote, less those the tap dropped, is what reached the server.
    let written = scrape.value("pgpipe_pipeline_batch_size", &[]) - written_before;
    let expected = written - saved;
    assert!(
        (syncs as f64 - expected).abs() <= expected * 0.01 + 16.0,
        "the proxy counted {syncs} Syncs; the pool wrote {written} and dropped {saved}"
    );
    pgpipe_test_support::notice(&format!(
        "read groups: {seen:?}; {syncs} Syncs through the proxy for 102,400 reads; \
         {saved} saved; {resent} run again after a skip"
    ));
    assert_eq!(
        seen.wrong.load(Ordering::Relaxed),
        0,
        "an answer reached the wrong caller"
    );
    assert_eq!(seen.unexpected.load(Ordering::Relaxed), 0, "{seen:?}");
    assert!(seen.expected_errors.load(Ordering::Relaxed) > 0);
    assert!(
        resent > 0.0,
        "some reads were skipped behind a failure and run again"
    );
    assert!(
        (syncs as f64) < 0.8 * 102_400.0,
        "the proxy saw {syncs} Syncs for 102,400 reads"
    );
    assert!(saved > 0.0);
    // The pool is in step afterwards.
    assert_reads_in_step(&pool, 100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_a_busy_group_fails_alone_with_25006_and_writes_nothing() {
    let table = scratch_table("group_write", "id int8").await;
    let proxy = proxy(Duration::from_micros(500));
    let registry = Registry::new();
    let pool = builder_via(&proxy, &app("groupw"))
        .max_size(1)
        .pipelining(true)
        .registry(&registry)
        .pool_name(unique("groupw"))
        .build()
        .unwrap();
    pool.read().query("SELECT 1", &[]).await.unwrap();
    for round in 0..20i64 {
        let mut reads = Vec::new();
        for i in 0..40i64 {
            let pool = pool.clone();
            reads.push(tokio::spawn(async move {
                pool.read().query_one("SELECT $1::int8", &[&i]).await
            }));
        }
        let insert = format!("INSERT INTO {table} VALUES ($1)");
        let write = pool.read().execute(&insert, &[&round]).await.unwrap_err();
        assert_eq!(
            write.code(),
            Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION),
            "{write}"
        );
        for (i, read) in reads.into_iter().enumerate() {
            let row = read
                .await
                .unwrap()
                .expect("a neighbour of the write failed");
            assert_eq!(row.get::<_, i64>(0), i as i64);
        }
    }
    let written: i64 = admin()
        .await
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(written, 0, "a write through the read handle wrote");
    assert!(Scrape::of(&registry).value("pgpipe_read_group_syncs_saved_total", &[]) > 0.0);
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_cut_by_a_terminated_backend_fails_what_it_carried_and_the_rest_run() {
    let app = app("groupcut");
    let pool = builder(&app).max_size(2).pipelining(true).build().unwrap();
    pool.read().query("SELECT 1", &[]).await.unwrap();
    let mut reads = Vec::new();
    for i in 0..400i64 {
        let pool = pool.clone();
        reads.push(tokio::spawn(async move {
            pool.read()
                .query_one("SELECT $1::int8, pg_sleep(0.002)::text", &[&i])
                .await
                .map(|row| row.get::<_, i64>(0) == i)
        }));
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let admin = admin().await;
    for pid in backend_pids(&admin, &app).await {
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
    }
    let (mut ok, mut lost) = (0, 0);
    for read in reads {
        match read.await.unwrap() {
            Ok(true) => ok += 1,
            Ok(false) => panic!("a wrong answer"),
            Err(e) if e.kind() == ErrorKind::ConnectionLost => lost += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(ok > 0 && ok + lost == 400, "ok {ok}, lost {lost}");
    // Healed.
    let row = pool.read().query_one("SELECT 7::int8", &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_reads_heal_a_stale_statement_after_alter_table() {
    let table = unique("group_stale");
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int8); INSERT INTO {table} SELECT generate_series(1, 10)"
        ))
        .await
        .unwrap();
    let pool: Pool = builder(&app("groupstale"))
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    let select = format!("SELECT * FROM {table} WHERE id = $1");
    pool.read().query_one(&select, &[&1i64]).await.unwrap();
    admin
        .batch_execute(&format!(
            "ALTER TABLE {table} ADD COLUMN extra text DEFAULT 'x'"
        ))
        .await
        .unwrap();
    let mut reads = Vec::new();
    for i in 1..=10i64 {
        let (pool, select) = (pool.clone(), select.clone());
        reads.push(tokio::spawn(async move {
            pool.read().query_one(&select, &[&i]).await
        }));
    }
    for read in reads {
        let row = read
            .await
            .unwrap()
            .expect("a grouped read failed on a stale statement");
        assert_eq!(row.len(), 2, "the new column shows");
    }
    admin
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_local_setting_never_reaches_a_neighbour_in_its_group() {
    let pool = builder(&app("grouplocal"))
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    pool.read().query("SELECT 1", &[]).await.unwrap();
    let mut leaked = 0;
    for _ in 0..100 {
        let mut tasks = Vec::new();
        for i in 0..30 {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move {
                if i % 10 == 0 {
                    // Allowed on the shared path: it ends with its own
                    // transaction. In a group it would last to the group's end.
                    pool.read()
                        .query("SELECT set_config('pgpipe.tenant', 'leak', true)", &[])
                        .await
                        .map(|_| false)
                } else {
                    pool.read()
                        .query_one("SELECT current_setting('pgpipe.tenant', true)", &[])
                        .await
                        .map(|row| row.get::<_, Option<String>>(0).as_deref() == Some("leak"))
                }
            }));
        }
        for task in tasks {
            leaked += u32::from(task.await.unwrap().unwrap());
        }
    }
    assert_eq!(leaked, 0, "a neighbour saw another query's SET LOCAL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_raising_the_skip_code_itself_is_never_run_again() {
    let sequence = unique("skipcode");
    let admin = admin().await;
    admin
        .batch_execute(&format!("CREATE SEQUENCE {sequence}"))
        .await
        .unwrap();
    let pool = builder(&app("skipcode"))
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    let sql = format!(
        "DO $$ BEGIN PERFORM nextval('{sequence}'); \
         RAISE EXCEPTION 'mine' USING ERRCODE = 'PP001'; END $$"
    );
    let error = pool.execute(&sql, &[]).await.unwrap_err();
    assert_eq!(error.code().map(|c| c.code()), Some("PP001"));
    assert!(!error.to_string().is_empty());
    let ran: i64 = admin
        .query_one(&format!("SELECT last_value FROM {sequence}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(ran, 1, "the statement ran {ran} times");
    admin
        .batch_execute(&format!("DROP SEQUENCE {sequence}"))
        .await
        .unwrap();
}
