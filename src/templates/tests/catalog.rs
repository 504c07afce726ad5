//! The catalog, display tokens and the inventory revision.

use serde_json::json;

use super::*;

#[test]
fn the_catalog_lists_display_data_and_capabilities() {
    let (key, body) = revision(
        base_execution(),
        json!({"display": {
            "name": "Python",
            "description": "A Python sandbox",
            "extensions": {"example.com/tools": {"schema_version": "1", "icon": "snake"}},
        }}),
    );
    let (plain_key, plain_body) =
        revision(execution_with(&[("maxEnvironments", json!(7))]), json!({}));
    let registry = load_value(&file_of(&[
        ("python", template(Some(&key), &[(key.clone(), body)])),
        (
            "plain",
            template(Some(&plain_key), &[(plain_key.clone(), plain_body)]),
        ),
    ]))
    .unwrap();
    let catalog = registry.catalog();
    assert_eq!(catalog.len(), 2);
    let plain = &catalog[0];
    assert_eq!((plain.id.as_str(), plain.name.as_str()), ("plain", "plain"));
    assert_eq!(plain.revision, plain_key);
    assert!(plain.extensions.is_empty());
    let python = &catalog[1];
    assert_eq!(python.id, "python");
    assert_eq!(python.revision, key);
    assert_eq!(python.name, "Python");
    assert_eq!(python.description, "A Python sandbox");
    assert_eq!(python.extensions["example.com/tools/icon"], "snake");
    assert_eq!(python.extensions["example.com/tools/schema_version"], "1");
    assert_eq!(python.capabilities, ["filesystem", "foreground-command"]);
    assert!(revision::is_revision_id(&python.display_token));
    assert_ne!(python.display_token, plain.display_token);
}

#[test]
fn the_display_token_changes_with_display_edits_but_not_with_the_revision() {
    let token = |text: &str| load(text).unwrap().catalog()[0].display_token.clone();
    let original = token(FIXTURE);
    assert_eq!(original, token(FIXTURE));
    assert_ne!(
        original,
        token(&FIXTURE.replace("name: Default sandbox", "name: Default sandbox 2"))
    );
    // A new execution definition with the same display keeps the token.
    let revision = fixture_revision();
    let edited = FIXTURE.replace("maxEnvironments: 100", "maxEnvironments: 99");
    let expected = match load(&edited) {
        Err(TemplateError::RevisionMismatch { expected, .. }) => expected,
        other => panic!("expected a mismatch, got {other:?}"),
    };
    let moved = edited.replace(&revision, &expected);
    assert_eq!(original, token(&moved));
    assert_ne!(load(&moved).unwrap().catalog()[0].revision, revision);
}

#[test]
fn the_inventory_revision_depends_on_the_visible_items() {
    let h = history();
    let all = h.registry.catalog();
    let all_revision = TemplateRegistry::inventory_revision(&all);
    assert_eq!(
        all_revision,
        TemplateRegistry::inventory_revision(&h.registry.catalog())
    );
    assert!(revision::is_revision_id(&all_revision));
    let hidden = TemplateRegistry::inventory_revision(&[]);
    assert!(revision::is_revision_id(&hidden));
    assert_ne!(all_revision, hidden);
    let mut renamed = all.clone();
    renamed[0].name.push('!');
    assert_ne!(all_revision, TemplateRegistry::inventory_revision(&renamed));
    insta::assert_snapshot!("inventory_revision_of_nothing", hidden);
}
