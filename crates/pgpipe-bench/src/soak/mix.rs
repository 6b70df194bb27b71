//! The soak's load: the example service's kinds of work at once, every
//! answer checked against its own question.
//!
//! - `echo`: `pool.query` of `SELECT $1::int8` under 300 texts (more than
//!   the statement cache holds, so it evicts), 16 tasks;
//! - `read`: an account by id through `pool.read()` (a standby), 8 tasks;
//! - `transfer`: `begin()`, two `UPDATE`s, `commit()` (the sum of balances
//!   never moves), 4 tasks;
//! - `batch`: an isolated batch of three echoes, 2 tasks;
//! - `slow`: `slow()` with a 0.3 s sleep, once a second;
//! - `notify`: `pg_notify` every 100 ms, and a listener counting what
//!   arrives.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgpipe::{Event, Executor, Pool};
use tokio::task::JoinHandle;

/// The kinds of work, in report order.
pub(crate) const KINDS: [&str; 6] = ["echo", "read", "transfer", "batch", "slow", "notify"];

/// Tasks per kind (the listener is one more).
const TASKS: [usize; 6] = [16, 8, 4, 2, 1, 1];

/// Distinct echo texts.
const TEXTS: i64 = 300;

/// Accounts the transfers move money between.
pub(crate) const ACCOUNTS: i64 = 100;

/// Each kind's calls: right, wrong (another question's answer) and failed.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) right: AtomicU64,
    pub(crate) wrong: AtomicU64,
    pub(crate) failed: AtomicU64,
}

/// What the load did, shared with the sampler.
#[derive(Debug)]
pub(crate) struct Tally {
    pub(crate) kinds: [Counts; 6],
    /// Each looping task's last finished call, in milliseconds since the
    /// start.
    pub(crate) progress: Vec<AtomicU64>,
    pub(crate) notifications: AtomicU64,
    pub(crate) gaps: AtomicU64,
    started: Instant,
}

impl Tally {
    /// The longest any task has gone without finishing a call.
    pub(crate) fn longest_stall(&self) -> Duration {
        let now = self.started.elapsed().as_millis() as u64;
        let oldest = self
            .progress
            .iter()
            .map(|p| p.load(Ordering::Relaxed))
            .min()
            .unwrap_or(now);
        Duration::from_millis(now.saturating_sub(oldest))
    }

    fn done(&self, task: usize, kind: usize, outcome: Outcome) {
        let counts = &self.kinds[kind];
        match outcome {
            Outcome::Right => counts.right.fetch_add(1, Ordering::Relaxed),
            Outcome::Wrong => counts.wrong.fetch_add(1, Ordering::Relaxed),
            Outcome::Failed => counts.failed.fetch_add(1, Ordering::Relaxed),
        };
        self.progress[task].store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy)]
enum Outcome {
    Right,
    Wrong,
    Failed,
}

fn outcome(answer: Result<bool, pgpipe::Error>) -> Outcome {
    match answer {
        Ok(true) => Outcome::Right,
        Ok(false) => Outcome::Wrong,
        Err(_) => Outcome::Failed,
    }
}

/// The running load.
pub(crate) struct Mix {
    pub(crate) tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Mix {
    /// Starts every task on `pool`; `table` holds the accounts and
    /// `channel` is the notification channel.
    pub(crate) fn start(pool: &Pool, table: &str, channel: &str) -> Mix {
        let looping: usize = TASKS.iter().sum();
        let tally = Arc::new(Tally {
            kinds: Default::default(),
            progress: (0..looping).map(|_| AtomicU64::new(0)).collect(),
            notifications: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            started: Instant::now(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        let mut task = 0;
        for (kind, &count) in TASKS.iter().enumerate() {
            for _ in 0..count {
                let (pool, tally, stop) = (pool.clone(), Arc::clone(&tally), Arc::clone(&stop));
                let (table, channel) = (table.to_string(), channel.to_string());
                let me = task;
                tasks.push(tokio::spawn(async move {
                    let mut n: i64 = me as i64 * 1_000_000_000;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let done = one(&pool, kind, n, &table, &channel).await;
                        tally.done(me, kind, done);
                        if matches!(done, Outcome::Failed) {
                            // An outage: do not spin through it.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }));
                task += 1;
            }
        }
        tasks.push(tokio::spawn(listen(
            pool.clone(),
            channel.to_string(),
            Arc::clone(&tally),
            Arc::clone(&stop),
        )));
        Mix { tally, stop, tasks }
    }

    /// Stops every task after its call in flight.
    pub(crate) async fn stop(self) -> Arc<Tally> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.abort();
            let _ = task.await;
        }
        self.tally
    }
}

/// One call of `kind`, number `n`.
async fn one(pool: &Pool, kind: usize, n: i64, table: &str, channel: &str) -> Outcome {
    match KINDS[kind] {
        "echo" => {
            let sql = format!("SELECT $1::int8 AS c{}", n % TEXTS);
            outcome(echo(pool, &sql, n).await)
        }
        "read" => {
            let id = n % ACCOUNTS + 1;
            let sql = format!("SELECT id FROM {table} WHERE id = $1");
            let row = pool.read().query_one(&sql, &[&id]).await;
            outcome(row.map(|row| row.get::<_, i64>(0) == id))
        }
        "transfer" => outcome(transfer(pool, table, n).await.map(|()| true)),
        "batch" => {
            let sql = "SELECT $1::int8";
            let ids = [n, n + 1, n + 2];
            let mut batch = pool.batch();
            for id in &ids {
                batch.query(sql, &[id]);
            }
            // An item that failed fails the call; one with another
            // question's answer makes it wrong.
            let Ok(results) = batch.run().await else {
                return Outcome::Failed;
            };
            if results.len() != ids.len() {
                return Outcome::Wrong;
            }
            let mut done = Outcome::Right;
            for (answer, id) in results.iter().zip(ids) {
                match answer {
                    Ok(answer) if answer.rows().first().map(|r| r.get::<_, i64>(0)) == Some(id) => {
                    }
                    Ok(_) => return Outcome::Wrong,
                    Err(_) => done = Outcome::Failed,
                }
            }
            done
        }
        "slow" => {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let row = pool
                .slow()
                .query_one("SELECT $1::int8 FROM pg_sleep(0.3)", &[&n])
                .await;
            outcome(row.map(|row| row.get::<_, i64>(0) == n))
        }
        _ => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let sent = pool
                .execute("SELECT pg_notify($1, $2)", &[&channel, &n.to_string()])
                .await;
            outcome(sent.map(|rows| rows == 1))
        }
    }
}

async fn echo(pool: &Pool, sql: &str, n: i64) -> Result<bool, pgpipe::Error> {
    let row = pool.query_one(sql, &[&n]).await?;
    Ok(row.get::<_, i64>(0) == n)
}

/// Moves one unit from one account to another in a transaction.
async fn transfer(pool: &Pool, table: &str, n: i64) -> Result<(), pgpipe::Error> {
    let (from, to) = (n % ACCOUNTS + 1, (n * 7 + 3) % ACCOUNTS + 1);
    let tx = pool.begin().await?;
    let update = format!("UPDATE {table} SET balance = balance + $2 WHERE id = $1");
    tx.execute(&update, &[&from, &-1i64]).await?;
    tx.execute(&update, &[&to, &1i64]).await?;
    tx.commit().await
}

/// Counts the notifications and gaps that arrive on `channel`.
async fn listen(pool: Pool, channel: String, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let mut listener = pool.listener();
    while !stop.load(Ordering::Relaxed) {
        if listener.listen(&channel).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    while !stop.load(Ordering::Relaxed) {
        match listener.recv().await {
            Ok(Event::Notification(_)) => tally.notifications.fetch_add(1, Ordering::Relaxed),
            Ok(_) => tally.gaps.fetch_add(1, Ordering::Relaxed),
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                0
            }
        };
    }
}
