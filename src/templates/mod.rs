//! Profiles and templates: the operator's execution definitions, loaded strictly from YAML,
//! validated, and identified by a canonical revision id (k8s-executor §3, DECISIONS 2, 13, 14).
//!
//! # Public API
//!
//! - [`TemplateRegistry`]: [`load`](TemplateRegistry::load) a file or
//!   [`from_yaml_str`](TemplateRegistry::from_yaml_str); then
//!   - [`select_revision`](TemplateRegistry::select_revision) (new allocations: exists, not
//!     deprecated, not revoked),
//!   - [`retained_revision`](TemplateRegistry::retained_revision) (existing allocations: exists,
//!     not revoked),
//!   - [`for_environment`](TemplateRegistry::for_environment) (retained and the recorded digest
//!     matches; an error means the environment is fenced) and
//!     [`is_revoked`](TemplateRegistry::is_revoked),
//!   - [`default_revision`](TemplateRegistry::default_revision),
//!     [`default_template`](TemplateRegistry::default_template),
//!     [`profile`](TemplateRegistry::profile) (era-A profiles: a template through its default
//!     revision),
//!   - [`capacity`](TemplateRegistry::capacity) (least `maxEnvironments` over all revisions),
//!   - [`catalog`](TemplateRegistry::catalog) ([`CatalogItem`]s of ids with an eligible default),
//!     [`inventory_revision`](TemplateRegistry::inventory_revision) (over the visible items),
//!   - [`cluster_resources`](TemplateRegistry::cluster_resources) ([`ClusterResources`] for the
//!     preflight).
//! - [`TemplateRevision`] (ids, digest, [`ExecutionSpec`], policy, [`TemplateDisplay`],
//!   capabilities) and [`Template`] (id, default, revisions, capacity).
//! - [`ProfileSpec`] (the `execution:` block as written) →
//!   [`ProfileSpec::validate`] → [`ExecutionSpec`] (validated; quantities as
//!   [`Quantity`], compared by value; durations in milliseconds).
//! - [`canonical_template_revision`], [`template_digest`], [`canonical_json`]: the revision id
//!   encoding, documented in [`revision`].
//! - [`Quantity`]: Kubernetes quantities parsed exactly, compared by value (`0.1 == 100m`).
//! - Errors: [`TemplateError`] (loading: decode errors carry file, line and column) and
//!   [`LookupError`] (registry lookups; each variant carries the ids).
//! - [`CAPABILITIES`]: `["filesystem", "foreground-command"]`.
//!
//! # Decisions
//!
//! - Empty `imagePullSecrets`/`nodeSelector`/`tolerations` are the same as absent ones (same
//!   revision id), see [`revision`].
//! - Quantities hash as written (`0.1` and `100m` give different revision ids) but compare by
//!   value everywhere else.
//! - `maxCommandDuration` must be a whole number of milliseconds.
//! - The display token hashes the catalog display data and the id, not the revision; a catalog
//!   entry whose revision sets no display name shows the template id as its name.
//! - Extensions are flattened to `namespace/key`, `namespace/schema_version` included.

pub mod catalog;
pub mod display;
pub mod duration;
pub mod file;
pub mod jcs;
pub mod names;
pub mod quantity;
pub mod registry;
pub mod revision;
pub mod spec;
pub mod toleration;

#[cfg(test)]
mod tests;

pub use catalog::{CAPABILITIES, CatalogItem};
pub use display::{DisplaySpec, TemplateDisplay};
pub use file::{RevisionDefinition, TemplateDefinition, TemplatesFile};
pub use quantity::{Quantity, QuantityError};
pub use registry::{ClusterResources, Template, TemplateRegistry, TemplateRevision};
pub use revision::{canonical_json, canonical_template_revision, template_digest};
pub use spec::{ExecutionSpec, NetworkMode, ProfileSpec, RecoveryMode, SpecError};
pub use toleration::{Toleration, TolerationEffect, TolerationOperator, TolerationSpec};

/// Why a templates file was refused. Every variant names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The file could not be read.
    #[error("read execution templates {source_name}: {reason}")]
    Read {
        /// The file.
        source_name: String,
        /// The I/O error.
        reason: String,
    },
    /// The file is larger than [`file::MAX_FILE_BYTES`].
    #[error("execution templates {source_name} exceed {limit} bytes")]
    TooLarge {
        /// The file.
        source_name: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// Not YAML of the expected shape: syntax, unknown or missing fields (the legacy
    /// `profiles:` key included), wrong types, duplicate keys.
    #[error("decode execution templates {source_name}:{line}:{column}: {message}")]
    Decode {
        /// The file.
        source_name: String,
        /// 1-based line (0 when unknown).
        line: u64,
        /// 1-based column (0 when unknown).
        column: u64,
        /// The decoder's message.
        message: String,
    },
    /// A file-level rule is broken: bounds, ids, default rules, display data.
    #[error("execution templates {source_name}: {path}: {reason}")]
    Invalid {
        /// The file.
        source_name: String,
        /// Where, e.g. `templates.default.default`.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// An execution definition breaks a rule of §3.1.
    #[error(
        "execution templates {source_name}: templates.{template_id}.revisions.{revision}.execution.{field}: {reason}"
    )]
    InvalidExecution {
        /// The file.
        source_name: String,
        /// The template id.
        template_id: String,
        /// The revision key as written.
        revision: String,
        /// The YAML field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A revision key is not the canonical id of its execution definition.
    #[error(
        "execution templates {source_name}: templates.{template_id}.revisions.{revision}: revision does not match canonical execution definition: expected {expected}"
    )]
    RevisionMismatch {
        /// The file.
        source_name: String,
        /// The template id.
        template_id: String,
        /// The revision key as written.
        revision: String,
        /// The canonical id the key must be.
        expected: String,
    },
}

/// Why a registry lookup found no usable revision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// No template has this id.
    #[error("template {template_id:?} is not defined")]
    UnknownTemplate {
        /// The template id asked for.
        template_id: String,
    },
    /// The template has no such revision (never had it, or it was removed).
    #[error("template {template_id:?} has no revision {revision:?}")]
    UnknownRevision {
        /// The template id.
        template_id: String,
        /// The revision asked for.
        revision: String,
    },
    /// The revision is deprecated: existing allocations keep it, new ones may not use it.
    #[error("template {template_id:?} revision {revision} is deprecated")]
    Deprecated {
        /// The template id.
        template_id: String,
        /// The revision.
        revision: String,
    },
    /// The revision is revoked.
    #[error("template {template_id:?} revision {revision} is revoked")]
    Revoked {
        /// The template id.
        template_id: String,
        /// The revision.
        revision: String,
    },
    /// The environment recorded another digest than the revision has now.
    #[error(
        "template {template_id:?} revision {revision} has digest {expected}, the environment recorded {actual}"
    )]
    DigestMismatch {
        /// The template id.
        template_id: String,
        /// The revision.
        revision: String,
        /// The registry's digest.
        expected: String,
        /// The digest the environment recorded.
        actual: String,
    },
    /// The template is made only of history (no eligible default).
    #[error("template {template_id:?} has no eligible default revision")]
    NoDefault {
        /// The template id.
        template_id: String,
    },
    /// A profile name that is empty or contains `/` or `\`.
    #[error("profile name {name:?} is invalid")]
    InvalidProfileName {
        /// The name asked for.
        name: String,
    },
}
