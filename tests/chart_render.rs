//! The Helm chart renders (with `helm template`, the binary named by `$HELM`) into exactly the
//! objects of k8s-executor §5, pinned by a snapshot; its RBAC is least privilege; its templates
//! ConfigMap is a file the provider loads; its values schema refuses bad values.
//!
//! A `libtest-mimic` harness (`harness = false`): helm is `$HELM`, else the one
//! `tests/e2e/bin/build-bins.sh` caches (built here on first use when Go is installed); where
//! there is none and none can be built, the tests are reported *ignored* with the reason, and
//! under CI (`$CI` set) they fail.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

use execution_provider::security::SecurityManifest;
use execution_provider::templates::TemplateRegistry;
use serde_json::Value;

const NAMESPACE: &str = "execution";

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/execution-provider")
}

/// `helm template` of the chart with the CI values plus `extra` arguments.
fn render(helm: &Path, extra: &[&str]) -> Result<String, String> {
    let chart = chart();
    let output = Command::new(helm)
        .args(["template", "demo"])
        .arg(&chart)
        .args(["--namespace", NAMESPACE, "--kube-version", "1.33.0", "-f"])
        .arg(chart.join("ci/test-values.yaml"))
        .args(extra)
        .output()
        .expect("helm runs");
    if output.status.success() {
        Ok(String::from_utf8(output.stdout).expect("utf-8"))
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

fn objects(rendered: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(rendered)
        .expect("helm output is YAML")
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} is rendered"))
}

fn the_chart_renders_exactly_its_snapshot(helm: &Path) {
    let rendered = render(helm, &[]).expect("renders");
    insta::assert_snapshot!("chart_render", rendered);
}

fn the_rendered_templates_and_manifest_are_what_the_provider_loads(helm: &Path) {
    let objects = objects(&render(helm, &[]).expect("renders"));
    let templates = find(&objects, "ConfigMap", "demo-execution-provider-templates");
    let text = templates["data"]["templates.yaml"].as_str().unwrap();
    let registry = TemplateRegistry::from_yaml_str(text, "chart").expect("the provider loads it");
    assert!(registry.default_revision("default").is_some());
    let manifest = find(
        &objects,
        "ConfigMap",
        "demo-execution-provider-security-manifest",
    );
    let text = manifest["data"]["manifest.json"].as_str().unwrap();
    SecurityManifest::parse(text.as_bytes()).expect("the provider loads the manifest");
    let deployment = find(&objects, "Deployment", "demo-execution-provider");
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(args[0], "serve");
    assert!(args.as_array().unwrap().contains(&Value::from(
        "--executor-service-account=demo-execution-provider-executor"
    )));
    assert_eq!(deployment["spec"]["replicas"], 2);
}

/// A template of 10,000 environments (the largest `maxEnvironments`) with a quota to match
/// renders, passes the values schema, and is what the provider loads (docs/operating.md §4,
/// "Raising a template's limit").
fn a_template_of_ten_thousand_environments_renders_and_loads(helm: &Path) {
    let values: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart().join("ci/test-values.yaml")).expect("values"),
    )
    .expect("yaml");
    let default = &values["templates"]["default"];
    let key = default["default"].as_str().expect("default revision");
    let mut execution = default["revisions"][key]["execution"].clone();
    execution["maxEnvironments"] = 10_000.into();
    let spec: execution_provider::templates::ProfileSpec =
        serde_json::from_value(execution.clone()).expect("spec");
    let large = execution_provider::templates::canonical_template_revision(
        &spec.validate().expect("valid"),
    );
    let extra = serde_json::json!({
        "templates": {"large": {"default": large, "revisions": {large.clone(): {"execution": execution}}}},
        "resourceGovernance": {"executionEnvironments": "10100", "persistentVolumeClaims": "10100",
                               "pods": "10200"},
    });
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("large.yaml");
    std::fs::write(&file, extra.to_string()).expect("write");
    let rendered = render(helm, &["-f", file.to_str().unwrap()]).expect("renders");
    let objects = objects(&rendered);
    let templates = find(&objects, "ConfigMap", "demo-execution-provider-templates");
    let text = templates["data"]["templates.yaml"].as_str().unwrap();
    let registry = TemplateRegistry::from_yaml_str(text, "chart").expect("the provider loads it");
    assert_eq!(registry.capacity("large"), Some(10_000));
    let quota = find(&objects, "ResourceQuota", "demo-execution-provider");
    assert_eq!(
        quota["spec"]["hard"]["count/executionenvironments.execution.mecatl.dev"],
        "10100"
    );
    for index in 1..execution_provider::kube::crd::LEDGER_SHARDS {
        let name = execution_provider::kube::crd::ledger_shard_name(index);
        let shard = find(&objects, "ConfigMap", &name);
        assert_eq!(
            shard["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{name}"
        );
    }
}

fn rbac_is_exactly_what_the_provider_calls_and_never_secrets(helm: &Path) {
    let rendered = render(helm, &[]).expect("renders");
    let objects = objects(&rendered);
    let role = find(&objects, "Role", "demo-execution-provider");
    let rules: Vec<String> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {} {} {}",
                r["apiGroups"], r["resources"], r["verbs"], r["resourceNames"]
            )
        })
        .collect();
    insta::assert_debug_snapshot!("chart_role_rules", rules);
    for rbac in objects
        .iter()
        .filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole")
    {
        for rule in rbac["rules"].as_array().unwrap() {
            let text = rule.to_string();
            assert!(!text.contains("secrets"), "no Secrets access: {text}");
            assert!(!text.contains("\"*\""), "no wildcard: {text}");
        }
    }
    let preflight = find(
        &objects,
        "ClusterRole",
        "execution-demo-execution-provider-profile-preflight",
    );
    assert_eq!(
        preflight["rules"][0]["resourceNames"],
        serde_json::json!(["gvisor"])
    );
    assert_eq!(
        preflight["rules"][1]["resourceNames"],
        serde_json::json!(["standard"])
    );
    for rule in preflight["rules"].as_array().unwrap() {
        assert_eq!(rule["verbs"], serde_json::json!(["get"]));
    }
    let executor = find(
        &objects,
        "ServiceAccount",
        "demo-execution-provider-executor",
    );
    assert_eq!(executor["automountServiceAccountToken"], false);
    assert!(executor.get("imagePullSecrets").is_none());
    assert!(
        !objects
            .iter()
            .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
            .any(|b| b.to_string().contains("demo-execution-provider-executor")),
        "the executor account is bound to nothing"
    );
}

fn the_chart_has_no_hooks_no_pvcs_and_no_open_egress(helm: &Path) {
    let rendered = render(helm, &[]).expect("renders");
    assert!(!rendered.contains("helm.sh/hook"));
    assert!(!rendered.contains("0.0.0.0/0"));
    let objects = objects(&rendered);
    assert!(!objects.iter().any(|o| o["kind"] == "PersistentVolumeClaim"));
    let deny = find(
        &objects,
        "NetworkPolicy",
        "demo-execution-provider-workload-default-deny",
    );
    assert_eq!(deny["spec"]["egress"], serde_json::json!([]));
    assert_eq!(deny["spec"]["ingress"], serde_json::json!([]));
    for kept in [
        ("ConfigMap", "mecatl-execution-profile-allocations"),
        ("ConfigMap", "demo-execution-provider-security-authority"),
        ("ServiceAccount", "demo-execution-provider-executor"),
    ] {
        let object = find(&objects, kept.0, kept.1);
        assert_eq!(
            object["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{kept:?}"
        );
    }
    assert!(find(&objects, "ResourceQuota", "demo-execution-provider").is_object());
    assert!(find(&objects, "LimitRange", "demo-execution-provider").is_object());
}

fn the_values_schema_refuses_bad_values(helm: &Path) {
    // Each bad value with what must name it in helm's refusal: the values schema, field by
    // field. Any other failure (a broken chart, a bad flag, a missing file) is not a refusal
    // of that value.
    const SCHEMA: &str = "values don't meet the specifications of the schema";
    let cases: [(&[&str], &[&str]); 21] = [
        (
            &[
                "--set",
                "templates.default.revisions.v1-fc8098ef55abb210d60af3b2bf78c5f8a91062edfdf49995ac5896b0c60f2899.execution.network=open",
            ],
            &[SCHEMA, "network"],
        ),
        (&["--set", "provider.replicas=1"], &[SCHEMA, "replicas"]),
        (
            &["--set", "provider.terminationGracePeriodSeconds=0"],
            &[SCHEMA, "terminationGracePeriodSeconds"],
        ),
        (
            &["--set", "provider.image=registry.example/provider:latest"],
            &[SCHEMA, "image"],
        ),
        (&["--set", "surprise=1"], &[SCHEMA, "surprise"]),
        (
            &["--set", "metrics.serviceMonitor.surprise=1"],
            &[SCHEMA, "surprise"],
        ),
        (
            &["--set", "metrics.rules.limiterRejectionRatio=2"],
            &[SCHEMA, "limiterRejectionRatio"],
        ),
        (
            &["--set", "metrics.serviceMonitor.interval=soon"],
            &[SCHEMA, "interval"],
        ),
        (
            &["--set", "service.metricsPort=0"],
            &[SCHEMA, "metricsPort"],
        ),
        (&["--set", "provider.surprise=1"], &[SCHEMA, "surprise"]),
        (
            &["--set-json", "provider.apiServerCIDRs=[]"],
            &[SCHEMA, "apiServerCIDRs"],
        ),
        (
            &["--set", "provider.securityReloadInterval=2m"],
            &[SCHEMA, "securityReloadInterval"],
        ),
        (
            &["--set", "provider.maxConcurrentRPCs=0"],
            &[SCHEMA, "maxConcurrentRPCs"],
        ),
        (
            &["--set", "provider.maxConcurrentRPCsPerClient=5000"],
            &[SCHEMA, "maxConcurrentRPCsPerClient"],
        ),
        (
            &["--set", "provider.maxConnections=70000"],
            &[SCHEMA, "maxConnections"],
        ),
        (
            &["--set", "provider.maxTlsHandshakes=0"],
            &[SCHEMA, "maxTlsHandshakes"],
        ),
        (
            &["--set", "networkPolicy.enabled=false"],
            &[SCHEMA, "enabled"],
        ),
        (
            &["--set", "resourceGovernance.enabled=false"],
            &[SCHEMA, "enabled"],
        ),
        (
            &[
                "--set-json",
                "maintenance.pruneRevisions={\"default\":[\"latest\"]}",
            ],
            &[SCHEMA, "pruneRevisions"],
        ),
        (
            &[
                "--set-json",
                "provider.securitySources=[{\"name\":\"tls\",\"items\":[{\"key\":\"a\",\"path\":\"../server.pem\"}]}]",
            ],
            &[SCHEMA, "path"],
        ),
        (
            &[
                "--set-json",
                "networkPolicy.workloadProfiles={\"default\":{\"egress\":[{\"cidr\":\"192.0.2.0/24\",\"except\":[\"nowhere\"],\"ports\":[{\"port\":443}]}]}}",
            ],
            &[SCHEMA, "except"],
        ),
    ];
    for (extra, named) in cases {
        let refusal = render(helm, extra).expect_err(&format!("{extra:?} is refused"));
        for text in named {
            assert!(
                refusal.contains(text),
                "{extra:?} was refused, but not for the bad value ({text:?} missing): {refusal}"
            );
        }
    }
    assert!(render(helm, &[]).is_ok());
}

#[path = "chart_render/checks.rs"]
mod checks;
#[path = "k8s_bins/mod.rs"]
mod k8s_bins;
#[path = "chart_render/lifetime_guard.rs"]
mod lifetime_guard;
#[path = "chart_render/monitoring.rs"]
mod monitoring;
#[path = "chart_render/values_read.rs"]
mod values_read;

/// The helm binary of this run, else why not and whether that only makes the tests ignored
/// (`true`: there is none and none can be built here, outside CI) or fails them.
fn helm_binary() -> &'static Result<PathBuf, (bool, String)> {
    static HELM: OnceLock<Result<PathBuf, (bool, String)>> = OnceLock::new();
    HELM.get_or_init(|| {
        if let Some(path) = std::env::var_os("HELM").filter(|v| !v.is_empty()) {
            return Ok(PathBuf::from(path));
        }
        let cached = k8s_bins::cache_dir("HELM_DIR")
            .map_err(|e| (false, e))?
            .join("helm");
        if let Some(reason) = k8s_bins::why_unbuildable("helm", std::slice::from_ref(&cached)) {
            let reason = format!("HELM is unset and {reason}");
            return Err((!k8s_bins::under_ci(), reason));
        }
        if !cached.is_file() {
            k8s_bins::build(&["helm"]).map_err(|e| (false, e))?;
        }
        Ok(cached)
    })
}

fn chart_test(name: &'static str, test: fn(&Path)) -> Trial {
    Trial::ignorable_test(name, move || match helm_binary() {
        Ok(helm) => {
            test(helm);
            Ok(Completion::Completed)
        }
        Err((true, reason)) => Ok(Completion::ignored_with(reason)),
        Err((false, failure)) => Err(Failed::from(failure)),
    })
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let trials = vec![
        chart_test(
            "the_chart_renders_exactly_its_snapshot",
            the_chart_renders_exactly_its_snapshot,
        ),
        chart_test(
            "the_rendered_templates_and_manifest_are_what_the_provider_loads",
            the_rendered_templates_and_manifest_are_what_the_provider_loads,
        ),
        chart_test(
            "rbac_is_exactly_what_the_provider_calls_and_never_secrets",
            rbac_is_exactly_what_the_provider_calls_and_never_secrets,
        ),
        chart_test(
            "a_template_of_ten_thousand_environments_renders_and_loads",
            a_template_of_ten_thousand_environments_renders_and_loads,
        ),
        chart_test(
            "the_chart_has_no_hooks_no_pvcs_and_no_open_egress",
            the_chart_has_no_hooks_no_pvcs_and_no_open_egress,
        ),
        chart_test(
            "the_values_schema_refuses_bad_values",
            the_values_schema_refuses_bad_values,
        ),
        chart_test(
            "the_values_schema_names_every_value_the_templates_read",
            values_read::the_values_schema_names_every_value_the_templates_read,
        ),
        chart_test(
            "the_deployment_passes_every_provider_value",
            values_read::the_deployment_passes_every_provider_value,
        ),
        chart_test(
            "the_otlp_endpoint_reaches_the_container_and_its_collector_only",
            values_read::the_otlp_endpoint_reaches_the_container_and_its_collector_only,
        ),
        chart_test(
            "the_egress_check_refuses_every_split_of_the_public_address_space",
            checks::the_egress_check_refuses_every_split_of_the_public_address_space,
        ),
        chart_test(
            "the_render_checks_refuse_what_the_schema_cannot_express",
            checks::the_render_checks_refuse_what_the_schema_cannot_express,
        ),
        chart_test(
            "each_upgrade_guard_refuses_its_case",
            lifetime_guard::each_upgrade_guard_refuses_its_case,
        ),
        Trial::test("the_tokenizer_finds_exactly_the_metric_names", || {
            monitoring::the_tokenizer_finds_exactly_the_metric_names();
            Ok(())
        }),
        chart_test(
            "every_dashboard_and_alert_metric_is_one_the_scrape_test_saw",
            monitoring::every_dashboard_and_alert_metric_is_one_the_scrape_test_saw,
        ),
        chart_test(
            "the_metrics_port_and_monitoring_objects_render_when_asked",
            monitoring::the_metrics_port_and_monitoring_objects_render_when_asked,
        ),
        chart_test(
            "the_monitoring_objects_render_exactly_their_snapshot",
            monitoring::the_monitoring_objects_render_exactly_their_snapshot,
        ),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
