//! The chart's upgrade guard (k8s-executor §5.3) on the real API server: its `lookup`s see the
//! live namespace. An upgrade of a running provider is refused; once scaled to 0 it goes
//! through; a prune is refused while the ledger holds a slot and, with the ledger emptied,
//! while the environment, its Pod and its PVC exist; with the templates ConfigMap gone, the
//! executor NetworkPolicies left are orphans, and without them too the retained environment
//! makes the render refuse to bootstrap.

use execution_provider::kube::crd::{
    ExecutionEnvironment, LEDGER_CONFIGMAP_NAME, ledger_slots_key,
};
use kube::Api;

use crate::cluster::{CHART_DIR, Cluster, repo_root, run};
use crate::common;
use crate::flow::Setup;
use crate::provider::FULLNAME;

/// `helm upgrade e2e` of the working tree's chart with the installed values plus `extra`:
/// `Ok` when it went through, else helm's error output.
async fn upgrade(cluster: &Cluster, ns: &str, extra: &[&str]) -> Result<(), String> {
    let chart = repo_root().join(CHART_DIR);
    let config = format!("--kubeconfig={}", cluster.kubeconfig.display());
    let chart = chart.to_string_lossy();
    let mut args = vec![
        config.as_str(),
        "upgrade",
        "e2e",
        &chart,
        "--namespace",
        ns,
        "--reuse-values",
    ];
    args.extend_from_slice(extra);
    let out = run(&cluster.helm, &args, None).await;
    if out.success {
        Ok(())
    } else {
        Err(format!("{}{}", out.stdout, out.stderr))
    }
}

fn refused(result: Result<(), String>, named: &str) {
    match result {
        Ok(()) => panic!("the upgrade went through; expected a refusal naming {named:?}"),
        Err(e) => assert!(e.contains(named), "refused, but not for {named:?}: {e}"),
    }
}

pub async fn the_upgrade_guard_sees_the_live_namespace(cluster: Cluster) {
    let setup = Setup::new(cluster, "upgrade").await;
    let provider = setup.installation.start_provider("provider").await;
    let mut client = setup.installation.client(&provider);
    let allocation = common::ensure_ready(&mut client, "up").await;
    provider.stop().await;
    let (cluster, ns) = (&setup.cluster, setup.ns.name.as_str());
    let name = allocation.environment.unwrap().id;
    let env = Api::<ExecutionEnvironment>::namespaced(setup.ns.client.clone(), ns)
        .get(&name)
        .await
        .unwrap();

    refused(upgrade(cluster, ns, &[]).await, "scale the Deployment to 0");
    cluster
        .kubectl(&["scale", "deployment", FULLNAME, "--replicas=0", "-n", ns])
        .await;
    upgrade(cluster, ns, &[])
        .await
        .expect("a quiesced provider upgrades with its environment retained");
    // The upgrade rendered the Deployment back to its replicas: quiesce again for the next one.
    cluster
        .kubectl(&["scale", "deployment", FULLNAME, "--replicas=0", "-n", ns])
        .await;

    let prune = format!(
        "maintenance.pruneRevisions={{\"{}\":[\"{}\"]}}",
        env.spec.template_id, env.spec.template_revision
    );
    refused(
        upgrade(cluster, ns, &["--set-json", &prune]).await,
        "capacity ledger present with every entry empty",
    );
    // The template's limit fits the root shard, so its one slot is there.
    let emptied =
        serde_json::json!({"data": {ledger_slots_key(&env.spec.template_id): r#"{"slots":[]}"#}});
    cluster
        .kubectl(&[
            "patch",
            "configmap",
            LEDGER_CONFIGMAP_NAME,
            "-n",
            ns,
            "--type=merge",
            "-p",
            &emptied.to_string(),
        ])
        .await;
    refused(
        upgrade(cluster, ns, &["--set-json", &prune]).await,
        "without ExecutionEnvironments, Pods and PVCs",
    );

    cluster
        .kubectl(&[
            "delete",
            "configmap",
            &format!("{FULLNAME}-templates"),
            "-n",
            ns,
        ])
        .await;
    refused(
        upgrade(cluster, ns, &[]).await,
        "orphan executor NetworkPolicy",
    );
    cluster
        .kubectl(&["delete", "networkpolicy", "--all", "-n", ns])
        .await;
    // Nothing of the installation is left but the ledger, the environment, its Pod and its PVC:
    // the render sees them and refuses to start over.
    refused(upgrade(cluster, ns, &[]).await, "bootstrap is forbidden");
    setup.finish().await;
}
