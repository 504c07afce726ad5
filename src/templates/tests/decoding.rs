//! Strict YAML decoding: unknown fields, the legacy key, types; errors carry line and column.

use super::*;

#[test]
fn unknown_top_level_fields_are_rejected_with_line_and_column() {
    let text = format!("{FIXTURE}extra: true\n");
    let line = u64::try_from(text.lines().count()).unwrap();
    let (at_line, column, message) = decode_error(load(&text));
    assert_eq!((at_line, column), (line, 1), "{message}");
    assert!(message.contains("extra"), "{message}");
    let err = load(&text).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("decode execution templates test.yaml:{line}:1: ")),
        "{err}"
    );
}

#[test]
fn unknown_nested_fields_are_rejected_with_line_and_column() {
    let revision = fixture_revision();
    let cases = [
        // (inserted after this line, inserted text, field, column)
        ("  default:\n", "    colour: blue\n", "colour", 5),
        (
            "        execution:\n",
            "          cpuRequests: 1\n",
            "cpuRequests",
            11,
        ),
        ("        display:\n", "          title: x\n", "title", 11),
        (
            &format!("      {revision}:\n") as &str,
            "        retired: true\n",
            "retired",
            9,
        ),
    ];
    for (after, inserted, field, column) in cases {
        assert_eq!(FIXTURE.matches(after).count(), 1, "{after}");
        let text = FIXTURE.replace(after, &format!("{after}{inserted}"));
        let line = text[..text.find(inserted).unwrap()].lines().count() + 1;
        let (at_line, at_column, message) = decode_error(load(&text));
        assert_eq!(
            (at_line, at_column),
            (u64::try_from(line).unwrap(), column),
            "{field}: {message}"
        );
        assert!(message.contains(field), "{message}");
    }
    // Tolerations are strict too.
    let text = FIXTURE.replace(
        "          maxEnvironments: 100\n",
        "          maxEnvironments: 100\n          tolerations:\n          - operator: Exists\n            tolerationSecond: 5\n",
    );
    let (line, column, message) = decode_error(load(&text));
    assert_eq!(
        (line, column),
        (u64::try_from(text.lines().count()).unwrap(), 13),
        "{message}"
    );
    assert!(message.contains("tolerationSecond"), "{message}");
}

#[test]
fn the_legacy_profiles_key_is_rejected() {
    let text = "profiles:\n  default:\n    image: x\n";
    let (line, column, message) = decode_error(load(text));
    assert_eq!((line, column), (1, 1));
    assert!(message.contains("profiles"), "{message}");
    let err = load(text).unwrap_err().to_string();
    assert!(
        err.starts_with("decode execution templates test.yaml"),
        "{err}"
    );
}

#[test]
fn wrong_types_missing_fields_and_duplicate_keys_are_decode_errors() {
    for text in [
        "",
        "templates: []\n",
        "templates:\n  default: {}\n",
        &FIXTURE.replace("maxEnvironments: 100", "maxEnvironments: many"),
        &FIXTURE.replace("          maxEnvironments: 100\n", ""),
        &FIXTURE.replace(
            "          maxEnvironments: 100\n",
            "          maxEnvironments: 100\n          maxEnvironments: 100\n",
        ),
        &FIXTURE.replace(
            "          maxEnvironments: 100\n",
            "          maxEnvironments: 100\n          imagePullSecrets: creds\n",
        ),
        &FIXTURE.replace(
            "          maxEnvironments: 100\n",
            "          maxEnvironments: 100\n          imagePullSecret: [creds]\n",
        ),
        &FIXTURE.replace(
            "        display:\n",
            "        deprecated: yes\n        display:\n",
        ),
        &FIXTURE.replace("runtimeClassName: gvisor", "runtimeClassName: ~"),
    ] {
        assert!(
            matches!(load(text), Err(TemplateError::Decode { .. })),
            "{text:?} should not decode: {:?}",
            load(text)
        );
    }
}
