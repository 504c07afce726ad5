//! What an admitted client may do (`ClientPolicy`), and the snapshot of admitted clients that
//! every RPC is authorized against.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::server::limiter::Slot;

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
/// While it lives it may hold the RPC's limiter slot (released when the handler drops it).
#[derive(Debug, Clone)]
pub struct Client {
    /// The canonical URI SAN.
    pub uri: String,
    /// Its permissions.
    pub policy: ClientPolicy,
    /// The limiter slot of the RPC, once reserved.
    pub slot: Option<Arc<Slot>>,
}

impl PartialEq for Client {
    fn eq(&self, other: &Self) -> bool {
        self.uri == other.uri && self.policy == other.policy
    }
}

impl Eq for Client {}

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
            slot: None,
        })
    }
}
