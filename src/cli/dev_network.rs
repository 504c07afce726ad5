//! The network of a `dev` environment's sandbox, from its template revision's `network`
//! setting: none (an empty network namespace) by default; with `network: outbound` the host's
//! network with the provider's own ports refused (docs/sandbox.md, "Network").

use std::sync::Arc;

use kube::Api;

use crate::executor::sandbox_networks::SandboxNetworks;
use crate::executor::transport::BoxFuture;
use crate::kube::crd::ExecutionEnvironment;
use crate::sandbox::Network;
use crate::templates::{NetworkMode, TemplateRegistry};

/// Chooses each sandbox's network from the environment's template revision.
pub struct TemplateNetworks {
    environments: Api<ExecutionEnvironment>,
    templates: Arc<TemplateRegistry>,
    provider_ports: Vec<u16>,
}

impl TemplateNetworks {
    /// Networks for the environments of `namespace`; an outbound sandbox is refused
    /// `provider_ports` (every port the provider listens on).
    pub fn new(
        client: kube::Client,
        namespace: &str,
        templates: Arc<TemplateRegistry>,
        provider_ports: Vec<u16>,
    ) -> Self {
        Self {
            environments: Api::namespaced(client, namespace),
            templates,
            provider_ports,
        }
    }

    async fn mode_of(&self, environment: &str) -> Option<NetworkMode> {
        let env = self.environments.get_opt(environment).await.ok()??;
        let revision = self
            .templates
            .retained_revision(&env.spec.template_id, &env.spec.template_revision)
            .ok()?;
        Some(revision.execution().network())
    }
}

impl SandboxNetworks for TemplateNetworks {
    fn network_of<'a>(&'a self, environment: &'a str) -> BoxFuture<'a, Network> {
        Box::pin(async move {
            match self.mode_of(environment).await {
                Some(NetworkMode::Outbound) => {
                    Network::HostExceptPorts(self.provider_ports.clone())
                }
                Some(NetworkMode::None) | None => Network::None,
            }
        })
    }
}
