//! Timing answers: what each task logged, merged at the end, the window
//! that counts, and the summaries of latencies.

use std::time::Instant;

use crate::targets::BoxError;

/// What one request did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Answer {
    pub(crate) mismatches: u64,
    pub(crate) slow: bool,
}

/// What a run measured.
#[derive(Debug, Default)]
pub(crate) struct Measured {
    /// Requests started inside the window and answered.
    pub(crate) requests: u64,
    pub(crate) mismatches: u64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    /// Request latencies in microseconds (fast requests only for
    /// head-of-line), sorted.
    pub(crate) latencies: Vec<u32>,
    /// Slow requests' latencies (head-of-line), sorted.
    pub(crate) slow_latencies: Vec<u32>,
    /// Open loop: requests dropped because too many were outstanding.
    pub(crate) dropped: u64,
}

/// When a run measures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) from: Instant,
    pub(crate) until: Instant,
}

impl Window {
    pub(crate) fn contains(&self, t: Instant) -> bool {
        t >= self.from && t < self.until
    }
}

/// Per-task results, merged at the end (no shared lock on the hot path).
#[derive(Debug, Default)]
pub(crate) struct TaskLog {
    requests: u64,
    mismatches: u64,
    errors: u64,
    first_error: Option<String>,
    fast: Vec<u32>,
    slow: Vec<u32>,
}

impl TaskLog {
    pub(crate) fn record(&mut self, started: Instant, result: Result<Answer, BoxError>) {
        let micros = started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
        match result {
            Ok(answer) => {
                self.requests += 1;
                self.mismatches += answer.mismatches;
                if answer.slow {
                    self.slow.push(micros);
                } else {
                    self.fast.push(micros);
                }
            }
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| {
                    // With its causes: "db error" alone says little.
                    let mut text = e.to_string();
                    let mut source = e.source();
                    while let Some(cause) = source {
                        text = format!("{text}: {cause}");
                        source = cause.source();
                    }
                    text
                });
            }
        }
    }
}

pub(crate) fn merge(logs: Vec<TaskLog>) -> Measured {
    let mut measured = Measured::default();
    for log in logs {
        measured.requests += log.requests;
        measured.mismatches += log.mismatches;
        measured.errors += log.errors;
        if measured.first_error.is_none() {
            measured.first_error = log.first_error;
        }
        measured.latencies.extend(log.fast);
        measured.slow_latencies.extend(log.slow);
    }
    measured.latencies.sort_unstable();
    measured.slow_latencies.sort_unstable();
    measured
}

/// The mean of microsecond samples, in milliseconds.
pub(crate) fn mean_ms(samples: &[u32]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.iter().map(|&s| f64::from(s)).sum::<f64>() / samples.len() as f64 / 1000.0
}

/// The `q`-quantile of sorted microsecond samples, in milliseconds.
pub(crate) fn quantile_ms(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    f64::from(sorted[rank.min(sorted.len() - 1)]) / 1000.0
}
