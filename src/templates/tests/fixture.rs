//! The fixture files: they load, their revision keys are canonical, edits behave.

use super::*;

#[test]
fn the_fixture_loads_with_its_canonical_revision_as_default() {
    let registry = fixture();
    let revision = registry.default_template("default").unwrap();
    assert_eq!(revision.revision(), fixture_revision());
    assert_eq!(
        revision.revision(),
        canonical_template_revision(revision.execution())
    );
    assert_eq!(
        revision.digest(),
        format!("sha256:{}", &revision.revision()[3..])
    );
    let spec = revision.execution();
    assert_eq!(spec.runtime_class_name(), "gvisor");
    assert_eq!(spec.storage_class(), "standard");
    assert_eq!(spec.cpu_request(), &Quantity::parse("0.1").unwrap());
    assert_eq!(spec.max_command_duration_millis(), 300_000);
    assert_eq!(spec.max_file_bytes(), 5_242_880);
    assert_eq!(spec.max_command_bytes(), 1_048_576);
    assert_eq!(registry.capacity("default"), Some(100));
    assert_eq!(revision.display().name, "Default sandbox");
}

#[test]
fn a_one_character_change_to_any_execution_field_changes_the_revision() {
    let original = fixture_revision();
    let edits = [
        ("0442723", "0442724"),
        ("storageClass: standard", "storageClass: standarc"),
        ("storageSize: 1Gi", "storageSize: 2Gi"),
        ("cpuRequest: 100m", "cpuRequest: 200m"),
        ("cpuLimit: \"1\"", "cpuLimit: \"2\""),
        ("memoryRequest: 128Mi", "memoryRequest: 129Mi"),
        ("memoryLimit: 512Mi", "memoryLimit: 511Mi"),
        (
            "ephemeralStorageRequest: 256Mi",
            "ephemeralStorageRequest: 255Mi",
        ),
        ("ephemeralStorageLimit: 1Gi", "ephemeralStorageLimit: 2Gi"),
        ("tmpSizeLimit: 64Mi", "tmpSizeLimit: 65Mi"),
        ("runtimeClassName: gvisor", "runtimeClassName: gvisos"),
        ("maxFileBytes: 5242880", "maxFileBytes: 5242879"),
        ("maxCommandBytes: 1048576", "maxCommandBytes: 1048575"),
        ("maxCommandDuration: 5m", "maxCommandDuration: 6m"),
        ("maxEnvironments: 100", "maxEnvironments: 101"),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for (from, to) in edits {
        assert_eq!(FIXTURE.matches(from).count(), 1, "{from} occurs once");
        let err = load(&FIXTURE.replace(from, to)).unwrap_err();
        let TemplateError::RevisionMismatch {
            revision, expected, ..
        } = &err
        else {
            panic!("{from} -> {to}: expected a revision mismatch, got {err}");
        };
        assert_eq!(revision, &original);
        assert_ne!(expected, &original);
        assert!(
            seen.insert(expected.clone()),
            "{from} -> {to} gave a repeated id"
        );
        assert!(
            err.to_string()
                .contains("revision does not match canonical execution definition: expected v1-")
        );
        // Recomputing the key makes the edited file load again.
        let fixed = FIXTURE.replace(from, to).replace(&original, expected);
        assert!(
            load(&fixed).is_ok(),
            "{from} -> {to} loads once the key is updated"
        );
    }
}

#[test]
fn display_and_policy_edits_keep_the_revision() {
    let original = fixture();
    let renamed =
        load(&FIXTURE.replace("name: Default sandbox", "name: Default sandbox 2")).unwrap();
    let described =
        load(&FIXTURE.replace("description: A gVisor", "description: The gVisor")).unwrap();
    for edited in [&renamed, &described] {
        assert_eq!(
            edited.default_revision("default"),
            original.default_revision("default")
        );
        assert_eq!(
            edited.default_template("default").unwrap().digest(),
            original.default_template("default").unwrap().digest()
        );
    }
    let revision = fixture_revision();
    let deprecated = FIXTURE
        .replace(&format!("    default: {revision}\n"), "")
        .replace(
            "        display:\n",
            "        deprecated: true\n        display:\n",
        );
    let deprecated = load(&deprecated).unwrap();
    let kept = deprecated.retained_revision("default", &revision).unwrap();
    assert!(kept.is_deprecated());
    assert_eq!(kept.revision(), revision);
    let revoked = FIXTURE
        .replace(&format!("    default: {revision}\n"), "")
        .replace(
            "        display:\n",
            "        revoked: true\n        display:\n",
        );
    let revoked = load(&revoked).unwrap();
    assert!(revoked.templates()["default"].revisions()[&revision].is_revoked());
}

#[test]
fn the_fixture_files_load_or_fail_as_their_names_say() {
    let dir = format!("{FIXTURE_DIR}/templates");
    let history = TemplateRegistry::load(format!("{dir}/history.yaml")).unwrap();
    assert_eq!(history.templates().len(), 3);
    assert_eq!(
        history.default_revision("default"),
        Some(fixture_revision().as_str())
    );
    assert_eq!(history.default_revision("retired"), None);
    assert_eq!(history.capacity("default"), Some(50));
    let ids: Vec<String> = history.catalog().into_iter().map(|item| item.id).collect();
    assert_eq!(ids, ["default", "scheduled"]);
    let scheduled = history.default_template("scheduled").unwrap().execution();
    assert_eq!(
        scheduled.image_pull_secrets(),
        ["registry-creds", "mirror.creds"]
    );
    assert_eq!(scheduled.tolerations().len(), 2);
    assert_eq!(scheduled.node_selector().len(), 2);

    for (name, needle) in [
        ("legacy-profiles.yaml", "unknown field `profiles`"),
        (
            "unknown-nested-field.yaml",
            "unknown field `tolerationSecond`",
        ),
        (
            "wrong-revision.yaml",
            "revision does not match canonical execution definition: expected v1-",
        ),
    ] {
        let path = format!("{dir}/{name}");
        let err = TemplateRegistry::load(&path).unwrap_err().to_string();
        assert!(err.contains(needle), "{name}: {err}");
        assert!(err.contains(&path), "{name} names the file: {err}");
    }
}

#[test]
fn a_missing_file_is_a_read_error_naming_the_file() {
    let err = TemplateRegistry::load("/nonexistent/templates.yaml").unwrap_err();
    assert!(matches!(err, TemplateError::Read { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/templates.yaml"));
}

/// Prints the canonical key of every revision in the fixture files, for updating them after an
/// execution edit: `cargo test --lib templates::tests::fixture::print -- --ignored --nocapture`.
#[test]
#[ignore = "a helper for updating fixtures, not a test"]
fn print_canonical_revisions_of_fixture_files() {
    let mut paths = vec![format!("{FIXTURE_DIR}/templates.yaml")];
    let mut more: Vec<String> = std::fs::read_dir(format!("{FIXTURE_DIR}/templates"))
        .unwrap()
        .map(|entry| entry.unwrap().path().display().to_string())
        .collect();
    more.sort();
    paths.extend(more);
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let Ok(decoded) = file::decode(&text, &path) else {
            continue;
        };
        for (id, definition) in &decoded.templates {
            for (key, written) in &definition.revisions {
                if let Ok(spec) = written.execution.validate() {
                    let canonical = canonical_template_revision(&spec);
                    println!("{path} {id} {key} -> {canonical}");
                }
            }
        }
    }
}
