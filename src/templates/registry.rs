//! The template registry (k8s-executor §3.3): loaded once at start-up, immutable afterwards,
//! serving both catalogue styles (templates, and profiles as one-revision templates).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::catalog::{CAPABILITIES, CatalogItem, display_token, inventory_revision};
use super::display::TemplateDisplay;
use super::file;
use super::spec::ExecutionSpec;
use super::{LookupError, TemplateError};

/// One loaded revision: validated execution spec, ids and policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRevision {
    pub(super) template_id: String,
    pub(super) revision: String,
    pub(super) digest: String,
    pub(super) execution: ExecutionSpec,
    pub(super) deprecated: bool,
    pub(super) revoked: bool,
    pub(super) display: TemplateDisplay,
}

impl TemplateRevision {
    /// The template id this revision belongs to.
    pub fn template_id(&self) -> &str {
        &self.template_id
    }
    /// The revision id (`v1-` + 64 hex).
    pub fn revision(&self) -> &str {
        &self.revision
    }
    /// The digest (`sha256:` + the revision's hex), stored in `spec.templateDigest`.
    pub fn digest(&self) -> &str {
        &self.digest
    }
    /// The validated execution definition.
    pub fn execution(&self) -> &ExecutionSpec {
        &self.execution
    }
    /// Deprecated: kept for existing allocations, not offered to new ones.
    pub fn is_deprecated(&self) -> bool {
        self.deprecated
    }
    /// Revoked: environments on it are fenced.
    pub fn is_revoked(&self) -> bool {
        self.revoked
    }
    /// Neither deprecated nor revoked: new allocations may use it.
    pub fn is_selectable(&self) -> bool {
        !self.deprecated && !self.revoked
    }
    /// Catalog display data.
    pub fn display(&self) -> &TemplateDisplay {
        &self.display
    }
    /// What environments of this revision can do: always `filesystem`, `foreground-command`.
    pub fn capabilities(&self) -> &'static [&'static str] {
        &CAPABILITIES
    }
}

/// One template id and all its revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub(super) id: String,
    pub(super) default: Option<String>,
    pub(super) revisions: BTreeMap<String, TemplateRevision>,
    pub(super) capacity: u32,
}

impl Template {
    /// The template id.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// The default revision id, if the template has an eligible one.
    pub fn default_revision(&self) -> Option<&str> {
        self.default.as_deref()
    }
    /// Every revision, deprecated and revoked included, by revision id.
    pub fn revisions(&self) -> &BTreeMap<String, TemplateRevision> {
        &self.revisions
    }
    /// The pooled environment limit: the least `maxEnvironments` over all revisions.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }
}

/// The names the start-up preflight checks exist in the cluster (k8s-executor §2.1): every
/// revision's, deprecated and revoked included.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterResources {
    /// RuntimeClass names, sorted.
    pub runtime_classes: BTreeSet<String>,
    /// StorageClass names, sorted.
    pub storage_classes: BTreeSet<String>,
}

/// The validated, immutable set of templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRegistry {
    source_name: String,
    templates: BTreeMap<String, Template>,
}

impl TemplateRegistry {
    /// Reads and strictly validates a templates file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TemplateError> {
        let path = path.as_ref();
        let text = file::read_file(path)?;
        Self::from_yaml_str(&text, &path.display().to_string())
    }

    /// Strictly validates templates YAML; `source_name` names it in errors.
    pub fn from_yaml_str(text: &str, source_name: &str) -> Result<Self, TemplateError> {
        let decoded = file::decode(text, source_name)?;
        let templates = file::build(&decoded, source_name)?;
        Ok(Self {
            source_name: source_name.to_owned(),
            templates,
        })
    }

    /// The file name (or other source name) this registry was loaded from.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// Every template, by id.
    pub fn templates(&self) -> &BTreeMap<String, Template> {
        &self.templates
    }

    /// One template.
    pub fn template(&self, id: &str) -> Result<&Template, LookupError> {
        self.templates
            .get(id)
            .ok_or_else(|| LookupError::UnknownTemplate {
                template_id: id.to_owned(),
            })
    }

    fn revision(&self, id: &str, revision: &str) -> Result<&TemplateRevision, LookupError> {
        self.template(id)?
            .revisions
            .get(revision)
            .ok_or_else(|| LookupError::UnknownRevision {
                template_id: id.to_owned(),
                revision: revision.to_owned(),
            })
    }

    /// A revision for a *new* allocation: it exists and is neither deprecated nor revoked.
    pub fn select_revision(
        &self,
        id: &str,
        revision: &str,
    ) -> Result<&TemplateRevision, LookupError> {
        let found = self.retained_revision(id, revision)?;
        if found.deprecated {
            return Err(LookupError::Deprecated {
                template_id: id.to_owned(),
                revision: revision.to_owned(),
            });
        }
        Ok(found)
    }

    /// A revision for an *existing* allocation (reattach, runs, reconcile): it exists and is
    /// not revoked; deprecated revisions stay usable.
    pub fn retained_revision(
        &self,
        id: &str,
        revision: &str,
    ) -> Result<&TemplateRevision, LookupError> {
        let found = self.revision(id, revision)?;
        if found.revoked {
            return Err(LookupError::Revoked {
                template_id: id.to_owned(),
                revision: revision.to_owned(),
            });
        }
        Ok(found)
    }

    /// The revision an environment runs on: retained, and with exactly the digest the
    /// environment recorded. Any error means the environment is fenced (revoked, removed or
    /// changed definition).
    pub fn for_environment(
        &self,
        template_id: &str,
        revision: &str,
        digest: &str,
    ) -> Result<&TemplateRevision, LookupError> {
        let found = self.retained_revision(template_id, revision)?;
        if found.digest != digest {
            return Err(LookupError::DigestMismatch {
                template_id: template_id.to_owned(),
                revision: revision.to_owned(),
                expected: found.digest.clone(),
                actual: digest.to_owned(),
            });
        }
        Ok(found)
    }

    /// Whether an environment on this definition is fenced: `!for_environment(..).is_ok()`.
    pub fn is_revoked(&self, template_id: &str, revision: &str, digest: &str) -> bool {
        self.for_environment(template_id, revision, digest).is_err()
    }

    /// The default revision id of a template; `None` for an unknown id or one made only of
    /// history.
    pub fn default_revision(&self, id: &str) -> Option<&str> {
        self.templates.get(id)?.default_revision()
    }

    /// The default revision of a template.
    pub fn default_template(&self, id: &str) -> Result<&TemplateRevision, LookupError> {
        let template = self.template(id)?;
        let default = template
            .default
            .as_deref()
            .ok_or_else(|| LookupError::NoDefault {
                template_id: id.to_owned(),
            })?;
        self.select_revision(id, default)
    }

    /// An era-A profile: a template used through its default revision (DECISIONS 2). The name
    /// must be non-empty and contain no `/` or `\`.
    pub fn profile(&self, name: &str) -> Result<&TemplateRevision, LookupError> {
        if name.is_empty() || name.contains(['/', '\\']) {
            return Err(LookupError::InvalidProfileName {
                name: name.to_owned(),
            });
        }
        self.default_template(name)
    }

    /// The pooled environment limit of a template: the least `maxEnvironments` over all its
    /// revisions.
    pub fn capacity(&self, id: &str) -> Option<u32> {
        self.templates.get(id).map(Template::capacity)
    }

    /// Every template with an eligible default, in id order, described by its default
    /// revision. Ids made only of history are never listed. Callers filter by client policy
    /// and then compute [`TemplateRegistry::inventory_revision`] over what the client sees.
    pub fn catalog(&self) -> Vec<CatalogItem> {
        self.templates
            .values()
            .filter_map(|template| {
                let revision = template.revisions.get(template.default.as_deref()?)?;
                let display = &revision.display;
                let name = if display.name.is_empty() {
                    template.id.clone()
                } else {
                    display.name.clone()
                };
                Some(CatalogItem {
                    id: template.id.clone(),
                    revision: revision.revision.clone(),
                    display_token: display_token(&template.id, &name, display),
                    name,
                    description: display.description.clone(),
                    extensions: display.extensions.clone(),
                    capabilities: CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
                })
            })
            .collect()
    }

    /// The revision of a visible catalog: `v1-` + hex SHA-256 of its canonical encoding.
    pub fn inventory_revision(visible_items: &[CatalogItem]) -> String {
        inventory_revision(visible_items)
    }

    /// Every RuntimeClass and StorageClass any revision names, for the start-up preflight.
    pub fn cluster_resources(&self) -> ClusterResources {
        let mut resources = ClusterResources::default();
        for revision in self.templates.values().flat_map(|t| t.revisions.values()) {
            resources
                .runtime_classes
                .insert(revision.execution.runtime_class_name().to_owned());
            resources
                .storage_classes
                .insert(revision.execution.storage_class().to_owned());
        }
        resources
    }
}
