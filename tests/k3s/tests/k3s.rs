//! The CRD on a real k3s API server, started by testcontainers: it installs, becomes
//! established, accepts a valid environment and enforces spec immutability with its CEL rules.
//! Needs a Docker engine: `cargo test -p k3s-tests --features k3s -- --ignored`.
#![cfg(feature = "k3s")]

use std::time::Duration;

use execution_provider::kube::crd::ExecutionEnvironment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, PostParams};
use testcontainers_modules::k3s::{K3s, KUBE_SECURE_PORT};
use testcontainers_modules::testcontainers::ImageExt;
use testcontainers_modules::testcontainers::runners::AsyncRunner;

/// k8s-openapi 0.29 targets Kubernetes 1.33 and later; the module's default image is older.
const K3S_TAG: &str = "v1.33.5-k3s1";

async fn client(conf_dir: &std::path::Path) -> (impl Drop, kube::Client) {
    let container = K3s::default()
        .with_conf_mount(conf_dir)
        .with_privileged(true)
        .with_userns_mode("host")
        .with_tag(K3S_TAG)
        .start()
        .await
        .expect("k3s starts (is a Docker engine available?)");
    let port = container
        .get_host_port_ipv4(KUBE_SECURE_PORT)
        .await
        .unwrap();
    let raw = container.image().read_kube_config().unwrap();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&raw).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.cluster_url = format!("https://127.0.0.1:{port}").parse().unwrap();
    (container, kube::Client::try_from(config).unwrap())
}

fn environment() -> ExecutionEnvironment {
    let hex = "0".repeat(64);
    serde_json::from_value(serde_json::json!({
        "apiVersion": "execution.mecatl.dev/v1alpha1",
        "kind": "ExecutionEnvironment",
        "metadata": {"name": "exec-k3s", "namespace": "default"},
        "spec": {
            "schemaVersion": 2, "allocationID": "exec-k3s", "revision": "r1",
            "ownerHash": hex, "clientHash": hex, "bindingID": "b", "requestFingerprint": hex,
            "templateID": "default", "templateRevision": format!("v1-{hex}"),
            "templateDigest": format!("sha256:{hex}"),
            "image": format!("registry.example/executor@sha256:{hex}"),
            "storageClass": "standard", "storageSize": "1Gi",
            "resources": {"cpuRequest": "100m", "memoryRequest": "128Mi", "cpuLimit": "1", "memoryLimit": "512Mi"},
            "desired": "Active"
        }
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker engine"]
async fn the_crd_installs_and_its_immutability_rules_hold_on_k3s() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let conf = std::env::temp_dir().join("execution-provider-k3s");
    std::fs::create_dir_all(&conf).unwrap();
    let (_container, client) = client(&conf).await;

    let crd = ExecutionEnvironment::crd();
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();

    let envs = Api::<ExecutionEnvironment>::namespaced(client, "default");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let created = loop {
        match envs.create(&PostParams::default(), &environment()).await {
            Ok(created) => break created,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("the CRD never became usable: {e}"),
        }
    };
    let mut changed = created.clone();
    changed.spec.binding_id = "another".into();
    let refused = envs
        .replace("exec-k3s", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 422),
        "{refused:?}"
    );
}
