//! CPU time of the benchmark, its proxy and the PostgreSQL server, from the
//! kernel's own accounting.

use std::fs;
use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};
use pgpipe_proxy::Proxy;

/// Linux reports per-process times in USER_HZ ticks, which is 100 on every
/// architecture Linux supports today.
const TICKS_PER_SECOND: u64 = 100;

/// CPU time used so far.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    /// This process, without the proxy thread.
    pub(crate) client: Duration,
    /// Every `postgres` process on the machine (backends and helpers).
    pub(crate) server: Duration,
    /// The proxy's thread.
    pub(crate) proxy: Duration,
}

impl Cpu {
    pub(crate) fn now(proxy: Option<&Proxy>) -> Cpu {
        let proxy = proxy.and_then(Proxy::cpu_time).unwrap_or_default();
        Cpu {
            client: process_cpu().saturating_sub(proxy),
            server: server_cpu(),
            proxy,
        }
    }

    pub(crate) fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            client: self.client.saturating_sub(earlier.client),
            server: self.server.saturating_sub(earlier.server),
            proxy: self.proxy.saturating_sub(earlier.proxy),
        }
    }
}

fn process_cpu() -> Duration {
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let micros = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
            };
            micros(usage.user_time()) + micros(usage.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

fn server_cpu() -> Duration {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    let ticks: u64 = entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|stat| postgres_ticks(&stat))
        .sum();
    Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)
}

/// utime + stime of a `/proc/PID/stat` line whose command is `postgres`.
fn postgres_ticks(stat: &str) -> Option<u64> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    if &stat[open + 1..close] != "postgres" {
        return None;
    }
    // Fields after the command: state is field 3; utime and stime are 14
    // and 15, so the 12th and 13th after it.
    let mut rest = stat[close + 1..].split_whitespace();
    let utime: u64 = rest.nth(11)?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_utime_and_stime_of_postgres_processes() {
        let line = "1234 (postgres) S 1 2 3 4 5 6 7 8 9 10 70 30 0 0 20 0 1 0";
        assert_eq!(postgres_ticks(line), Some(100));
        assert_eq!(
            postgres_ticks("1 (bash) S 1 2 3 4 5 6 7 8 9 10 70 30"),
            None
        );
    }
}
