//! The canonical revision id of an execution definition (DECISIONS 13).
//!
//! # Encoding
//!
//! The revision id is `v1-` followed by the lowercase hex SHA-256 of the RFC 8785 (JCS)
//! canonical JSON of the revision's validated [`ExecutionSpec`]; the digest stored in
//! `spec.templateDigest` is `sha256:` followed by the same hex. The JSON object is:
//!
//! - member names are the YAML keys exactly as in the templates file (camelCase), sorted by
//!   JCS (UTF-16 code units), no whitespace;
//! - `image`, `storageClass`, `runtimeClassName` and every quantity (`storageSize`,
//!   `cpuRequest`, `cpuLimit`, `memoryRequest`, `memoryLimit`, `ephemeralStorageRequest`,
//!   `ephemeralStorageLimit`, `tmpSizeLimit`) are JSON strings holding the text exactly as
//!   written (quantities are not normalised, so `0.1` and `100m` give different ids even though
//!   they compare equal);
//! - `maxFileBytes`, `maxCommandBytes` and `maxEnvironments` are JSON integers;
//! - `maxCommandDuration` is a JSON integer of **milliseconds** (`5m` gives `300000`; `300s`
//!   and `5m` give the same id);
//! - `imagePullSecrets` is an array of strings in file order; `nodeSelector` an object;
//!   `tolerations` an array (file order) of objects with the members `key`, `operator`,
//!   `value`, `effect` (strings) and `tolerationSeconds` (integer), where an empty or absent
//!   string member and an absent `tolerationSeconds` are omitted;
//! - **empty is the same as absent**: `imagePullSecrets`, `nodeSelector` and `tolerations` are
//!   omitted when they are absent *or* empty (`[]`, `{}`), so both spellings give one id;
//! - `recovery` is the string `manual` when set so, and omitted at its default (`automatic`,
//!   written or not), so every revision written before the setting existed keeps its id;
//! - `network` likewise: the string `outbound` when set so, omitted at its default (`none`).
//!
//! Byte compatibility with the reference Go encoder is not a goal. The snapshot tests below pin
//! the encoding; changing it changes every revision id, which fences every existing environment.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::jcs::to_canonical_json;
use super::spec::{ExecutionSpec, NetworkMode, RecoveryMode};
use super::toleration::Toleration;

/// The prefix of every revision id of this encoding.
pub const REVISION_PREFIX: &str = "v1-";
/// The prefix of every template digest.
pub const DIGEST_PREFIX: &str = "sha256:";
/// The length of a revision id: `v1-` plus 64 hex digits.
pub const REVISION_LEN: usize = 67;

/// The canonical JSON value of an execution definition (see the module documentation).
pub fn canonical_value(spec: &ExecutionSpec) -> Value {
    let mut object = Map::new();
    let mut put = |name: &str, value: Value| {
        object.insert(name.to_owned(), value);
    };
    put("image", json!(spec.image()));
    put("storageClass", json!(spec.storage_class()));
    put("storageSize", json!(spec.storage_size().as_str()));
    put("cpuRequest", json!(spec.cpu_request().as_str()));
    put("memoryRequest", json!(spec.memory_request().as_str()));
    put("cpuLimit", json!(spec.cpu_limit().as_str()));
    put("memoryLimit", json!(spec.memory_limit().as_str()));
    put(
        "ephemeralStorageRequest",
        json!(spec.ephemeral_storage_request().as_str()),
    );
    put(
        "ephemeralStorageLimit",
        json!(spec.ephemeral_storage_limit().as_str()),
    );
    put("tmpSizeLimit", json!(spec.tmp_size_limit().as_str()));
    put("runtimeClassName", json!(spec.runtime_class_name()));
    if !spec.image_pull_secrets().is_empty() {
        put("imagePullSecrets", json!(spec.image_pull_secrets()));
    }
    if !spec.node_selector().is_empty() {
        put("nodeSelector", json!(spec.node_selector()));
    }
    if !spec.tolerations().is_empty() {
        let tolerations = spec.tolerations().iter().map(toleration_value).collect();
        put("tolerations", Value::Array(tolerations));
    }
    put("maxFileBytes", json!(spec.max_file_bytes()));
    put("maxCommandBytes", json!(spec.max_command_bytes()));
    put(
        "maxCommandDuration",
        json!(spec.max_command_duration_millis()),
    );
    put("maxEnvironments", json!(spec.max_environments()));
    if spec.recovery() != RecoveryMode::default() {
        put("recovery", json!(spec.recovery().as_str()));
    }
    if spec.network() != NetworkMode::default() {
        put("network", json!(spec.network().as_str()));
    }
    Value::Object(object)
}

fn toleration_value(toleration: &Toleration) -> Value {
    let mut object = Map::new();
    if !toleration.key.is_empty() {
        object.insert("key".to_owned(), json!(toleration.key));
    }
    object.insert("operator".to_owned(), json!(toleration.operator.as_str()));
    if !toleration.value.is_empty() {
        object.insert("value".to_owned(), json!(toleration.value));
    }
    if let Some(effect) = toleration.effect {
        object.insert("effect".to_owned(), json!(effect.as_str()));
    }
    if let Some(seconds) = toleration.toleration_seconds {
        object.insert("tolerationSeconds".to_owned(), json!(seconds));
    }
    Value::Object(object)
}

/// The canonical JSON text (RFC 8785) of an execution definition.
pub fn canonical_json(spec: &ExecutionSpec) -> String {
    to_canonical_json(&canonical_value(spec))
        .expect("a validated execution spec holds only strings and small integers")
}

fn canonical_hex(spec: &ExecutionSpec) -> String {
    hex::encode(Sha256::digest(canonical_json(spec).as_bytes()))
}

/// The canonical revision id: `v1-` + lowercase hex SHA-256 of [`canonical_json`].
pub fn canonical_template_revision(spec: &ExecutionSpec) -> String {
    format!("{REVISION_PREFIX}{}", canonical_hex(spec))
}

/// The template digest: `sha256:` + the same hex as the revision id.
pub fn template_digest(spec: &ExecutionSpec) -> String {
    format!("{DIGEST_PREFIX}{}", canonical_hex(spec))
}

/// Whether `revision` has the shape of a revision id (`v1-` + 64 lowercase hex digits).
pub fn is_revision_id(revision: &str) -> bool {
    revision.len() == REVISION_LEN
        && revision.strip_prefix(REVISION_PREFIX).is_some_and(|hex| {
            hex.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::templates::spec::ProfileSpec;

    const FIXTURE: &str = include_str!("../../fixtures/templates.yaml");

    fn spec_from(yaml: &str) -> ExecutionSpec {
        let profile: ProfileSpec = serde_saphyr::from_str(yaml).unwrap();
        profile.validate().unwrap()
    }

    const BASE: &str = "
image: registry.example/execution/executor@sha256:0000000000000000000000000000000000000000000000000000000000000000
storageClass: standard
storageSize: 1Gi
cpuRequest: 100m
cpuLimit: '1'
memoryRequest: 128Mi
memoryLimit: 512Mi
ephemeralStorageRequest: 256Mi
ephemeralStorageLimit: 1Gi
tmpSizeLimit: 64Mi
runtimeClassName: gvisor
maxFileBytes: 5242880
maxCommandBytes: 1048576
maxCommandDuration: 5m
maxEnvironments: 100
";

    #[test]
    fn the_fixture_revision_is_pinned() {
        let registry =
            crate::templates::TemplateRegistry::from_yaml_str(FIXTURE, "templates.yaml").unwrap();
        let revision = registry.default_template("default").unwrap();
        insta::assert_snapshot!(
            "fixture_canonical_json",
            canonical_json(revision.execution())
        );
        insta::assert_snapshot!(
            "fixture_revision_id",
            canonical_template_revision(revision.execution())
        );
        assert_eq!(
            revision.revision(),
            canonical_template_revision(revision.execution())
        );
        assert_eq!(
            revision.digest(),
            format!("sha256:{}", &revision.revision()[3..])
        );
    }

    #[test]
    fn scheduling_and_pull_secrets_are_pinned_in_the_canonical_json() {
        let spec = spec_from(&format!(
            "{BASE}
imagePullSecrets: [zeta, alpha.creds]
nodeSelector: {{kubernetes.io/arch: amd64, example.com/pool: sandboxes}}
tolerations:
- {{key: sandbox, operator: Equal, value: 'true', effect: NoSchedule}}
- {{operator: Exists}}
- {{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 300}}
"
        ));
        insta::assert_snapshot!("scheduling_canonical_json", canonical_json(&spec));
    }

    #[test]
    fn durations_hash_as_milliseconds() {
        let five_minutes = spec_from(BASE);
        let seconds =
            spec_from(&BASE.replace("maxCommandDuration: 5m", "maxCommandDuration: 300s"));
        assert!(canonical_json(&five_minutes).contains("\"maxCommandDuration\":300000"));
        assert_eq!(
            canonical_template_revision(&five_minutes),
            canonical_template_revision(&seconds)
        );
    }

    #[test]
    fn empty_scheduling_and_pull_secret_lists_hash_like_absent_ones() {
        let absent = spec_from(BASE);
        let empty = spec_from(&format!(
            "{BASE}imagePullSecrets: []\nnodeSelector: {{}}\ntolerations: []\n"
        ));
        assert_eq!(
            canonical_template_revision(&absent),
            canonical_template_revision(&empty)
        );
        let configured = spec_from(&format!("{BASE}imagePullSecrets: [creds]\n"));
        assert_ne!(
            canonical_template_revision(&absent),
            canonical_template_revision(&configured)
        );
    }

    #[test]
    fn no_network_keeps_existing_revision_ids_and_outbound_changes_them() {
        let absent = spec_from(BASE);
        let none = spec_from(&format!("{BASE}network: none\n"));
        let outbound = spec_from(&format!("{BASE}network: outbound\n"));
        assert_eq!(canonical_json(&absent), canonical_json(&none));
        assert!(canonical_json(&outbound).contains("\"network\":\"outbound\""));
        assert_ne!(
            canonical_template_revision(&absent),
            canonical_template_revision(&outbound)
        );
    }

    #[test]
    fn automatic_recovery_keeps_existing_revision_ids_and_manual_changes_them() {
        let absent = spec_from(BASE);
        let automatic = spec_from(&format!("{BASE}recovery: automatic\n"));
        let manual = spec_from(&format!("{BASE}recovery: manual\n"));
        // The default, written or not, is left out of the hash: revisions written before the
        // setting existed keep their ids (the fixture's id is pinned by a snapshot above).
        assert_eq!(canonical_json(&absent), canonical_json(&automatic));
        assert_eq!(
            canonical_template_revision(&absent),
            canonical_template_revision(&automatic)
        );
        assert!(canonical_json(&manual).contains("\"recovery\":\"manual\""));
        assert_ne!(
            canonical_template_revision(&absent),
            canonical_template_revision(&manual)
        );
        let fixture =
            crate::templates::TemplateRegistry::from_yaml_str(FIXTURE, "templates.yaml").unwrap();
        let pinned = fixture
            .default_template("default")
            .unwrap()
            .revision()
            .to_owned();
        let written = FIXTURE.replace(
            "          maxEnvironments: 100\n",
            "          maxEnvironments: 100\n          recovery: automatic\n",
        );
        assert_ne!(
            written, FIXTURE,
            "the fixture's revision gained the setting"
        );
        let automatic =
            crate::templates::TemplateRegistry::from_yaml_str(&written, "templates.yaml").unwrap();
        assert_eq!(
            automatic.default_template("default").unwrap().revision(),
            pinned
        );
    }

    #[test]
    fn pull_secret_order_changes_the_revision() {
        let ab = spec_from(&format!("{BASE}imagePullSecrets: [a, b]\n"));
        let ba = spec_from(&format!("{BASE}imagePullSecrets: [b, a]\n"));
        assert_ne!(
            canonical_template_revision(&ab),
            canonical_template_revision(&ba)
        );
    }

    #[test]
    fn quantities_hash_as_written() {
        let milli = spec_from(BASE);
        let decimal = spec_from(&BASE.replace("cpuRequest: 100m", "cpuRequest: '0.1'"));
        assert_eq!(milli.cpu_request(), decimal.cpu_request());
        assert_ne!(
            canonical_template_revision(&milli),
            canonical_template_revision(&decimal)
        );
    }

    #[test]
    fn revision_ids_have_a_fixed_shape() {
        let id = canonical_template_revision(&spec_from(BASE));
        assert!(is_revision_id(&id));
        assert!(!is_revision_id(&id.to_uppercase()));
        assert!(!is_revision_id(&id[..66]));
        assert!(!is_revision_id(&format!("v2-{}", &id[3..])));
    }
}
