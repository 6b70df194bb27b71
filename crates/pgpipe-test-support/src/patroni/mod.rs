//! [`Patroni`]: the HA stack production teams run, on this machine: three
//! PostgreSQL nodes, each under a Patroni 4.1 agent (from PyPI, by
//! `.ci/install-patroni`), with one etcd 3.4 as their consensus store (`synchronous_mode: true`), and, when asked, an
//! HAProxy in front whose health checks ask Patroni's REST API.
//!
//! Everything runs on free ports in a temporary directory and is stopped
//! and removed when the cluster is dropped, or by a reaper process when the
//! test process dies first. About 15 s to start on a small machine.
//!
//! The timings: `ttl: 20` (Patroni's smallest), `loop_wait: 1`,
//! `retry_timeout: 5`, and `primary_start_timeout: 0`, so that a leader
//! whose postgres crashes fails over to its synchronous standby rather than
//! restarting in place.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use std::{fs, io};

use crate::{
    after_exit, as_postgres_user, free_port, hand_to_postgres_user, required_tool, server_bin_dir,
    unique,
};

/// The cluster's name in etcd.
const SCOPE: &str = "pgpipe";

mod config;
mod faults;
mod haproxy;
mod http;

use http::http_status;

pub use haproxy::HaproxyPorts;

/// A running Patroni cluster.
#[derive(Debug)]
pub struct Patroni {
    dir: PathBuf,
    bin: PathBuf,
    patroni: PathBuf,
    etcd_pid: u32,
    nodes: Vec<Node>,
    haproxy_pid: Option<u32>,
}

/// One member: its postgres port, its REST API port.
#[derive(Debug)]
struct Node {
    pg_port: u16,
    api_port: u16,
}

impl Patroni {
    /// Starts etcd and three members, and waits until one leads and both
    /// others stream from it (one of them synchronous). `None` when Patroni
    /// or etcd is not installed (outside CI: under `CI=true` that panics,
    /// see [`required_tool`]).
    ///
    /// # Errors
    ///
    /// When a process does not start, or the cluster is not healthy within
    /// 90 s.
    pub fn start() -> io::Result<Option<Patroni>> {
        // A member's ports are chosen as etcd's are, and a member binds
        // them later, on its own: one taken meanwhile shows in its log
        // (kept in the error), and the cluster starts again on others.
        for _ in 0..3 {
            match Patroni::start_once() {
                Err(e) if crate::port_taken(&e.to_string()) => crate::notice(
                    "a port was taken before a Patroni member bound it; starting on others",
                ),
                started => return started,
            }
        }
        Patroni::start_once()
    }

    fn start_once() -> io::Result<Option<Patroni>> {
        let tools = (
            patroni_bin(),
            required_tool("etcd", "apt-get install etcd-server"),
            server_bin_dir(),
        );
        let (Some(patroni), Some(etcd), Some(bin)) = tools else {
            return Ok(None);
        };
        let dir = std::env::temp_dir().join(unique("pgpipe-patroni"));
        fs::create_dir_all(&dir)?;
        hand_to_postgres_user(&dir)?;
        let mut cluster = Patroni {
            dir,
            bin,
            patroni,
            etcd_pid: 0,
            nodes: Vec::new(),
            haproxy_pid: None,
        };
        // Free ports are chosen by binding port 0 and letting it go: another
        // process may take one before etcd binds it. Then others, up to
        // five times.
        let mut tries = 0;
        let client = loop {
            let (client, peer) = (free_port()?, free_port()?);
            match cluster.start_etcd(&etcd, client, peer) {
                Err(e) if tries < 5 && crate::port_taken(&e.to_string()) => {
                    tries += 1;
                    crate::notice("a port was taken before etcd started; trying others");
                }
                Err(e) => return Err(e),
                Ok(pid) => {
                    cluster.etcd_pid = pid;
                    break client;
                }
            }
        };
        after_exit(&cluster.stop_command())?;
        for n in 0..3 {
            let node = Node {
                pg_port: free_port()?,
                api_port: free_port()?,
            };
            cluster.write_config(n, &node, client)?;
            cluster.nodes.push(node);
        }
        for n in 0..3 {
            cluster.start_agent(n)?;
        }
        if !cluster.wait_healthy(Duration::from_secs(90)) {
            // The agents' and etcd's own words, before the drop removes them.
            return Err(io::Error::other(format!(
                "the Patroni cluster was not healthy within 90 s; the logs end:\n{}",
                cluster.log_tails()
            )));
        }
        Ok(Some(cluster))
    }

    /// The last lines of etcd's and each agent's log, for a failure's
    /// message.
    pub fn log_tails(&self) -> String {
        let mut logs = vec![self.dir.join("etcd.log")];
        for n in 0..self.nodes.len() {
            logs.push(self.dir.join(format!("agent{n}.log")));
            logs.push(self.dir.join(format!("log{n}/patroni.log")));
        }
        let mut out = String::new();
        for log in logs {
            let text = fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(25)..];
            out.push_str(&format!("== {}\n{}\n", log.display(), tail.join("\n")));
        }
        out
    }

    fn start_etcd(&self, etcd: &Path, client: u16, peer: u16) -> io::Result<u32> {
        let log = fs::File::create(self.dir.join("etcd.log"))?;
        let child = Command::new(etcd)
            .args([
                "--name",
                "e1",
                "--data-dir",
                &self.dir.join("etcd").display().to_string(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-cluster",
                &format!("e1=http://127.0.0.1:{peer}"),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut child = child;
        let deadline = Instant::now() + Duration::from_secs(20);
        // Its health, not whoever else answers on the port; its log if it
        // ends first (a port taken meanwhile).
        while http_status(client, "/health") != Some(200) {
            if Instant::now() > deadline || child.try_wait()?.is_some() {
                let _ = child.kill();
                let _ = child.wait();
                let log = fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
                let _ = fs::remove_dir_all(self.dir.join("etcd"));
                return Err(io::Error::other(format!(
                    "etcd did not become healthy within 20 s: {log}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(child.id())
    }

    pub(super) fn config(&self, n: usize) -> PathBuf {
        self.dir.join(format!("n{n}.yml"))
    }

    fn data(&self, n: usize) -> PathBuf {
        self.dir.join(format!("data{n}"))
    }

    /// Starts member `n`'s Patroni agent (again, after
    /// [`kill_agent`](Patroni::kill_agent)); it starts or adopts its
    /// postgres, and rejoins as a standby (with `pg_rewind`) if another
    /// member leads.
    ///
    /// # Errors
    ///
    /// When the agent cannot be started.
    pub fn start_agent(&self, n: usize) -> io::Result<()> {
        let script = format!(
            "echo $$ > {dir}/agent{n}.pid; exec {patroni} {config} >> {dir}/agent{n}.log 2>&1",
            dir = self.dir.display(),
            patroni = self.patroni.display(),
            config = self.config(n).display(),
        );
        as_postgres_user(Path::new("/bin/sh"), &["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(drop)
    }

    /// `patronictl switchover` from the leader to member `candidate`, and
    /// waits for it to finish.
    ///
    /// # Errors
    ///
    /// When there is no leader or `patronictl` fails.
    pub fn switchover(&self, candidate: usize) -> io::Result<()> {
        let leader = self
            .leader()
            .ok_or_else(|| io::Error::other("no leader to switch over from"))?;
        let patronictl = self.patroni.with_file_name("patronictl");
        let output = Command::new(patronictl)
            .arg("-c")
            .arg(self.config(0))
            .args([
                "switchover",
                "--leader",
                &format!("n{leader}"),
                "--candidate",
                &format!("n{candidate}"),
                "--force",
            ])
            .stdin(Stdio::null())
            .output()?;
        if output.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "patronictl switchover failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )))
        }
    }

    /// The member Patroni's REST API calls the leader (`GET /primary`
    /// answers 200), if exactly one does.
    pub fn leader(&self) -> Option<usize> {
        let leaders: Vec<usize> = (0..self.nodes.len())
            .filter(|&n| self.answers(n, "/primary"))
            .collect();
        match leaders.as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }

    /// The synchronous standby (`GET /sync` answers 200), if one is: the
    /// only member a switchover may go to under `synchronous_mode`.
    pub fn sync_standby(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&n| self.answers(n, "/sync"))
    }

    /// Whether member `n`'s REST API answers 200 at `path` (`/primary`,
    /// `/replica`, `/sync`, `/health`, `/replica?lag=1MB` …).
    pub fn answers(&self, n: usize, path: &str) -> bool {
        http_status(self.nodes[n].api_port, path) == Some(200)
    }

    /// Waits until `ready` holds, checking every 100 ms; returns whether it
    /// did within `timeout`.
    pub fn wait_for(&self, timeout: Duration, ready: impl Fn(&Patroni) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while !ready(self) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        true
    }

    /// Waits until one member leads and both others run as standbys, one of
    /// them synchronous; returns whether that happened within `timeout`.
    pub fn wait_healthy(&self, timeout: Duration) -> bool {
        self.wait_for(timeout, |cluster| {
            let Some(leader) = cluster.leader() else {
                return false;
            };
            let others: Vec<usize> = (0..3).filter(|&n| n != leader).collect();
            others.iter().all(|&n| cluster.answers(n, "/replica"))
                && others.iter().any(|&n| cluster.answers(n, "/sync"))
        })
    }

    /// Member `n`'s postgres port.
    pub fn port(&self, n: usize) -> u16 {
        self.nodes[n].pg_port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres` of member `n`.
    pub fn url(&self, n: usize) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port(n))
    }

    /// One URL naming every member, as a pool lists them.
    pub fn multi_host_url(&self) -> String {
        let hosts: Vec<String> = (0..self.nodes.len())
            .map(|n| format!("127.0.0.1:{}", self.port(n)))
            .collect();
        format!("postgres://postgres@{}/postgres", hosts.join(","))
    }

    /// What stops everything, as one shell command.
    fn stop_command(&self) -> String {
        let dir = self.dir.display();
        let pg_ctl = self.bin.join("pg_ctl");
        let stop = |n: usize| {
            let command = format!(
                "{} -D {} -m immediate stop",
                pg_ctl.display(),
                self.data(n).display()
            );
            if crate::is_root() {
                format!("runuser -u postgres -- {command}")
            } else {
                command
            }
        };
        let mut command =
            format!("for f in {dir}/agent*.pid; do kill -KILL $(cat $f) 2>/dev/null; done; ");
        for n in 0..3 {
            command.push_str(&format!("{} >/dev/null 2>&1; ", stop(n)));
        }
        for pid in [self.etcd_pid].into_iter().chain(self.haproxy_pid) {
            if pid != 0 {
                command.push_str(&format!("kill -KILL {pid} 2>/dev/null; "));
            }
        }
        command.push_str(&format!("rm -rf {dir}"));
        command
    }
}

impl Drop for Patroni {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .args(["-c", &self.stop_command()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Patroni 4's `patroni`: `$PGPIPE_PATRONI`, else the environment
/// `.ci/install-patroni` makes in the cache. Not Debian 12's 3.0.2 on
/// `PATH`: it overwrites the leader key unconditionally, so a thawed
/// frozen leader can take the key back and have the promoted member
/// rewound, losing writes acknowledged there (fixed in 3.0.3). Missing:
/// `None` outside CI (a note), a panic under `CI=true`.
fn patroni_bin() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PGPIPE_PATRONI") {
        return Some(PathBuf::from(path));
    }
    let bin = crate::cache_dir().join("patroni-4/bin/patroni");
    if bin.is_file() {
        return Some(bin);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "Patroni 4 is not at {} and CI=true: .ci/run must install it (.ci/install-patroni), \
         or this check would pass without checking",
        bin.display()
    );
    crate::notice("Patroni 4 is not installed (.ci/install-patroni); skipping the Patroni suite");
    None
}
