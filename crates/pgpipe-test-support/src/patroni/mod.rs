//! [`Patroni`]: the HA stack production teams run, on this machine: three
//! PostgreSQL nodes, each under a Patroni 3.0 agent, with one etcd 3.4 as
//! their consensus store (`synchronous_mode: true`), and, when asked, an
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

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use std::{fs, io};

use crate::{
    after_exit, as_postgres_user, free_port, hand_to_postgres_user, postmaster_pid, required_tool,
    run_shell, server_bin_dir, unique,
};

/// The cluster's name in etcd.
const SCOPE: &str = "pgpipe";

mod config;
mod haproxy;

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
        let tools = (
            required_tool("patroni", "apt-get install patroni"),
            required_tool("etcd", "apt-get install etcd-server"),
            server_bin_dir(),
        );
        let (Some(patroni), Some(etcd), Some(bin)) = tools else {
            return Ok(None);
        };
        let dir = std::env::temp_dir().join(unique("pgpipe-patroni"));
        fs::create_dir_all(&dir)?;
        hand_to_postgres_user(&dir)?;
        let (client, peer) = (free_port()?, free_port()?);
        let mut cluster = Patroni {
            dir,
            bin,
            patroni,
            etcd_pid: 0,
            nodes: Vec::new(),
            haproxy_pid: None,
        };
        cluster.etcd_pid = cluster.start_etcd(&etcd, client, peer)?;
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
            return Err(io::Error::other(format!(
                "the Patroni cluster was not healthy within 90 s; logs in {}",
                cluster.dir.display()
            )));
        }
        Ok(Some(cluster))
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
        let deadline = Instant::now() + Duration::from_secs(20);
        while http_status(client, "/health").is_none() {
            if Instant::now() > deadline {
                return Err(io::Error::other("etcd did not answer within 20 s"));
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

    /// Kills member `n`'s Patroni agent (`SIGKILL`: no hand-over; its
    /// postgres keeps running, as when the agent crashes).
    ///
    /// # Errors
    ///
    /// When its pid is unknown or `kill` fails.
    pub fn kill_agent(&self, n: usize) -> io::Result<()> {
        let pid = fs::read_to_string(self.dir.join(format!("agent{n}.pid")))?;
        run_shell(&format!("kill -KILL {}", pid.trim()))
    }

    /// Kills member `n`'s postmaster (`SIGKILL`: a crash).
    ///
    /// # Errors
    ///
    /// When it is not running or `kill` fails.
    pub fn kill_postgres(&self, n: usize) -> io::Result<()> {
        run_shell(&format!("kill -KILL {}", postmaster_pid(&self.data(n))?))
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

/// The status code of `GET path` on `127.0.0.1:port`, if it answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 16];
    let mut read = 0;
    while read < head.len() {
        match stream.read(&mut head[read..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => read += n,
        }
    }
    std::str::from_utf8(&head[..read])
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}
