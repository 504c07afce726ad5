//! Releasing an environment's slot in the capacity ledger (the store's sharded ledger,
//! `src/store/ledger`): the chart (or `dev`) creates the ConfigMaps; the reconciler only reads
//! and updates them by compare-and-swap, and fails clearly when the root is missing
//! (DECISIONS 16).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use super::Context;
use super::error::ReconcileError;
use crate::kube::crd::ExecutionEnvironment;
use crate::store::ledger::Ledger;

/// Removes `env` from the ledger of `template_id` wherever it is recorded; absent already is
/// fine.
pub async fn release(ctx: &Context, template_id: &str, env: &str) -> Result<(), ReconcileError> {
    let ledger = Ledger::new(
        Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.config.namespace),
        Api::<ExecutionEnvironment>::namespaced(ctx.client.clone(), &ctx.config.namespace),
    );
    Ok(ledger.release(template_id, env).await?)
}
