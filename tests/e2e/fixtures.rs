//! What the provider is configured with in the suite: a development PKI and security manifest
//! (made by the same code as `dev`'s state directory) and a template catalogue whose
//! templates, `default` and `manual` (the same with `recovery: manual`), use the cluster's
//! storage class (kwok's `kwok-volume` here, kind's `standard` there) and a RuntimeClass the
//! suite creates, with the canonical revision ids computed by the crate.

use std::path::{Path, PathBuf};

use execution_provider::cli::state_dir::StateDir;
use execution_provider::templates::revision::canonical_template_revision;
use execution_provider::templates::spec::ProfileSpec;

/// The RuntimeClass the suite's template names (handler `runc`; kwok ignores it).
pub const RUNTIME_CLASS: &str = "e2e-runc";

/// The storage class of the suite's template: `E2E_STORAGE_CLASS`, else kwok's provisioner.
pub fn storage_class() -> String {
    std::env::var("E2E_STORAGE_CLASS").unwrap_or_else(|_| "kwok-volume".to_owned())
}

/// The executor image of the suite's template: `E2E_EXECUTOR_IMAGE` (kind loads a real one),
/// else a digest-pinned name that kwok never pulls.
pub fn executor_image() -> String {
    std::env::var("E2E_EXECUTOR_IMAGE").unwrap_or_else(|_| {
        format!(
            "registry.invalid/execution/executor@sha256:{}",
            "0123456789abcdef".repeat(4)
        )
    })
}

/// The `execution:` block of the suite's template.
pub fn execution_yaml() -> String {
    execution_yaml_for(&executor_image(), &storage_class(), RUNTIME_CLASS)
}

/// An `execution:` block with the suite's limits and the given image, storage class and
/// RuntimeClass.
pub fn execution_yaml_for(image: &str, class: &str, runtime_class: &str) -> String {
    format!(
        "image: {image}\nstorageClass: {class}\nstorageSize: 1Gi\ncpuRequest: 50m\ncpuLimit: \"1\"\n\
         memoryRequest: 64Mi\nmemoryLimit: 512Mi\nephemeralStorageRequest: 64Mi\n\
         ephemeralStorageLimit: 1Gi\ntmpSizeLimit: 64Mi\nruntimeClassName: {runtime_class}\n\
         maxFileBytes: 5242880\nmaxCommandBytes: 1048576\nmaxCommandDuration: 1m\n\
         maxEnvironments: 20\n",
    )
}

/// The template whose revision sets `recovery: manual`: a fenced environment of it stays
/// fenced until an administrator walks the manual path (docs/operating.md §7.1).
pub const MANUAL_TEMPLATE: &str = "manual";

/// One template of the catalogue: `id` with one revision of `execution`, keyed as the crate
/// computes it.
fn template_yaml(id: &str, description: &str, execution: &str) -> String {
    let spec: ProfileSpec = serde_saphyr::from_str(execution).expect("the e2e execution block");
    let revision = canonical_template_revision(&spec.validate().expect("a valid execution block"));
    let indented: String = execution
        .lines()
        .map(|line| format!("          {line}\n"))
        .collect();
    format!(
        "  {id}:\n    default: {revision}\n    revisions:\n      {revision}:\n        \
         display:\n          name: End-to-end sandbox\n          description: {description}\n        \
         execution:\n{indented}"
    )
}

/// The suite's template catalogue, with the revision keys the crate computes: `default`
/// (automatic recovery, the default) and [`MANUAL_TEMPLATE`].
pub fn templates_yaml() -> String {
    templates_yaml_for(&execution_yaml())
}

/// A catalogue of `default` and [`MANUAL_TEMPLATE`] over one `execution:` block.
pub fn templates_yaml_for(execution: &str) -> String {
    let execution = execution.to_owned();
    let manual = format!("{execution}recovery: manual\n");
    format!(
        "templates:\n{}{}",
        template_yaml("default", "The e2e suite's template.", &execution),
        template_yaml(
            MANUAL_TEMPLATE,
            "The e2e suite's template with manual recovery.",
            &manual
        ),
    )
}

/// A provider's configuration files: PKI, security manifest, supervisor key and templates.
pub struct ProviderFiles {
    pub state: StateDir,
}

impl ProviderFiles {
    /// Creates them in the empty or absent directory `dir`, with the template catalogue
    /// `templates` (a [`templates_yaml_for`]).
    pub fn create(dir: &Path, templates: &str) -> Self {
        let state = StateDir::open_or_init(dir).expect("a fresh state directory");
        std::fs::write(state.templates_path(), templates).unwrap();
        allow_every_template(&state.manifest_path());
        let files = Self { state };
        let mut key = [0u8; 32];
        execution_provider::runtime::IdSource::fill(&execution_provider::runtime::OsIds, &mut key);
        std::fs::write(files.supervisor_key(), key).unwrap();
        files
    }

    /// The supervisor key `K_sup` every `serve` of the test shares (docs/commands.md §4.2).
    pub fn supervisor_key(&self) -> PathBuf {
        self.state.security_dir().join("supervisor.key")
    }

    pub fn templates(&self) -> PathBuf {
        self.state.templates_path()
    }

    pub fn security_dir(&self) -> PathBuf {
        self.state.security_dir()
    }

    pub fn manifest(&self) -> PathBuf {
        self.state.manifest_path()
    }
}

/// The state directory's manifest offers its client the `default` template only; the suite's
/// client may also use [`MANUAL_TEMPLATE`].
fn allow_every_template(manifest: &Path) {
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(manifest).unwrap()).unwrap();
    for client in json["clients"].as_array_mut().expect("clients") {
        if let Some(templates) = client["executionTemplates"].as_array_mut() {
            templates.push(MANUAL_TEMPLATE.into());
        }
    }
    std::fs::write(manifest, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
}

pub fn the_suite_template_catalogue_loads_with_the_revision_the_crate_computes() {
    let registry = execution_provider::templates::TemplateRegistry::from_yaml_str(
        &templates_yaml(),
        "e2e templates",
    )
    .expect("the catalogue loads");
    let default = registry.default_template("default").unwrap();
    assert_eq!(default.execution().runtime_class_name(), RUNTIME_CLASS);
    assert!(default.revision().starts_with("v1-"));
    assert_eq!(
        default.execution().recovery(),
        execution_provider::templates::RecoveryMode::Automatic
    );
    let manual = registry.default_template(MANUAL_TEMPLATE).unwrap();
    assert_eq!(
        manual.execution().recovery(),
        execution_provider::templates::RecoveryMode::Manual
    );
    assert_ne!(manual.revision(), default.revision());
}
