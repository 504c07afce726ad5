//! Registry semantics: selection, retention, fencing, capacity, profiles, preflight sets.

use serde_json::json;

use super::*;

#[test]
fn capacity_is_the_minimum_across_revisions() {
    let h = history();
    assert_eq!(h.registry.capacity("default"), Some(10));
    assert_eq!(h.registry.templates()["default"].capacity(), 10);
    assert_eq!(h.registry.capacity("retired"), Some(100));
    assert_eq!(h.registry.capacity("unknown"), None);
}

#[test]
fn a_deprecated_revision_is_retained_but_not_selectable() {
    let h = history();
    let retained = h
        .registry
        .retained_revision("default", &h.deprecated)
        .unwrap();
    assert!(retained.is_deprecated());
    assert_eq!(
        h.registry.select_revision("default", &h.deprecated),
        Err(LookupError::Deprecated {
            template_id: "default".into(),
            revision: h.deprecated.clone(),
        })
    );
    let digest = retained.digest().to_owned();
    assert!(
        h.registry
            .for_environment("default", &h.deprecated, &digest)
            .is_ok()
    );
    assert!(!h.registry.is_revoked("default", &h.deprecated, &digest));
    assert!(h.registry.select_revision("default", &h.current).is_ok());
}

#[test]
fn a_revoked_revision_is_neither_retained_nor_selectable() {
    let h = history();
    let revoked = LookupError::Revoked {
        template_id: "default".into(),
        revision: h.revoked.clone(),
    };
    assert_eq!(
        h.registry.select_revision("default", &h.revoked),
        Err(revoked.clone())
    );
    assert_eq!(
        h.registry.retained_revision("default", &h.revoked),
        Err(revoked)
    );
    let digest = format!("sha256:{}", &h.revoked[3..]);
    assert!(h.registry.is_revoked("default", &h.revoked, &digest));
}

#[test]
fn unknown_templates_and_revisions_are_not_found() {
    let h = history();
    assert_eq!(
        h.registry.select_revision("nope", &h.current),
        Err(LookupError::UnknownTemplate {
            template_id: "nope".into()
        })
    );
    for revision in ["", "v1-", &("v1-".to_owned() + &"c".repeat(64))] {
        assert_eq!(
            h.registry.retained_revision("default", revision),
            Err(LookupError::UnknownRevision {
                template_id: "default".into(),
                revision: revision.into(),
            })
        );
    }
}

#[test]
fn an_environment_is_fenced_when_its_recorded_digest_differs() {
    let h = history();
    let current = h.registry.select_revision("default", &h.current).unwrap();
    let digest = current.digest().to_owned();
    assert!(
        h.registry
            .for_environment("default", &h.current, &digest)
            .is_ok()
    );
    let other = format!("sha256:{}", "d".repeat(64));
    assert!(matches!(
        h.registry.for_environment("default", &h.current, &other),
        Err(LookupError::DigestMismatch { .. })
    ));
    assert!(h.registry.is_revoked("default", &h.current, &other));
    assert!(h.registry.is_revoked("removed", &h.current, &digest));
}

#[test]
fn a_template_made_only_of_history_is_never_in_the_catalog() {
    let h = history();
    assert_eq!(h.registry.default_revision("retired"), None);
    assert_eq!(
        h.registry.default_template("retired"),
        Err(LookupError::NoDefault {
            template_id: "retired".into()
        })
    );
    let ids: Vec<String> = h
        .registry
        .catalog()
        .into_iter()
        .map(|item| item.id)
        .collect();
    assert_eq!(ids, ["default"]);

    // A lone deprecated revision: retained, no default, empty catalog.
    let (key, body) = revision(base_execution(), json!({"deprecated": true}));
    let lone = load_value(&file_of(&[(
        "default",
        template(None, &[(key.clone(), body)]),
    )]))
    .unwrap();
    assert!(lone.catalog().is_empty());
    assert!(lone.retained_revision("default", &key).is_ok());
    assert!(lone.select_revision("default", &key).is_err());
    assert!(lone.profile("default").is_err());
}

#[test]
fn profiles_are_templates_through_their_default_revision() {
    let registry = fixture();
    let profile = registry.profile("default").unwrap();
    assert_eq!(profile.revision(), fixture_revision());
    assert_eq!(profile.capabilities(), ["filesystem", "foreground-command"]);
    for name in ["", "a/b", "a\\b", "/default"] {
        assert_eq!(
            registry.profile(name),
            Err(LookupError::InvalidProfileName { name: name.into() })
        );
    }
    assert_eq!(
        registry.profile("other"),
        Err(LookupError::UnknownTemplate {
            template_id: "other".into()
        })
    );
}

#[test]
fn cluster_resources_name_every_revision_including_history() {
    let resources = history().registry.cluster_resources();
    assert_eq!(
        resources.runtime_classes.into_iter().collect::<Vec<_>>(),
        ["gvisor", "kata"]
    );
    assert_eq!(
        resources.storage_classes.into_iter().collect::<Vec<_>>(),
        ["fast", "standard"]
    );
}
