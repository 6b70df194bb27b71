//! The server-bound ceiling: `pgbench` with 50-statement pipelines.
//!
//! One `Sync` per 50 statements, so this is an upper bound on what any
//! client can get from the server through the same path, not a like-for-like
//! peer of the pools (each of their queries has its own `Sync`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const STATEMENTS_PER_PIPELINE: usize = 50;

/// Where `pgbench` is, if anywhere.
fn pgbench() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("pgbench"))
            .find(|p| p.exists())
    });
    on_path.or_else(|| {
        let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin/pgbench")))
            .filter(|p| p.exists())
            .collect();
        found.sort();
        found.pop()
    })
}

/// Statements per second with `clients` pgbench clients for `duration`
/// against `host:port`; `None` when pgbench is missing or fails.
pub(crate) fn ceiling(
    host: &str,
    port: u16,
    user: &str,
    db: &str,
    clients: u32,
    duration: Duration,
) -> Option<f64> {
    let pgbench = pgbench()?;
    let script = std::env::temp_dir().join(format!("pgpipe-bench-{}.sql", std::process::id()));
    let mut body = String::from("\\startpipeline\n");
    for _ in 0..STATEMENTS_PER_PIPELINE {
        body.push_str("SELECT 1;\n");
    }
    body.push_str("\\endpipeline\n");
    std::fs::write(&script, body).ok()?;
    let output = Command::new(pgbench)
        .args(["-n", "-M", "extended", "-j", "1"])
        .arg("-c")
        .arg(clients.to_string())
        .arg("-T")
        .arg(duration.as_secs().max(1).to_string())
        .arg("-f")
        .arg(&script)
        .args(["-h", host, "-p", &port.to_string(), "-U", user, db])
        .stdin(Stdio::null())
        .output()
        .ok();
    let _ = std::fs::remove_file(&script);
    let stdout = String::from_utf8_lossy(&output?.stdout).into_owned();
    let tps: f64 = stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix("tps = "))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(tps * STATEMENTS_PER_PIPELINE as f64)
}
