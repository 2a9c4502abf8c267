//! The dashboards and alerting rules in `dashboards/`: the rules pass their `promtool` unit
//! tests (a firing and a calm case for every alert), and every dashboard query names only
//! metrics the gateway or the election library export.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use fencing_gateway::metrics as gateway_metrics;
use serde_json::Value;

fn dashboards_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dashboards")
}

fn promtool(args: &[&str]) -> String {
    let output = match Command::new("promtool").args(args).current_dir(dashboards_dir()).output() {
        Ok(output) => output,
        Err(error) => panic!(
            "promtool is needed for the alerting-rule tests ({error}): install Prometheus, \
             e.g. `apt-get install prometheus` on Debian or Ubuntu"
        ),
    };
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn alerting_rules_are_valid_and_pass_their_promtool_unit_tests() {
    let checked = promtool(&["check", "rules", "alerts.yml"]);
    assert!(checked.contains("SUCCESS: 11 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "alerts_test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Every metric name the gateway and the election library export.
fn exported_metrics() -> BTreeSet<&'static str> {
    [
        gateway_metrics::WRITES,
        gateway_metrics::WRITE_DURATION,
        gateway_metrics::CHECK_DURATION,
        gateway_metrics::LEASE_OPERATIONS,
        gateway_metrics::LEASE_TRANSITIONS,
        gateway_metrics::STORE_ERRORS,
        gateway_metrics::INFLIGHT_WRITES,
        gateway_metrics::UPSTREAM_ERRORS,
        gateway_metrics::PASSTHROUGH,
        gateway_metrics::CACHED_REFUSALS,
        gateway_metrics::BATCH_SIZE,
        gateway_metrics::REFUSALS_DROPPED,
        gateway_metrics::SQL_REFUSALS,
        gateway_metrics::CONNECTIONS_REFUSED,
        gateway_metrics::LEASE_HELD,
        gateway_metrics::LEASE_TERM,
        gateway_metrics::LEASE_REMAINING,
        gateway_metrics::LEASE_RENEW_FAILURES,
        gateway_metrics::CLOCK_DISAGREEMENTS,
        gateway_metrics::GRANTS_HELD,
        gateway_metrics::GRANT_TABLE_BYTES,
        gateway_metrics::GRANT_COVERED,
        gateway_metrics::GRANT_RENEWALS,
        gateway_metrics::WATCHERS,
        gateway_metrics::WATCH_REFUSALS,
        gateway_metrics::WATCH_LISTENING,
        gateway_metrics::LOG_APPENDS,
        fencing_gateway::proxy::reads::FOLLOWER_READS,
        fencing_election::log::APPENDS,
        fencing_election::log::FOLLOWER_LAG_ENTRIES,
        fencing_election::log::FOLLOWER_LAG_SECONDS,
        fencing_election::metrics::CLOCK_DISAGREEMENTS,
        fencing_election::membership::CLOCK_DISAGREEMENTS,
        fencing_election::metrics::IS_LEADER,
        fencing_election::metrics::TERM,
        fencing_election::metrics::RENEW_FAILURES,
        fencing_election::metrics::RESIGNATIONS,
        fencing_election::metrics::LEASE_REMAINING_SECONDS,
        gateway_metrics::MEMBER_OPERATIONS,
        fencing_election::membership::LIVE_NODES,
        fencing_election::membership::HEARTBEAT_FAILURES,
        fencing_election::daemons::DAEMONS,
        fencing_election::daemons::REASSIGNMENTS,
        fencing_election::daemons::ASSIGN_SECONDS,
        fencing_election::daemons::RUNNING,
    ]
    .into_iter()
    .collect()
}

/// The metric names in a PromQL expression: words starting with `fencing_`, `election_` or
/// `membership_`.
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| ["fencing_", "election_", "membership_"].iter().any(|prefix| word.starts_with(prefix)))
        .map(|word| word.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count").to_owned())
        .collect()
}

#[test]
fn dashboard_panels_query_only_exported_metrics_through_the_datasource_variable() {
    let text = std::fs::read_to_string(dashboards_dir().join("fencing-gateway.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables.iter().any(|v| v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"),
        "the Prometheus datasource is a variable"
    );
    let exported = exported_metrics();
    let mut used = BTreeSet::new();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10, "one panel per thing an operator watches");
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has queries");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{title}: {expr} names no metric of ours");
            for name in names {
                assert!(exported.contains(name.as_str()), "{title}: {name} is not exported");
                used.insert(name);
            }
        }
    }
    for required in [
        "fencing_writes_total",
        "election_term",
        "election_renew_failures_total",
        "fencing_check_duration_seconds",
        "membership_live_nodes",
        "election_daemons",
        "election_daemon_reassignments_total",
        "election_daemon_assign_seconds",
        "fencing_watchers",
        "election_resignations_total",
    ] {
        assert!(used.contains(required), "no panel shows {required}");
    }
    let rules = std::fs::read_to_string(dashboards_dir().join("alerts.yml")).unwrap();
    for name in metric_names(&rules) {
        assert!(exported.contains(name.as_str()), "alerts.yml: {name} is not exported");
    }
}

#[test]
fn the_readme_lists_every_exported_metric() {
    let readme = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md")).unwrap();
    for name in exported_metrics() {
        assert!(readme.contains(&format!("`{name}`")), "docs/metrics.md's metric table lacks {name}");
    }
}
