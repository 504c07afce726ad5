//! What the cluster operator provides before the provider starts (the capacity-ledger
//! ConfigMap, RuntimeClasses and StorageClasses the templates name). The convergence
//! judgement of the liveness phase is `crate::liveness`.

use execution_provider::kube::seed::seed_cluster;
use execution_provider::templates::TemplateRegistry;

use crate::world::NAMESPACE;

/// Creates the cluster objects the provider expects (idempotent: the API server host may
/// restart).
pub async fn seed(kube: &kube::Client, templates: &TemplateRegistry) -> Result<(), kube::Error> {
    seed_cluster(
        kube,
        NAMESPACE,
        templates,
        "sim.execution.mecatl.dev/memory",
    )
    .await
}
