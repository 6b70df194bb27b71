//! [`Pgbouncer`]: a PgBouncer of the test's own, on a free port, in front of
//! a server the test names; stopped and removed when dropped (and by a
//! reaper process if the test process dies first).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use std::{fs, io};

use crate::{
    after_exit, as_postgres_user, free_port, hand_to_postgres_user, required_tool, unique,
};

/// A running PgBouncer.
#[derive(Debug)]
pub struct Pgbouncer {
    dir: PathBuf,
    port: u16,
    pid: u32,
    settings: Vec<(String, String)>,
    database: String,
}

/// How a [`Pgbouncer`] is set up before it starts.
#[derive(Debug)]
#[must_use = "a builder does nothing until `.start()`"]
pub struct PgbouncerBuilder {
    upstream: String,
    settings: Vec<(String, String)>,
    binary: Option<PathBuf>,
    database: Option<String>,
}

impl PgbouncerBuilder {
    /// A `[pgbouncer]` setting (`pool_mode`, `default_pool_size`,
    /// `query_wait_timeout` …), replacing the default of that name.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.retain(|(n, _)| n != name);
        self.settings.push((name.into(), value.into()));
        self
    }

    /// The database its [`url`](Pgbouncer::url) asks for: by default the
    /// one [`database_url`](crate::database_url) names, which is right for
    /// that server; a throwaway [`Cluster`](crate::Cluster) has `postgres`.
    pub fn database(mut self, name: &str) -> Self {
        self.database = Some(name.into());
        self
    }

    /// Runs this `pgbouncer` binary (another version) instead of the
    /// installed one.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Starts it; `None` when PgBouncer is not installed (outside CI: under
    /// `CI=true` that panics, see [`required_tool`]).
    ///
    /// # Errors
    ///
    /// When it does not start or does not answer within 10 s.
    pub fn start(self) -> io::Result<Option<Pgbouncer>> {
        let Some(binary) = self.binary.or_else(find) else {
            return Ok(None);
        };
        let dir = std::env::temp_dir().join(unique("pgpipe-pgbouncer"));
        fs::create_dir_all(&dir)?;
        let port = free_port()?;
        let mut bouncer = Pgbouncer {
            dir,
            port,
            pid: 0,
            settings: self.settings,
            database: self.database.unwrap_or_else(crate::database_name),
        };
        fs::write(bouncer.dir.join("userlist.txt"), "\"postgres\" \"\"\n")?;
        hand_to_postgres_user(&bouncer.dir)?;
        hand_to_postgres_user(&bouncer.dir.join("userlist.txt"))?;
        // A free port is chosen by binding port 0 and letting it go: another
        // process may take it before PgBouncer binds it. Then another port,
        // up to five times.
        let mut tries = 0;
        loop {
            match bouncer.launch(&binary, &self.upstream) {
                Err(e) if tries < 5 && crate::port_taken(&e.to_string()) => {
                    tries += 1;
                    crate::notice(&format!(
                        "port {} was taken before PgBouncer started; trying another",
                        bouncer.port
                    ));
                    bouncer.port = free_port()?;
                }
                Err(e) => return Err(e),
                Ok(()) => break,
            }
        }
        bouncer.spawn_reaper()?;
        Ok(Some(bouncer))
    }
}

impl Pgbouncer {
    /// Writes its configuration for its port and starts it; waits until it
    /// answers (10 s at most). The error carries its log.
    fn launch(&mut self, binary: &std::path::Path, upstream: &str) -> io::Result<()> {
        // A failed try's log and pid would speak for this one.
        let _ = fs::remove_file(self.dir.join("pgbouncer.log"));
        let _ = fs::remove_file(self.dir.join("pgbouncer.pid"));
        self.write_config(upstream)?;
        hand_to_postgres_user(&self.dir.join("pgbouncer.ini"))?;
        let ini = self.dir.join("pgbouncer.ini");
        let output = as_postgres_user(binary, &["-d", &ini.display().to_string()])
            .stdin(Stdio::null())
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "pgbouncer did not start: {}{}",
                String::from_utf8_lossy(&output.stderr),
                self.log()
            )));
        }
        // Its own word that it listens ("process up", after "listening on"):
        // a connect alone may reach whoever took the port; "nowhere to
        // listen on" is its end.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pid = fs::read_to_string(self.dir.join("pgbouncer.pid"))
                .ok()
                .and_then(|p| p.trim().parse().ok());
            let log = self.log();
            if log.contains("nowhere to listen") {
                return Err(io::Error::other(format!("pgbouncer did not start: {log}")));
            }
            if let Some(pid) = pid.filter(|_| log.contains("process up")) {
                self.pid = pid;
                break;
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "pgbouncer did not answer within 10 s: {}",
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// `pgbouncer`, on `PATH` or in `/usr/sbin` where Debian puts it.
/// The newer PgBouncer's binary (1.21 or later), named by
/// `PGPIPE_PGBOUNCER_1_21` (`.ci/run` builds 1.24 and sets it), or `None`
/// with a notice that `test` was skipped. Under `CI=true` a missing one
/// fails: the check would pass without checking.
pub fn newer_pgbouncer(test: &str) -> Option<String> {
    let found = std::env::var("PGPIPE_PGBOUNCER_1_21").ok();
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "PGPIPE_PGBOUNCER_1_21 is unset and CI=true: .ci/run builds PgBouncer 1.24 \
             (.ci/install-pgbouncer-1.24) and sets it, or {test} would pass without checking"
        );
        crate::notice(&format!(
            "SKIPPED {test}: set PGPIPE_PGBOUNCER_1_21 to a pgbouncer binary of version 1.21 \
             or later"
        ));
    }
    found
}

fn find() -> Option<PathBuf> {
    let sbin = PathBuf::from("/usr/sbin/pgbouncer");
    if sbin.is_file() {
        return Some(sbin);
    }
    required_tool(
        "pgbouncer",
        "Debian's pgbouncer package: apt-get install pgbouncer",
    )
}

impl Pgbouncer {
    /// A PgBouncer in front of `upstream` (`host:port`), in transaction
    /// mode with two server connections per pool, trust authentication.
    pub fn builder(upstream: &str) -> PgbouncerBuilder {
        PgbouncerBuilder {
            upstream: upstream.into(),
            settings: [
                ("pool_mode", "transaction"),
                ("default_pool_size", "2"),
                ("max_client_conn", "500"),
                ("ignore_startup_parameters", "extra_float_digits"),
                ("server_reset_query", ""),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            binary: None,
            database: None,
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`, `DB` the builder's
    /// [`database`](PgbouncerBuilder::database).
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.port, self.database
        )
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    /// Panics with its log if it logged a `FATAL` (it exits after one).
    pub fn assert_up(&self, when: &str) {
        let log = self.log();
        assert!(!log.contains("FATAL"), "{when}: the bouncer exited:\n{log}");
    }

    /// Points it at another server (`host:port`) and reloads: new server
    /// connections go there.
    ///
    /// # Errors
    ///
    /// When the configuration cannot be written or the reload signal sent.
    pub fn repoint(&self, upstream: &str) -> io::Result<()> {
        self.write_config(upstream)?;
        signal(self.pid, "HUP")
    }

    fn write_config(&self, upstream: &str) -> io::Result<()> {
        let (host, port) = upstream
            .rsplit_once(':')
            .ok_or_else(|| io::Error::other(format!("{upstream}: not host:port")))?;
        let mut ini = format!(
            "[databases]\n* = host={host} port={port}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {dir}/userlist.txt\nadmin_users = postgres\n\
             logfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\n",
            self.port,
            dir = self.dir.display()
        );
        for (name, value) in &self.settings {
            ini.push_str(&format!("{name} = {value}\n"));
        }
        let path = self.dir.join("pgbouncer.ini");
        fs::write(&path, ini)?;
        hand_to_postgres_user(&path)
    }

    fn spawn_reaper(&self) -> io::Result<()> {
        after_exit(&format!(
            "kill {} 2>/dev/null; sleep 1; rm -rf {}",
            self.pid,
            self.dir.display()
        ))
    }
}

fn signal(pid: u32, name: &str) -> io::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("kill -{name} {pid} failed")))
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        if self.pid != 0 {
            let _ = signal(self.pid, "INT");
            // Wait for it to go, so its port and files are free.
            for _ in 0..100 {
                if signal(self.pid, "0").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
