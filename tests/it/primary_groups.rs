//! Read groups on the default path: plain reads through `pool.query` on the
//! primary's shared connections share one Sync behind a read-only head
//! (`set_config('transaction_read_only', 'on', true)`), while writes and
//! anything the guard cannot prove a plain read keep a Sync of their own.
//! Every answer reaches its caller, writes never fail for the grouping, the
//! head's setting never outlives its group, and a statement the guard took
//! for a read but the server refuses as a write (25006) runs again alone,
//! once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use pgpipe_test_support::{admin, unique};
use prometheus::Registry;

use crate::support::{
    Rng, Scrape, app, assert_reads_in_step, builder, builder_via, drop_table, proxy, scratch_table,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_reads_share_syncs_on_the_primary_and_writes_keep_their_own() {
    let table = scratch_table("primary_groups", "id int8 PRIMARY KEY").await;
    let proxy = proxy(Duration::from_micros(250));
    let registry = Registry::new();
    let pool = builder_via(&proxy, &app("pgroups"))
        .max_size(2)
        .pipelining(true)
        .registry(&registry)
        .pool_name(unique("pgroups"))
        .build()
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    let before = proxy.stats();
    let scraped = Scrape::of(&registry);
    let written_before = scraped.value("pgpipe_pipeline_batch_size", &[]);
    let saved_before = scraped.value("pgpipe_read_group_syncs_saved_total", &[]);
    let (wrong, unexpected, writes) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let insert = format!("INSERT INTO {table} VALUES ($1) RETURNING id");
    let mut tasks = Vec::new();
    for task in 0..256u64 {
        let (pool, insert) = (pool.clone(), insert.clone());
        let (wrong, unexpected, writes) = (wrong.clone(), unexpected.clone(), writes.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(task + 7);
            for i in 0..100i64 {
                let id = (task as i64) << 32 | i;
                let answer = match rng.below(100) {
                    // 5% write, each in its own transaction: never refused.
                    0..=4 => pool.query_one(&insert, &[&id]).await.map(|row| {
                        writes.fetch_add(1, Ordering::Relaxed);
                        row.get::<_, i64>(0)
                    }),
                    // 1% fail, alone.
                    5 => match pool.query_one("SELECT $1::int8 / 0", &[&id]).await {
                        Err(e) if e.code().map(|c| c.code()) == Some("22012") => Ok(id),
                        other => other.map(|_| !id),
                    },
                    _ => pool
                        .query_one("SELECT $1::int8", &[&id])
                        .await
                        .map(|row| row.get::<_, i64>(0)),
                };
                match answer {
                    Ok(got) if got == id => {}
                    Ok(_) => drop(wrong.fetch_add(1, Ordering::Relaxed)),
                    Err(e) => {
                        eprintln!("unexpected: {e}");
                        unexpected.fetch_add(1, Ordering::Relaxed);
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
    let written = scrape.value("pgpipe_pipeline_batch_size", &[]) - written_before;
    assert_eq!(
        wrong.load(Ordering::Relaxed),
        0,
        "an answer reached the wrong caller"
    );
    assert_eq!(
        unexpected.load(Ordering::Relaxed),
        0,
        "a query failed for its group"
    );
    let landed: i64 = admin()
        .await
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        landed as u64,
        writes.load(Ordering::Relaxed),
        "every write landed once"
    );
    // Every Sync tokio-postgres wrote, less those the tap dropped, reached
    // the server (and the head's Parse of a connection opened meanwhile).
    let expected = written - saved;
    assert!(
        (syncs as f64 - expected).abs() <= expected * 0.01 + 16.0,
        "the proxy counted {syncs} Syncs; the pool wrote {written} and dropped {saved}"
    );
    assert!(
        (syncs as f64) < 0.8 * 25_600.0,
        "the proxy saw {syncs} Syncs for 25,600 queries: reads did not share them"
    );
    pgpipe_test_support::notice(&format!(
        "primary read groups: {syncs} Syncs for 25,600 queries, {saved} saved"
    ));
    assert_reads_in_step(&pool, 100).await;
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heads_read_only_setting_never_reaches_a_query_outside_its_group() {
    let table = scratch_table("primary_head", "id int8").await;
    let pool = builder(&app("phead"))
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let (mut seen_on, mut refused) = (0, 0);
    for round in 0..50i64 {
        let mut tasks = Vec::new();
        for i in 0..30i64 {
            let (pool, insert) = (pool.clone(), insert.clone());
            tasks.push(tokio::spawn(async move {
                match i % 10 {
                    // Never in a group (it reads a setting), so never behind
                    // a head: it sees the session's own value.
                    0 => pool
                        .query_one("SELECT current_setting('transaction_read_only')", &[])
                        .await
                        .map(|row| u32::from(row.get::<_, String>(0) != "off"))
                        .map(|on| (on, 0)),
                    // A write between groups: never read-only.
                    1 => match pool.execute(&insert, &[&(round * 100 + i)]).await {
                        Ok(_) => Ok((0, 0)),
                        Err(e) if e.code().map(|c| c.code()) == Some("25006") => Ok((0, 1)),
                        Err(e) => Err(e),
                    },
                    _ => pool
                        .query_one("SELECT $1::int8", &[&i])
                        .await
                        .map(|row| (u32::from(row.get::<_, i64>(0) != i) * 1000, 0)),
                }
            }));
        }
        for task in tasks {
            let (on, no) = task.await.unwrap().unwrap();
            seen_on += on;
            refused += no;
        }
    }
    assert_eq!(seen_on, 0, "a query outside a group saw the head's setting");
    assert_eq!(refused, 0, "a write was refused as read-only");
    drop_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_the_server_refuses_as_a_write_runs_again_alone_and_writes_once() {
    // A view over a function that writes, both created after the pool read
    // the catalog: until its next reading (10 s) the guard takes `SELECT *
    // FROM v` for a plain read of a table, and it joins groups. Behind the
    // head the server refuses its write (25006) and writes nothing; the tap
    // takes that for "not run", forgets the statement as groupable, and it
    // runs again with a Sync of its own, where it writes once.
    let table = scratch_table("primary_refused", "id int8").await;
    let pool = builder(&app("prefused"))
        .max_size(1)
        .pipelining(true)
        .build()
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    let (function, view) = (unique("writes"), unique("writes_view"));
    admin()
        .await
        .batch_execute(&format!(
            "CREATE FUNCTION {function}() RETURNS int8 LANGUAGE plpgsql AS \
             $$ BEGIN INSERT INTO {table} SELECT count(*) FROM {table}; RETURN 1; END $$; \
             CREATE VIEW {view} AS SELECT {function}() AS one"
        ))
        .await
        .unwrap();
    let call = format!("SELECT one, $1::int8 FROM {view}");
    let mut tasks = Vec::new();
    for i in 0..200i64 {
        let (pool, call) = (pool.clone(), call.clone());
        tasks.push(tokio::spawn(async move {
            // Beside plain reads, so that it finds groups to join.
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&i];
            let (read, call) = tokio::join!(
                pool.query_one("SELECT $1::int8", &params),
                pool.query_one(&call, &params)
            );
            assert_eq!(read.unwrap().get::<_, i64>(0), i);
            call.map(|row| row.get::<_, i64>(1))
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let got = task.await.unwrap().expect("refused for its group");
        assert_eq!(got, i as i64);
    }
    let rows: i64 = admin()
        .await
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 200, "each call wrote once");
    admin()
        .await
        .batch_execute(&format!("DROP VIEW {view}; DROP FUNCTION {function}()"))
        .await
        .unwrap();
    drop_table(&table).await;
}
