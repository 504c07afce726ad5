//! The chart's monitoring objects: the Service's `metrics` port reaches the health listener,
//! the ServiceMonitor, PrometheusRule and dashboard ConfigMap are off by default and render
//! when asked, and every metric named by a dashboard query or an alert expression is one the
//! scrape test saw (the metric families snapshotted by `tests/dev_walkthrough.rs`).
//!
//! Metric names are taken from PromQL by a small tokenizer: strings, label matchers (`{…}`),
//! ranges (`[…]`), numbers and durations are skipped, as are functions and aggregations (a
//! word before `(`), the label lists of `by`, `without`, `on`, `ignoring`, `group_left` and
//! `group_right`, and the operator keywords; every other word is a metric name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

use super::{find, objects, render};

/// Words that take a parenthesised label list.
const LABEL_LIST_KEYWORDS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Aggregation operators, which may stand before `by (…)` rather than `(`; operator and
/// literal keywords (PromQL keywords are case-insensitive).
const KEYWORDS: [&str; 26] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
    "group_left",
    "group_right",
    "on",
    "ignoring",
];

const ALL_ON: &str =
    "metrics.serviceMonitor.enabled=true,metrics.rules.enabled=true,metrics.dashboard.enabled=true";

/// The index after the string literal that opens at `start`.
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        if chars[i] == '\\' && quote != '`' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// The index after the bracket closing the one at `start` (strings inside are skipped).
fn skip_group(chars: &[char], start: usize) -> usize {
    let (open, close) = match chars[start] {
        '{' => ('{', '}'),
        '[' => ('[', ']'),
        _ => ('(', ')'),
    };
    let mut depth = 0;
    let mut i = start;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => {
                i = skip_string(chars, i);
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

fn is_word_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The first non-blank character at or after `i`.
fn next_char(chars: &[char], mut i: usize) -> Option<char> {
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    chars.get(i).copied()
}

/// The metric names `expr` selects, in order of appearance.
pub fn metric_names(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_string(&chars, i);
        } else if matches!(c, '{' | '[') {
            i = skip_group(&chars, i);
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if is_word_start(c) {
            let start = i;
            while i < chars.len() && is_word(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let lower = word.to_ascii_lowercase();
            let before_paren = next_char(&chars, i) == Some('(');
            if LABEL_LIST_KEYWORDS.contains(&lower.as_str()) && before_paren {
                let open = i + chars[i..].iter().position(|c| *c == '(').unwrap_or(0);
                i = skip_group(&chars, open);
            } else if !before_paren && !KEYWORDS.contains(&lower.as_str()) {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The metric families of the scrape snapshot, name to type.
fn scraped_families() -> BTreeMap<String, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "tests/snapshots/dev_walkthrough__the_walk_is_counted_by_method_and_code_on_the_metrics_endpoint.snap",
    );
    let text = std::fs::read_to_string(&path).expect("the scrape snapshot");
    let body = text.splitn(3, "---\n").nth(2).expect("an insta snapshot");
    let families: BTreeMap<String, String> = body
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect();
    assert!(families.len() >= 10, "{families:?}");
    families
}

/// The family a sample name of an exposition belongs to, if the scrape has it.
fn family_of<'a>(name: &str, families: &'a BTreeMap<String, String>) -> Option<&'a str> {
    let candidates = [
        (name, "gauge"),
        (name.strip_suffix("_total").unwrap_or(""), "counter"),
        (name.strip_suffix("_bucket").unwrap_or(""), "histogram"),
        (name.strip_suffix("_count").unwrap_or(""), "histogram"),
        (name.strip_suffix("_sum").unwrap_or(""), "histogram"),
    ];
    candidates.into_iter().find_map(|(family, kind)| {
        families
            .get_key_value(family)
            .filter(|(_, k)| k.as_str() == kind)
            .map(|(f, _)| f.as_str())
    })
}

/// Every `expr` of the dashboard's panels (rows included) and the metric selector of its
/// `label_values(…)` variables, each with where it is.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"]
                    .as_str()
                    .expect("a Prometheus target has an expr");
                out.push((format!("panel {}", panel["title"]), expr.to_owned()));
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .expect("a query variable has a query");
        let selector = query
            .strip_prefix("label_values(")
            .and_then(|rest| rest.rsplit_once(','))
            .map(|(selector, _)| selector)
            .expect("variables are label_values(<selector>, <label>)");
        out.push((
            format!("variable {}", variable["name"]),
            selector.to_owned(),
        ));
    }
    out
}

/// Every alert's expression, with its name.
fn rule_expressions(rule: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for group in rule["spec"]["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let expr = rule["expr"].as_str().expect("an expr");
            out.push((format!("alert {}", rule["alert"]), expr.to_owned()));
        }
    }
    out
}

/// The families `queries` name; panics on a query that names no metric, or one the scrape
/// does not have.
fn families_named(queries: &[(String, String)]) -> BTreeSet<String> {
    let families = scraped_families();
    let mut named = BTreeSet::new();
    let mut unknown = Vec::new();
    for (place, expr) in queries {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{place} names no metric: {expr}");
        for name in names {
            match family_of(&name, &families) {
                Some(family) => {
                    named.insert(family.to_owned());
                }
                None => unknown.push(format!("{place}: {name}")),
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics the scrape test did not see (tests/snapshots/dev_walkthrough__…snap): {unknown:?}"
    );
    named
}

pub fn the_tokenizer_finds_exactly_the_metric_names() {
    let expr = r#"sum by (namespace, le) (rate(a_bucket{x="}",y=~"b|c"}[5m] offset 1h)) / on (namespace) group_left (pod) max without (le) (b_total) > bool 0.5e3 and c unless D:e"#;
    assert_eq!(metric_names(expr), ["a_bucket", "b_total", "c", "D:e"]);
    assert_eq!(
        metric_names("histogram_quantile(0.9, x[$__rate_interval]) > Inf"),
        ["x"]
    );
    assert!(metric_names("vector(1)").is_empty());
    assert_eq!(metric_names("sum without (a) (m) * count(n)"), ["m", "n"]);
}

pub fn every_dashboard_and_alert_metric_is_one_the_scrape_test_saw(helm: &Path) {
    let objects = objects(&render(helm, &["--set", ALL_ON]).expect("renders"));
    let config = find(&objects, "ConfigMap", "demo-execution-provider-dashboard");
    let text = config["data"]["execution-provider.json"]
        .as_str()
        .expect("the dashboard");
    let dashboard: Value = serde_json::from_str(text).expect("the dashboard is JSON");
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 20, "{queries:?}");
    let shown = families_named(&queries);
    assert!(shown.len() >= 15, "{shown:?}");

    let rule = find(&objects, "PrometheusRule", "demo-execution-provider");
    let alerts = rule_expressions(rule);
    let alerted = families_named(&alerts);
    for needed in [
        "execution_provider_fences",
        "execution_provider_environments",
        "execution_provider_ensure_to_ready_seconds",
        "execution_provider_limiter_rejections",
        "execution_provider_security_reloads",
        "execution_provider_security_authority_generation",
    ] {
        assert!(alerted.contains(needed), "no alert on {needed}: {alerts:?}");
    }
    for (alert, expr) in &alerts {
        assert!(
            expr.contains("namespace=\"execution\""),
            "{alert} is not scoped to the release namespace: {expr}"
        );
    }
}

pub fn the_metrics_port_and_monitoring_objects_render_when_asked(helm: &Path) {
    let defaults = objects(&render(helm, &[]).expect("renders"));
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        assert!(
            !defaults.iter().any(|o| o["kind"] == kind),
            "{kind} is off by default"
        );
    }
    assert!(
        !defaults
            .iter()
            .any(|o| o["metadata"]["name"] == "demo-execution-provider-dashboard"),
        "the dashboard is off by default"
    );
    let service = find(&defaults, "Service", "demo-execution-provider");
    let metrics = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a metrics port");
    assert_eq!(metrics["port"], 8081);
    assert_eq!(metrics["targetPort"], "health");
    let deployment = find(&defaults, "Deployment", "demo-execution-provider");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert!(
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "health" && p["containerPort"] == 8081)
    );
    assert!(
        container["args"]
            .as_array()
            .unwrap()
            .contains(&Value::from("--health-listen=0.0.0.0:8081"))
    );

    let scraper = r#"metrics.scrapeIngressSelectors=[{"namespaceLabels":{"kubernetes.io/metadata.name":"monitoring"},"podLabels":{"app.kubernetes.io/name":"prometheus"}}]"#;
    let on = objects(
        &render(
            helm,
            &[
                "--set",
                ALL_ON,
                "--set",
                "metrics.serviceMonitor.labels.release=kps",
                "--set-json",
                scraper,
            ],
        )
        .expect("renders"),
    );
    let monitor = find(&on, "ServiceMonitor", "demo-execution-provider");
    assert_eq!(monitor["metadata"]["labels"]["release"], "kps");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    let service = find(&on, "Service", "demo-execution-provider");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][key], value, "{key}");
    }
    let dashboard = find(&on, "ConfigMap", "demo-execution-provider-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let policy = find(&on, "NetworkPolicy", "demo-execution-provider-provider");
    let ingress = policy["spec"]["ingress"].as_array().unwrap();
    let scrape = ingress
        .iter()
        .find(|rule| rule["ports"][0]["port"] == 8081)
        .expect("the scrapers' ingress rule");
    assert_eq!(
        scrape["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "prometheus"
    );
    let default_policy = find(
        &defaults,
        "NetworkPolicy",
        "demo-execution-provider-provider",
    );
    assert!(
        !default_policy["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .any(|rule| rule["ports"][0]["port"] == 8081),
        "nothing may scrape unless listed"
    );
}

pub fn the_monitoring_objects_render_exactly_their_snapshot(helm: &Path) {
    let rendered = render(
        helm,
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true,metrics.rules.enabled=true",
            "--show-only",
            "templates/monitoring.yaml",
        ],
    )
    .expect("renders");
    insta::with_settings!({snapshot_path => "../snapshots"}, {
        insta::assert_snapshot!("chart_monitoring", rendered);
    });
}
