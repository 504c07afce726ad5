//! Display data of a revision: inert text shown in the catalog, never authority, never part of
//! the revision id.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::names::is_qualified_name;

/// Longest display name, in bytes.
pub const MAX_NAME_BYTES: usize = 120;
/// Longest display description, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 1024;
/// Most extension namespaces per revision.
pub const MAX_EXTENSION_NAMESPACES: usize = 8;
/// Longest extension namespace, in bytes.
pub const MAX_NAMESPACE_BYTES: usize = 238;
/// Most fields per extension namespace, `schema_version` included.
pub const MAX_EXTENSION_FIELDS: usize = 16;
/// Longest flattened extension key (`namespace/key`), in bytes.
pub const MAX_FLATTENED_KEY_BYTES: usize = 253;
/// Longest extension value, in bytes.
pub const MAX_EXTENSION_VALUE_BYTES: usize = 256;
/// The field every extension namespace must carry, with the value [`EXTENSION_SCHEMA_VERSION`].
pub const SCHEMA_VERSION_KEY: &str = "schema_version";
/// The only extension schema version.
pub const EXTENSION_SCHEMA_VERSION: &str = "1";

/// The `display:` block as written.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisplaySpec {
    /// Human-readable name.
    #[serde(default)]
    pub name: Option<String>,
    /// Human-readable description.
    #[serde(default)]
    pub description: Option<String>,
    /// Namespaced key/value data for clients: namespace → key → value.
    #[serde(default)]
    pub extensions: Option<BTreeMap<String, BTreeMap<String, String>>>,
}

/// Validated display data. Extensions are flattened to `namespace/key` → value, with
/// `namespace/schema_version` included.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TemplateDisplay {
    /// Human-readable name (may be empty).
    pub name: String,
    /// Human-readable description (may be empty).
    pub description: String,
    /// Flattened extensions.
    pub extensions: BTreeMap<String, String>,
}

/// A display rule that is broken: the field (relative to `display`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisplayError {
    /// E.g. `name` or `extensions["example.com/tools"].schema_version`.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

fn refuse<T>(field: impl Into<String>, reason: impl Into<String>) -> Result<T, DisplayError> {
    Err(DisplayError {
        field: field.into(),
        reason: reason.into(),
    })
}

impl DisplaySpec {
    /// Checks the display bounds of k8s-executor §3.1 and flattens the extensions.
    pub fn validate(&self) -> Result<TemplateDisplay, DisplayError> {
        let name = self.name.clone().unwrap_or_default();
        let description = self.description.clone().unwrap_or_default();
        if name.len() > MAX_NAME_BYTES {
            return refuse("name", format!("longer than {MAX_NAME_BYTES} bytes"));
        }
        if description.len() > MAX_DESCRIPTION_BYTES {
            return refuse(
                "description",
                format!("longer than {MAX_DESCRIPTION_BYTES} bytes"),
            );
        }
        let mut extensions = BTreeMap::new();
        let namespaces = self.extensions.clone().unwrap_or_default();
        if namespaces.len() > MAX_EXTENSION_NAMESPACES {
            return refuse(
                "extensions",
                format!("at most {MAX_EXTENSION_NAMESPACES} namespaces"),
            );
        }
        for (namespace, fields) in &namespaces {
            validate_namespace(namespace, fields)?;
            for (key, value) in fields {
                extensions.insert(format!("{namespace}/{key}"), value.clone());
            }
        }
        Ok(TemplateDisplay {
            name,
            description,
            extensions,
        })
    }
}

fn validate_namespace(
    namespace: &str,
    fields: &BTreeMap<String, String>,
) -> Result<(), DisplayError> {
    let at = format!("extensions[{namespace:?}]");
    if namespace.len() > MAX_NAMESPACE_BYTES {
        return refuse(
            at,
            format!("namespace longer than {MAX_NAMESPACE_BYTES} bytes"),
        );
    }
    if !namespace.contains('/') || !is_qualified_name(namespace) {
        return refuse(
            at,
            "namespace must be a qualified name <dns-subdomain>/<name>",
        );
    }
    if fields.is_empty() || fields.len() > MAX_EXTENSION_FIELDS {
        return refuse(
            at,
            format!("must have 1 to {MAX_EXTENSION_FIELDS} fields including {SCHEMA_VERSION_KEY}"),
        );
    }
    match fields.get(SCHEMA_VERSION_KEY) {
        Some(version) if version == EXTENSION_SCHEMA_VERSION => {}
        Some(version) => {
            return refuse(
                format!("{at}.{SCHEMA_VERSION_KEY}"),
                format!("{version:?} must be \"{EXTENSION_SCHEMA_VERSION}\""),
            );
        }
        None => return refuse(at, format!("{SCHEMA_VERSION_KEY} is required")),
    }
    for (key, value) in fields {
        if !is_qualified_name(key) {
            return refuse(format!("{at}.{key}"), "key must be a qualified name");
        }
        if namespace.len() + 1 + key.len() > MAX_FLATTENED_KEY_BYTES {
            return refuse(
                format!("{at}.{key}"),
                format!("namespace/key is longer than {MAX_FLATTENED_KEY_BYTES} bytes"),
            );
        }
        if value.len() > MAX_EXTENSION_VALUE_BYTES {
            return refuse(
                format!("{at}.{key}"),
                format!("value longer than {MAX_EXTENSION_VALUE_BYTES} bytes"),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn display(namespace: &str, fields: &[(&str, &str)]) -> DisplaySpec {
        let fields = fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        DisplaySpec {
            name: Some("Default".into()),
            description: Some("A sandbox".into()),
            extensions: Some(BTreeMap::from([(namespace.to_owned(), fields)])),
        }
    }

    fn namespace_of_len(len: usize) -> String {
        // "<subdomain>/tools", the subdomain made of 63-byte labels.
        let mut prefix = String::new();
        while prefix.len() + "/tools".len() < len {
            if !prefix.is_empty() {
                prefix.push('.');
            }
            let room = len - "/tools".len() - prefix.len();
            prefix.push_str(&"a".repeat(room.min(63)));
        }
        let namespace = format!("{prefix}/tools");
        assert_eq!(namespace.len(), len);
        namespace
    }

    #[test]
    fn extensions_are_flattened_with_their_namespace() {
        let valid = display(
            "example.com/tools",
            &[("schema_version", "1"), ("icon", "box")],
        )
        .validate()
        .unwrap();
        assert_eq!(
            valid.extensions,
            BTreeMap::from([
                ("example.com/tools/icon".to_owned(), "box".to_owned()),
                (
                    "example.com/tools/schema_version".to_owned(),
                    "1".to_owned()
                ),
            ])
        );
    }

    #[test]
    fn a_238_byte_namespace_is_accepted_and_a_key_past_253_bytes_is_refused() {
        let namespace = namespace_of_len(238);
        let valid = display(&namespace, &[("schema_version", "1"), ("custom", "x")])
            .validate()
            .unwrap();
        assert!(
            valid
                .extensions
                .contains_key(&format!("{namespace}/custom"))
        );
        let long_key = "k".repeat(30);
        let err = display(&namespace, &[("schema_version", "1"), (&long_key, "x")])
            .validate()
            .unwrap_err();
        assert!(err.reason.contains("253"), "{err:?}");
        let too_long = namespace_of_len(239);
        assert!(
            display(&too_long, &[("schema_version", "1")])
                .validate()
                .is_err()
        );
    }

    #[test]
    fn extensions_need_schema_version_one_and_a_qualified_namespace() {
        assert!(
            display("example.com/tools", &[("icon", "box")])
                .validate()
                .is_err()
        );
        assert!(
            display("example.com/tools", &[("schema_version", "2")])
                .validate()
                .is_err()
        );
        assert!(
            display("tools", &[("schema_version", "1")])
                .validate()
                .is_err()
        );
        assert!(
            display("Example.com/tools", &[("schema_version", "1")])
                .validate()
                .is_err()
        );
        assert!(display("example.com/tools", &[]).validate().is_err());
        assert!(
            display(
                "example.com/tools",
                &[("schema_version", "1"), ("bad key", "x")]
            )
            .validate()
            .is_err()
        );
        assert!(
            display(
                "example.com/tools",
                &[("schema_version", "1"), ("v", &"x".repeat(257))]
            )
            .validate()
            .is_err()
        );
    }

    #[test]
    fn extension_field_and_namespace_counts_are_bounded() {
        let mut fields: Vec<(String, String)> =
            (0..15).map(|i| (format!("k{i}"), "v".into())).collect();
        fields.push(("schema_version".into(), "1".into()));
        let borrowed: Vec<(&str, &str)> = fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert!(display("example.com/tools", &borrowed).validate().is_ok());
        let mut more = borrowed.clone();
        more.push(("k99", "v"));
        assert!(display("example.com/tools", &more).validate().is_err());

        let version = BTreeMap::from([("schema_version".to_owned(), "1".to_owned())]);
        let namespaces = |n: usize| DisplaySpec {
            extensions: Some(
                (0..n)
                    .map(|i| (format!("example.com/ns{i}"), version.clone()))
                    .collect(),
            ),
            ..DisplaySpec::default()
        };
        assert!(namespaces(8).validate().is_ok());
        assert!(namespaces(9).validate().is_err());
    }

    #[test]
    fn name_and_description_are_bounded() {
        let long_name = DisplaySpec {
            name: Some("n".repeat(121)),
            ..DisplaySpec::default()
        };
        assert_eq!(long_name.validate().unwrap_err().field, "name");
        let long_description = DisplaySpec {
            description: Some("d".repeat(1025)),
            ..DisplaySpec::default()
        };
        assert_eq!(
            long_description.validate().unwrap_err().field,
            "description"
        );
        let at_bounds = DisplaySpec {
            name: Some("n".repeat(120)),
            description: Some("d".repeat(1024)),
            extensions: None,
        };
        assert!(at_bounds.validate().is_ok());
    }
}
