//! Faults a [`Patroni`] member can be put through: its agent or its
//! postgres killed, or both frozen.

use std::{fs, io};

use super::Patroni;
use crate::{postmaster_pid, run_shell};

impl Patroni {
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

    /// Freezes member `n`: its Patroni agent, its postmaster and every
    /// backend stopped with `SIGSTOP`, their sockets left open (a host that
    /// hangs: nothing answers, nothing is refused). Its leader key expires
    /// after `ttl`. [`thaw`](Patroni::thaw) undoes it.
    ///
    /// # Errors
    ///
    /// When a pid is unknown or `kill` fails.
    pub fn freeze(&self, n: usize) -> io::Result<()> {
        self.signal_member(n, "STOP")
    }

    /// Continues member `n` after [`freeze`](Patroni::freeze): its agent
    /// finds another member holding the leader key, demotes its postgres
    /// and rejoins as a standby (`pg_rewind`).
    ///
    /// # Errors
    ///
    /// When a pid is unknown or `kill` fails.
    pub fn thaw(&self, n: usize) -> io::Result<()> {
        self.signal_member(n, "CONT")
    }

    fn signal_member(&self, n: usize, signal: &str) -> io::Result<()> {
        let agent = fs::read_to_string(self.dir.join(format!("agent{n}.pid")))?;
        let postmaster = postmaster_pid(&self.data(n))?;
        // The postgres processes first on STOP (so the agent cannot notice
        // them stop), last on CONT.
        let postgres = format!("pkill -{signal} -P {postmaster}; kill -{signal} {postmaster}");
        let agent = format!("kill -{signal} {}", agent.trim());
        run_shell(&if signal == "STOP" {
            format!("{postgres}; {agent}")
        } else {
            format!("{agent}; {postgres}")
        })
    }
}
