//! The upgrade and lifetime guard (k8s-executor §5.3, `templates/_lifetime.tpl`) against live
//! states handed to it directly: `helm template` has no cluster, so a driver chart made of the
//! chart's own `_helpers.tpl` and `_lifetime.tpl` calls the guard with the state of each case.
//! The baseline (an installation quiesced for an upgrade, one environment retained) passes;
//! every case changes one thing and must be refused by the rule that names it.

use std::path::Path;
use std::process::Command;

use execution_provider::kube::crd::{ledger_key, ledger_slots_key, template_label};
use serde_json::{Value, json};

use super::{chart, find, objects, render};

const REVISION: &str = "v1-fc8098ef55abb210d60af3b2bf78c5f8a91062edfdf49995ac5896b0c60f2899";

/// Runs the guard on `live` with the chart's default and CI values plus `extra`.
fn guard(helm: &Path, live: &Value, extra: &[&str]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let templates = dir.path().join("templates");
    std::fs::create_dir(&templates).unwrap();
    for file in ["_helpers.tpl", "_lifetime.tpl"] {
        std::fs::copy(chart().join("templates").join(file), templates.join(file)).unwrap();
    }
    std::fs::write(
        dir.path().join("Chart.yaml"),
        "apiVersion: v2\nname: lifetime-guard-driver\nversion: 0.0.0\n",
    )
    .unwrap();
    std::fs::write(
        templates.join("guard.yaml"),
        "{{- include \"ep.lifetimeGuard\" (dict \"root\" . \"live\" .Values.live) -}}\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {name: guard-passed}\n",
    )
    .unwrap();
    let live_file = dir.path().join("live.json");
    std::fs::write(&live_file, json!({ "live": live }).to_string()).unwrap();
    let output = Command::new(helm)
        .args(["template", "demo"])
        .arg(dir.path())
        .args(["--namespace", "execution", "-f"])
        .arg(chart().join("values.yaml"))
        .arg("-f")
        .arg(chart().join("ci/test-values.yaml"))
        .arg("-f")
        .arg(&live_file)
        .args(extra)
        .output()
        .expect("helm runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    if output.status.success() && stdout.contains("guard-passed") {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

fn labelled(kind: &str, name: &str, labels: Value) -> Value {
    json!({"kind": kind, "metadata": {"name": name, "labels": labels}})
}

/// An installation ready for an upgrade: what the chart rendered, the provider scaled to 0 and
/// one environment with its executor Pod and workspace PVC.
fn baseline(helm: &Path) -> Value {
    let rendered = objects(&render(helm, &[]).expect("renders"));
    let map = |name: &str| find(&rendered, "ConfigMap", name).clone();
    let mut authority = map("demo-execution-provider-security-authority");
    authority["data"] = json!({"state.json": "{\"generation\":1}"});
    let mut ledger = map("mecatl-execution-profile-allocations");
    ledger["data"] = json!({ ledger_key("default"): "[\"env-a\"]" });
    let policies: Vec<Value> = rendered
        .iter()
        .filter(|o| o["kind"] == "NetworkPolicy")
        .cloned()
        .collect();
    let workload = json!({
        "execution.mecatl.dev/environment": "env-a",
        "execution.mecatl.dev/template-id": template_label("default"),
    });
    json!({
        "deployment": {"kind": "Deployment", "spec": {"replicas": 0}},
        "templatesMap": map("demo-execution-provider-templates"),
        "legacyProfiles": {},
        "manifestMap": map("demo-execution-provider-security-manifest"),
        "authorityMap": authority,
        "ledger": ledger,
        "executorAccount": find(&rendered, "ServiceAccount", "demo-execution-provider-executor"),
        "pods": [labelled("Pod", "env-a-executor", workload.clone())],
        "pvcs": [labelled("PersistentVolumeClaim", "env-a-workspace", workload)],
        "environments": [{"kind": "ExecutionEnvironment", "metadata": {"name": "env-a"}}],
        "networkPolicies": policies,
    })
}

/// Edits the `lifetime.json` the previous release recorded.
fn edit_lifetime(live: &mut Value, edit: impl FnOnce(&mut Value)) {
    let data = &mut live["templatesMap"]["data"]["lifetime.json"];
    let mut lifetime: Value = serde_json::from_str(data.as_str().unwrap()).unwrap();
    edit(&mut lifetime);
    *data = Value::from(lifetime.to_string());
}

/// A namespace without environments, executors, PVCs or ledger slots, ready for a prune.
fn emptied(live: &mut Value) {
    live["pods"] = json!([]);
    live["pvcs"] = json!([]);
    live["environments"] = json!([]);
    live["ledger"]["data"] = json!({
        ledger_key("default"): "[]",
        ledger_slots_key("default"): r#"{"slots":[]}"#,
    });
    live["ledgerShards"] = json!([{"data": { ledger_slots_key("default"): r#"{"slots":[]}"# }}]);
}

type Edit = fn(&mut Value);

pub fn each_upgrade_guard_refuses_its_case(helm: &Path) {
    let base = baseline(helm);
    guard(helm, &base, &[]).expect("a quiesced installation upgrades");
    let fresh = json!({"deployment": {}, "templatesMap": {}, "legacyProfiles": {}, "manifestMap": {},
        "authorityMap": {}, "ledger": {}, "executorAccount": {}, "pods": [], "pvcs": [],
        "environments": [], "networkPolicies": []});
    guard(helm, &fresh, &[]).expect("a fresh install passes");
    let prune = format!("maintenance.pruneRevisions={{\"default\":[\"{REVISION}\"]}}");
    let mut pruning = base.clone();
    emptied(&mut pruning);
    guard(helm, &pruning, &["--set-json", &prune]).expect("a prune of an empty namespace passes");
    let new_profile = "networkPolicy.workloadProfiles.fresh={\"egress\":[{\"cidr\":\"198.51.100.0/24\",\"ports\":[{\"port\":443}]}]}";
    guard(helm, &base, &["--set-json", new_profile]).expect("egress for a new template id passes");

    let changed_revision = format!("templates.default.revisions.{REVISION}.execution.cpuLimit=2");
    let cases: Vec<(&str, Value, Edit, Vec<&str>, &str)> = vec![
        (
            "legacy profiles ConfigMap",
            base.clone(),
            |l| l["legacyProfiles"] = json!({"kind": "ConfigMap"}),
            vec![],
            "earlier layout",
        ),
        (
            "provider not scaled to 0",
            base.clone(),
            |l| l["deployment"]["spec"]["replicas"] = json!(2),
            vec![],
            "scale the Deployment to 0",
        ),
        (
            "a provider Pod remains",
            base.clone(),
            |l| {
                l["pods"].as_array_mut().unwrap().push(labelled(
                    "Pod",
                    "provider-0",
                    json!({"app.kubernetes.io/name": "demo-execution-provider"}),
                ));
            },
            vec![],
            "provider Pod provider-0 still exists",
        ),
        (
            "no lifetime.json",
            base.clone(),
            |l| l["templatesMap"]["data"] = json!({"templates.yaml": "x"}),
            vec![],
            "has no lifetime.json",
        ),
        (
            "network configuration changed",
            base.clone(),
            |_| {},
            vec!["--set-json", "networkPolicy.dnsPorts=[5353]"],
            "networkPolicy (apart from new workloadProfiles) is immutable",
        ),
        (
            "an existing profile changed",
            base.clone(),
            |_| {},
            vec![
                "--set-json",
                "networkPolicy.workloadProfiles.default.egress=[{\"cidr\":\"198.51.100.0/24\",\"ports\":[{\"port\":443}]}]",
            ],
            "workloadProfiles.default is immutable",
        ),
        (
            "egress added to an existing template",
            base.clone(),
            |l| edit_lifetime(l, |t| t["networkPolicy"]["workloadProfiles"] = json!({})),
            vec![],
            "only with a new template id",
        ),
        (
            "egress for a template id a Pod runs",
            base.clone(),
            |l| {
                l["pods"].as_array_mut().unwrap().push(labelled("Pod", "early", json!({"execution.mecatl.dev/environment": "early", "execution.mecatl.dev/template-id": template_label("fresh")})));
            },
            vec!["--set-json", new_profile],
            "Pod early already runs this template id",
        ),
        (
            "a revision changed",
            base.clone(),
            |_| {},
            vec!["--set", &changed_revision],
            "must stay present and unchanged",
        ),
        (
            "a revision dropped",
            base.clone(),
            |l| {
                edit_lifetime(l, |t| {
                    t["definitions"]["default"]["revisions"]["v1-0000000000000000000000000000000000000000000000000000000000000000"] =
                        json!({"execution": {"image": "old"}});
                })
            },
            vec![],
            "must stay present and unchanged",
        ),
        (
            "a prune of a revision never installed",
            pruning.clone(),
            |_| {},
            vec![
                "--set-json",
                "maintenance.pruneRevisions={\"default\":[\"v1-0000000000000000000000000000000000000000000000000000000000000000\"]}",
            ],
            "was never installed",
        ),
        (
            "a prune without an observed scaled-to-zero provider",
            pruning.clone(),
            |l| l["deployment"] = json!({}),
            vec!["--set-json", &prune],
            "observed scaled to 0",
        ),
        (
            "a prune with ledger slots",
            pruning.clone(),
            |l| l["ledger"]["data"] = json!({ ledger_key("default"): "[\"env-a\"]" }),
            vec!["--set-json", &prune],
            "every entry empty",
        ),
        (
            "a prune with a slot of the sharded format in the root",
            pruning.clone(),
            |l| {
                l["ledger"]["data"][ledger_slots_key("default")] =
                    Value::from(r#"{"slots":[["env-a",0]]}"#);
            },
            vec!["--set-json", &prune],
            "every entry empty",
        ),
        (
            "a prune with a slot held only in a shard beside the root",
            pruning.clone(),
            |l| {
                l["ledgerShards"] = json!([{}, {}, {"data": {
                    ledger_slots_key("default"): r#"{"slots":[["env-a",1800000030]]}"#
                }}]);
            },
            vec!["--set-json", &prune],
            "every entry empty",
        ),
        (
            "a prune with an overflow name in a shard",
            pruning.clone(),
            |l| {
                l["ledgerShards"][0]["data"][ledger_slots_key("default")] =
                    Value::from(r#"{"slots":[],"overflow":["env-a"]}"#);
            },
            vec!["--set-json", &prune],
            "every entry empty",
        ),
        (
            "a prune with a ledger entry that does not parse",
            pruning.clone(),
            |l| l["ledger"]["data"][ledger_slots_key("default")] = Value::from("{not json"),
            vec!["--set-json", &prune],
            "every entry empty",
        ),
        (
            "a prune with an environment left",
            pruning.clone(),
            |l| {
                l["environments"] =
                    json!([{"kind": "ExecutionEnvironment", "metadata": {"name": "env-a"}}])
            },
            vec!["--set-json", &prune],
            "without ExecutionEnvironments, Pods and PVCs",
        ),
        (
            "a prune with a Pod left",
            pruning.clone(),
            |l| l["pods"] = json!([labelled("Pod", "other", json!({}))]),
            vec!["--set-json", &prune],
            "without ExecutionEnvironments, Pods and PVCs",
        ),
        (
            "executor account missing on upgrade",
            base.clone(),
            |l| {
                l["executorAccount"] = json!({});
                l["environments"] = json!([]);
                l["pods"] = json!([]);
                l["pvcs"] = json!([]);
                l["ledger"]["data"] = json!({});
            },
            vec![],
            "executor ServiceAccount is missing",
        ),
        (
            "ledger missing on upgrade",
            base.clone(),
            |l| {
                l["ledger"] = json!({});
                l["environments"] = json!([]);
                l["pods"] = json!([]);
                l["pvcs"] = json!([]);
            },
            vec![],
            "capacity ledger ConfigMap is missing",
        ),
        (
            "default-deny missing on upgrade",
            base.clone(),
            |l| {
                l["networkPolicies"] = json!([]);
                l["environments"] = json!([]);
                l["pods"] = json!([]);
                l["pvcs"] = json!([]);
                l["ledger"]["data"] = json!({});
            },
            vec![],
            "default-deny NetworkPolicy is missing",
        ),
        (
            "retained, executor account with a token",
            base.clone(),
            |l| l["executorAccount"]["automountServiceAccountToken"] = json!(true),
            vec![],
            "tokenless and without pull secrets",
        ),
        (
            "retained, executor account with pull secrets",
            base.clone(),
            |l| l["executorAccount"]["imagePullSecrets"] = json!([{"name": "x"}]),
            vec![],
            "tokenless and without pull secrets",
        ),
        (
            "retained, security manifest map missing",
            base.clone(),
            |l| l["manifestMap"] = json!({}),
            vec![],
            "security-manifest ConfigMap is missing or empty",
        ),
        (
            "retained, authority map empty",
            base.clone(),
            |l| l["authorityMap"]["data"] = json!({}),
            vec![],
            "security-authority ConfigMap is missing or empty",
        ),
        (
            "retained, authority map without state.json",
            base.clone(),
            |l| l["authorityMap"]["data"] = json!({"other": "x"}),
            vec![],
            "has no state.json",
        ),
        (
            "retained, ledger empty",
            base.clone(),
            |l| l["ledger"]["data"] = json!({}),
            vec![],
            "capacity ledger ConfigMap is missing or empty",
        ),
        (
            "retained, an old profile policy missing",
            base.clone(),
            |l| {
                l["networkPolicies"].as_array_mut().unwrap().retain(|p| {
                    !p["metadata"]["name"]
                        .as_str()
                        .unwrap()
                        .contains("-profile-")
                });
            },
            vec![],
            "of workload profile default is missing",
        ),
        (
            "retained without any installation",
            fresh.clone(),
            |l| {
                l["environments"] =
                    json!([{"kind": "ExecutionEnvironment", "metadata": {"name": "env-a"}}])
            },
            vec![],
            "bootstrap is forbidden",
        ),
        (
            "retained PVC without any installation",
            fresh.clone(),
            |l| {
                l["pvcs"] = json!([labelled(
                    "PersistentVolumeClaim",
                    "env-a-workspace",
                    json!({"execution.mecatl.dev/environment": "env-a"})
                )])
            },
            vec![],
            "bootstrap is forbidden",
        ),
        (
            "retained ledger slots without any installation",
            fresh.clone(),
            |l| l["ledger"] = json!({"data": { ledger_key("default"): "[\"env-a\"]" }}),
            vec![],
            "bootstrap is forbidden",
        ),
        (
            "orphan default-deny policy",
            fresh.clone(),
            |l| {
                l["networkPolicies"] =
                    json!([{"metadata": {"name": "demo-execution-provider-workload-default-deny"}}])
            },
            vec![],
            "orphan executor NetworkPolicy",
        ),
        (
            "orphan profile policy",
            fresh.clone(),
            |l| {
                l["networkPolicies"] = json!([{"metadata": {"name": "demo-execution-provider-profile-0123456789abcdef"}}])
            },
            vec![],
            "orphan executor NetworkPolicy",
        ),
    ];
    let mut wrong = Vec::new();
    for (what, mut live, edit, extra, named) in cases {
        edit(&mut live);
        match guard(helm, &live, &extra) {
            Ok(()) => wrong.push(format!("{what}: passed")),
            Err(refusal) if !refusal.contains(named) => {
                wrong.push(format!("{what}: refused without {named:?}: {refusal}"));
            }
            Err(_) => {}
        }
    }
    assert!(
        wrong.is_empty(),
        "guards that did not hold:\n{}",
        wrong.join("\n")
    );
}
