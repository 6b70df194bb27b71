//! A primary and streaming standbys of the test's own: [`ReplicaSet`].
//!
//! Each server is a [`Cluster`] on a free port in a temporary directory;
//! the standbys come from `pg_basebackup -R`, so they stream from the
//! primary from the start. Everything stops when the set is dropped, or
//! when the process exits. About 2–3 s to start on a small machine.

use std::io;
use std::time::{Duration, Instant};

use crate::{Cluster, ClusterBuilder};

/// A primary and its standbys.
#[derive(Debug)]
pub struct ReplicaSet {
    /// The primary, as started (after a failover, maybe no longer one).
    pub primary: Cluster,
    /// The standbys, named `s1`, `s2` … in `pg_stat_replication`.
    pub standbys: Vec<Cluster>,
}

/// Sets up a [`ReplicaSet`].
#[derive(Debug, Default)]
#[must_use = "a builder does nothing until `.start()`"]
pub struct ReplicaSetBuilder {
    standbys: usize,
    primary: Vec<(String, String)>,
    standby: Vec<(String, String)>,
}

impl ReplicaSetBuilder {
    /// A setting of the primary.
    pub fn primary_setting(mut self, name: &str, value: &str) -> Self {
        self.primary.push((name.into(), value.into()));
        self
    }

    /// A setting of every standby (`recovery_min_apply_delay`,
    /// `max_standby_streaming_delay` …).
    pub fn standby_setting(mut self, name: &str, value: &str) -> Self {
        self.standby.push((name.into(), value.into()));
        self
    }

    /// Starts the primary, then the standbys, and waits until every
    /// standby streams.
    ///
    /// # Errors
    ///
    /// When a server cannot be made or started.
    pub fn start(self) -> io::Result<ReplicaSet> {
        let mut primary = Cluster::builder()
            .setting("wal_level", "replica")
            .setting("max_wal_senders", "10")
            .setting("hot_standby_feedback", "off");
        for (name, value) in &self.primary {
            primary = primary.setting(name, value);
        }
        let primary = primary.start()?;
        let mut standbys = Vec::with_capacity(self.standbys);
        for n in 1..=self.standbys {
            let mut standby = ClusterBuilder::default()
                .setting("cluster_name", &format!("s{n}"))
                .setting("hot_standby", "on")
                .setting("hot_standby_feedback", "off")
                .setting("max_standby_streaming_delay", "1s");
            for (name, value) in &self.standby {
                standby = standby.setting(name, value);
            }
            standbys.push(standby.standby_of(&primary)?);
        }
        Ok(ReplicaSet { primary, standbys })
    }
}

impl ReplicaSet {
    /// A primary with `standbys` standbys, to be started.
    pub fn builder(standbys: usize) -> ReplicaSetBuilder {
        ReplicaSetBuilder {
            standbys,
            ..ReplicaSetBuilder::default()
        }
    }

    /// Starts a primary and `standbys` standbys with default settings.
    ///
    /// # Errors
    ///
    /// When a server cannot be made or started.
    pub fn start(standbys: usize) -> io::Result<ReplicaSet> {
        ReplicaSet::builder(standbys).start()
    }

    /// Waits until every standby that is up has replayed everything the
    /// primary has written (its insert position: with `synchronous_commit
    /// =off` the flushed one trails a commit), or `timeout` passes;
    /// returns whether they did.
    ///
    /// # Panics
    ///
    /// When the primary does not answer.
    pub async fn wait_caught_up(&self, timeout: Duration) -> bool {
        let primary = connect(&self.primary.url())
            .await
            .expect("the primary answers");
        let target: String = primary
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .expect("the primary's position")
            .get(0);
        let deadline = Instant::now() + timeout;
        for standby in &self.standbys {
            let Ok(client) = connect(&standby.url()).await else {
                continue;
            };
            loop {
                let done: bool = client
                    .query_one(
                        "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)",
                        &[&target],
                    )
                    .await
                    .is_ok_and(|row| row.get(0));
                if done {
                    break;
                }
                if Instant::now() > deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        true
    }
}

impl ReplicaSet {
    /// Makes commits on the primary wait for the standby `name` (`s1` …)
    /// by `ALTER SYSTEM` (so that a later [`Cluster::set_in_auto_conf`]
    /// can undo it for a restart), and reloads.
    ///
    /// # Panics
    ///
    /// When the primary does not answer.
    pub async fn synchronous(&self, name: &str) {
        let primary = connect(&self.primary.url())
            .await
            .expect("the primary answers");
        primary
            .simple_query(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = '{name}'"
            ))
            .await
            .expect("ALTER SYSTEM");
        primary
            .simple_query("SELECT pg_reload_conf()")
            .await
            .expect("reload");
    }
}

impl Cluster {
    /// Makes the (empty) data directory a standby of `primary`:
    /// `pg_basebackup -R`, or where the server binaries have none, a copy
    /// between `pg_backup_start` and `pg_backup_stop` (see
    /// [`copied_standby`]).
    pub(crate) fn copy_as_standby_of(&self, primary: &Cluster) -> io::Result<()> {
        if !self.bin.join("pg_basebackup").exists() {
            return copied_standby(self, primary);
        }
        self.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port().to_string(),
                "-U",
                "postgres",
                "-D",
                &self.data(),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ],
        )
    }

    /// What an HA manager does to a server that must follow another
    /// (Patroni's `reinit`, or `pg_rewind` where it can): the server
    /// stopped, its data thrown away, and made again a streaming standby
    /// of `primary`, on its own port and with its own settings, so that it
    /// then receives `primary`'s timeline.
    ///
    /// # Errors
    ///
    /// When the copy or the start fails.
    pub fn rebuild_as_standby_of(&self, primary: &Cluster) -> io::Result<()> {
        let _ = self.stop("immediate");
        std::fs::remove_dir_all(self.data())?;
        self.copy_as_standby_of(primary)?;
        self.start_server()
    }
}

/// Makes `cluster`'s data directory a standby of `primary` without
/// `pg_basebackup` (the PostgreSQL builds of other majors that CI installs
/// carry the server only): in one `psql` session (the machine's client
/// talks to newer servers), the primary's data directory copied between
/// `pg_backup_start` and `pg_backup_stop`, the backup label written from the
/// latter's answer, then `standby.signal` and `primary_conninfo`, as
/// `pg_basebackup -R` leaves them. The standby streams the WAL since the
/// backup's start from the primary.
pub(crate) fn copied_standby(cluster: &Cluster, primary: &Cluster) -> io::Result<()> {
    let (from, to) = (primary.data(), cluster.data());
    let port = primary.port();
    let script = format!(
        "\\set ON_ERROR_STOP on
SELECT pg_backup_start('pgpipe-standby', true);
\\! mkdir -m 700 {to} && tar -C {from} --exclude=./postmaster.pid --exclude=./postmaster.opts \
--exclude=./server.log --exclude='./.s.PGSQL.*' --exclude='./pg_wal/*' --exclude='./pg_replslot/*' \
-cf - . | tar -C {to} -xf - && mkdir -p {to}/pg_wal/archive_status && touch {to}/standby.signal \
&& echo \"primary_conninfo = 'host=127.0.0.1 port={port} user=postgres'\" >> {to}/postgresql.auto.conf
\\pset format unaligned
\\pset tuples_only on
SELECT labelfile FROM pg_backup_stop(false) \\g {to}/backup_label
"
    );
    let file = cluster.dir.join("standby.sql");
    std::fs::write(&file, script)?;
    let port = port.to_string();
    let file = file.display().to_string();
    let args = [
        "-X",
        "-q",
        "-h",
        "127.0.0.1",
        "-p",
        &port,
        "-U",
        "postgres",
        "-f",
        &file,
    ];
    let output = crate::as_postgres_user(std::path::Path::new("psql"), &args)
        .stdin(std::process::Stdio::null())
        .output()?;
    let made = ["backup_label", "standby.signal", "PG_VERSION"]
        .iter()
        .all(|f| std::path::Path::new(&to).join(f).exists());
    if output.status.success() && made {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "a standby copy by pg_backup_start/stop failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// A plain client of one server, its connection driven by a task.
///
/// # Errors
///
/// When the server does not answer.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}
