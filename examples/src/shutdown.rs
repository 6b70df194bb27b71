//! Stopping: which signal asked for it, and the settings for how long each
//! step may take.
//!
//! Docker (`docker stop`, `docker compose down`) and Kubernetes stop a
//! container with `SIGTERM`, then `SIGKILL` after a grace period (10 s and
//! 30 s by default); a person at a terminal presses Ctrl-C (`SIGINT`). A
//! process that is PID 1 in a container has no default action for
//! `SIGTERM`, so without a handler it is simply killed at the end of the
//! grace period, mid-request.

use std::fmt;
use std::time::Duration;

/// The signal that asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `SIGTERM`: the orchestrator. A load balancer may still be sending
    /// requests here; see [`delay`].
    Terminate,
    /// `SIGINT`, Ctrl-C: a person, with no load balancer to tell.
    Interrupt,
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Signal::Terminate => "SIGTERM",
            Signal::Interrupt => "SIGINT",
        })
    }
}

/// Waits for `SIGTERM` or Ctrl-C and says which came (on other platforms
/// than Unix, Ctrl-C only).
///
/// # Panics
///
/// When the handlers cannot be installed (the process has no signal
/// support at all).
pub async fn signal() -> Signal {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate()).expect("a SIGTERM handler");
        tokio::select! {
            _ = terminate.recv() => Signal::Terminate,
            _ = tokio::signal::ctrl_c() => Signal::Interrupt,
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.expect("a Ctrl-C handler");
        Signal::Interrupt
    }
}

/// How long the service goes on serving after `SIGTERM`, with `/readyz`
/// answering `503`: long enough for the load balancer to see it and stop
/// sending requests (in Kubernetes, the readiness probe's `periodSeconds`
/// × `failureThreshold`, and the endpoints' propagation). `SHUTDOWN_DELAY`
/// in seconds, default 5. Ctrl-C skips it.
///
/// # Errors
///
/// When `SHUTDOWN_DELAY` is not a number of seconds.
pub fn delay() -> Result<Duration, String> {
    seconds("SHUTDOWN_DELAY", 5.0)
}

/// How long the requests in flight may take to finish once the service
/// stops taking new connections; past it they are abandoned and the pool
/// closed. `SHUTDOWN_TIMEOUT` in seconds, default 15: with the delay, the
/// pool's close (at most 10 s) and start-up, under Kubernetes' 30 s grace.
///
/// # Errors
///
/// When `SHUTDOWN_TIMEOUT` is not a number of seconds.
pub fn timeout() -> Result<Duration, String> {
    seconds("SHUTDOWN_TIMEOUT", 15.0)
}

/// A duration from the variable `name` in (fractional) seconds, or
/// `default`.
fn seconds(name: &str, default: f64) -> Result<Duration, String> {
    let Ok(text) = std::env::var(name) else {
        return Ok(Duration::from_secs_f64(default));
    };
    text.trim()
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{name}={text}: expected a number of seconds, such as 5 or 0.5"))
}
