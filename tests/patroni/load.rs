//! The load the Patroni tests run, and what its callers saw.
//!
//! - 16 writers insert unique keys into a table with no primary key, each
//!   recording how every write ended: acknowledged, in doubt (the error says
//!   it may have run) or refused (it says it never ran);
//! - 8 readers read through `pool.read()`: which server answered, and the
//!   newest mark it had;
//! - a marker writes a numbered mark every 50 ms, recording when each was
//!   acknowledged (for how stale a read was);
//! - a watcher asks every member `pg_is_in_recovery()` every 20 ms, on a
//!   connection of its own, to date each promotion from the server itself.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pgpipe::Pool;
use pgpipe_test_support::{Patroni, connect, unique};
use tokio::task::JoinHandle;

/// How each write of one writer ended.
#[derive(Debug, Default)]
struct Writes {
    acknowledged: Vec<(i64, Instant)>,
    in_doubt: Vec<i64>,
    refused: Vec<i64>,
    /// The first few refusals' errors, for a failure's message.
    why_refused: Vec<String>,
    unexpected: Vec<String>,
    /// The longest any one write took, however it ended.
    longest: Duration,
}

/// One read: when it started and ended, the server's port, the newest mark.
#[derive(Debug, Clone, Copy)]
struct Read {
    started: Instant,
    ended: Instant,
    port: u16,
    mark: i64,
}

#[derive(Debug, Default)]
struct Reads {
    ok: Vec<Read>,
    failed: Vec<String>,
}

/// The running load.
pub(crate) struct Load {
    running: Arc<AtomicBool>,
    table: String,
    marks: String,
    writers: Vec<JoinHandle<Writes>>,
    readers: Vec<JoinHandle<Reads>>,
    marker: JoinHandle<Vec<(i64, Instant)>>,
    watcher: JoinHandle<Vec<(usize, Instant, bool)>>,
}

/// What the callers saw, once the load stopped.
pub(crate) struct Outcome {
    table: String,
    writes: Writes,
    reads: Reads,
    marks: Vec<(i64, Instant)>,
    /// (member, when, writable): each change the watcher saw.
    roles: Vec<(usize, Instant, bool)>,
}

impl Load {
    pub(crate) async fn start(pool: &Pool, cluster: &Patroni) -> Load {
        let (table, marks) = (unique("patroni_writes"), unique("patroni_marks"));
        // Made on a plain connection to the leader: DDL through the pool
        // leaves nothing proven until the lane reads its catalog again
        // (#43), which a failover a moment later may not let it do, and
        // its writes would then run alone.
        let leader = cluster.leader().expect("a leader");
        connect(&cluster.url(leader))
            .await
            .unwrap()
            .batch_execute(&format!(
                "CREATE TABLE {table} (id int8 NOT NULL); CREATE TABLE {marks} (n int8 NOT NULL)"
            ))
            .await
            .unwrap();
        // Reads go to any standby (no lag bound in most tests): start them
        // once every member has the tables, or a standby still catching
        // up from its start answers "relation does not exist".
        for n in 0..3 {
            visible_on(&cluster.url(n), &marks).await;
        }
        let running = Arc::new(AtomicBool::new(true));
        let writers = (0..16i64)
            .map(|task| tokio::spawn(write(pool.clone(), table.clone(), task, running.clone())))
            .collect();
        let readers = (0..8)
            .map(|_| tokio::spawn(read(pool.clone(), marks.clone(), running.clone())))
            .collect();
        let marker = tokio::spawn(mark(pool.clone(), marks.clone(), running.clone()));
        let urls = (0..3).map(|n| cluster.url(n)).collect();
        let watcher = tokio::spawn(watch(urls, running.clone()));
        Load {
            running,
            table,
            marks,
            writers,
            readers,
            marker,
            watcher,
        }
    }

    pub(crate) async fn stop(self) -> Outcome {
        self.running.store(false, Ordering::Relaxed);
        let mut writes = Writes::default();
        for writer in self.writers {
            let w = writer.await.unwrap();
            writes.acknowledged.extend(w.acknowledged);
            writes.in_doubt.extend(w.in_doubt);
            writes.refused.extend(w.refused);
            writes.why_refused.extend(w.why_refused);
            writes.unexpected.extend(w.unexpected);
            writes.longest = writes.longest.max(w.longest);
        }
        let mut reads = Reads::default();
        for reader in self.readers {
            let r = reader.await.unwrap();
            reads.ok.extend(r.ok);
            reads.failed.extend(r.failed);
        }
        let _ = self.marks;
        Outcome {
            table: self.table,
            writes,
            reads,
            marks: self.marker.await.unwrap(),
            roles: self.watcher.await.unwrap(),
        }
    }
}

async fn write(pool: Pool, table: String, task: i64, running: Arc<AtomicBool>) -> Writes {
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let mut writes = Writes::default();
    let mut i = 0;
    while running.load(Ordering::Relaxed) {
        let id = task * 1_000_000 + i;
        i += 1;
        let started = Instant::now();
        let result = pool.execute(&insert, &[&id]).await;
        writes.longest = writes.longest.max(started.elapsed());
        match result {
            Ok(_) => writes.acknowledged.push((id, Instant::now())),
            Err(e) if e.may_have_run() => writes.in_doubt.push(id),
            Err(e) if is_refusal(&e) => {
                writes.refused.push(id);
                if writes.why_refused.len() < 3 {
                    writes.why_refused.push(format!("{:?}: {e}", e.kind()));
                }
            }
            Err(e) => writes.unexpected.push(format!("{:?}: {e}", e.kind())),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    writes
}

/// An error a write may meet during a failover that says nothing ran.
fn is_refusal(error: &pgpipe::Error) -> bool {
    use pgpipe::ErrorKind::{Connect, ConnectionLost, NoPrimary, Timeout};
    matches!(error.kind(), NoPrimary | Connect | Timeout | ConnectionLost)
}

async fn read(pool: Pool, marks: String, running: Arc<AtomicBool>) -> Reads {
    let sql = format!("SELECT inet_server_port(), coalesce((SELECT max(n) FROM {marks}), 0)");
    let mut reads = Reads::default();
    while running.load(Ordering::Relaxed) {
        let started = Instant::now();
        match pool.read().query_one(&sql, &[]).await {
            Ok(row) => reads.ok.push(Read {
                started,
                ended: Instant::now(),
                port: u16::try_from(row.get::<_, i32>(0)).unwrap(),
                mark: row.get(1),
            }),
            Err(e) => reads.failed.push(format!("{:?}: {e}", e.kind())),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    reads
}

async fn mark(pool: Pool, marks: String, running: Arc<AtomicBool>) -> Vec<(i64, Instant)> {
    let insert = format!("INSERT INTO {marks} VALUES ($1)");
    let mut acknowledged = Vec::new();
    let mut n = 0i64;
    while running.load(Ordering::Relaxed) {
        n += 1;
        if pool.execute(&insert, &[&n]).await.is_ok() {
            acknowledged.push((n, Instant::now()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    acknowledged
}

/// Waits (up to 60 s) until the server at `url` has `table`.
async fn visible_on(url: &str, table: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Ok(client)) = tokio::time::timeout(Duration::from_secs(2), connect(url)).await {
            let row = client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
                .await;
            if matches!(row, Ok(ref row) if row.get::<_, bool>(0)) {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{table} not visible on {url} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn watch(urls: Vec<String>, running: Arc<AtomicBool>) -> Vec<(usize, Instant, bool)> {
    let mut clients: Vec<Option<tokio_postgres::Client>> = urls.iter().map(|_| None).collect();
    let mut last: Vec<Option<bool>> = vec![None; urls.len()];
    let mut changes = Vec::new();
    while running.load(Ordering::Relaxed) {
        for (n, url) in urls.iter().enumerate() {
            if clients[n]
                .as_ref()
                .is_none_or(tokio_postgres::Client::is_closed)
            {
                clients[n] = tokio::time::timeout(Duration::from_millis(500), connect(url))
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            let Some(client) = &clients[n] else { continue };
            let answer = tokio::time::timeout(
                Duration::from_millis(500),
                client.query_one("SELECT NOT pg_is_in_recovery()", &[]),
            )
            .await;
            if let Ok(Ok(row)) = answer {
                let writable: bool = row.get(0);
                if last[n] != Some(writable) {
                    last[n] = Some(writable);
                    changes.push((n, Instant::now(), writable));
                }
            } else {
                clients[n] = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    changes
}

impl Outcome {
    /// When member `n` was first seen writable after having been seen a
    /// standby.
    pub(crate) fn promoted_at(&self, n: usize) -> Option<Instant> {
        let mut was_standby = false;
        for &(member, at, writable) in &self.roles {
            if member != n {
                continue;
            }
            if !writable {
                was_standby = true;
            } else if was_standby {
                return Some(at);
            }
        }
        None
    }

    /// No acknowledged write missing from the leader at `url`, none there
    /// twice, none refused (`failover_wait` outlasts the failover: a write
    /// that could not be sent waits for the new leader), and no error of a
    /// kind a failover does not explain.
    pub(crate) async fn check_writes(&self, url: &str) {
        assert!(
            self.writes.unexpected.is_empty(),
            "unexpected write errors: {:?}",
            &self.writes.unexpected[..self.writes.unexpected.len().min(5)]
        );
        assert!(
            self.writes.refused.is_empty(),
            "{} writes refused within failover_wait, e.g. {:?}",
            self.writes.refused.len(),
            &self.writes.why_refused[..self.writes.why_refused.len().min(5)]
        );
        let leader = connect(url).await.unwrap();
        let rows = leader
            .query(
                &format!("SELECT id, count(*) FROM {} GROUP BY id", self.table),
                &[],
            )
            .await
            .unwrap();
        let held: HashMap<i64, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        let twice: Vec<_> = held.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "writes run twice: {twice:?}");
        let missing: Vec<i64> = self
            .writes
            .acknowledged
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| !held.contains_key(id))
            .collect();
        assert!(
            missing.is_empty(),
            "{} acknowledged writes missing on the new leader, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        let ran: Vec<i64> = self
            .writes
            .refused
            .iter()
            .copied()
            .filter(|id| held.contains_key(id))
            .collect();
        assert!(
            ran.is_empty(),
            "writes reported as never run are there: {ran:?}"
        );
    }

    /// How long after `since` the first write was acknowledged.
    pub(crate) fn writes_resumed_after(&self, since: Instant) -> Duration {
        self.writes
            .acknowledged
            .iter()
            .filter(|(_, at)| *at > since)
            .map(|(_, at)| *at - since)
            .min()
            .expect("writes resumed")
    }

    /// The longest any one write took, however it ended.
    pub(crate) fn longest_write(&self) -> Duration {
        self.writes.longest
    }

    /// Acknowledged writes after `since` that the server at `url` holds.
    pub(crate) async fn acknowledged_on(&self, url: &str, since: Instant) -> usize {
        let ids: Vec<i64> = self
            .writes
            .acknowledged
            .iter()
            .filter(|(_, at)| *at > since)
            .map(|(id, _)| *id)
            .collect();
        let server = connect(url).await.unwrap();
        let rows = server
            .query(
                &format!("SELECT id FROM {} WHERE id = ANY($1)", self.table),
                &[&ids],
            )
            .await
            .unwrap();
        rows.len()
    }

    /// No read failed, and reads never stopped for `max_gap`.
    pub(crate) fn check_reads(&self, max_gap: Duration) -> Duration {
        assert!(
            self.reads.failed.is_empty(),
            "{} reads failed: {:?}",
            self.reads.failed.len(),
            &self.reads.failed[..self.reads.failed.len().min(5)]
        );
        let mut ends: Vec<Instant> = self.reads.ok.iter().map(|r| r.ended).collect();
        ends.sort();
        let gap = ends
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        assert!(gap < max_gap, "reads stopped for {gap:?}");
        gap
    }

    /// No read missed a mark acknowledged more than `bound` before it
    /// started.
    pub(crate) fn check_staleness(&self, bound: Duration) {
        for read in &self.reads.ok {
            let owed = self
                .marks
                .iter()
                .filter(|(_, at)| *at + bound < read.started)
                .map(|(n, _)| *n)
                .max()
                .unwrap_or(0);
            assert!(
                read.mark >= owed,
                "a read on port {} saw mark {} but mark {owed} was acknowledged over {bound:?} \
                 before it started",
                read.port,
                read.mark
            );
        }
    }

    /// Counts, for the notice.
    pub(crate) fn summary(&self) -> String {
        let ports: HashSet<u16> = self.reads.ok.iter().map(|r| r.port).collect();
        format!(
            "{} writes acknowledged, {} in doubt, {} refused; {} reads ({} failed) over {} \
             servers",
            self.writes.acknowledged.len(),
            self.writes.in_doubt.len(),
            self.writes.refused.len(),
            self.reads.ok.len(),
            self.reads.failed.len(),
            ports.len()
        )
    }
}
