//! The templates file (k8s-executor §3.1): strict YAML decoding and the file-level rules
//! (bounds, ids, revision keys, default rules).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::Path;

use serde::Deserialize;

use super::TemplateError;
use super::display::DisplaySpec;
use super::names::is_dns1123_label;
use super::registry::{Template, TemplateRevision};
use super::revision::{canonical_template_revision, template_digest};
use super::spec::{MAX_ENVIRONMENTS, ProfileSpec};

/// Largest templates file read, in bytes.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Most template ids per file.
pub const MAX_TEMPLATES: usize = 64;
/// Most revisions per template id.
pub const MAX_REVISIONS_PER_TEMPLATE: usize = 32;
/// Most revisions across all template ids.
pub const MAX_REVISIONS_TOTAL: usize = 64;

/// The whole file: `templates:` and nothing else (the legacy `profiles:` key is refused).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplatesFile {
    /// Template id → definition.
    pub templates: BTreeMap<String, TemplateDefinition>,
}

/// One template id: its revisions and which one new allocations get by default.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateDefinition {
    /// The default revision; must be eligible (neither deprecated nor revoked).
    #[serde(default)]
    pub default: Option<String>,
    /// Revision id → revision. Each key must equal the canonical id of its execution spec.
    pub revisions: BTreeMap<String, RevisionDefinition>,
}

/// One revision as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevisionDefinition {
    /// The execution definition (hashed into the revision id).
    pub execution: ProfileSpec,
    /// Kept for existing allocations, not offered to new ones.
    #[serde(default)]
    pub deprecated: bool,
    /// Neither offered nor kept: environments on it are fenced.
    #[serde(default)]
    pub revoked: bool,
    /// Catalog display data (not hashed).
    #[serde(default)]
    pub display: Option<DisplaySpec>,
}

/// Reads a templates file, refusing files larger than [`MAX_FILE_BYTES`].
pub(super) fn read_file(path: &Path) -> Result<String, TemplateError> {
    let source_name = path.display().to_string();
    let read_error = |e: std::io::Error| TemplateError::Read {
        source_name: source_name.clone(),
        reason: e.to_string(),
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(TemplateError::TooLarge {
            source_name,
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(text)
}

/// Decodes the YAML strictly; errors carry the line and column.
pub fn decode(text: &str, source_name: &str) -> Result<TemplatesFile, TemplateError> {
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(TemplateError::TooLarge {
            source_name: source_name.to_owned(),
            limit: MAX_FILE_BYTES,
        });
    }
    let options = serde_saphyr::options! {
        strict_booleans: true,
        with_snippet: false,
    };
    serde_saphyr::from_str_with_options(text, options).map_err(|e| {
        let location = e.location();
        let render = serde_saphyr::render_options! {
            snippets: serde_saphyr::SnippetMode::Off,
        };
        let line = location.map_or(0, |l| l.line());
        let column = location.map_or(0, |l| l.column());
        // The plain rendering ends with the location, which the error already shows first.
        let message = e.render_with_options(render);
        let suffix = format!(" at line {line}, column {column}");
        let message = message.strip_suffix(&suffix).unwrap_or(&message).to_owned();
        TemplateError::Decode {
            source_name: source_name.to_owned(),
            line,
            column,
            message,
        }
    })
}

/// Applies every file-level rule and builds the templates.
pub(super) fn build(
    file: &TemplatesFile,
    source_name: &str,
) -> Result<BTreeMap<String, Template>, TemplateError> {
    let invalid = |path: String, reason: String| TemplateError::Invalid {
        source_name: source_name.to_owned(),
        path,
        reason,
    };
    if file.templates.is_empty() || file.templates.len() > MAX_TEMPLATES {
        return Err(invalid(
            "templates".into(),
            format!("must define 1 to {MAX_TEMPLATES} template ids"),
        ));
    }
    let total: usize = file.templates.values().map(|t| t.revisions.len()).sum();
    if total > MAX_REVISIONS_TOTAL {
        return Err(invalid(
            "templates".into(),
            format!("{total} revisions in total; at most {MAX_REVISIONS_TOTAL} are allowed"),
        ));
    }
    let mut templates = BTreeMap::new();
    for (id, definition) in &file.templates {
        let template = build_template(id, definition, source_name)?;
        templates.insert(id.clone(), template);
    }
    Ok(templates)
}

fn build_template(
    id: &str,
    definition: &TemplateDefinition,
    source_name: &str,
) -> Result<Template, TemplateError> {
    let invalid = |path: String, reason: String| TemplateError::Invalid {
        source_name: source_name.to_owned(),
        path,
        reason,
    };
    let at = format!("templates.{id}");
    if !is_dns1123_label(id) {
        return Err(invalid(
            at,
            "template id must be a DNS-1123 label (at most 63 of [a-z0-9-], alphanumeric ends)"
                .into(),
        ));
    }
    let count = definition.revisions.len();
    if count == 0 || count > MAX_REVISIONS_PER_TEMPLATE {
        return Err(invalid(
            format!("{at}.revisions"),
            format!("must define 1 to {MAX_REVISIONS_PER_TEMPLATE} revisions"),
        ));
    }
    let mut revisions = BTreeMap::new();
    for (key, written) in &definition.revisions {
        let revision = build_revision(id, key, written, source_name)?;
        revisions.insert(key.clone(), revision);
    }
    check_default(id, definition.default.as_deref(), &revisions)
        .map_err(|reason| invalid(format!("{at}.default"), reason))?;
    let capacity = revisions
        .values()
        .map(|r| r.execution.max_environments())
        .fold(
            u32::try_from(MAX_ENVIRONMENTS).expect("10000 fits"),
            u32::min,
        );
    Ok(Template {
        id: id.to_owned(),
        default: definition.default.clone(),
        revisions,
        capacity,
    })
}

fn build_revision(
    id: &str,
    key: &str,
    written: &RevisionDefinition,
    source_name: &str,
) -> Result<TemplateRevision, TemplateError> {
    let execution =
        written
            .execution
            .validate()
            .map_err(|error| TemplateError::InvalidExecution {
                source_name: source_name.to_owned(),
                template_id: id.to_owned(),
                revision: key.to_owned(),
                field: error.field,
                reason: error.reason,
            })?;
    let expected = canonical_template_revision(&execution);
    if key != expected {
        return Err(TemplateError::RevisionMismatch {
            source_name: source_name.to_owned(),
            template_id: id.to_owned(),
            revision: key.to_owned(),
            expected,
        });
    }
    let display = written
        .display
        .clone()
        .unwrap_or_default()
        .validate()
        .map_err(|error| TemplateError::Invalid {
            source_name: source_name.to_owned(),
            path: format!("templates.{id}.revisions.{key}.display.{}", error.field),
            reason: error.reason,
        })?;
    Ok(TemplateRevision {
        template_id: id.to_owned(),
        digest: template_digest(&execution),
        revision: expected,
        execution,
        deprecated: written.deprecated,
        revoked: written.revoked,
        display,
    })
}

fn check_default(
    id: &str,
    default: Option<&str>,
    revisions: &BTreeMap<String, TemplateRevision>,
) -> Result<(), String> {
    match default {
        Some(default) => match revisions.get(default) {
            Some(revision) if revision.is_selectable() => Ok(()),
            Some(_) => Err(format!(
                "template {id:?} requires an eligible default revision: {default} is deprecated or revoked"
            )),
            None => Err(format!(
                "template {id:?} requires an eligible default revision: {default} is not one of its revisions"
            )),
        },
        None if revisions.values().any(TemplateRevision::is_selectable) => Err(format!(
            "template {id:?} has selectable revisions but no default"
        )),
        None => Ok(()),
    }
}
