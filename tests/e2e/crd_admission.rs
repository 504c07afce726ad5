//! The CRD's admission rules on a real kube-apiserver (k8s-executor §1 and the §7 CRD
//! catalogue): every immutable spec field is refused a change with its own CEL message while
//! schemaVersion-independent `desired` stays mutable; schemaVersion admits only the integer 2
//! in spec and status (the nine cases); and pruning keeps every controller-owned status field
//! while dropping the removed migration fields. The in-process API server evaluates neither
//! CEL nor the schema, so these facts are only checked for real here (tests/chart_crd.rs pins
//! the schema text).

use std::time::{Duration, UNIX_EPOCH};

use execution_provider::kube::crd::{
    ActiveOperation, ActiveRun, ConditionStatus, Desired, EnvironmentCondition,
    ExecutionEnvironment, ExecutionEnvironmentSpec, ExecutionEnvironmentStatus, ExecutorResources,
    FenceState, LastReplacement, LifecycleOperation, LifecyclePhase, LifecycleType, ObjectIdentity,
    RecoveredOperation, ReferenceRecord, ReferenceState, RenewReceipt, RevocationReceipt, RfcTime,
    TerminalPodPhase, TerminationProof,
};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::cluster::{Cluster, TestNamespace};

fn hex(byte: char) -> String {
    std::iter::repeat_n(byte, 64).collect()
}

fn at(seconds: u64) -> RfcTime {
    RfcTime::from_system_time(UNIX_EPOCH + Duration::from_secs(seconds))
}

fn spec(name: &str) -> ExecutionEnvironmentSpec {
    ExecutionEnvironmentSpec {
        schema_version: 2,
        allocation_id: name.to_owned(),
        revision: "r1".to_owned(),
        owner_hash: hex('a'),
        owner_issuer: Some("https://issuer.test".to_owned()),
        owner_subject: Some("alice".to_owned()),
        client_hash: hex('b'),
        binding_id: "admission-binding".to_owned(),
        request_fingerprint: hex('c'),
        template_id: "default".to_owned(),
        template_revision: format!("v1-{}", hex('d')),
        template_digest: format!("sha256:{}", hex('e')),
        image: format!("registry.test/executor@sha256:{}", hex('f')),
        storage_class: "kwok-volume".to_owned(),
        storage_size: "1Gi".to_owned(),
        resources: ExecutorResources {
            cpu_request: "50m".to_owned(),
            memory_request: "64Mi".to_owned(),
            cpu_limit: "1".to_owned(),
            memory_limit: "512Mi".to_owned(),
        },
        desired: Desired::Active,
        create_deadline: None,
    }
}

/// The raw API of environments, so a test can send what the Rust types cannot express.
fn raw(ns: &TestNamespace) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<ExecutionEnvironment>(&());
    Api::namespaced_with(ns.client.clone(), &ns.name, &resource)
}

fn object(name: &str, spec: Value) -> DynamicObject {
    let resource = ApiResource::erase::<ExecutionEnvironment>(&());
    let mut object = DynamicObject::new(name, &resource);
    object.data = json!({ "spec": spec });
    object
}

async fn created(ns: &TestNamespace, name: &str) -> Api<ExecutionEnvironment> {
    let api = Api::<ExecutionEnvironment>::namespaced(ns.client.clone(), &ns.name);
    api.create(
        &PostParams::default(),
        &ExecutionEnvironment::new(name, spec(name)),
    )
    .await
    .expect("a well-formed environment is accepted");
    api
}

/// A different valid value for each immutable field.
fn changed(field: &str) -> Value {
    match field {
        "allocationID" => json!("exec-other"),
        "revision" => json!("r2"),
        "ownerHash" | "clientHash" | "requestFingerprint" => json!(hex('9')),
        "ownerIssuer" => json!("https://other.test"),
        "ownerSubject" => json!("mallory"),
        "bindingID" => json!("other-binding"),
        "templateID" => json!("other"),
        "templateRevision" => json!(format!("v1-{}", hex('9'))),
        "templateDigest" => json!(format!("sha256:{}", hex('9'))),
        "image" => json!(format!("registry.test/other@sha256:{}", hex('9'))),
        "storageClass" => json!("other-class"),
        "storageSize" => json!("2Gi"),
        "resources" => json!({"cpuRequest": "100m", "memoryRequest": "64Mi",
            "cpuLimit": "1", "memoryLimit": "512Mi"}),
        other => panic!("no change for {other}"),
    }
}

pub async fn the_api_server_refuses_a_change_of_every_immutable_spec_field(cluster: Cluster) {
    cluster.install_crd().await;
    let ns = cluster.namespace("crd-immutable").await;
    let name = "exec-crd-immutable";
    let api = created(&ns, name).await;
    let before = api.get(name).await.unwrap();
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
        "resources",
    ] {
        let patch = json!({"spec": {field: changed(field)}});
        let refused = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect_err(field);
        let message = if field == "resources" {
            "resources are immutable".to_owned()
        } else {
            format!("{field} is immutable")
        };
        assert!(refused.to_string().contains(&message), "{field}: {refused}");
    }
    // Removing an optional immutable field is a change too.
    let removal = json!({"spec": {"ownerIssuer": null}});
    let refused = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&removal))
        .await
        .expect_err("ownerIssuer cannot be removed");
    assert!(
        refused.to_string().contains("ownerIssuer is immutable"),
        "{refused}"
    );
    assert_eq!(
        api.get(name).await.unwrap().spec,
        before.spec,
        "nothing changed"
    );

    let retiring = json!({"spec": {"desired": "Retiring"}});
    let accepted = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&retiring))
        .await
        .expect("desired is not immutable");
    assert_eq!(accepted.spec.desired, Desired::Retiring);
    ns.delete().await;
}

pub async fn the_api_server_admits_schema_version_2_only_in_spec_and_status(cluster: Cluster) {
    cluster.install_crd().await;
    let ns = cluster.namespace("crd-schema").await;
    let api = raw(&ns);
    let base = serde_json::to_value(spec("exec-crd-schema")).unwrap();
    for (case, version) in [
        ("omitted", None),
        ("1", Some(json!(1))),
        ("3", Some(json!(3))),
        ("string", Some(json!("2"))),
    ] {
        let mut body = base.clone();
        match version {
            Some(v) => body["schemaVersion"] = v,
            None => {
                body.as_object_mut().unwrap().remove("schemaVersion");
            }
        }
        let name = format!("exec-crd-spec-{case}");
        let refused = api
            .create(&PostParams::default(), &object(&name, body))
            .await
            .expect_err(&name);
        assert!(
            refused.to_string().contains("schemaVersion"),
            "{case}: {refused}"
        );
    }
    let name = "exec-crd-schema";
    let current = api
        .create(&PostParams::default(), &object(name, base))
        .await
        .expect("schemaVersion 2 is admitted, without any status");
    assert!(current.data.get("status").is_none());
    for (case, version) in [("1", json!(1)), ("3", json!(3)), ("string", json!("2"))] {
        let patch = json!({"status": {"schemaVersion": version}});
        let refused = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect_err(case);
        assert!(
            refused.to_string().contains("schemaVersion"),
            "status {case}: {refused}"
        );
    }
    let patch = json!({"status": {"schemaVersion": 2}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("status schemaVersion 2 is admitted");
    ns.delete().await;
}

fn full_status() -> ExecutionEnvironmentStatus {
    ExecutionEnvironmentStatus {
        schema_version: Some(2),
        observed_generation: Some(1),
        epoch: Some(4),
        grant_generation: Some(2),
        fence_state: Some(FenceState::Healthy),
        revocation_receipts: vec![RevocationReceipt {
            operation_id: "revoke-1".to_owned(),
            fingerprint: hex('a'),
            expected_grant_generation: 1,
            grant_generation: 2,
        }],
        references: vec![ReferenceRecord {
            binding_id: "session-2".to_owned(),
            state: ReferenceState::PendingCreate,
            operation_id: "reserve-1".to_owned(),
            source_binding_id: Some("session-1".to_owned()),
            created_at: at(1_700_000_000),
        }],
        pvc: Some(ObjectIdentity {
            name: "workspace-crd-prune".to_owned(),
            uid: "pvc-uid".to_owned(),
        }),
        pod: Some(ObjectIdentity {
            name: "executor-crd-prune".to_owned(),
            uid: "pod-uid".to_owned(),
        }),
        active_run: Some(ActiveRun {
            binding_id: "session-1".to_owned(),
            run_id: "run-1".to_owned(),
            claim_id: "claim-1".to_owned(),
            operation_id: "acquire-1".to_owned(),
            owner_hash: hex('a'),
            client_hash: hex('b'),
            epoch: 4,
            grant_generation: 2,
            expires_at: at(1_700_000_060),
        }),
        renew_receipts: vec![RenewReceipt {
            operation_id: "renew-1".to_owned(),
            fingerprint: hex('b'),
            expires_at: at(1_700_000_090),
        }],
        active_operation: Some(ActiveOperation {
            id: "op-1".to_owned(),
            operation: "file.read".to_owned(),
            started_at: at(1_700_000_010),
            claim_id: "claim-1".to_owned(),
            run_id: "run-1".to_owned(),
            epoch: 4,
            holder_id: "holder-1".to_owned(),
            renewed_at: at(1_700_000_020),
            expires_at: at(1_700_000_050),
        }),
        commands: Vec::new(),
        lifecycle_operation: Some(LifecycleOperation {
            id: "replace-2".to_owned(),
            type_: LifecycleType::ReplaceExecutor,
            phase: LifecyclePhase::WaitingForTermination,
            expected_epoch: Some(4),
            expected_pod_uid: Some("pod-uid".to_owned()),
            expected_pvc_uid: Some("pvc-uid".to_owned()),
            created_at: at(1_700_000_100),
        }),
        termination_proof: Some(TerminationProof {
            operation_id: "retire-1".to_owned(),
            pod_uid: "pod-uid".to_owned(),
            pvc_uid: "pvc-uid".to_owned(),
            epoch: 4,
            pod_phase: TerminalPodPhase::Succeeded,
            observed_at: at(1_700_000_110),
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
            recorded_at: at(1_700_000_120),
        }),
        conditions: vec![EnvironmentCondition {
            type_: "Ready".to_owned(),
            status: ConditionStatus::True,
            reason: "Reconciled".to_owned(),
            message: "PVC and executor Pod are ready".to_owned(),
            observed_generation: 1,
            last_transition_time: at(1_700_000_005),
        }],
    }
}

pub async fn pruning_keeps_every_controller_owned_status_field_and_drops_removed_ones(
    cluster: Cluster,
) {
    cluster.install_crd().await;
    let ns = cluster.namespace("crd-prune").await;
    let name = "exec-crd-prune";
    created(&ns, name).await;
    let api = raw(&ns);
    let mut status = serde_json::to_value(full_status()).unwrap();
    status["migrationOperation"] = json!({"id": "m-1"});
    status["lastMigrationOperationID"] = json!("m-1");
    status["lastMigrationFromSchema"] = json!(1);
    let written = api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
        .expect("the full status is admitted");
    let kept = &written.data["status"];
    let typed: ExecutionEnvironmentStatus =
        serde_json::from_value(kept.clone()).expect("the stored status decodes");
    assert_eq!(
        typed,
        full_status(),
        "every controller-owned field survives"
    );
    for removed in [
        "migrationOperation",
        "lastMigrationOperationID",
        "lastMigrationFromSchema",
    ] {
        assert!(kept.get(removed).is_none(), "{removed} is pruned");
    }
    ns.delete().await;
}
