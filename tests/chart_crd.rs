//! The chart ships the CRD generated from the Rust types; this fails when the two drift. It
//! also pins the admission facts of k8s-executor §1 that live in the schema.
//! Regenerate with `cargo run -- crd --output charts/execution-provider/crds/executionenvironment.yaml`.

use execution_provider::cli::CHART_CRD_PATH;
use execution_provider::kube::crd::{ExecutionEnvironment, crd_yaml};
use kube::CustomResourceExt;
use serde_json::{Value, json};

#[test]
fn the_chart_crd_equals_the_crd_generated_from_the_types() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(CHART_CRD_PATH);
    let shipped = std::fs::read_to_string(&path).expect("the chart carries the CRD");
    assert!(
        shipped == crd_yaml(),
        "{} is stale: regenerate it with `cargo run -- crd --output {CHART_CRD_PATH}`",
        path.display()
    );
}

// The admission facts of k8s-executor §1 that a real API server enforces from the schema. The
// in-process API server evaluates neither CEL nor OpenAPI, so these read the generated schema
// itself: which transition rule guards which field, what schemaVersion admits, and that
// pruning keeps every controller-owned status field. tests/e2e/crd_admission.rs checks the
// same rules against a real kube-apiserver.

fn schema() -> Value {
    let crd = serde_json::to_value(ExecutionEnvironment::crd()).unwrap();
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema")
        .expect("a structural schema")
        .clone()
}

const IMMUTABLE: [&str; 16] = [
    "allocationID",
    "revision",
    "ownerHash",
    "ownerIssuer",
    "ownerSubject",
    "clientHash",
    "bindingID",
    "requestFingerprint",
    "templateRevision",
    "templateDigest",
    "templateID",
    "image",
    "storageClass",
    "storageSize",
    "resources",
    "createDeadline",
];

#[test]
fn each_immutable_spec_field_has_exactly_its_own_transition_rule() {
    let schema = schema();
    let rules = schema
        .pointer("/properties/spec/x-kubernetes-validations")
        .and_then(Value::as_array)
        .expect("spec validations");
    assert_eq!(rules.len(), IMMUTABLE.len(), "one rule per immutable field");
    for field in IMMUTABLE {
        let message = if field == "resources" {
            "resources are immutable".to_owned()
        } else {
            format!("{field} is immutable")
        };
        let rule = format!(
            "!has(oldSelf.{field}) || (has(self.{field}) && self.{field} == oldSelf.{field})"
        );
        let found: Vec<&Value> = rules.iter().filter(|r| r["message"] == message).collect();
        assert_eq!(found.len(), 1, "{field}");
        assert_eq!(found[0]["rule"], rule, "{field}");
        assert!(
            schema
                .pointer(&format!("/properties/spec/properties/{field}"))
                .is_some(),
            "{field} is a spec property"
        );
    }
    for mutable in ["schemaVersion", "desired"] {
        assert!(
            rules
                .iter()
                .all(|r| !r["rule"].as_str().unwrap().contains(mutable)),
            "{mutable} stays mutable"
        );
    }
    // No rule anywhere else: status is written only by the provider, through the subresource.
    let text = schema.to_string();
    assert_eq!(
        text.matches("x-kubernetes-validations").count(),
        1,
        "validations only on spec"
    );
}

/// Whether the schema of one integer-enum property admits `value` (absent is `None`).
fn schema_version_admits(property: &Value, required: bool, value: Option<&Value>) -> bool {
    let Some(value) = value else {
        return !required;
    };
    let integer = property["type"] == "integer" && value.is_i64();
    let allowed = property["enum"]
        .as_array()
        .is_none_or(|e| e.contains(value));
    integer && allowed
}

#[test]
fn schema_version_admits_only_the_integer_2_in_spec_and_status() {
    let schema = schema();
    let spec_required = schema
        .pointer("/properties/spec/required")
        .and_then(Value::as_array)
        .unwrap()
        .contains(&json!("schemaVersion"));
    assert!(spec_required, "spec.schemaVersion is required");
    let status_required = schema
        .pointer("/properties/status/required")
        .and_then(Value::as_array)
        .is_some_and(|r| r.contains(&json!("schemaVersion")));
    assert!(!status_required, "status may be absent or partial");
    let root_required = schema["required"].as_array().unwrap();
    assert!(root_required.contains(&json!("spec")));
    assert!(!root_required.contains(&json!("status")));

    let spec = schema
        .pointer("/properties/spec/properties/schemaVersion")
        .unwrap();
    let status = schema
        .pointer("/properties/status/properties/schemaVersion")
        .unwrap();
    let cases: [(&str, &Value, bool, Option<Value>, bool); 9] = [
        ("spec 2", spec, true, Some(json!(2)), true),
        ("spec omitted", spec, true, None, false),
        ("spec 1", spec, true, Some(json!(1)), false),
        ("spec 3", spec, true, Some(json!(3)), false),
        ("spec \"2\"", spec, true, Some(json!("2")), false),
        ("status omitted", status, false, None, true),
        ("status 1", status, false, Some(json!(1)), false),
        ("status 3", status, false, Some(json!(3)), false),
        ("status \"2\"", status, false, Some(json!("2")), false),
    ];
    for (what, property, required, value, admitted) in cases {
        assert_eq!(
            schema_version_admits(property, required, value.as_ref()),
            admitted,
            "{what}"
        );
    }
}

#[test]
fn pruning_keeps_every_controller_owned_status_field() {
    let schema = schema();
    assert!(
        !schema
            .to_string()
            .contains("x-kubernetes-preserve-unknown-fields"),
        "fully structural: unknown fields are pruned"
    );
    let status = schema.pointer("/properties/status/properties").unwrap();
    for field in [
        "schemaVersion",
        "observedGeneration",
        "epoch",
        "grantGeneration",
        "fenceState",
        "revocationReceipts",
        "references",
        "pvc",
        "pod",
        "activeRun",
        "renewReceipts",
        "activeOperation",
        "lifecycleOperation",
        "terminationProof",
        "lastReplacement",
        "conditions",
    ] {
        assert!(
            status.get(field).is_some(),
            "status.{field} survives pruning"
        );
    }
    for removed in [
        "migrationOperation",
        "lastMigrationOperationID",
        "lastMigrationFromSchema",
    ] {
        assert!(status.get(removed).is_none(), "status.{removed} is pruned");
    }
    let lifecycle = &status["lifecycleOperation"]["properties"];
    for field in [
        "id",
        "type",
        "phase",
        "createdAt",
        "expectedEpoch",
        "expectedPodUID",
        "expectedPVCUID",
    ] {
        assert!(lifecycle.get(field).is_some(), "lifecycleOperation.{field}");
    }
    let proof = &status["terminationProof"]["properties"];
    for field in [
        "operationID",
        "podUID",
        "pvcUID",
        "epoch",
        "podPhase",
        "observedAt",
    ] {
        assert!(proof.get(field).is_some(), "terminationProof.{field}");
    }
}
