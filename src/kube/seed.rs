//! What a cluster operator (or the Helm chart) provides before the provider starts, for the
//! embedded worlds that have no operator: the capacity-ledger ConfigMaps (DECISIONS 16) and the
//! RuntimeClasses and StorageClasses the templates name. Idempotent, so a restarted world can
//! seed again.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::kube::crd::{LEDGER_SHARDS, ledger_shard_name};
use crate::templates::TemplateRegistry;

/// Creates the ledger shards in `namespace` and every class `templates` names; StorageClasses get
/// `provisioner`. Objects that already exist are left as they are.
pub async fn seed_cluster(
    kube: &kube::Client,
    namespace: &str,
    templates: &TemplateRegistry,
    provisioner: &str,
) -> Result<(), kube::Error> {
    for index in 0..LEDGER_SHARDS {
        let ledger = ConfigMap {
            metadata: meta(&ledger_shard_name(index)),
            ..ConfigMap::default()
        };
        create_if_absent(
            &Api::<ConfigMap>::namespaced(kube.clone(), namespace),
            &ledger,
        )
        .await?;
    }
    let resources = templates.cluster_resources();
    for name in &resources.runtime_classes {
        let class = RuntimeClass {
            metadata: meta(name),
            handler: "runc".to_owned(),
            ..RuntimeClass::default()
        };
        create_if_absent(&Api::<RuntimeClass>::all(kube.clone()), &class).await?;
    }
    for name in &resources.storage_classes {
        let class = StorageClass {
            metadata: meta(name),
            provisioner: provisioner.to_owned(),
            ..StorageClass::default()
        };
        create_if_absent(&Api::<StorageClass>::all(kube.clone()), &class).await?;
    }
    Ok(())
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    }
}

async fn create_if_absent<K>(api: &Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}
