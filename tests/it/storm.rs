//! A cancellation storm: queries dropped at every point where they can be
//! (after 0, 1, 2 … polls), pipelined and exclusive, inside transactions
//! too. The survivors are all correct, no transaction is left open, and no
//! connection falls out of step.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pgpipe_test_support::{admin, unique};
use tokio_postgres::types::ToSql;

use crate::support::{Rng, app, builder, idle_in_transaction, settle};

/// Polls a future at most `polls` times, then drops it wherever it is.
struct Cancellable<F> {
    inner: Pin<Box<F>>,
    polls: u32,
}

impl<F: Future> Future for Cancellable<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        if self.polls == 0 {
            return Poll::Ready(None); // dropped with `self`, mid-flight
        }
        self.polls -= 1;
        self.inner.as_mut().poll(cx).map(Some)
    }
}

fn cancellable<F: Future>(inner: F, polls: u32) -> Cancellable<F> {
    Cancellable {
        inner: Box::pin(inner),
        polls,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_queries_dropped_at_random_points() {
    for pipelining in [true, false] {
        let pool = builder(&app("storm"))
            .max_size(4)
            .pipelining(pipelining)
            .build()
            .unwrap();
        let tasks = 200u64;
        let per_task = 500;
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let mut rng = Rng::new(task * 31 + 7);
                    // (answered, dropped after at least one poll, drawn to
                    // run to completion, drawn to be dropped after one poll)
                    let (mut survived, mut mid_flight, mut patient, mut once) =
                        (0u64, 0u64, 0u64, 0u64);
                    for i in 0..per_task {
                        let id = (task * 100_000 + i) as i64;
                        let params: [&(dyn ToSql + Sync); 1] = [&id];
                        let query = pool.query_one("SELECT $1::int8", &params);
                        // Half run to completion; half are dropped after a
                        // random number of polls (0 to 7).
                        let polls = if rng.below(2) == 0 {
                            patient += 1;
                            u32::MAX
                        } else {
                            let polls = rng.below(8) as u32;
                            once += u64::from(polls == 1);
                            polls
                        };
                        match cancellable(query, polls).await {
                            Some(result) => {
                                let row = result.expect("a surviving query succeeds");
                                assert_eq!(row.get::<_, i64>(0), id, "its own answer");
                                survived += 1;
                            }
                            // Polled at least once, so it had started: it
                            // was dropped mid-flight.
                            None if polls > 0 => mid_flight += 1,
                            None => {}
                        }
                    }
                    (survived, mid_flight, patient, once)
                })
            })
            .collect();
        let (mut survived, mut mid_flight, mut patient, mut once) = (0, 0, 0, 0);
        for handle in handles {
            let (s, m, p, o) = handle.await.unwrap();
            survived += s;
            mid_flight += m;
            patient += p;
            once += o;
        }
        let total = tasks * per_task;
        eprintln!(
            "pipelining {pipelining}: {total} queries, {survived} survived \
             ({patient} drawn to run to the end), {mid_flight} dropped mid-flight \
             ({once} after one poll)"
        );
        // Every patient query survived, the others only if answered within
        // their polls. A query sent on its first poll cannot have its answer
        // by then (that takes a round trip to the server), so at least every
        // query drawn to be dropped after one poll was dropped mid-flight
        // (measured: about that many, 1 in 8 of the impatient half).
        assert!(
            survived >= patient && survived < total,
            "{survived} of {total} survived, {patient} were drawn to run to the end"
        );
        assert!(
            once > 0 && mid_flight >= once,
            "{mid_flight} dropped mid-flight, {once} were drawn to be dropped after one poll"
        );
        settle(&pool).await;
        for i in 0..200i64 {
            let row = pool.query_one("SELECT $1::int8 * 3", &[&i]).await.unwrap();
            assert_eq!(row.get::<_, i64>(0), i * 3, "no connection is out of step");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_dropped_at_random_points_leave_nothing_open() {
    let app = app("tx_storm");
    let table = unique("tx_storm");
    let admin = admin().await;
    admin
        .batch_execute(&format!("CREATE TABLE {table} (task int8, n int8)"))
        .await
        .unwrap();
    let pool = builder(&app).max_size(4).pipelining(true).build().unwrap();
    let handles: Vec<_> = (0..40u64)
        .map(|task| {
            let (pool, table) = (pool.clone(), table.clone());
            tokio::spawn(async move {
                let mut rng = Rng::new(task + 1);
                let mut committed = 0i64;
                for n in 0..40i64 {
                    let work = async {
                        let mut conn = pool.get().await?;
                        let tx = conn.transaction().await?;
                        tx.execute(
                            &format!("INSERT INTO {table} VALUES ($1, $2)"),
                            &[&(task as i64), &n],
                        )
                        .await?;
                        tx.commit().await?;
                        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                    };
                    let polls = if rng.below(3) == 0 {
                        u32::MAX
                    } else {
                        rng.below(12) as u32
                    };
                    if let Some(result) = cancellable(work, polls).await {
                        result.expect("a surviving transaction commits");
                        committed += 1;
                    }
                    // Pipelined work in between, on whatever connection.
                    let row = pool.query_one("SELECT $1::int8", &[&n]).await.unwrap();
                    assert_eq!(row.get::<_, i64>(0), n);
                }
                committed
            })
        })
        .collect();
    let mut committed = 0;
    for handle in handles {
        committed += handle.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        idle_in_transaction(&app).await,
        0,
        "no transaction left open"
    );
    let rows: i64 = admin
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0);
    // Commits dropped after COMMIT was sent may still land: at least every
    // acknowledged one did.
    assert!(
        rows >= committed,
        "{rows} rows, {committed} acknowledged commits"
    );
    eprintln!("{committed} acknowledged commits, {rows} rows");
    for i in 0..50i64 {
        let row = pool.query_one("SELECT $1::int8 + 1", &[&i]).await.unwrap();
        assert_eq!(row.get::<_, i64>(0), i + 1);
    }
    admin
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}
