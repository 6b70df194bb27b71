//! Finds the PostgreSQL server for pgpipe's tests and benchmark, or starts
//! one.
//!
//! [`database_url`] reads `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). If nothing answers there
//! and PostgreSQL's server binaries are installed, it starts a throwaway
//! cluster in a temporary directory (as the `postgres` OS user when running
//! as root, since the server refuses root) that stops when the process
//! exits. Otherwise it fails with a message that says how to point
//! `DATABASE_URL` at a server.
//!
//! Tests share the server with whatever else runs on it: they use
//! [`unique`] names and never assume they are alone.

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use std::{fs, io};

use tokio_postgres::config::Host;

mod patroni;
mod pgbouncer;
mod pgpool;
mod priority;
mod replication;

pub use patroni::{HaproxyPorts, Patroni};
pub use pgbouncer::{Pgbouncer, PgbouncerBuilder, newer_pgbouncer};
pub use pgpool::Pgpool;
pub use priority::ahead_of_other_work;
pub use replication::{ReplicaSet, ReplicaSetBuilder, connect};

/// The server tests use when `DATABASE_URL` is not set.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The URL of a PostgreSQL server that answers; see the crate docs.
///
/// # Panics
///
/// When no server answers and none can be started, with instructions.
pub fn database_url() -> String {
    try_database_url().unwrap_or_else(|message| panic!("{message}"))
}

/// Like [`database_url`], but returns the instructions instead of
/// panicking.
///
/// # Errors
///
/// When no server answers and none can be started.
pub fn try_database_url() -> Result<String, String> {
    static URL: OnceLock<Result<String, String>> = OnceLock::new();
    URL.get_or_init(|| {
        let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_string());
        if answers(&url) {
            return Ok(url);
        }
        let target = describe(&url);
        match Cluster::start() {
            Ok(cluster) => {
                let url = cluster.url();
                notice(&format!(
                    "nothing answers at {target}; started a throwaway cluster at {url}"
                ));
                // Lives until the process exits; its reaper stops it then.
                std::mem::forget(cluster);
                Ok(url)
            }
            Err(e) => Err(format!(
                "no PostgreSQL server answers at {target}, and a throwaway one could not be \
                 started ({e}). Point DATABASE_URL at a server \
                 (DATABASE_URL=postgres://USER@HOST:PORT/DB), or install PostgreSQL's server \
                 binaries (initdb, pg_ctl) so that one can be started."
            )),
        }
    })
    .clone()
}

/// `host:port` of a URL, without its user or password.
fn describe(url: &str) -> String {
    match url.parse::<tokio_postgres::Config>() {
        Ok(config) => {
            let host = match config.get_hosts().first() {
                Some(Host::Tcp(host)) => host.clone(),
                #[cfg(unix)]
                Some(Host::Unix(path)) => path.display().to_string(),
                None => "?".into(),
            };
            let port = config.get_ports().first().copied().unwrap_or(5432);
            format!("{host}:{port}")
        }
        Err(_) => "an unparseable DATABASE_URL".into(),
    }
}

/// Whether something accepts connections at the URL's first host.
fn answers(url: &str) -> bool {
    let Ok(config) = url.parse::<tokio_postgres::Config>() else {
        return false;
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match config.get_hosts().first() {
        Some(Host::Tcp(host)) => (host.as_str(), port)
            .to_socket_addrs()
            .map(|mut addrs| {
                addrs.any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok())
            })
            .unwrap_or(false),
        #[cfg(unix)]
        Some(Host::Unix(dir)) => dir.join(format!(".s.PGSQL.{port}")).exists(),
        None => false,
    }
}

/// Says something on the terminal even while the test harness captures
/// the test's output (it captures `eprintln!`, not writes to stderr
/// itself): a skipped check, a server started for the tests.
pub fn notice(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "pgpipe-test-support: {message}");
}

/// The path of the program `name`, found on `PATH`.
///
/// Outside CI a missing program skips the test that needs it (`None`, with a
/// note on stderr saying what is skipped). Under CI (`CI=true`, as `.ci/run`
/// is run) it panics: CI installs what its tests need, so a missing program
/// means a check would pass without checking.
pub fn required_tool(name: &str, install: &str) -> Option<PathBuf> {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{name} is not on PATH, and CI=true: .ci/run must install it ({install}), \
             or this check would pass without checking"
        );
        notice(&format!(
            "{name} is not installed ({install}); skipping (under CI=true this fails)"
        ));
    }
    found
}

/// A name no other test (or test run) uses: `prefix_pid_counter`.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// [`database_url`] with `application_name` set, so a test can find its own
/// backends in `pg_stat_activity`.
pub fn url_with_app(application_name: &str) -> String {
    with_param(&database_url(), "application_name", application_name)
}

/// `host:port` of [`database_url`]'s first host (TCP; `127.0.0.1` else),
/// for a proxy or a pooler to forward to.
pub fn server_addr() -> String {
    let config: tokio_postgres::Config = database_url().parse().expect("DATABASE_URL parses");
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

/// [`database_url`] with its user, its address (`host:port`) or its
/// database replaced where given: the test server as another role, through
/// a proxy, or in a database of the test's own. Without a password.
pub fn server_url(user: Option<&str>, addr: Option<&str>, db: Option<&str>) -> String {
    let config: tokio_postgres::Config = database_url().parse().expect("DATABASE_URL parses");
    let user = user.unwrap_or(config.get_user().unwrap_or("postgres"));
    let addr = addr.map_or_else(server_addr, str::to_owned);
    let db = db.unwrap_or(config.get_dbname().unwrap_or("postgres"));
    format!("postgres://{user}@{addr}/{db}")
}

/// The database [`database_url`] names (`postgres` when it names none):
/// what a pooler of the test's own in front of that server should be
/// asked for, so that what the test sets up through [`admin`] is there.
pub fn database_name() -> String {
    let config: tokio_postgres::Config = database_url().parse().expect("DATABASE_URL parses");
    config.get_dbname().unwrap_or("postgres").to_owned()
}

/// Adds `key=value` to a URL's query string.
pub fn with_param(url: &str, key: &str, value: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{key}={value}")
}

/// A plain tokio-postgres client on [`database_url`], for setting up and
/// inspecting (never for the code under test).
///
/// # Panics
///
/// When it cannot connect.
pub async fn admin() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(connection);
    client
}

/// Backend process ids of the sessions with this `application_name`.
///
/// # Panics
///
/// When the query fails.
pub async fn backend_pids(admin: &tokio_postgres::Client, application_name: &str) -> Vec<i32> {
    admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 ORDER BY pid",
            &[&application_name],
        )
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// A PostgreSQL cluster of the test's own, in a temporary directory, on a
/// free port, with trust authentication and durability off (it is thrown
/// away). Stopped and removed when dropped, and by a reaper process if this
/// process dies first.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    /// Chosen free, and chosen again if another process took it before the
    /// first start (see [`Cluster::first_start`]).
    port: AtomicU16,
    settings: Vec<(String, String)>,
}

/// Sets up a [`Cluster`] before it starts: server settings, and files in
/// its data directory (certificates, say).
#[derive(Debug, Default)]
#[must_use = "a builder does nothing until `.start()`"]
pub struct ClusterBuilder {
    settings: Vec<(String, String)>,
    files: Vec<(String, Vec<u8>)>,
    /// The server binaries, when not the machine's (see [`major_bin`]).
    bin: Option<PathBuf>,
}

impl ClusterBuilder {
    /// The server binaries of another major, from [`major_bin`].
    pub fn bin(mut self, bin: PathBuf) -> Self {
        self.bin = Some(bin);
        self
    }

    /// A server setting, passed as `-c name=value`.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// A file written into the data directory before the server starts,
    /// readable by the server only (as a private key must be).
    pub fn file(mut self, name: &str, contents: impl Into<Vec<u8>>) -> Self {
        self.files.push((name.into(), contents.into()));
        self
    }

    /// Creates and starts the cluster.
    ///
    /// # Errors
    ///
    /// When the server binaries are missing or `initdb`/`pg_ctl` fail.
    pub fn start(self) -> io::Result<Cluster> {
        Cluster::create(self)
    }

    /// Creates and starts a streaming standby of `primary`
    /// (`pg_basebackup -R`: it follows the primary from the start), on a
    /// port of its own. Settings given to the builder apply to the
    /// standby. Where the server binaries have no `pg_basebackup` (the
    /// builds of other majors CI installs), the same by a copy of the data
    /// directory between `pg_backup_start` and `pg_backup_stop`.
    ///
    /// # Errors
    ///
    /// When the server binaries are missing or `pg_basebackup`/`pg_ctl`
    /// fail.
    pub fn standby_of(self, primary: &Cluster) -> io::Result<Cluster> {
        let cluster = Cluster::empty(self.settings, self.bin)?;
        cluster.copy_as_standby_of(primary)?;
        cluster.first_start()?;
        Ok(cluster)
    }
}

impl Cluster {
    /// Creates and starts a cluster with default settings.
    ///
    /// # Errors
    ///
    /// When the server binaries are missing or `initdb`/`pg_ctl` fail.
    pub fn start() -> io::Result<Cluster> {
        Cluster::create(ClusterBuilder::default())
    }

    /// Sets up a cluster with settings or files of its own.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// A directory and a port, reaped when this process exits; no data yet.
    fn empty(settings: Vec<(String, String)>, bin: Option<PathBuf>) -> io::Result<Cluster> {
        let bin = bin
            .or_else(server_bin_dir)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "initdb/pg_ctl not found"))?;
        let port = free_port()?;
        let dir = std::env::temp_dir().join(unique("pgpipe-cluster"));
        fs::create_dir_all(&dir)?;
        hand_to_postgres_user(&dir)?;
        let cluster = Cluster {
            dir,
            bin,
            port: AtomicU16::new(port),
            settings,
        };
        cluster.spawn_reaper()?;
        Ok(cluster)
    }

    fn create(setup: ClusterBuilder) -> io::Result<Cluster> {
        let cluster = Cluster::empty(setup.settings, setup.bin)?;
        cluster.run(
            "initdb",
            &[
                "-D",
                &cluster.data(),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
        )?;
        for (name, contents) in &setup.files {
            let path = cluster.dir.join("data").join(name);
            fs::write(&path, contents)?;
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
            hand_to_postgres_user(&path)?;
        }
        cluster.first_start()?;
        Ok(cluster)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port())
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port.load(Ordering::Acquire)
    }

    /// Starts the server again after [`stop`](Cluster::stop).
    ///
    /// # Errors
    ///
    /// When `pg_ctl start` fails.
    pub fn start_server(&self) -> io::Result<()> {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=200",
            self.port(),
            self.data()
        );
        for (name, value) in &self.settings {
            options.push_str(&format!(" -c {name}={value}"));
        }
        let log = format!("{}/server.log", self.data());
        let started = self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-w",
                "-o",
                &options,
                "start",
            ],
        );
        // The server's own word on why, while its data directory (and so
        // its log) is still there.
        started.map_err(|e| {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            io::Error::other(format!("{e}; server.log ends:\n{}", tail.join("\n")))
        })
    }

    /// The first start: when another process took the free port chosen for
    /// it meanwhile (choosing one binds port 0 and lets it go, a race with
    /// every other process choosing one), again on another port, up to five
    /// times. A restart keeps its port: pools hold its URL.
    fn first_start(&self) -> io::Result<()> {
        let mut tries = 0;
        loop {
            match self.start_server() {
                Err(e) if tries < 5 && port_taken(&e.to_string()) => {
                    tries += 1;
                    notice(&format!(
                        "port {} was taken before the cluster started; trying another",
                        self.port()
                    ));
                    self.port.store(free_port()?, Ordering::Release);
                }
                result => return result,
            }
        }
    }

    /// Stops the server (`mode`: `smart`, `fast` or `immediate`).
    ///
    /// # Errors
    ///
    /// When `pg_ctl stop` fails.
    pub fn stop(&self, mode: &str) -> io::Result<()> {
        self.run("pg_ctl", &["-D", &self.data(), "-w", "-m", mode, "stop"])
    }

    /// Promotes a standby (`pg_ctl promote`, waiting until it accepts
    /// writes).
    ///
    /// # Errors
    ///
    /// When `pg_ctl promote` fails (it is no standby, or it is down).
    pub fn promote(&self) -> io::Result<()> {
        self.run("pg_ctl", &["-D", &self.data(), "-w", "promote"])
    }

    /// Appends `name = 'value'` to `postgresql.auto.conf`, for the next
    /// start or reload (what `ALTER SYSTEM` does, while the server is
    /// down). Settings given to the builder are on the command line and
    /// win over it.
    ///
    /// # Errors
    ///
    /// When the file cannot be written.
    pub fn set_in_auto_conf(&self, name: &str, value: &str) -> io::Result<()> {
        use std::io::Write;
        let path = format!("{}/postgresql.auto.conf", self.data());
        let mut file = fs::OpenOptions::new().append(true).open(path)?;
        writeln!(file, "{name} = '{}'", value.replace('\'', "''"))
    }

    /// Stops every process of the server (`SIGSTOP` to the postmaster and
    /// its children): it neither answers nor refuses, as a server that
    /// hangs. [`resume`](Cluster::resume) undoes it.
    ///
    /// # Errors
    ///
    /// When it is not running or `kill` fails.
    pub fn pause(&self) -> io::Result<()> {
        self.signal_all("STOP")
    }

    /// Continues a server stopped by [`pause`](Cluster::pause).
    ///
    /// # Errors
    ///
    /// When it is not running or `kill` fails.
    pub fn resume(&self) -> io::Result<()> {
        self.signal_all("CONT")
    }

    fn signal_all(&self, signal: &str) -> io::Result<()> {
        let pid = postmaster_pid(&self.dir.join("data"))?;
        run_shell(&format!("pkill -{signal} -P {pid}; kill -{signal} {pid}"))
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(format!("{}/server.log", self.data())).unwrap_or_default()
    }

    /// `host:port`, for a proxy or a pooler in front of it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// `pg_ctl restart -m fast`: every session is terminated.
    ///
    /// # Errors
    ///
    /// When `pg_ctl restart` fails.
    pub fn restart(&self) -> io::Result<()> {
        self.stop("fast")?;
        self.start_server()
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn run(&self, program: &str, args: &[&str]) -> io::Result<()> {
        let output = as_postgres_user(&self.bin.join(program), args)
            .stdin(Stdio::null())
            .output()?;
        if output.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "{program} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }

    /// A detached shell that stops and removes the cluster once this process
    /// has exited, however it exits.
    fn spawn_reaper(&self) -> io::Result<()> {
        let pg_ctl = self.bin.join("pg_ctl");
        let stop = if is_root() {
            format!(
                "runuser -u postgres -- {} -D {} -m immediate stop",
                pg_ctl.display(),
                self.data()
            )
        } else {
            format!("{} -D {} -m immediate stop", pg_ctl.display(), self.data())
        };
        after_exit(&format!(
            "{stop} >/dev/null 2>&1; rm -rf {}",
            self.dir.display()
        ))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop("immediate");
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Runs `cleanup` (shell) in a detached process once this process has
/// exited, however it exits: what a test started does not outlive it.
pub(crate) fn after_exit(cleanup: &str) -> io::Result<()> {
    let script = format!(
        "while kill -0 {} 2>/dev/null; do sleep 1; done; {cleanup}",
        std::process::id()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(drop)
}

/// The postmaster's pid of the data directory `data`.
pub(crate) fn postmaster_pid(data: &Path) -> io::Result<String> {
    let pid = fs::read_to_string(data.join("postmaster.pid"))?;
    Ok(pid.lines().next().unwrap_or_default().trim().to_owned())
}

/// Runs `script` with `sh -c`; an error if it fails.
pub(crate) fn run_shell(script: &str) -> io::Result<()> {
    let status = Command::new("sh").args(["-c", script]).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("`{script}` failed")))
    }
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

pub(crate) fn as_postgres_user(program: &Path, args: &[&str]) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command
            .args(["-u", "postgres", "--"])
            .arg(program)
            .args(args);
        command
    } else {
        let mut command = Command::new(program);
        command.args(args);
        command
    }
}

pub(crate) fn hand_to_postgres_user(dir: &Path) -> io::Result<()> {
    if !is_root() {
        return Ok(());
    }
    let status = Command::new("chown")
        .args(["postgres:postgres"])
        .arg(dir)
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(
            "chown to postgres failed (is there a postgres user?)",
        ))
    }
}

/// The server binaries of PostgreSQL `major` (16, 17, 18), as
/// `.ci/install-postgres-majors` installs them:
/// `$PGPIPE_CACHE/postgres/MAJOR/bin`, else `/var/cache/pgpipe/…` as root,
/// else `$HOME/.cache/pgpipe/…`.
///
/// Missing, outside CI it skips the test that needs it (`None`, with a
/// note); under CI (`CI=true`) it panics: `.ci/run` installs them.
pub fn major_bin(major: u32) -> Option<PathBuf> {
    let bin = cache_dir()
        .join("postgres")
        .join(major.to_string())
        .join("bin");
    if bin.join("postgres").is_file() {
        return Some(bin);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "PostgreSQL {major} is not in {} and CI=true: .ci/run must install it \
         (.ci/install-postgres-majors), or this check would pass without checking",
        bin.display()
    );
    notice(&format!(
        "PostgreSQL {major} is not installed (.ci/install-postgres-majors {major}); skipping \
         (under CI=true this fails)"
    ));
    None
}

/// Where `.ci/install-*` put what they install: `$PGPIPE_CACHE`, else
/// `/var/cache/pgpipe` as root, else `~/.cache/pgpipe`.
pub(crate) fn cache_dir() -> PathBuf {
    match std::env::var_os("PGPIPE_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None if is_root() => PathBuf::from("/var/cache/pgpipe"),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/pgpipe"),
    }
}

/// The directory holding `initdb` and `pg_ctl`: `PG_BIN` if set, else the
/// newest `/usr/lib/postgresql/*/bin`, else whatever `PATH` has.
pub(crate) fn server_bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    versions.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions.pop()
}

/// Whether a failed start's message (with its server log) says the port
/// was in use.
pub(crate) fn port_taken(message: &str) -> bool {
    message.contains("could not bind") || message.contains("Address already in use")
        // etcd's Go: "bind: address already in use".
        || message.contains("address already in use")
}

pub(crate) fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}
