//! A sleep with microsecond precision.
//!
//! tokio's timer wheel ticks in milliseconds, so `sleep(500µs)` sleeps about
//! a millisecond: twice the delay this proxy is asked to add. A Linux
//! `timerfd` wakes the event loop at the requested instant instead; the
//! runtime waits for it like for any socket.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Instant;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use tokio::io::unix::AsyncFd;

/// A one-shot precise timer; one per task that sleeps.
#[derive(Debug)]
pub(crate) struct PreciseTimer {
    fd: AsyncFd<Fd>,
}

#[derive(Debug)]
struct Fd(TimerFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl PreciseTimer {
    pub(crate) fn new() -> io::Result<PreciseTimer> {
        let fd = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        // tokio 1.54 deprecates `AsyncFd::new` in favour of an `unsafe`
        // `register`, because a borrowed descriptor could be closed while
        // registered. This one cannot: `Fd` owns it (`TimerFd` holds an
        // `OwnedFd`) and `AsyncFd` owns `Fd`, so it lives exactly as long as
        // its registration. Using `new` keeps this crate free of `unsafe`.
        #[allow(deprecated)]
        let fd = AsyncFd::new(Fd(fd))?;
        Ok(PreciseTimer { fd })
    }

    /// Sleeps until `deadline`.
    pub(crate) async fn sleep_until(&self, deadline: Instant) -> io::Result<()> {
        // Never early: a chunk forwarded before its time would make the
        // network look faster than it is.
        let now = Instant::now();
        if deadline <= now {
            return Ok(());
        }
        let wait = TimeSpec::from_duration(deadline - now);
        self.fd
            .get_ref()
            .0
            .set(Expiration::OneShot(wait), TimerSetTimeFlags::empty())?;
        loop {
            let mut ready = self.fd.readable().await?;
            // Reading the expiry count clears the timer; a read that would
            // block means the wake-up was spurious.
            match ready.try_io(|fd| fd.get_ref().0.wait().map_err(io::Error::from)) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn sleeps_sub_millisecond_delays_precisely() {
        let timer = PreciseTimer::new().unwrap();
        let mut samples = Vec::new();
        for _ in 0..50 {
            let start = Instant::now();
            timer
                .sleep_until(start + Duration::from_micros(300))
                .await
                .unwrap();
            samples.push(start.elapsed());
        }
        samples.sort();
        let median = samples[samples.len() / 2];
        assert!(median >= Duration::from_micros(300), "{median:?}");
        assert!(median < Duration::from_micros(900), "{median:?}");
    }
}
