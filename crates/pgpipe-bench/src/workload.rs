//! What the benchmark asks of each pool, and how answers are timed.
//!
//! Closed loop: each task sends a request and waits for its answer before
//! the next; throughput is what the pool sustains. Open loop: requests
//! arrive at a fixed rate whatever the answers do, and each request's
//! latency counts from when it was due, so queueing delay is not hidden
//! (coordinated omission).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::measure::{Answer, Measured, TaskLog, Window, merge};
use crate::targets::{BoxError, Target, TxVia};

/// One kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload {
    /// `SELECT $1::int8`, every answer checked against its caller.
    Echo,
    /// A web request: three independent queries issued concurrently.
    Web,
    /// Echo, with 1% of the queries `pg_sleep(0.02)`.
    HeadOfLine,
    /// Single-row `INSERT`s into an unlogged table.
    Writes,
    /// Echo, with 10% of the queries calling a user-defined (plpgsql)
    /// function: code the pool's guard cannot read, so on pgpipe's shared
    /// path each such query has the session cleanup pipelined behind it.
    Functions,
    /// Echo from nine tasks in ten; the tenth runs interactive transactions
    /// on an exclusive connection (`get()`): two `UPDATE`s of an unlogged
    /// table the reads never touch, then `COMMIT`. How much the
    /// transactions squeeze the pipelined reads, apart from the database's
    /// own cost.
    Transfers,
    /// As `Transfers`, with the transaction an atomic batch on pgpipe
    /// (`BEGIN`, the items and `COMMIT` pipelined); an interactive
    /// transaction on the other pools.
    Batches,
    /// As `Transfers`, with the transaction from `pool.begin()` on pgpipe
    /// (the session reset between users rides along with `BEGIN` and
    /// `COMMIT`); an interactive transaction on the other pools.
    Begins,
    /// Echo through pgpipe's read handle (`pool.read()`: read-only
    /// connections, the reads of one write under one Sync); the same echo on
    /// the other pools.
    Reads,
}

const ECHO: &str = "SELECT $1::int8";
const WEB: [&str; 3] = [
    "SELECT $1::int8 AS user_id",
    "SELECT $1::int8 + 1 AS cart_id",
    "SELECT $1::int8 + 2 AS offer_id",
];
const SLOW: &str = "SELECT $1::int8 FROM pg_sleep(0.02)";

impl Workload {
    pub(crate) const ALL: [Workload; 9] = [
        Workload::Echo,
        Workload::Reads,
        Workload::Web,
        Workload::HeadOfLine,
        Workload::Writes,
        Workload::Functions,
        Workload::Transfers,
        Workload::Batches,
        Workload::Begins,
    ];

    /// Whether its requests fall in two classes, reported apart: the slow
    /// queries of head-of-line, the transactions of transfers and batches.
    /// Transfers and batches: every tenth task runs only transactions.
    pub(crate) fn has_transaction_tasks(self) -> bool {
        matches!(
            self,
            Workload::Transfers | Workload::Batches | Workload::Begins
        )
    }

    pub(crate) fn has_second_class(self) -> bool {
        matches!(
            self,
            Workload::HeadOfLine | Workload::Transfers | Workload::Batches | Workload::Begins
        )
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Echo => "echo",
            Workload::Web => "web",
            Workload::HeadOfLine => "head-of-line",
            Workload::Writes => "writes",
            Workload::Functions => "functions",
            Workload::Transfers => "transfers",
            Workload::Batches => "batches",
            Workload::Begins => "begins",
            Workload::Reads => "reads",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }

    /// Every SQL text the workload sends (for targets that prepare up front).
    pub(crate) fn statements(self, table: &str) -> Vec<String> {
        match self {
            Workload::Echo | Workload::Reads => vec![ECHO.into()],
            Workload::Web => WEB.iter().map(|s| s.to_string()).collect(),
            Workload::HeadOfLine => vec![ECHO.into(), SLOW.into()],
            Workload::Writes => vec![insert_sql(table)],
            Workload::Functions => vec![ECHO.into(), function_sql(table)],
            Workload::Transfers | Workload::Batches | Workload::Begins => {
                vec![ECHO.into(), transfer_sql(table)]
            }
        }
    }

    /// Whether it needs none of the benchmark's tables and functions.
    pub(crate) fn without_table(self) -> bool {
        matches!(
            self,
            Workload::Echo | Workload::Reads | Workload::Web | Workload::HeadOfLine
        )
    }

    /// Queries per request.
    pub(crate) fn queries_per_request(self) -> u64 {
        match self {
            Workload::Web => 3,
            _ => 1,
        }
    }
}

/// The user-defined function the `functions` workload calls; made and
/// dropped with the benchmark's table.
pub(crate) fn function_ddl(table: &str) -> String {
    format!(
        "CREATE OR REPLACE FUNCTION {table}_echo(v int8) RETURNS int8 LANGUAGE plpgsql AS \
         $$ BEGIN RETURN v; END $$"
    )
}

fn function_sql(table: &str) -> String {
    format!("SELECT {table}_echo($1)")
}

/// The accounts the transactions of `transfers` and `batches` update;
/// made and dropped with the benchmark's table.
pub(crate) fn accounts_ddl(table: &str) -> String {
    format!(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {table}_accounts (id int8 PRIMARY KEY, n int8); \
         INSERT INTO {table}_accounts SELECT g, 0 FROM generate_series(1, 1000) g \
         ON CONFLICT DO NOTHING"
    )
}

pub(crate) fn transfer_sql(table: &str) -> String {
    format!("UPDATE {table}_accounts SET n = n + $2 WHERE id = $1")
}

fn insert_sql(table: &str) -> String {
    format!("INSERT INTO {table} (task, n) VALUES ($1, $2) RETURNING n")
}

/// Whether `task` runs only transactions (transfers, batches: every tenth).
fn is_transaction_task(workload: Workload, task: u64) -> bool {
    workload.has_transaction_tasks() && task % 10 == 0
}

/// Sends request number `n` of task `task`, checking every answer.
async fn request(
    target: &Target,
    workload: Workload,
    table: &str,
    task: u64,
    n: u64,
) -> Result<Answer, BoxError> {
    let value = ((task << 32) | (n & 0xffff_ffff)) as i64;
    let mut answer = Answer::default();
    let check = |rows: Vec<tokio_postgres::Row>, expected: i64| -> u64 {
        let got: Option<i64> = rows.first().map(|row| row.get(0));
        u64::from(got != Some(expected))
    };
    match workload {
        Workload::Echo => {
            answer.mismatches = check(target.query(ECHO, &[&value]).await?, value);
        }
        Workload::Reads => {
            answer.mismatches = check(target.read(ECHO, &[&value]).await?, value);
        }
        Workload::Web => {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&value];
            let (a, b, c) = tokio::join!(
                target.query(WEB[0], &params),
                target.query(WEB[1], &params),
                target.query(WEB[2], &params),
            );
            answer.mismatches = check(a?, value) + check(b?, value + 1) + check(c?, value + 2);
        }
        Workload::HeadOfLine => {
            // Deterministic 1%: the same requests are slow for every target.
            answer.slow = (task * 7919 + n) % 100 == 0;
            let sql = if answer.slow { SLOW } else { ECHO };
            answer.mismatches = check(target.query(sql, &[&value]).await?, value);
        }
        Workload::Functions => {
            // Deterministic 10%: the same requests call the function for
            // every target.
            let sql = if (task * 7919 + n) % 10 == 0 {
                function_sql(table)
            } else {
                ECHO.into()
            };
            answer.mismatches = check(target.query(&sql, &[&value]).await?, value);
        }
        Workload::Transfers | Workload::Batches | Workload::Begins => {
            // Every tenth task runs only transactions, the others only
            // reads: were each task to mix them, every task would soon wait
            // on a transaction and the reads would measure the
            // transactions' throughput, not what they do to the reads. Two
            // accounts in ascending order, so transactions never deadlock.
            answer.slow = is_transaction_task(workload, task);
            if answer.slow {
                let a = (value.unsigned_abs() % 999 + 1) as i64;
                let b = a + 1;
                let via = match workload {
                    Workload::Batches => TxVia::AtomicBatch,
                    Workload::Begins => TxVia::Begin,
                    _ => TxVia::Get,
                };
                target.transfer(&transfer_sql(table), a, b, via).await?;
            } else {
                answer.mismatches = check(target.query(ECHO, &[&value]).await?, value);
            }
        }
        Workload::Writes => {
            let (task_id, n_id) = (task as i64, n as i64);
            let rows = target.query(&insert_sql(table), &[&task_id, &n_id]).await?;
            answer.mismatches = check(rows, n_id);
        }
    }
    Ok(answer)
}

/// `tasks` tasks, each sending requests back to back until the window
/// closes; only requests started inside the window count.
///
/// With a `tx_rate`, the transaction tasks of transfers and batches pace
/// themselves to that many transactions per second together (a task that
/// falls behind does not catch up), so that every target carries the same
/// transactions beside its reads.
pub(crate) async fn closed_loop(
    target: Arc<Target>,
    (workload, tx_rate): (Workload, Option<f64>),
    table: Arc<str>,
    tasks: u64,
    window: Window,
) -> Measured {
    let transaction_tasks = (0..tasks)
        .filter(|&t| is_transaction_task(workload, t))
        .count();
    let pace = tx_rate
        .filter(|_| transaction_tasks > 0)
        .map(|rate| Duration::from_secs_f64(transaction_tasks as f64 / rate));
    let mut handles = Vec::with_capacity(tasks as usize);
    for task in 0..tasks {
        let (target, table) = (Arc::clone(&target), Arc::clone(&table));
        let pace = pace.filter(|_| is_transaction_task(workload, task));
        handles.push(tokio::spawn(async move {
            let mut log = TaskLog::default();
            let mut n = 0;
            let mut due = Instant::now();
            loop {
                if let Some(pace) = pace {
                    due = (due + pace).max(Instant::now());
                    tokio::time::sleep_until(due.into()).await;
                }
                let started = Instant::now();
                if started >= window.until {
                    return log;
                }
                let result = request(&target, workload, &table, task, n).await;
                if window.contains(started) {
                    log.record(started, result);
                }
                n += 1;
            }
        }));
    }
    let mut logs = Vec::with_capacity(handles.len());
    for handle in handles {
        logs.push(handle.await.unwrap_or_default());
    }
    merge(logs)
}

/// Requests arriving at `rate` per second from `window.from - warmup` until
/// the window closes, each timed from when it was due.
pub(crate) async fn open_loop(
    target: Arc<Target>,
    workload: Workload,
    table: Arc<str>,
    rate: f64,
    start: Instant,
    window: Window,
) -> Measured {
    const MAX_OUTSTANDING: u64 = 20_000;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let outstanding = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    let mut dropped = 0;
    let mut n: u64 = 0;
    loop {
        let due = start + interval.mul_f64(n as f64);
        if due >= window.until {
            break;
        }
        // tokio's timer ticks in milliseconds: sleep to the tick, then send
        // everything that has come due (each timed from its own due time).
        let now = Instant::now();
        if due > now {
            tokio::time::sleep(due - now).await;
        }
        if outstanding.load(Ordering::Relaxed) >= MAX_OUTSTANDING {
            dropped += u64::from(window.contains(due));
            n += 1;
            continue;
        }
        outstanding.fetch_add(1, Ordering::Relaxed);
        let (target, table, outstanding) = (
            Arc::clone(&target),
            Arc::clone(&table),
            Arc::clone(&outstanding),
        );
        handles.push(tokio::spawn(async move {
            // Task ids in blocks of 1024 requests: one in a hundred requests of
            // a block is slow in the head-of-line workload, as in closed loop.
            let result = request(&target, workload, &table, n / 1024, n).await;
            outstanding.fetch_sub(1, Ordering::Relaxed);
            let mut log = TaskLog::default();
            if window.contains(due) {
                log.record(due, result);
            }
            log
        }));
        n += 1;
    }
    let mut logs = Vec::with_capacity(handles.len());
    for handle in handles {
        logs.push(handle.await.unwrap_or_default());
    }
    let mut measured = merge(logs);
    measured.dropped = dropped;
    measured
}
