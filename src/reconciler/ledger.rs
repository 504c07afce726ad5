//! Releasing an environment's slot in the capacity ledger: the ConfigMap
//! `mecatl-execution-profile-allocations`, one key per template id holding the sorted JSON array
//! of environment names. The chart (or `dev`) creates the ConfigMap; the reconciler only reads
//! and updates it by compare-and-swap, and fails clearly when it is missing (DECISIONS 16).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

use super::Context;
use super::error::ReconcileError;
use crate::kube::crd::{LEDGER_CONFIGMAP_NAME, ledger_key};

/// How many lost races the release survives.
const ATTEMPTS: usize = 8;

/// Removes `env` from the ledger entry of `template_id`; absent already is fine.
pub async fn release(ctx: &Context, template_id: &str, env: &str) -> Result<(), ReconcileError> {
    let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let key = ledger_key(template_id);
    for _ in 0..ATTEMPTS {
        let mut ledger = api
            .get_opt(LEDGER_CONFIGMAP_NAME)
            .await
            .map_err(ReconcileError::kube(env, "read capacity ledger"))?
            .ok_or_else(|| ReconcileError::mismatch(env, "capacity ledger ConfigMap is missing"))?;
        let data = ledger.data.get_or_insert_with(Default::default);
        let Some(text) = data.get(&key) else {
            return Ok(());
        };
        let mut names: Vec<String> = serde_json::from_str(text)
            .map_err(|_| ReconcileError::mismatch(env, "capacity ledger entry is malformed"))?;
        if !names.iter().any(|n| n == env) {
            return Ok(());
        }
        names.retain(|n| n != env);
        names.sort();
        data.insert(
            key.clone(),
            serde_json::to_string(&names).expect("names serialize"),
        );
        match api
            .replace(LEDGER_CONFIGMAP_NAME, &PostParams::default(), &ledger)
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(ReconcileError::kube(env, "update capacity ledger")(e)),
        }
    }
    Err(ReconcileError::Conflict {
        env: env.to_owned(),
        what: "capacity ledger changed concurrently",
    })
}
