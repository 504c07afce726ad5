//! Pure naming rules for the objects that belong to an environment: the workspace PVC, the
//! executor Pod, the template label and the capacity-ledger key.

use sha2::{Digest as _, Sha256};

/// Prefix of every environment (CR) name.
pub const ENVIRONMENT_NAME_PREFIX: &str = "exec-";
/// Prefix of the workspace PVC name.
pub const PVC_NAME_PREFIX: &str = "workspace-";
/// Prefix of the executor Pod name.
pub const POD_NAME_PREFIX: &str = "executor-";
/// Longest name a Pod or PVC may have here (a DNS label).
pub const MAX_OBJECT_NAME_BYTES: usize = 63;

/// The name of the environment's workspace PVC: `workspace-` + the CR name without its leading
/// `exec-`, cut to 63 bytes, with trailing `-` removed.
#[must_use]
pub fn pvc_name(cr_name: &str) -> String {
    runtime_name(PVC_NAME_PREFIX, cr_name)
}

/// The name of the environment's executor Pod: `executor-` + the CR name without its leading
/// `exec-`, cut to 63 bytes, with trailing `-` removed.
#[must_use]
pub fn pod_name(cr_name: &str) -> String {
    runtime_name(POD_NAME_PREFIX, cr_name)
}

fn runtime_name(prefix: &str, cr_name: &str) -> String {
    let suffix = cr_name
        .strip_prefix(ENVIRONMENT_NAME_PREFIX)
        .unwrap_or(cr_name);
    let mut name = format!("{prefix}{suffix}");
    if name.len() > MAX_OBJECT_NAME_BYTES {
        let mut cut = MAX_OBJECT_NAME_BYTES;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    let trimmed = name.trim_end_matches('-').len();
    name.truncate(trimmed);
    name
}

/// The value of the Pod label `execution.mecatl.dev/template-id`: the first 16 hex characters of
/// SHA-256 of the template id (template ids can be longer than a label value allows).
#[must_use]
pub fn template_label(template_id: &str) -> String {
    let digest = Sha256::digest(template_id.as_bytes());
    hex::encode(&digest[..8])
}

/// The capacity-ledger ConfigMap key of a template: `profile-` + hex of the first 16 bytes of
/// SHA-256 of the template id + `.json`.
#[must_use]
pub fn ledger_key(template_id: &str) -> String {
    format!("{}.json", ledger_key_stem(template_id))
}

/// The key of a template's slots in each capacity-ledger shard (the current format; the
/// `.json` key of [`ledger_key`] is the format before sharding, migrated on first use).
#[must_use]
pub fn ledger_slots_key(template_id: &str) -> String {
    format!("{}.slots", ledger_key_stem(template_id))
}

fn ledger_key_stem(template_id: &str) -> String {
    let digest = Sha256::digest(template_id.as_bytes());
    format!("profile-{}", hex::encode(&digest[..16]))
}
