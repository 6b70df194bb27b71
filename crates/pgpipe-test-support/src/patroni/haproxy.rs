//! HAProxy in front of a [`Patroni`] cluster, choosing by Patroni's REST
//! API: the second topology the Patroni suite tests.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use std::{fs, io};

use super::Patroni;
use crate::{after_exit, free_port, required_tool};

/// HAProxy's two ports in front of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct HaproxyPorts {
    /// Routes to the leader (`GET /primary` answers 200 there).
    pub read_write: u16,
    /// Balances over the running standbys (`GET /replica`).
    pub read_only: u16,
}

impl Patroni {
    /// Starts an HAProxy in front of the members: a read-write port routed
    /// to the leader and a read-only port balanced over the standbys, each
    /// checked on Patroni's REST API every 500 ms (down after two failures,
    /// up after one success; sessions on a server marked down are cut).
    /// `None` when HAProxy is not installed (see [`required_tool`]).
    ///
    /// # Errors
    ///
    /// When it does not start or its ports do not answer within 10 s.
    pub fn haproxy(&mut self) -> io::Result<Option<HaproxyPorts>> {
        let sbin = PathBuf::from("/usr/sbin/haproxy");
        let found = if sbin.is_file() {
            Some(sbin)
        } else {
            required_tool("haproxy", "apt-get install haproxy")
        };
        let Some(haproxy) = found else {
            return Ok(None);
        };
        let ports = HaproxyPorts {
            read_write: free_port()?,
            read_only: free_port()?,
        };
        let stats = free_port()?;
        let mut config = format!(
            "global\n  maxconn 2000\ndefaults\n  mode tcp\n  timeout connect 2s\n  \
             timeout client 30m\n  timeout server 30m\n  timeout check 1s\n  \
             default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions\n\
             listen stats\n  mode http\n  bind 127.0.0.1:{stats}\n  stats enable\n  \
             stats uri /stats\n"
        );
        for (name, port, check) in [
            ("rw", ports.read_write, "/primary"),
            ("ro", ports.read_only, "/replica"),
        ] {
            config.push_str(&format!(
                "listen {name}\n  bind 127.0.0.1:{port}\n  balance roundrobin\n  \
                 option httpchk GET {check}\n  http-check expect status 200\n"
            ));
            for (n, node) in self.nodes.iter().enumerate() {
                config.push_str(&format!(
                    "  server n{n} 127.0.0.1:{} check port {}\n",
                    node.pg_port, node.api_port
                ));
            }
        }
        let path = self.dir.join("haproxy.cfg");
        fs::write(&path, config)?;
        let log = fs::File::create(self.dir.join("haproxy.log"))?;
        let child = Command::new(haproxy)
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.haproxy_pid = Some(child.id());
        after_exit(&format!("kill -KILL {} 2>/dev/null", child.id()))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", ports.read_only)).is_err()
            || TcpStream::connect(("127.0.0.1", ports.read_write)).is_err()
        {
            if Instant::now() > deadline {
                return Err(io::Error::other("haproxy did not listen within 10 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // HAProxy starts with every server up and marks them down only
        // after failed checks: until then its read-write port may reach a
        // standby. Wait until its own view is settled.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !settled(stats) {
            if Instant::now() > deadline {
                return Err(io::Error::other(
                    "haproxy's checks did not settle within 20 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Some(ports))
    }
}

/// Whether HAProxy's stats (CSV) show one server up behind the read-write
/// port and two behind the read-only one, none in between.
fn settled(stats: u16) -> bool {
    let Some(csv) = http_body(stats, "/stats;csv") else {
        return false;
    };
    let up = |proxy: &str| {
        let rows = csv.lines().map(|line| line.split(',').collect::<Vec<_>>());
        let servers: Vec<Vec<&str>> = rows
            .filter(|f| f.len() > 17 && f[0] == proxy && f[1].starts_with('n'))
            .collect();
        let settled = servers.iter().all(|f| f[17] == "UP" || f[17] == "DOWN");
        let up = servers.iter().filter(|f| f[17] == "UP").count();
        (servers.len() == 3 && settled).then_some(up)
    };
    up("rw") == Some(1) && up("ro") == Some(2)
}

/// The body of `GET path` on `127.0.0.1:port`.
fn http_body(port: u16, path: &str) -> Option<String> {
    let answer = super::http::http_get(port, path)?;
    let (_, body) = answer.split_once("\r\n\r\n")?;
    Some(body.to_owned())
}
