//! What the soak samples (the process's memory, descriptors and tasks, the
//! pool's connections and every gauge it exports) and how a series is
//! judged: nothing may grow without bound.

use std::collections::BTreeMap;
use std::time::Duration;

use pgpipe::Pool;
use prometheus::Registry;
use prometheus::proto::MetricType;

/// One sample: each series' value at `at`.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) at: Duration,
    pub(crate) values: BTreeMap<String, f64>,
}

/// Samples everything now.
pub(crate) fn take(at: Duration, pool: &Pool, registry: &Registry) -> Sample {
    let mut values = BTreeMap::new();
    if let Some(kib) = rss_kib() {
        values.insert("process RSS (KiB)".to_string(), kib);
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        values.insert("open file descriptors".to_string(), fds.count() as f64);
    }
    let runtime = tokio::runtime::Handle::current().metrics();
    values.insert(
        "tokio tasks alive".to_string(),
        runtime.num_alive_tasks() as f64,
    );
    let status = pool.status();
    values.insert("pool connections".to_string(), status.size as f64);
    values.insert(
        "pool waiting".to_string(),
        (status.waiting + status.exclusive_waiting) as f64,
    );
    for family in registry.gather() {
        if family.get_field_type() != MetricType::GAUGE {
            continue;
        }
        let sum: f64 = family
            .get_metric()
            .iter()
            .map(|m| m.get_gauge().get_value())
            .sum();
        values.insert(family.name().to_string(), sum);
    }
    Sample { at, values }
}

fn rss_kib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// One series over the run.
#[derive(Debug)]
pub(crate) struct Judged {
    pub(crate) name: String,
    pub(crate) first: f64,
    pub(crate) last: f64,
    pub(crate) max: f64,
    /// Least-squares slope over the second half, per hour.
    pub(crate) slope_per_hour: f64,
    /// The last quarter's median less the second quarter's.
    pub(crate) growth: f64,
    pub(crate) flat: bool,
    /// A limit, not a use (`_max`, `_capacity`): it steps up once when a
    /// lane is first used (a read lane on the primary when the standby is
    /// lost) and is not judged.
    pub(crate) limit: bool,
}

/// Growth a series may show between the second and the last quarter
/// without counting as unbounded: an absolute floor (a series near zero
/// moves by whole units) plus a tenth of its level.
fn allowed(name: &str, level: f64) -> f64 {
    let floor = match name {
        "process RSS (KiB)" => 8192.0,
        "open file descriptors" => 8.0,
        "tokio tasks alive" => 16.0,
        _ => 4.0,
    };
    floor + 0.1 * level.abs()
}

/// Judges every series: it grew when the median of the last quarter of
/// the run exceeds that of the second quarter (past the warm-up) by more
/// than [`allowed`], *and* the second half's least-squares trend rises by
/// more than that across it. Medians, not peaks or means: a fault makes
/// every series spike for a moment (connections reopened, queues filled),
/// while a leak raises the level the series keeps between faults; and a
/// load gauge that happens to sit higher in the last quarter (the
/// pipeline depth, at one hour: +7 with a falling trend) is not a leak,
/// which rises in both.
pub(crate) fn judge(samples: &[Sample]) -> Vec<Judged> {
    let n = samples.len();
    let names: Vec<&String> = samples
        .last()
        .map(|s| s.values.keys().collect())
        .unwrap_or_default();
    names
        .into_iter()
        .map(|name| {
            let series: Vec<(f64, f64)> = samples
                .iter()
                .filter_map(|s| Some((s.at.as_secs_f64(), *s.values.get(name)?)))
                // A gauge with nothing to say yet (an RTT before any
                // estimate) is NaN.
                .filter(|&(_, v)| v.is_finite())
                .collect();
            let values = || series.iter().map(|&(_, v)| v).chain(std::iter::once(0.0));
            let quarter = |q: usize| {
                let (from, to) = (n * q / 4, n * (q + 1) / 4);
                let mut part: Vec<f64> = series[from.min(series.len())..to.min(series.len())]
                    .iter()
                    .map(|&(_, v)| v)
                    .collect();
                part.sort_by(f64::total_cmp);
                part.get(part.len() / 2).copied().unwrap_or(0.0)
            };
            let (second, last_quarter) = (quarter(1), quarter(3));
            let growth = last_quarter - second;
            let half = &series[series.len() / 2..];
            let per_second = slope(half);
            // How far the second half's trend rises across it.
            let rise =
                per_second * (half.last().map_or(0.0, |p| p.0) - half.first().map_or(0.0, |p| p.0));
            let allowance = allowed(name, second);
            Judged {
                name: name.clone(),
                first: series.first().map_or(0.0, |&(_, v)| v),
                last: series.last().map_or(0.0, |&(_, v)| v),
                max: values().fold(f64::MIN, f64::max),
                slope_per_hour: per_second * 3600.0,
                growth,
                flat: growth <= allowance || rise <= allowance,
                limit: name.ends_with("_max") || name.ends_with("_capacity"),
            }
        })
        .collect()
}

/// Least-squares slope of `(t, v)` points, per second.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mt, mv) = points
        .iter()
        .fold((0.0, 0.0), |(t, v), &(pt, pv)| (t + pt / n, v + pv / n));
    let (cov, var) = points.iter().fold((0.0, 0.0), |(c, s), &(t, v)| {
        (c + (t - mt) * (v - mv), s + (t - mt) * (t - mt))
    });
    if var == 0.0 { 0.0 } else { cov / var }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(values: impl Fn(usize) -> f64) -> Vec<Sample> {
        (0..40)
            .map(|i| Sample {
                at: Duration::from_secs(i as u64 * 10),
                values: [("pool connections".to_string(), values(i))].into(),
            })
            .collect()
    }

    #[test]
    fn a_swinging_series_is_flat_and_a_climbing_one_is_not() {
        let swinging = judge(&samples(|i| if i % 5 == 0 { 2.0 } else { 16.0 }));
        assert!(swinging[0].flat, "{swinging:?}");
        let climbing = judge(&samples(|i| 10.0 + i as f64));
        assert!(!climbing[0].flat, "{climbing:?}");
        // Higher in the last quarter than the second, but falling.
        let settling = judge(&samples(|i| match i {
            10..20 => 5.0,
            20..30 => 40.0 - i as f64,
            _ => 12.0,
        }));
        assert!(settling[0].flat, "{settling:?}");
        assert!((climbing[0].slope_per_hour - 360.0).abs() < 1e-6);
    }
}
