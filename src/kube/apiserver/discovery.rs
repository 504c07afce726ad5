//! Discovery, as clients such as kubectl read it before any request: `/api` (the core group's
//! versions), `/apis` (every other group), `/apis/<group>` and the resource lists of
//! `/api/v1` and `/apis/<group>/<version>`, all derived from the served kinds. Only the
//! legacy (unaggregated) documents are served: clients that ask for aggregated discovery see
//! a plain JSON answer and fall back to them, as they do with older servers.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::registry::{KINDS, KindInfo};

/// A discovery document.
#[derive(Debug, PartialEq, Eq)]
pub enum Document {
    /// `/api`.
    CoreVersions,
    /// `/apis`.
    Groups,
    /// `/apis/<group>`.
    Group(String),
    /// `/api/<version>` or `/apis/<group>/<version>`.
    Resources {
        /// The group, empty for the core group.
        group: String,
        /// The version.
        version: String,
    },
}

/// The document at a path's segments, if it is a discovery path of a served group and version.
pub fn document(segments: &[&str]) -> Option<Document> {
    let served = |group: &str, version: Option<&str>| {
        KINDS
            .iter()
            .any(|k| k.group == group && version.is_none_or(|v| k.version == v))
    };
    match segments {
        ["api"] => Some(Document::CoreVersions),
        ["apis"] => Some(Document::Groups),
        ["apis", group] if served(group, None) && !group.is_empty() => {
            Some(Document::Group((*group).to_string()))
        }
        ["api", version] if served("", Some(version)) => Some(Document::Resources {
            group: String::new(),
            version: (*version).to_string(),
        }),
        ["apis", group, version] if served(group, Some(version)) && !group.is_empty() => {
            Some(Document::Resources {
                group: (*group).to_string(),
                version: (*version).to_string(),
            })
        }
        _ => None,
    }
}

/// The versions of `group`, in registry order, without repeats.
fn versions(group: &str) -> Vec<&'static str> {
    let mut seen = BTreeSet::new();
    KINDS
        .iter()
        .filter(|k| k.group == group && seen.insert(k.version))
        .map(|k| k.version)
        .collect()
}

fn group_document(group: &str) -> Value {
    let versions: Vec<Value> = versions(group)
        .into_iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "name": group,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
        "versions": versions,
    })
}

fn resources(kind: &KindInfo) -> Vec<Value> {
    let verbs = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];
    let mut entries = vec![json!({
        "name": kind.plural,
        "singularName": kind.kind.to_lowercase(),
        "namespaced": kind.namespaced,
        "kind": kind.kind,
        "verbs": verbs,
        "shortNames": kind.short_names,
    })];
    if kind.status_subresource {
        entries.push(json!({
            "name": format!("{}/status", kind.plural),
            "singularName": "",
            "namespaced": kind.namespaced,
            "kind": kind.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    entries
}

/// Renders a discovery document.
pub fn render(document: &Document) -> Value {
    match document {
        Document::CoreVersions => json!({
            "kind": "APIVersions",
            "versions": versions(""),
            "serverAddressByClientCIDRs": [],
        }),
        Document::Groups => {
            let mut seen = BTreeSet::new();
            let groups: Vec<Value> = KINDS
                .iter()
                .filter(|k| !k.group.is_empty() && seen.insert(k.group))
                .map(|k| group_document(k.group))
                .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        Document::Group(group) => {
            let mut document = group_document(group);
            document["kind"] = json!("APIGroup");
            document["apiVersion"] = json!("v1");
            document
        }
        Document::Resources { group, version } => {
            let group_version = if group.is_empty() {
                version.clone()
            } else {
                format!("{group}/{version}")
            };
            let entries: Vec<Value> = KINDS
                .iter()
                .filter(|k| k.group == group && k.version == version)
                .flat_map(resources)
                .collect();
            json!({
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": entries,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_kind_is_discoverable_from_the_roots() {
        let core = render(&Document::CoreVersions);
        let groups = render(&Document::Groups);
        for kind in KINDS {
            let document = if kind.group.is_empty() {
                assert_eq!(core["versions"], json!(["v1"]));
                document(&["api", kind.version])
            } else {
                let listed = groups["groups"]
                    .as_array()
                    .expect("groups")
                    .iter()
                    .any(|g| g["name"] == kind.group);
                assert!(listed, "{} is in /apis", kind.group);
                document(&["apis", kind.group, kind.version])
            };
            let resources = render(&document.expect("a served group version"));
            let entry = resources["resources"]
                .as_array()
                .expect("resources")
                .iter()
                .find(|r| r["name"] == kind.plural)
                .cloned()
                .expect("listed");
            assert_eq!(entry["kind"], kind.kind);
            assert_eq!(entry["namespaced"], kind.namespaced);
        }
    }

    #[test]
    fn unserved_groups_and_versions_are_not_documents() {
        assert_eq!(document(&["apis", "apps", "v1"]), None);
        assert_eq!(document(&["api", "v2"]), None);
        assert_eq!(document(&["apis", "apps"]), None);
        let env = document(&["apis", "execution.mecatl.dev", "v1alpha1"]).expect("served");
        let listed = render(&env);
        assert_eq!(listed["groupVersion"], "execution.mecatl.dev/v1alpha1");
        assert_eq!(listed["resources"][0]["shortNames"], json!(["execenv"]));
        assert_eq!(
            listed["resources"][1]["name"],
            "executionenvironments/status"
        );
    }
}
