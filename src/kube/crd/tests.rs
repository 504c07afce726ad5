//! The CRD snapshot, JSON round trips with the exact wire names, and the naming rules.

use std::time::{Duration, UNIX_EPOCH};

use kube::Resource as _;
use serde_json::{Value, json};

use super::*;

const HEX64_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const HEX64_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const ENV_NAME: &str = "exec-0123456789abcdef0123456789abcdef01234567";

fn at(seconds: u64, nanos: u32) -> RfcTime {
    RfcTime::from_system_time(UNIX_EPOCH + Duration::new(seconds, nanos))
}

fn full_spec() -> ExecutionEnvironmentSpec {
    ExecutionEnvironmentSpec {
        schema_version: SCHEMA_VERSION,
        allocation_id: ENV_NAME.to_owned(),
        revision: "0123456789abcdef0123456789abcdef".to_owned(),
        owner_hash: HEX64_A.to_owned(),
        owner_issuer: Some("https://issuer.example".to_owned()),
        owner_subject: Some("user-1".to_owned()),
        client_hash: HEX64_B.to_owned(),
        binding_id: "session-1".to_owned(),
        request_fingerprint: HEX64_A.to_owned(),
        template_id: "python".to_owned(),
        template_revision: format!("v1-{HEX64_A}"),
        template_digest: format!("sha256:{HEX64_B}"),
        image: format!("registry.example/executor@sha256:{HEX64_A}"),
        storage_class: "standard".to_owned(),
        storage_size: "1Gi".to_owned(),
        resources: ExecutorResources {
            cpu_request: "100m".to_owned(),
            memory_request: "128Mi".to_owned(),
            cpu_limit: "1".to_owned(),
            memory_limit: "1Gi".to_owned(),
        },
        desired: Desired::Active,
        create_deadline: None,
    }
}

fn full_status() -> ExecutionEnvironmentStatus {
    ExecutionEnvironmentStatus {
        schema_version: Some(SCHEMA_VERSION),
        observed_generation: Some(3),
        epoch: Some(4),
        grant_generation: Some(2),
        fence_state: Some(FenceState::Healthy),
        revocation_receipts: vec![RevocationReceipt {
            operation_id: "revoke-1".to_owned(),
            fingerprint: HEX64_A.to_owned(),
            expected_grant_generation: 1,
            grant_generation: 2,
        }],
        references: vec![ReferenceRecord {
            binding_id: "session-2".to_owned(),
            state: ReferenceState::PendingCreate,
            operation_id: "reserve-1".to_owned(),
            source_binding_id: Some("session-1".to_owned()),
            created_at: at(1_700_000_000, 0),
        }],
        pvc: Some(ObjectIdentity {
            name: pvc_name(ENV_NAME),
            uid: "pvc-uid".to_owned(),
        }),
        pod: Some(ObjectIdentity {
            name: pod_name(ENV_NAME),
            uid: "pod-uid".to_owned(),
        }),
        active_run: Some(ActiveRun {
            binding_id: "session-1".to_owned(),
            run_id: "run-1".to_owned(),
            claim_id: "claim-1".to_owned(),
            operation_id: "acquire-1".to_owned(),
            owner_hash: HEX64_A.to_owned(),
            client_hash: HEX64_B.to_owned(),
            epoch: 4,
            grant_generation: 2,
            expires_at: at(1_700_000_060, 123_456_789),
        }),
        renew_receipts: vec![RenewReceipt {
            operation_id: "renew-1".to_owned(),
            fingerprint: HEX64_B.to_owned(),
            expires_at: at(1_700_000_090, 500_000_000),
        }],
        active_operation: Some(ActiveOperation {
            id: "op-1".to_owned(),
            operation: "file.read".to_owned(),
            started_at: at(1_700_000_010, 1),
            claim_id: "claim-1".to_owned(),
            run_id: "run-1".to_owned(),
            epoch: 4,
            holder_id: "holder-1".to_owned(),
            renewed_at: at(1_700_000_020, 0),
            expires_at: at(1_700_000_050, 0),
        }),
        commands: vec![CommandLease {
            id: "cmd-1".to_owned(),
            claim_id: "claim-1".to_owned(),
            run_id: "run-1".to_owned(),
            epoch: 4,
            grant_generation: 2,
            detached: true,
            started_at: at(1_700_000_011, 0),
            state: CommandLeaseState::Ended,
            cancel_operation_id: None,
            outcome: Some(CommandOutcome {
                state: CommandEndState::Cancelled,
                exit_code: -1,
                terminal_receipt: Some(HEX64_A.to_owned()),
                ended_at: at(1_700_000_012, 0),
                reason: CommandEndReason::Cancelled,
            }),
        }],
        lifecycle_operation: Some(LifecycleOperation {
            id: "retire-1".to_owned(),
            type_: LifecycleType::DeleteRetiredEnvironment,
            phase: LifecyclePhase::DeletingPvc,
            expected_epoch: Some(4),
            expected_pod_uid: Some("pod-uid".to_owned()),
            expected_pvc_uid: Some("pvc-uid".to_owned()),
            created_at: at(1_700_000_100, 0),
        }),
        termination_proof: Some(TerminationProof {
            operation_id: "retire-1".to_owned(),
            pod_uid: "pod-uid".to_owned(),
            pvc_uid: "pvc-uid".to_owned(),
            epoch: 4,
            pod_phase: TerminalPodPhase::Succeeded,
            observed_at: at(1_700_000_110, 0),
        }),
        last_replacement: Some(LastReplacement {
            operation_id: "replace-1".to_owned(),
            previous_pod_uid: "old-pod".to_owned(),
            replacement_pod_uid: "pod-uid".to_owned(),
            pvc_uid: "pvc-uid".to_owned(),
            previous_epoch: 3,
            replacement_epoch: 4,
        }),
        recovered_operation: Some(RecoveredOperation {
            id: "op-1".to_owned(),
            operation: "command".to_owned(),
            state: "succeeded".to_owned(),
            terminal_receipt: "ab".repeat(32),
            cancelled_by_recovery: false,
            recorded_at: at(1_700_000_120, 0),
        }),
        conditions: vec![EnvironmentCondition {
            type_: condition::READY.to_owned(),
            status: ConditionStatus::True,
            reason: condition::reason::RECONCILED.to_owned(),
            message: "PVC and executor Pod are ready".to_owned(),
            observed_generation: 3,
            last_transition_time: at(1_700_000_005, 0),
        }],
    }
}

fn full_object() -> ExecutionEnvironment {
    let mut env = ExecutionEnvironment::new(ENV_NAME, full_spec());
    env.metadata.namespace = Some("sandboxes".to_owned());
    env.metadata.finalizers = Some(vec![ENVIRONMENT_FINALIZER.to_owned()]);
    env.status = Some(full_status());
    env
}

#[test]
fn the_crd_yaml_matches_the_reviewed_snapshot() {
    insta::assert_snapshot!("crd_yaml", crd_yaml());
}

#[test]
fn the_crd_is_named_and_versioned_as_the_spec_says() {
    let crd = ExecutionEnvironment::crd();
    assert_eq!(crd.metadata.name.as_deref(), Some(CRD_NAME));
    assert_eq!(crd.spec.group, GROUP);
    assert_eq!(crd.spec.names.plural, PLURAL);
    assert_eq!(crd.spec.names.kind, KIND);
    assert_eq!(
        crd.spec.names.short_names,
        Some(vec![SHORT_NAME.to_owned()])
    );
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.versions.len(), 1);
    assert_eq!(crd.spec.versions[0].name, VERSION);
    assert_eq!(
        ExecutionEnvironment::api_version(&()),
        "execution.mecatl.dev/v1alpha1"
    );
    let annotations = crd.metadata.annotations.expect("annotations");
    assert_eq!(annotations[HELM_RESOURCE_POLICY_ANNOTATION], "keep");
}

#[test]
fn every_spec_field_but_schema_version_and_desired_is_immutable() {
    let yaml = crd_yaml();
    for field in [
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
    ] {
        assert!(
            yaml.contains(&format!("message: {field} is immutable")),
            "{field}"
        );
    }
    assert!(yaml.contains("message: resources are immutable"));
    assert!(!yaml.contains("schemaVersion is immutable"));
    assert!(!yaml.contains("desired is immutable"));
}

#[test]
fn a_full_object_round_trips_through_json() {
    let env = full_object();
    let text = serde_json::to_string(&env).expect("serializes");
    let back: ExecutionEnvironment = serde_json::from_str(&text).expect("deserializes");
    assert_eq!(back, env);
}

#[test]
fn a_full_object_round_trips_through_yaml() {
    let env = full_object();
    let text = serde_saphyr::to_string(&env).expect("serializes");
    let back: ExecutionEnvironment = serde_saphyr::from_str(&text).expect("deserializes");
    assert_eq!(back, env);
}

#[test]
fn serialized_field_names_are_exactly_the_specs() {
    let value = serde_json::to_value(full_object()).expect("serializes");
    let spec = &value["spec"];
    for key in [
        "schemaVersion",
        "allocationID",
        "revision",
        "ownerHash",
        "ownerIssuer",
        "ownerSubject",
        "clientHash",
        "bindingID",
        "requestFingerprint",
        "templateID",
        "templateRevision",
        "templateDigest",
        "image",
        "storageClass",
        "storageSize",
        "resources",
        "desired",
    ] {
        assert!(spec.get(key).is_some(), "spec.{key}");
    }
    assert_eq!(spec.as_object().map(serde_json::Map::len), Some(17));
    assert_eq!(
        spec["resources"],
        json!({"cpuRequest": "100m", "memoryRequest": "128Mi", "cpuLimit": "1", "memoryLimit": "1Gi"})
    );
    assert_eq!(spec["desired"], "Active");
    assert_eq!(spec["schemaVersion"], 2);

    let status = &value["status"];
    for key in [
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
        assert!(status.get(key).is_some(), "status.{key}");
    }
    assert_eq!(status["fenceState"], "Healthy");
    assert_eq!(
        status["references"][0],
        json!({
            "bindingID": "session-2",
            "state": "PendingCreate",
            "operationID": "reserve-1",
            "sourceBindingID": "session-1",
            "createdAt": "2023-11-14T22:13:20Z",
        })
    );
    let run = &status["activeRun"];
    for key in [
        "bindingID",
        "runID",
        "claimID",
        "operationID",
        "ownerHash",
        "clientHash",
        "grantGeneration",
    ] {
        assert!(run.get(key).is_some(), "activeRun.{key}");
    }
    assert_eq!(run["expiresAt"], "2023-11-14T22:14:20.123456789Z");
    assert!(status["activeOperation"].get("holderID").is_some());
    let lifecycle = &status["lifecycleOperation"];
    assert_eq!(lifecycle["type"], "DeleteRetiredEnvironment");
    assert_eq!(lifecycle["phase"], "DeletingPVC");
    assert!(lifecycle.get("expectedPodUID").is_some());
    assert!(lifecycle.get("expectedPVCUID").is_some());
    let proof = &status["terminationProof"];
    assert!(proof.get("podUID").is_some() && proof.get("pvcUID").is_some());
    assert_eq!(proof["podPhase"], "Succeeded");
    let replacement = &status["lastReplacement"];
    for key in [
        "previousPodUID",
        "replacementPodUID",
        "pvcUID",
        "previousEpoch",
        "replacementEpoch",
    ] {
        assert!(replacement.get(key).is_some(), "lastReplacement.{key}");
    }
    assert!(
        status["revocationReceipts"][0]
            .get("expectedGrantGeneration")
            .is_some()
    );
    let condition = &status["conditions"][0];
    assert_eq!(condition["type"], "Ready");
    assert_eq!(condition["status"], "True");
    assert!(condition.get("lastTransitionTime").is_some());
}

#[test]
fn absent_optional_fields_are_omitted_not_null() {
    let mut env = ExecutionEnvironment::new(ENV_NAME, full_spec());
    env.spec.owner_issuer = None;
    env.spec.owner_subject = None;
    env.status = Some(ExecutionEnvironmentStatus::default());
    let value = serde_json::to_value(&env).expect("serializes");
    assert!(value["spec"].get("ownerIssuer").is_none());
    assert!(value["spec"].get("ownerSubject").is_none());
    assert_eq!(value["status"], json!({}));
    let back: ExecutionEnvironment = serde_json::from_value(value).expect("deserializes");
    assert_eq!(back, env);
}

#[test]
fn a_string_schema_version_is_rejected() {
    let mut value = serde_json::to_value(full_spec()).expect("serializes");
    value["schemaVersion"] = Value::from("2");
    assert!(serde_json::from_value::<ExecutionEnvironmentSpec>(value).is_err());
}

#[test]
fn timestamps_keep_sub_second_precision_and_accept_offsets() {
    let t = at(1_700_000_000, 250_000_000);
    assert_eq!(t.to_string(), "2023-11-14T22:13:20.25Z");
    assert_eq!(
        "2023-11-14T22:13:20.25Z"
            .parse::<RfcTime>()
            .expect("parses"),
        t
    );
    assert_eq!(
        "2023-11-14T23:13:20.25+01:00"
            .parse::<RfcTime>()
            .expect("parses"),
        t
    );
    assert_eq!(
        t.to_system_time(),
        UNIX_EPOCH + Duration::new(1_700_000_000, 250_000_000)
    );
    assert_eq!(t.whole_seconds().to_string(), "2023-11-14T22:13:20Z");
    assert!("yesterday".parse::<RfcTime>().is_err());
    assert!(
        "2023-11-14T22:13:20".parse::<RfcTime>().is_err(),
        "an offset is required"
    );
}

#[test]
fn runtime_names_drop_the_exec_prefix() {
    assert_eq!(
        pvc_name(ENV_NAME),
        "workspace-0123456789abcdef0123456789abcdef01234567"
    );
    assert_eq!(
        pod_name(ENV_NAME),
        "executor-0123456789abcdef0123456789abcdef01234567"
    );
    assert_eq!(pvc_name("other"), "workspace-other");
}

#[test]
fn runtime_names_are_cut_to_63_and_lose_trailing_dashes() {
    let long = format!("exec-{}", "a".repeat(80));
    assert_eq!(pvc_name(&long).len(), 63);
    assert_eq!(pod_name(&long).len(), 63);
    // "executor-" (9 bytes) + 51 bytes leaves the three dashes as bytes 60..63: the cut ends on
    // dashes, and they are trimmed.
    let dashed = format!("exec-{}---{}", "b".repeat(51), "c".repeat(20));
    let pod = pod_name(&dashed);
    assert_eq!(pod, format!("executor-{}", "b".repeat(51)));
    assert!(!pod.ends_with('-'));
    assert_eq!(pod_name("exec-abc--"), "executor-abc");
}

#[test]
fn template_label_and_ledger_key_hash_the_template_id() {
    // sha256("python") = 11a4a60b518bf24989d481468076e5d5982884626aed9faeb35b8576fcd223e1
    assert_eq!(template_label("python"), "11a4a60b518bf249");
    assert_eq!(
        ledger_key("python"),
        "profile-11a4a60b518bf24989d481468076e5d5.json"
    );
    assert_eq!(template_label("python").len(), 16);
}
