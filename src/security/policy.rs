//! What an admitted client may do (`ClientPolicy`), and the snapshot of admitted clients that
//! every RPC is authorized against.

use std::collections::BTreeMap;

/// The permissions of one client, from the security manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientPolicy {
    /// May assert an end-user owner; required for the whole data plane.
    pub may_attest_owner: bool,
    /// May call the admin lifecycle RPCs.
    pub administrator: bool,
    /// Creators whose environments this admin may administer (empty: only its own).
    pub administrator_for: Vec<String>,
    /// Template ids this client may list, validate and allocate.
    pub execution_templates: Vec<String>,
}

impl ClientPolicy {
    /// Whether this client may use `template_id` on the data plane.
    pub fn may_use_template(&self, template_id: &str) -> bool {
        self.may_attest_owner && self.execution_templates.iter().any(|t| t == template_id)
    }
}

/// An admitted client: its canonical URI and the policy of the snapshot that admitted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// The canonical URI SAN.
    pub uri: String,
    /// Its permissions.
    pub policy: ClientPolicy,
}

/// One generation of the client allowlist.
#[derive(Debug, Clone, Default)]
pub struct SecuritySnapshot {
    /// The manifest generation this snapshot came from.
    pub generation: u64,
    /// Canonical client URI to policy.
    pub clients: BTreeMap<String, ClientPolicy>,
}

impl SecuritySnapshot {
    /// The admitted client named `uri`, if the allowlist has it.
    pub fn admit(&self, uri: &str) -> Option<Client> {
        self.clients.get(uri).map(|policy| Client {
            uri: uri.to_owned(),
            policy: policy.clone(),
        })
    }
}
