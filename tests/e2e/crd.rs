//! The CRD on a real API server: it installs and is established, the API server enforces its
//! CEL immutability rules and schema, and `kubectl get executionenvironments` shows the
//! printer columns of DECISIONS 17 from the status.

use execution_provider::kube::crd::{
    Desired, ExecutionEnvironment, ExecutionEnvironmentSpec, ExecutorResources,
};
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::cluster::Cluster;

fn hex(byte: char) -> String {
    std::iter::repeat_n(byte, 64).collect()
}

fn environment(name: &str) -> ExecutionEnvironment {
    let spec = ExecutionEnvironmentSpec {
        schema_version: 2,
        allocation_id: name.to_owned(),
        revision: "r1".to_owned(),
        owner_hash: hex('a'),
        owner_issuer: Some("https://issuer.test".to_owned()),
        owner_subject: Some("alice".to_owned()),
        client_hash: hex('b'),
        binding_id: "crd-binding".to_owned(),
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
    };
    ExecutionEnvironment::new(name, spec)
}

pub async fn the_api_server_enforces_the_crd_and_kubectl_shows_its_printer_columns(
    cluster: Cluster,
) {
    cluster.install_crd().await;
    let ns = cluster.namespace("crd").await;
    let api = Api::<ExecutionEnvironment>::namespaced(ns.client.clone(), &ns.name);

    let name = "exec-crd-printer-columns";
    api.create(&PostParams::default(), &environment(name))
        .await
        .expect("a well-formed environment is accepted");
    let status = serde_json::json!({"status": {
        "schemaVersion": 2,
        "epoch": 7,
        "conditions": [{
            "type": "Ready", "status": "False", "reason": "PodStarting",
            "message": "waiting", "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": 1
        }]
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the status subresource takes the status");

    let table = cluster
        .kubectl(&["get", "executionenvironments", "-n", &ns.name])
        .await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "READY", "EPOCH", "AGE"],
        "{table}"
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], [name, "PodStarting", "False", "7"], "{table}");
    let short = cluster
        .kubectl(&["get", "execenv", "-n", &ns.name, "-o", "name"])
        .await;
    assert_eq!(
        short.trim(),
        format!("executionenvironment.execution.mecatl.dev/{name}")
    );

    let changed = serde_json::json!({"spec": {"image": format!("other@sha256:{}", hex('0'))}});
    let refused = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&changed))
        .await
        .expect_err("the image is immutable");
    assert!(
        refused.to_string().contains("image is immutable"),
        "{refused}"
    );
    let mut bad = environment("exec-crd-bad-owner-hash");
    bad.spec.owner_hash = "not-hex".to_owned();
    let refused = api
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("the schema checks the owner hash");
    assert!(refused.to_string().contains("ownerHash"), "{refused}");
    let unchanged = api.get(name).await.unwrap();
    assert_eq!(unchanged.spec, environment(name).spec);

    ns.delete().await;
}
