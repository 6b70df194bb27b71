//! The Grafana dashboard and the alert rules only name metrics that a real
//! pool exports.

use std::collections::BTreeSet;
use std::path::PathBuf;

use prometheus::Registry;
use prometheus::proto::MetricType;
use promql_parser::parser::{self, Expr};

use crate::support::{app, builder, promtool};
use pgpipe_test_support::{url_with_app, with_param};

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

/// Every `expr` in the dashboard, with Grafana's variables filled in.
fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(repo_file("dashboards/pgpipe.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        variables,
        ["datasource", "job", "instance", "pool"],
        "the template variables: a fleet is picked by job and instance"
    );
    assert_eq!(dashboard["templating"]["list"][0]["type"], "datasource");
    assert_eq!(dashboard["templating"]["list"][0]["query"], "prometheus");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    exprs
        .into_iter()
        .map(|e| {
            ["$__rate_interval", "$job", "$instance", "$pool"]
                .iter()
                .zip(["1m", ".*", ".*", ".*"])
                .fold(e, |e, (variable, value)| e.replace(variable, value))
        })
        .collect()
}

fn collect_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                    _ => collect_exprs(value, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// Every `expr:` of the rules (kept on one line each).
fn rule_exprs() -> Vec<String> {
    rule_lines("expr:")
}

/// The value of every line of the rules that starts with `key`.
fn rule_lines(key: &str) -> Vec<String> {
    std::fs::read_to_string(repo_file("dashboards/alerts.yml"))
        .unwrap()
        .lines()
        .filter_map(|line| line.trim().trim_start_matches("- ").strip_prefix(key))
        .map(|value| value.trim().to_string())
        .collect()
}

fn metric_names(expr: &Expr, out: &mut BTreeSet<String>) {
    match expr {
        Expr::VectorSelector(vs) => out.extend(vs.name.clone()),
        Expr::MatrixSelector(ms) => out.extend(ms.vs.name.clone()),
        Expr::Aggregate(a) => {
            metric_names(&a.expr, out);
            if let Some(param) = &a.param {
                metric_names(param, out);
            }
        }
        Expr::Unary(u) => metric_names(&u.expr, out),
        Expr::Binary(b) => {
            metric_names(&b.lhs, out);
            metric_names(&b.rhs, out);
        }
        Expr::Paren(p) => metric_names(&p.expr, out),
        Expr::Subquery(s) => metric_names(&s.expr, out),
        Expr::Call(call) => call.args.args.iter().for_each(|a| metric_names(a, out)),
        _ => {}
    }
}

/// The series names a real pool exports, histograms with their suffixes.
async fn exported() -> BTreeSet<String> {
    let registry = Registry::new();
    let pool = builder(&app("dash"))
        .pipelining(true)
        .max_size(2)
        .registry(&registry)
        .build()
        .unwrap();
    pool.query("SELECT 1", &[]).await.unwrap();
    // A pool that checks host roles exports the host series too.
    let url = with_param(
        &url_with_app(&app("dash")),
        "target_session_attrs",
        "read-write",
    );
    let hosts = pgpipe::Pool::builder()
        .url(&url)
        .pool_name("dash-hosts")
        .registry(&registry)
        .build()
        .unwrap();
    hosts.query("SELECT 1", &[]).await.unwrap();
    let mut names = BTreeSet::new();
    for family in registry.gather() {
        let name = family.name().to_string();
        if family.get_field_type() == MetricType::HISTOGRAM {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
        names.insert(name);
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_expression_parses_and_names_exported_metrics() {
    let exported = exported().await;
    let dashboard = dashboard_exprs();
    let rules = rule_exprs();
    assert!(
        dashboard.len() >= 20,
        "{} dashboard expressions",
        dashboard.len()
    );
    assert_eq!(
        rules.len(),
        16,
        "four thresholds, one recording rule and eleven alerts"
    );
    // A name with a colon is a recording rule's, defined in the same file.
    let recorded: BTreeSet<String> = rule_lines("record:").into_iter().collect();
    assert_eq!(recorded.len(), 5);
    // The alerts' thresholds are recording rules of their own, in one place
    // a team can change, each used by an alert.
    let thresholds: Vec<&String> = recorded
        .iter()
        .filter(|r| r.starts_with("pgpipe:threshold:"))
        .collect();
    assert_eq!(thresholds.len(), 4);
    for threshold in thresholds {
        let used = format!("scalar({threshold})");
        assert!(
            rules.iter().any(|e| e.contains(&used)),
            "no alert compares with {threshold}"
        );
    }
    let mut used = BTreeSet::new();
    let constants = |e: &&String| !e.starts_with("vector(");
    for expr in dashboard.iter().chain(rules.iter().filter(constants)) {
        let ast = parser::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        let mut names = BTreeSet::new();
        metric_names(&ast, &mut names);
        assert!(!names.is_empty(), "{expr} names no metric");
        for name in names {
            if name.contains(':') {
                assert!(
                    recorded.contains(&name),
                    "{expr} names {name}, never recorded"
                );
                continue;
            }
            assert!(
                exported.contains(&name),
                "{expr} names {name}, which is not exported"
            );
            used.insert(name);
        }
    }
    // The panels the issue asks for each have their metrics.
    for needed in [
        "pgpipe_queries_total",
        "pgpipe_query_duration_seconds_bucket",
        "pgpipe_pipeline_depth",
        "pgpipe_pipeline_queue_depth",
        "pgpipe_pipeline_batch_size_bucket",
        "pgpipe_pipeline_latency_saved_seconds_total",
        "pgpipe_pipeline_latency_without_pipelining_seconds_total",
        "pgpipe_pipeline_alone_seconds",
        "pgpipe_pipeline_rtt_seconds",
        "pgpipe_connections",
        "pgpipe_pending_requests",
        "pgpipe_pipeline_rejected_total",
        "pgpipe_connection_errors_total",
        "pgpipe_pipeline_round_trips_saved_total",
        "pgpipe_build_info",
        "pgpipe_host_role",
        "pgpipe_replica_lag_seconds",
        "pgpipe_replica_in_rotation",
        "pgpipe_queries_routed_total",
        "pgpipe_route_fallbacks_total",
        "pgpipe_retries_total",
        "pgpipe_role_errors_total",
        "pgpipe_primary_changes_total",
        "pgpipe_primary_conflicts_total",
        "pgpipe_primary_discovery_seconds_bucket",
    ] {
        assert!(used.contains(needed), "no panel shows {needed}");
    }
}

#[test]
fn promtool_accepts_the_rules() {
    let Some(promtool) = promtool() else {
        return;
    };
    let output = std::process::Command::new(promtool)
        .args(["check", "rules"])
        .arg(repo_file("dashboards/alerts.yml"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr)
    );
}

/// Each alert waits before firing, has a severity an on-call accepts, is
/// computed per instance, and links to its runbook, which exists.
#[test]
fn every_alert_waits_is_per_instance_and_has_a_runbook() {
    let rules = std::fs::read_to_string(repo_file("dashboards/alerts.yml")).unwrap();
    let runbooks = std::fs::read_to_string(repo_file("dashboards/README.md")).unwrap();
    let alerts: Vec<&str> = rules.split("- alert: ").skip(1).collect();
    assert_eq!(alerts.len(), 11);
    let mut critical = Vec::new();
    for alert in alerts {
        let name = alert.lines().next().unwrap().trim();
        let field = |key: &str| {
            alert
                .lines()
                .find_map(|line| line.trim().strip_prefix(key))
                .map(|value| value.trim().trim_matches('"').to_string())
                .unwrap_or_else(|| panic!("{name} has no {key}"))
        };
        assert!(!field("for:").is_empty(), "{name}: for");
        let severity = field("severity:");
        assert!(
            ["critical", "warning", "info"].contains(&severity.as_str()),
            "{name}: severity {severity}"
        );
        if severity == "critical" {
            critical.push(name.to_string());
        }
        let expr = field("expr:");
        assert!(
            expr.contains("by (job, instance, pool)")
                || expr.contains("by (job, instance, pool, host)")
                || expr == "pgpipe:database_unreachable"
                || expr.starts_with("absent("),
            "{name} is not computed per instance: {expr}"
        );
        let runbook = field("runbook_url:");
        assert!(
            runbook.ends_with(&format!("dashboards/README.md#{}", name.to_lowercase())),
            "{name}: runbook_url {runbook}"
        );
        assert!(
            runbooks.contains(&format!("\n### {name}\n")),
            "{name} has no runbook section in dashboards/README.md"
        );
    }
    assert_eq!(
        critical,
        [
            "PgpipeDatabaseUnreachable",
            "PgpipeNoPrimary",
            "PgpipeSplitBrain"
        ],
        "only an unreachable database, no primary, or two primaries page"
    );
}

#[test]
fn choosing_a_pool_keeps_its_read_lanes_and_hosts() {
    // A pool's series carry `pool` values such as these (metrics/labels.rs):
    // the write lane by its name, the read lane `/read`, and with several
    // hosts each host's lanes `@host:port`.
    let values = [
        "orders",
        "orders/read",
        "orders@db1:5432",
        "orders@db1:5432/read",
        "orders@db2:5432/read",
        "orders2",
        "billing@db1:5432",
    ];
    let text = std::fs::read_to_string(repo_file("dashboards/pgpipe.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let variable = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "pool")
        .unwrap();
    // Grafana offers what the variable's regex captures: each pool once,
    // by its name.
    let capture = variable["regex"].as_str().unwrap().trim_matches('/');
    let capture = regex::Regex::new(capture).unwrap();
    let offered: BTreeSet<&str> = values
        .iter()
        .filter_map(|v| capture.captures(v))
        .map(|c| c.get(1).unwrap().as_str())
        .collect();
    assert_eq!(offered, BTreeSet::from(["billing", "orders", "orders2"]));
    // Every panel's matcher, with `orders` chosen, takes all of its lanes
    // and hosts and nothing of another pool (Prometheus anchors `=~`).
    let mut matchers = BTreeSet::new();
    collect_pool_matchers(&text, &mut matchers);
    assert_eq!(matchers.len(), 1, "one way to match a pool: {matchers:?}");
    let matcher = matchers.pop_first().unwrap().replace("$pool", "orders");
    let matcher = regex::Regex::new(&format!("^(?:{matcher})$")).unwrap();
    let chosen: Vec<&str> = values
        .iter()
        .copied()
        .filter(|v| matcher.is_match(v))
        .collect();
    assert_eq!(
        chosen,
        [
            "orders",
            "orders/read",
            "orders@db1:5432",
            "orders@db1:5432/read",
            "orders@db2:5432/read"
        ]
    );
}

/// The regex of every `pool=~"…"` in the dashboard's JSON text.
fn collect_pool_matchers(text: &str, out: &mut BTreeSet<String>) {
    let open = "pool=~\\\"";
    let mut rest = text;
    while let Some(at) = rest.find(open) {
        rest = &rest[at + open.len()..];
        let end = rest.find("\\\"").unwrap();
        out.insert(rest[..end].to_string());
        rest = &rest[end..];
    }
}
