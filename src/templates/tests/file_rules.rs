//! File-level rules: revision keys, defaults, ids, counts, display data.

use serde_json::{Value, json};

use super::*;

#[test]
fn a_wrong_revision_key_is_rejected_naming_the_expected_id() {
    let revision = fixture_revision();
    let wrong = "v1-".to_owned() + &"a".repeat(64);
    let err = load(&FIXTURE.replace(&revision, &wrong)).unwrap_err();
    assert_eq!(
        err,
        TemplateError::RevisionMismatch {
            source_name: "test.yaml".into(),
            template_id: "default".into(),
            revision: wrong.clone(),
            expected: revision.clone(),
        }
    );
    assert!(err.to_string().ends_with(&format!(
        "revision does not match canonical execution definition: expected {revision}"
    )));
    // The old `sha256:` key style is wrong too.
    let old_style = FIXTURE.replace(&revision, &format!("sha256:{}", &revision[3..]));
    assert!(matches!(
        load(&old_style),
        Err(TemplateError::RevisionMismatch { .. })
    ));
}

#[test]
fn the_default_must_name_an_eligible_revision() {
    let (current, current_body) = revision(base_execution(), json!({}));
    let (old, deprecated_body) = revision(
        execution_with(&[("maxEnvironments", json!(50))]),
        json!({"deprecated": true}),
    );
    let (gone, revoked_body) = revision(
        execution_with(&[("maxEnvironments", json!(10))]),
        json!({"revoked": true}),
    );
    let revisions = [
        (current.clone(), current_body),
        (old.clone(), deprecated_body),
        (gone.clone(), revoked_body),
    ];
    assert!(
        load_value(&file_of(&[(
            "default",
            template(Some(&current), &revisions)
        )]))
        .is_ok()
    );
    let missing = "v1-".to_owned() + &"b".repeat(64);
    for default in [&old, &gone, &missing] {
        let err = load_value(&file_of(&[(
            "default",
            template(Some(default), &revisions),
        )]))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("requires an eligible default revision"),
            "{err}"
        );
        assert!(
            matches!(err, TemplateError::Invalid { ref path, .. } if path == "templates.default.default")
        );
    }
}

#[test]
fn selectable_revisions_without_a_default_are_rejected() {
    let (key, body) = revision(base_execution(), json!({}));
    let err = load_value(&file_of(&[("default", template(None, &[(key, body)]))])).unwrap_err();
    assert!(
        err.to_string()
            .contains("has selectable revisions but no default"),
        "{err}"
    );
}

#[test]
fn template_ids_must_be_dns_labels() {
    let (key, body) = revision(base_execution(), json!({}));
    for id in ["Default", "-a", "a_b", "a.b", &"x".repeat(64), ""] {
        let file = file_of(&[(id, template(Some(&key), &[(key.clone(), body.clone())]))]);
        let err = load_value(&file).unwrap_err();
        assert!(err.to_string().contains("DNS-1123 label"), "{id}: {err}");
    }
    let file = file_of(&[(
        &"x".repeat(63),
        template(Some(&key), &[(key.clone(), body)]),
    )]);
    assert!(load_value(&file).is_ok());
}

/// `count` distinct valid revisions, all selectable.
fn distinct_revisions(count: usize, offset: usize) -> Vec<(String, Value)> {
    (0..count)
        .map(|i| {
            revision(
                execution_with(&[("maxEnvironments", json!(i + offset + 1))]),
                json!({}),
            )
        })
        .collect()
}

#[test]
fn template_and_revision_counts_are_bounded() {
    assert!(
        load("templates: {}\n")
            .unwrap_err()
            .to_string()
            .contains("1 to 64 template ids")
    );
    let empty = file_of(&[("default", json!({"revisions": {}}))]);
    assert!(
        load_value(&empty)
            .unwrap_err()
            .to_string()
            .contains("1 to 32 revisions")
    );

    let at_limit = distinct_revisions(32, 0);
    let ok = file_of(&[("default", template(Some(&at_limit[0].0), &at_limit))]);
    assert!(load_value(&ok).is_ok());
    let over = distinct_revisions(33, 0);
    let err = load_value(&file_of(&[("default", template(Some(&over[0].0), &over))])).unwrap_err();
    assert!(err.to_string().contains("1 to 32 revisions"), "{err}");

    let first = distinct_revisions(32, 0);
    let second = distinct_revisions(32, 32);
    let third = distinct_revisions(1, 64);
    let two = file_of(&[
        ("a", template(Some(&first[0].0), &first)),
        ("b", template(Some(&second[0].0), &second)),
    ]);
    assert!(load_value(&two).is_ok());
    let three = file_of(&[
        ("a", template(Some(&first[0].0), &first)),
        ("b", template(Some(&second[0].0), &second)),
        ("c", template(Some(&third[0].0), &third)),
    ]);
    let err = load_value(&three).unwrap_err();
    assert!(err.to_string().contains("at most 64"), "{err}");

    let (key, body) = revision(base_execution(), json!({}));
    let ids: Vec<String> = (0..65).map(|i| format!("t{i}")).collect();
    let many: Vec<(&str, Value)> = ids
        .iter()
        .map(|id| {
            (
                id.as_str(),
                template(Some(&key), &[(key.clone(), body.clone())]),
            )
        })
        .collect();
    let err = load_value(&file_of(&many)).unwrap_err();
    assert!(err.to_string().contains("1 to 64 template ids"), "{err}");
}

#[test]
fn display_rules_are_checked_at_load() {
    let long_name = revision(
        base_execution(),
        json!({"display": {"name": "n".repeat(121)}}),
    );
    let err = load_value(&file_of(&[(
        "default",
        template(Some(&long_name.0), std::slice::from_ref(&long_name)),
    )]))
    .unwrap_err();
    assert!(err.to_string().contains("display.name"), "{err}");
    let no_version = revision(
        base_execution(),
        json!({"display": {"extensions": {"example.com/tools": {"icon": "box"}}}}),
    );
    let err = load_value(&file_of(&[(
        "default",
        template(Some(&no_version.0), std::slice::from_ref(&no_version)),
    )]))
    .unwrap_err();
    assert!(
        err.to_string().contains("schema_version is required"),
        "{err}"
    );
}
