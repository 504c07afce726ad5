//! Every ProfileSpec rule of k8s-executor §3.1 has a rejection case; quantities compare by value.

use serde_json::{Value, json};

use super::*;

fn rejected_field(changes: &[(&str, Value)]) -> String {
    match load_value(&single_unchecked(execution_with(changes))) {
        Err(TemplateError::InvalidExecution { field, .. }) => field,
        other => panic!("{changes:?}: expected an invalid execution, got {other:?}"),
    }
}

#[test]
fn each_profile_spec_rule_has_a_rejection_case() {
    let digest = "acfcf802c681edf0945df6c6a3e68756f46abe4659774d022082ec45d0442723";
    let cases: Vec<(Vec<(&str, Value)>, &str)> = vec![
        (
            vec![("image", json!("registry.example/executor:latest"))],
            "image",
        ),
        (
            vec![("image", json!("registry.example/executor@sha256:abc"))],
            "image",
        ),
        (
            vec![("image", json!(format!("r@sha256:{}", "g".repeat(64))))],
            "image",
        ),
        (
            vec![("image", json!(format!("r@sha256:{digest}x")))],
            "image",
        ),
        (
            vec![("image", json!(format!("r@x@sha256:{digest}")))],
            "image",
        ),
        (
            vec![("image", json!(format!("r e@sha256:{digest}")))],
            "image",
        ),
        (vec![("image", json!(format!("@sha256:{digest}")))], "image"),
        (
            vec![("image", json!(format!("r@sha512:{digest}")))],
            "image",
        ),
        (vec![("storageClass", json!(""))], "storageClass"),
        (vec![("storageSize", json!("0"))], "storageSize"),
        (vec![("storageSize", json!("-1Gi"))], "storageSize"),
        (vec![("storageSize", json!("1 Gi"))], "storageSize"),
        (vec![("cpuRequest", json!("abc"))], "cpuRequest"),
        (vec![("cpuRequest", json!("0m"))], "cpuRequest"),
        (vec![("cpuLimit", json!("-1"))], "cpuLimit"),
        (vec![("cpuRequest", json!("1001m"))], "cpuRequest"),
        (vec![("memoryRequest", json!("0"))], "memoryRequest"),
        (vec![("memoryLimit", json!("x"))], "memoryLimit"),
        (vec![("memoryRequest", json!("513Mi"))], "memoryRequest"),
        (
            vec![("ephemeralStorageRequest", json!("0"))],
            "ephemeralStorageRequest",
        ),
        (
            vec![("ephemeralStorageLimit", json!("0"))],
            "ephemeralStorageLimit",
        ),
        (
            vec![("ephemeralStorageRequest", json!("2Gi"))],
            "ephemeralStorageRequest",
        ),
        (vec![("tmpSizeLimit", json!("0"))], "tmpSizeLimit"),
        (vec![("tmpSizeLimit", json!("1025Mi"))], "tmpSizeLimit"),
        (vec![("runtimeClassName", json!(""))], "runtimeClassName"),
        (
            vec![("imagePullSecrets", json!([""]))],
            "imagePullSecrets[0]",
        ),
        (
            vec![("imagePullSecrets", json!(["a", "a"]))],
            "imagePullSecrets[1]",
        ),
        (
            vec![("imagePullSecrets", json!(["Creds"]))],
            "imagePullSecrets[0]",
        ),
        (
            vec![("imagePullSecrets", json!(["a/b"]))],
            "imagePullSecrets[0]",
        ),
        (
            vec![("imagePullSecrets", json!(["a..b"]))],
            "imagePullSecrets[0]",
        ),
        (
            vec![("imagePullSecrets", json!(["x".repeat(64)]))],
            "imagePullSecrets[0]",
        ),
        (
            vec![(
                "imagePullSecrets",
                json!((0..9).map(|i| format!("s{i}")).collect::<Vec<_>>()),
            )],
            "imagePullSecrets",
        ),
        (
            vec![("nodeSelector", json!({"bad key": "x"}))],
            "nodeSelector[\"bad key\"]",
        ),
        (
            vec![("nodeSelector", json!({"zone": "-x"}))],
            "nodeSelector[\"zone\"]",
        ),
        (
            vec![(
                "nodeSelector",
                Value::Object((0..33).map(|i| (format!("k{i}"), json!("v"))).collect()),
            )],
            "nodeSelector",
        ),
        (
            vec![("tolerations", json!([{"key": "a"}]))],
            "tolerations[0].operator",
        ),
        (
            vec![("tolerations", json!([{"operator": "exists"}]))],
            "tolerations[0].operator",
        ),
        (
            vec![("tolerations", json!([{"operator": "Exists", "value": "x"}]))],
            "tolerations[0].value",
        ),
        (
            vec![("tolerations", json!([{"operator": "Equal", "value": "x"}]))],
            "tolerations[0].key",
        ),
        (
            vec![(
                "tolerations",
                json!([{"key": "a", "operator": "Equal", "value": "bad value"}]),
            )],
            "tolerations[0].value",
        ),
        (
            vec![(
                "tolerations",
                json!([{"key": "bad key", "operator": "Exists"}]),
            )],
            "tolerations[0].key",
        ),
        (
            vec![(
                "tolerations",
                json!([{"operator": "Exists", "effect": "NoRun"}]),
            )],
            "tolerations[0].effect",
        ),
        (
            vec![(
                "tolerations",
                json!([{"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 86401}]),
            )],
            "tolerations[0].tolerationSeconds",
        ),
        (
            vec![(
                "tolerations",
                json!([{"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": -1}]),
            )],
            "tolerations[0].tolerationSeconds",
        ),
        (
            vec![(
                "tolerations",
                json!([{"operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}]),
            )],
            "tolerations[0].tolerationSeconds",
        ),
        (
            vec![(
                "tolerations",
                json!([{"operator": "Exists", "tolerationSeconds": 5}]),
            )],
            "tolerations[0].tolerationSeconds",
        ),
        (
            vec![(
                "tolerations",
                json!([{"key": "a", "operator": "Exists"}, {"key": "a", "operator": "Exists"}]),
            )],
            "tolerations[1]",
        ),
        (
            vec![(
                "tolerations",
                json!(
                    (0..17)
                        .map(|i| json!({"key": format!("k{i}"), "operator": "Exists"}))
                        .collect::<Vec<_>>()
                ),
            )],
            "tolerations",
        ),
        (vec![("maxFileBytes", json!(0))], "maxFileBytes"),
        (vec![("maxFileBytes", json!(5_242_881))], "maxFileBytes"),
        (vec![("maxCommandBytes", json!(0))], "maxCommandBytes"),
        (
            vec![("maxCommandBytes", json!(1_048_577))],
            "maxCommandBytes",
        ),
        (
            vec![("maxCommandDuration", json!("0s"))],
            "maxCommandDuration",
        ),
        (
            vec![("maxCommandDuration", json!("0"))],
            "maxCommandDuration",
        ),
        (
            vec![("maxCommandDuration", json!("-1m"))],
            "maxCommandDuration",
        ),
        (
            vec![("maxCommandDuration", json!("30m1ms"))],
            "maxCommandDuration",
        ),
        (
            vec![("maxCommandDuration", json!("1h"))],
            "maxCommandDuration",
        ),
        (
            vec![("maxCommandDuration", json!("300"))],
            "maxCommandDuration",
        ),
        (
            vec![("maxCommandDuration", json!("1500us"))],
            "maxCommandDuration",
        ),
        (vec![("maxEnvironments", json!(0))], "maxEnvironments"),
        (vec![("maxEnvironments", json!(10_001))], "maxEnvironments"),
    ];
    for (changes, field) in cases {
        assert_eq!(rejected_field(&changes), field, "{changes:?}");
    }
}

#[test]
fn profile_spec_bounds_are_inclusive() {
    let eight: Vec<String> = (0..8).map(|i| format!("s{i}.creds")).collect();
    let thirty_two: serde_json::Map<String, Value> = (0..32)
        .map(|i| (format!("example.com/k{i}"), json!("v")))
        .collect();
    let sixteen: Vec<Value> = (0..16)
        .map(|i| json!({"key": format!("k{i}"), "operator": "Exists"}))
        .collect();
    for changes in [
        vec![("imagePullSecrets", json!(eight))],
        vec![("nodeSelector", Value::Object(thirty_two))],
        vec![("tolerations", json!(sixteen))],
        vec![("tolerations", json!([{"operator": "Exists"}]))],
        vec![(
            "tolerations",
            json!([{"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 0},
                   {"key": "a", "operator": "Equal", "effect": "NoExecute", "tolerationSeconds": 86400},
                   {"key": "b", "operator": "Equal", "value": "", "effect": "PreferNoSchedule"}]),
        )],
        vec![("maxFileBytes", json!(1)), ("maxCommandBytes", json!(1))],
        vec![
            ("maxCommandDuration", json!("30m")),
            ("maxEnvironments", json!(10_000)),
        ],
        vec![
            ("maxCommandDuration", json!("1ms")),
            ("maxEnvironments", json!(1)),
        ],
        vec![("cpuRequest", json!("1")), ("tmpSizeLimit", json!("1Gi"))],
    ] {
        let file = single(execution_with(&changes));
        assert!(
            load_value(&file).is_ok(),
            "{changes:?}: {:?}",
            load_value(&file)
        );
    }
}

#[test]
fn quantities_compare_by_value() {
    // Request equal to limit in another spelling is fine; one milli-unit more is not.
    for (request, limit) in [
        ("0.1", "100m"),
        ("1000m", "1"),
        ("1Gi", "1024Mi"),
        ("1e3", "1k"),
    ] {
        let file = single(execution_with(&[
            ("cpuRequest", json!(request)),
            ("cpuLimit", json!(limit)),
        ]));
        assert!(load_value(&file).is_ok(), "{request} <= {limit}");
    }
    assert_eq!(
        rejected_field(&[("cpuRequest", json!("0.101")), ("cpuLimit", json!("100m"))]),
        "cpuRequest"
    );
    assert_eq!(
        rejected_field(&[
            ("memoryRequest", json!("1G")),
            ("memoryLimit", json!("953Mi"))
        ]),
        "memoryRequest"
    );
    // The accepted unit variants of the reference tests.
    for (field, value) in [
        ("memoryLimit", "500M"),
        ("cpuLimit", "0.1"),
        ("cpuRequest", "250m"),
        ("memoryRequest", "1M"),
        ("memoryLimit", "2M"),
    ] {
        let mut changes = vec![(field, json!(value))];
        if field == "cpuLimit" {
            changes.push(("cpuRequest", json!("100m")));
        }
        if field == "memoryLimit" {
            changes.push(("memoryRequest", json!("1M")));
        }
        let file = single(execution_with(&changes));
        assert!(load_value(&file).is_ok(), "{field}: {value}");
    }
}
