//! [`Pgpool`]: a pgpool-II of the test's own, on a free port, in front of
//! one server (`raw` mode: no replication, no load balancing); stopped and
//! removed when dropped (and by a reaper process if the test process dies
//! first).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use std::{fs, io};

use crate::{
    after_exit, as_postgres_user, free_port, hand_to_postgres_user, required_tool, unique,
};

/// A running pgpool-II.
#[derive(Debug)]
pub struct Pgpool {
    dir: PathBuf,
    port: u16,
    child: Child,
}

impl Pgpool {
    /// Starts one in front of `upstream` (`host:port`) with `children`
    /// client slots (pgpool serves one client per process); `None` when
    /// pgpool-II is not installed (outside CI: under `CI=true` that panics,
    /// see [`required_tool`]).
    ///
    /// # Errors
    ///
    /// When it does not start or does not answer within 20 s.
    pub fn start(upstream: &str, children: u32) -> io::Result<Option<Pgpool>> {
        let Some(binary) = find() else {
            return Ok(None);
        };
        let (host, upstream_port) = upstream
            .rsplit_once(':')
            .ok_or_else(|| io::Error::other(format!("{upstream}: not host:port")))?;
        // Free ports are chosen by binding port 0 and letting it go: another
        // process may take one before pgpool binds it. Then other ports, up
        // to five times.
        let mut tries = 0;
        loop {
            // A directory of its own each time: a failed try's is removed.
            let dir = std::env::temp_dir().join(unique("pgpipe-pgpool"));
            fs::create_dir_all(&dir)?;
            let ports = (free_port()?, free_port()?);
            let upstream = (host, upstream_port);
            match launch(&binary, &dir, ports, upstream, children) {
                Err(e) if tries < 5 && crate::port_taken(&e.to_string()) => {
                    tries += 1;
                    crate::notice("a port was taken before pgpool started; trying others");
                }
                Err(e) => return Err(e),
                Ok(pool) => return Ok(Some(pool)),
            }
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`, `DB` the database
    /// [`database_url`](crate::database_url) names.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.port,
            crate::database_name()
        )
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("pgpool.log")).unwrap_or_default()
    }

    fn spawn_reaper(&self) -> io::Result<()> {
        after_exit(&format!(
            "kill {} 2>/dev/null; sleep 1; rm -rf {}",
            self.child.id(),
            self.dir.display()
        ))
    }
}

/// `pgpool`, on `PATH` or in `/usr/sbin` where Debian puts it.
fn find() -> Option<PathBuf> {
    let sbin = PathBuf::from("/usr/sbin/pgpool");
    if sbin.is_file() {
        return Some(sbin);
    }
    required_tool(
        "pgpool",
        "Debian's pgpool2 package: apt-get install pgpool2",
    )
}

impl Drop for Pgpool {
    fn drop(&mut self) {
        // SIGTERM to what we started: pgpool itself, or `runuser` when
        // running as root, which then ends pgpool ("Session terminated").
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Writes a configuration for `ports` (client, pcp) in front of `upstream`
/// and starts pgpool-II in the foreground; waits until it says it started.
fn launch(
    binary: &Path,
    dir: &Path,
    ports: (u16, u16),
    upstream: (&str, &str),
    children: u32,
) -> io::Result<Pgpool> {
    let (port, pcp_port) = ports;
    let (host, upstream_port) = upstream;
    let d = dir.display();
    let config = format!(
        "backend_clustering_mode = 'raw'\nlisten_addresses = '127.0.0.1'\nport = {port}\n\
         socket_dir = '{d}'\npcp_listen_addresses = ''\npcp_port = {pcp_port}\n\
         pcp_socket_dir = '{d}'\nwd_ipc_socket_dir = '{d}'\npid_file_name = '{d}/pgpool.pid'\n\
         logdir = '{d}'\nbackend_hostname0 = '{host}'\nbackend_port0 = {upstream_port}\n\
         backend_weight0 = 1\nbackend_flag0 = 'DISALLOW_TO_FAILOVER'\nenable_pool_hba = off\n\
         num_init_children = {children}\nmax_pool = 1\nload_balance_mode = off\n\
         sr_check_period = 0\nhealth_check_period = 0\nfailover_on_backend_error = off\n\
         use_watchdog = off\nmemory_cache_enabled = off\n"
    );
    let conf = dir.join("pgpool.conf");
    fs::write(&conf, config)?;
    fs::write(dir.join("pcp.conf"), "")?;
    fs::write(dir.join("pool_hba.conf"), "")?;
    for path in [
        dir.to_path_buf(),
        conf.clone(),
        dir.join("pcp.conf"),
        dir.join("pool_hba.conf"),
    ] {
        hand_to_postgres_user(&path)?;
    }
    let log = fs::File::create(dir.join("pgpool.log"))?;
    hand_to_postgres_user(&dir.join("pgpool.log"))?;
    let arg = |p: &Path| p.display().to_string();
    let child = as_postgres_user(
        binary,
        &[
            "-n",
            "-D",
            "-f",
            &arg(&conf),
            "-F",
            &arg(&dir.join("pcp.conf")),
            "-a",
            &arg(&dir.join("pool_hba.conf")),
        ],
    )
    .stdin(Stdio::null())
    .stdout(log.try_clone()?)
    .stderr(log)
    .spawn()?;
    let mut pool = Pgpool {
        dir: dir.to_path_buf(),
        port,
        child,
    };
    // Its own word that it listens: a connect alone may reach whoever
    // took the port. Its end, with its log, if it exits first.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pool.log().contains("successfully started") {
        if Instant::now() > deadline || pool.child.try_wait()?.is_some() {
            let _ = pool.child.kill();
            let _ = pool.child.wait();
            return Err(io::Error::other(format!(
                "pgpool did not start within 20 s: {}",
                pool.log()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    pool.spawn_reaper()?;
    Ok(pool)
}
