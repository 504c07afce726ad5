//! Loading and registry behaviour, against the fixtures and against files built in the tests.
//!
//! Files built here are JSON text (YAML is a superset of JSON), so revision keys can be computed
//! from the same values; tests about line and column use hand-written block YAML.

use serde_json::{Value, json};

use super::*;

mod catalog;
mod decoding;
mod file_rules;
mod fixture;
mod registry;
mod revision_props;
mod spec_rules;

pub(super) const FIXTURE: &str = include_str!("../../../fixtures/templates.yaml");
pub(super) const FIXTURE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");

pub(super) fn fixture() -> TemplateRegistry {
    TemplateRegistry::from_yaml_str(FIXTURE, "templates.yaml").expect("the fixture loads")
}

pub(super) fn fixture_revision() -> String {
    fixture()
        .default_revision("default")
        .expect("the fixture has a default")
        .to_owned()
}

pub(super) fn load(text: &str) -> Result<TemplateRegistry, TemplateError> {
    TemplateRegistry::from_yaml_str(text, "test.yaml")
}

pub(super) fn load_value(file: &Value) -> Result<TemplateRegistry, TemplateError> {
    load(&file.to_string())
}

pub(super) fn base_execution() -> Value {
    json!({
        "image": "registry.example/execution/executor@sha256:acfcf802c681edf0945df6c6a3e68756f46abe4659774d022082ec45d0442723",
        "storageClass": "standard",
        "storageSize": "1Gi",
        "cpuRequest": "100m",
        "cpuLimit": "1",
        "memoryRequest": "128Mi",
        "memoryLimit": "512Mi",
        "ephemeralStorageRequest": "256Mi",
        "ephemeralStorageLimit": "1Gi",
        "tmpSizeLimit": "64Mi",
        "runtimeClassName": "gvisor",
        "maxFileBytes": 5242880,
        "maxCommandBytes": 1048576,
        "maxCommandDuration": "5m",
        "maxEnvironments": 100
    })
}

/// The base execution with some fields replaced (`null` removes a field).
pub(super) fn execution_with(changes: &[(&str, Value)]) -> Value {
    let mut execution = base_execution();
    let object = execution.as_object_mut().expect("an object");
    for (field, value) in changes {
        if value.is_null() {
            object.remove(*field);
        } else {
            object.insert((*field).to_owned(), value.clone());
        }
    }
    execution
}

pub(super) fn key_of(execution: &Value) -> String {
    let spec: ProfileSpec = serde_json::from_value(execution.clone()).expect("a profile spec");
    canonical_template_revision(&spec.validate().expect("a valid profile spec"))
}

/// A revision entry: its canonical key and body (`extra` merges policy and display).
pub(super) fn revision(execution: Value, extra: Value) -> (String, Value) {
    let key = key_of(&execution);
    let mut body = json!({ "execution": execution });
    if let Value::Object(extra) = extra {
        body.as_object_mut().expect("an object").extend(extra);
    }
    (key, body)
}

pub(super) fn template(default: Option<&str>, revisions: &[(String, Value)]) -> Value {
    let revisions: serde_json::Map<String, Value> = revisions.iter().cloned().collect();
    match default {
        Some(default) => json!({ "default": default, "revisions": revisions }),
        None => json!({ "revisions": revisions }),
    }
}

pub(super) fn file_of(templates: &[(&str, Value)]) -> Value {
    let templates: serde_json::Map<String, Value> = templates
        .iter()
        .map(|(id, t)| ((*id).to_owned(), t.clone()))
        .collect();
    json!({ "templates": templates })
}

/// A one-template file whose default is its only revision.
pub(super) fn single(execution: Value) -> Value {
    let (key, body) = revision(execution, json!({}));
    file_of(&[("default", template(Some(&key), &[(key.clone(), body)]))])
}

/// A one-template file with an execution that may be invalid (so no canonical key exists).
pub(super) fn single_unchecked(execution: Value) -> Value {
    let key = "v1-".to_owned() + &"0".repeat(64);
    let body = json!({ "execution": execution });
    file_of(&[("default", template(Some(&key), &[(key.clone(), body)]))])
}

pub(super) fn decode_error(result: Result<TemplateRegistry, TemplateError>) -> (u64, u64, String) {
    match result {
        Err(TemplateError::Decode {
            line,
            column,
            message,
            ..
        }) => (line, column, message),
        other => panic!("expected a decode error, got {other:?}"),
    }
}

/// A template with a current, a deprecated and a revoked revision, and one made only of
/// history.
pub(super) struct History {
    pub(super) registry: TemplateRegistry,
    pub(super) current: String,
    pub(super) deprecated: String,
    pub(super) revoked: String,
}

pub(super) fn history() -> History {
    let (current, current_body) = revision(base_execution(), json!({}));
    let (deprecated, deprecated_body) = revision(
        execution_with(&[("maxEnvironments", json!(50))]),
        json!({"deprecated": true}),
    );
    let (revoked, revoked_body) = revision(
        execution_with(&[("maxEnvironments", json!(10))]),
        json!({"revoked": true}),
    );
    let (old, old_body) = revision(
        execution_with(&[
            ("runtimeClassName", json!("kata")),
            ("storageClass", json!("fast")),
        ]),
        json!({"revoked": true}),
    );
    let file = file_of(&[
        (
            "default",
            template(
                Some(&current),
                &[
                    (current.clone(), current_body),
                    (deprecated.clone(), deprecated_body),
                    (revoked.clone(), revoked_body),
                ],
            ),
        ),
        ("retired", template(None, &[(old, old_body)])),
    ]);
    History {
        registry: load_value(&file).unwrap(),
        current,
        deprecated,
        revoked,
    }
}
