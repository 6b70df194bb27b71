//! Results: one record per cell, a Markdown table, JSON lines and a chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

/// One measured cell (a target, a workload, a round trip, a task count).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Record {
    pub(crate) workload: String,
    /// `closed`, `open`, or `closed, N transactions/s` (transactions paced).
    pub(crate) mode: String,
    /// Open loop: requests per second offered.
    pub(crate) rate: Option<f64>,
    /// One-way delay added by the proxy, in microseconds; 0 means direct.
    pub(crate) delay_us: u64,
    pub(crate) target: String,
    pub(crate) tasks: u64,
    /// Which of the rounds this is; the table shows the median round.
    pub(crate) round: u32,
    pub(crate) seconds: f64,
    pub(crate) queries_per_sec: f64,
    pub(crate) requests_per_sec: f64,
    /// Mean request latency.
    pub(crate) mean_ms: f64,
    /// pgpipe's own estimate of latency saved per pipelined query, against
    /// the same pool with pipelining off (negative where it cost time).
    pub(crate) saved_ms_per_query: Option<f64>,
    /// pgpipe's count of round trips saved, per query.
    pub(crate) round_trips_saved_share: Option<f64>,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) p999_ms: f64,
    /// Head-of-line: the slow queries' p99 and rate.
    pub(crate) slow_p99_ms: Option<f64>,
    pub(crate) slow_per_sec: Option<f64>,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    pub(crate) mismatches: u64,
    pub(crate) dropped: u64,
    /// Server connections the target held at the end of the cell.
    pub(crate) connections: u64,
    pub(crate) client_cpu_us_per_query: f64,
    pub(crate) server_cpu_us_per_query: f64,
    /// Share of one core the proxy used during the cell.
    pub(crate) proxy_cpu_share: Option<f64>,
    pub(crate) proxy_realtime: Option<bool>,
    /// Syncs per chunk the proxy read from the client: the real batch size.
    pub(crate) syncs_per_write: Option<f64>,
    /// A lone `SELECT 1` on this path, measured before the cells (median of
    /// 50): the round trip as a client sees it, beside the nominal one.
    #[serde(default)]
    pub(crate) measured_rtt_ms: Option<f64>,
}

/// Writes records as JSON lines.
pub(crate) fn write_json_lines(path: &Path, records: &[Record]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::File::create(path)?;
    for record in records {
        let line = serde_json::to_string(record).map_err(std::io::Error::other)?;
        writeln!(file, "{line}")?;
    }
    Ok(())
}

/// What makes two records the same cell in different rounds.
type CellKey = (String, String, u64, u64, String, String);

/// The median round of each cell, by queries per second.
pub(crate) fn medians(records: &[Record]) -> Vec<Record> {
    let mut cells: BTreeMap<CellKey, Vec<&Record>> = BTreeMap::new();
    for r in records {
        let rate = r.rate.map_or(String::new(), |x| format!("{x}"));
        cells
            .entry((
                r.workload.clone(),
                r.mode.clone(),
                r.delay_us,
                r.tasks,
                rate,
                r.target.clone(),
            ))
            .or_default()
            .push(r);
    }
    cells
        .into_values()
        .map(|mut rounds| {
            rounds.sort_by(|a, b| a.queries_per_sec.total_cmp(&b.queries_per_sec));
            rounds[rounds.len() / 2].clone()
        })
        .collect()
}

fn rtt_label(delay_us: u64, measured_ms: Option<f64>) -> String {
    let measured = measured_ms
        .map(|ms| format!("; a lone `SELECT 1` measured {ms:.2} ms"))
        .unwrap_or_default();
    if delay_us == 0 {
        format!("loopback (direct{measured})")
    } else {
        format!(
            "RTT {} ms (proxy, {} µs each way{measured})",
            delay_us as f64 * 2.0 / 1000.0,
            delay_us
        )
    }
}

fn ms(x: f64) -> String {
    if x.is_nan() {
        "–".into()
    } else if x < 10.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.1}")
    }
}

/// One Markdown table per workload, mode and round trip, rows by task count
/// and target, with ratios against deadpool (16) and the shared client.
pub(crate) fn markdown(records: &[Record], target_order: &[String]) -> String {
    let mut groups: BTreeMap<(String, String, u64), Vec<&Record>> = BTreeMap::new();
    for r in records {
        groups
            .entry((r.workload.clone(), r.mode.clone(), r.delay_us))
            .or_default()
            .push(r);
    }
    let mut out = String::new();
    for ((workload, mode, delay), mut rows) in groups {
        let proxy = rows.iter().find_map(|r| {
            r.proxy_realtime
                .map(|rt| (rt, r.proxy_cpu_share.unwrap_or(0.0)))
        });
        let measured = rows.iter().find_map(|r| r.measured_rtt_ms);
        let _ = write!(
            out,
            "\n#### {workload}, {}, {}",
            match mode.split_once(", ") {
                Some((kind, paced)) => format!("{kind} loop ({paced}, paced)"),
                None => format!("{mode} loop"),
            },
            rtt_label(delay, measured)
        );
        if let Some((realtime, share)) = proxy {
            let _ = write!(
                out,
                "; proxy SCHED_FIFO: {}, proxy CPU up to {:.0}% of a core",
                if realtime { "yes" } else { "no" },
                rows.iter()
                    .filter_map(|r| r.proxy_cpu_share)
                    .fold(share, f64::max)
                    * 100.0
            );
        }
        out.push_str("\n\n");
        let hol = crate::workload::Workload::parse(workload.as_str())
            .is_some_and(|w| w.has_second_class());
        out.push_str("| tasks | target | queries/s | × deadpool (16) | × shared client | p50 ms | p99 ms | p99.9 ms |");
        if hol {
            out.push_str(" slow p99 ms | slow/s |");
        }
        out.push_str(
            " conns | syncs/write | saved ms/q: est. / vs off | client µs/q | server µs/q | errors |\n|",
        );
        let columns = if hol { 16 } else { 14 };
        out.push_str(&"---|".repeat(columns));
        out.push('\n');
        let order = |name: &str| {
            target_order
                .iter()
                .position(|t| t == name)
                .unwrap_or(usize::MAX)
        };
        rows.sort_by_key(|r| (r.tasks, r.rate.map(|x| x as u64), order(&r.target)));
        for r in &rows {
            let peer = |name: &str| {
                rows.iter()
                    .find(|p| p.tasks == r.tasks && p.rate == r.rate && p.target == name)
                    .map_or("–".to_string(), |p| {
                        format!("{:.2}", r.queries_per_sec / p.queries_per_sec)
                    })
            };
            let tasks = match r.rate {
                Some(rate) => format!("{rate:.0}/s"),
                None => r.tasks.to_string(),
            };
            let _ = write!(
                out,
                "| {tasks} | {} | {:.0} | {} | {} | {} | {} | {} |",
                r.target,
                r.queries_per_sec,
                peer("deadpool (16)"),
                peer("shared client (1)"),
                ms(r.p50_ms),
                ms(r.p99_ms),
                ms(r.p999_ms)
            );
            if hol {
                let _ = write!(
                    out,
                    " {} | {:.0} |",
                    ms(r.slow_p99_ms.unwrap_or(f64::NAN)),
                    r.slow_per_sec.unwrap_or(0.0)
                );
            }
            // pgpipe's own estimate of latency saved per query, beside the
            // measured difference in mean latency against the same pool
            // with pipelining off (same size, same cell).
            let pipelined = r.target.starts_with("pgpipe on");
            let saved =
                r.saved_ms_per_query
                    .filter(|_| pipelined)
                    .map_or("–".to_string(), |est| {
                        let off = r.target.replace("pgpipe on", "pgpipe off");
                        let measured = rows
                            .iter()
                            .find(|p| p.tasks == r.tasks && p.rate == r.rate && p.target == off)
                            .map_or("–".to_string(), |p| {
                                format!("{:.2}", p.mean_ms - r.mean_ms)
                            });
                        format!("{est:.2} / {measured}")
                    });
            let _ = writeln!(
                out,
                " {} | {} | {saved} | {:.1} | {:.1} | {} |",
                r.connections,
                r.syncs_per_write.map_or("–".into(), |x| format!("{x:.1}")),
                r.client_cpu_us_per_query,
                r.server_cpu_us_per_query,
                r.errors + r.mismatches
            );
        }
    }
    out
}

/// Throughput against tasks, one panel per round trip, one line per target
/// (closed loop, the given workload).
pub(crate) fn chart(
    path: &Path,
    records: &[Record],
    workload: &str,
    target_order: &[String],
) -> Result<(), Box<dyn std::error::Error>> {
    let records: Vec<&Record> = records
        .iter()
        .filter(|r| r.workload == workload && r.mode == "closed")
        .collect();
    let mut delays: Vec<u64> = records.iter().map(|r| r.delay_us).collect();
    delays.sort_unstable();
    delays.dedup();
    if delays.is_empty() {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let root = SVGBackend::new(path, (460 * delays.len() as u32, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, delays.len()));
    let palette = [
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(23, 23, 23),
    ];
    for (panel, delay) in panels.iter().zip(&delays) {
        let here: Vec<&&Record> = records.iter().filter(|r| r.delay_us == *delay).collect();
        let max_qps = here.iter().map(|r| r.queries_per_sec).fold(1.0, f64::max) * 1.1;
        let max_tasks = here.iter().map(|r| r.tasks).max().unwrap_or(1).max(2) as f64;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{workload}: {}", rtt_label(*delay, None)),
                ("sans-serif", 15),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d((1f64..max_tasks * 1.5).log_scale(), 0f64..max_qps)?;
        chart
            .configure_mesh()
            .x_desc("concurrent tasks")
            .y_desc("queries/s")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
            .draw()?;
        for (i, target) in target_order.iter().enumerate() {
            let mut points: Vec<(f64, f64)> = here
                .iter()
                .filter(|r| &r.target == target)
                .map(|r| (r.tasks as f64, r.queries_per_sec))
                .collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let color = palette[i % palette.len()];
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(target.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 11))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
