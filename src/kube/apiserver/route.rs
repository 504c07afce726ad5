//! Request routing: maps a REST path to a served kind, namespace, name and subresource, and
//! reads the query parameters the server understands.

use std::collections::BTreeMap;

use super::{
    discovery,
    registry::{self, KindInfo},
    status::ApiError,
};

/// What a path addresses.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// `/version`.
    Version,
    /// A discovery document (`/api`, `/apis`, a group or a group version).
    Discovery(discovery::Document),
    /// A collection: one namespace's objects, or (namespace `None`) every namespace's.
    Collection {
        /// The kind.
        kind: &'static KindInfo,
        /// The namespace of a namespaced collection path.
        namespace: Option<String>,
    },
    /// One object, or its `/status` subresource.
    Object {
        /// The kind.
        kind: &'static KindInfo,
        /// The namespace (empty for cluster-scoped kinds).
        namespace: String,
        /// The object's name.
        name: String,
        /// Whether the path ends in `/status`.
        status: bool,
    },
}

/// Parses a request path.
pub fn parse_path(path: &str) -> Result<Target, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    if let Some(document) = discovery::document(&segments) {
        return Ok(Target::Discovery(document));
    }
    let (group, version, rest) = match segments.as_slice() {
        ["version"] => return Ok(Target::Version),
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::unknown_path()),
    };
    let lookup = |plural: &str| registry::by_resource(group, version, plural);
    let target = match rest {
        ["namespaces", ns, plural, tail @ ..] => {
            let kind = lookup(plural).filter(|k| k.namespaced);
            object_or_collection(kind, Some(ns), tail)
        }
        [plural, tail @ ..] => object_or_collection(lookup(plural), None, tail),
        [] => None,
    };
    target.ok_or_else(ApiError::unknown_path)
}

fn object_or_collection(
    kind: Option<&'static KindInfo>,
    namespace: Option<&str>,
    tail: &[&str],
) -> Option<Target> {
    let kind = kind?;
    let cluster_path = namespace.is_none();
    if !tail.is_empty() && cluster_path && kind.namespaced {
        return None;
    }
    let object = |name: &str, status: bool| Target::Object {
        kind,
        namespace: namespace.unwrap_or("").to_string(),
        name: name.to_string(),
        status,
    };
    match tail {
        [] => Some(Target::Collection {
            kind,
            namespace: namespace.map(str::to_string),
        }),
        [name] if !name.is_empty() => Some(object(name, false)),
        [name, "status"] if kind.status_subresource && !name.is_empty() => Some(object(name, true)),
        _ => None,
    }
}

/// The query parameters, last value wins (kube may send a leading `&`).
#[derive(Debug, Default)]
pub struct Query {
    params: BTreeMap<String, String>,
}

impl Query {
    /// Parses a raw query string.
    pub fn parse(query: Option<&str>) -> Self {
        let params = url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        Self { params }
    }

    /// A parameter's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    /// A boolean parameter (`true` or `1`).
    pub fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("true" | "1"))
    }

    /// A non-negative integer parameter; malformed values are a 400.
    pub fn number(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| ApiError::bad_request(format!("invalid {name} {v:?}")))
            })
            .transpose()
    }

    /// A resourceVersion parameter: `None` for absent, empty or `0`.
    pub fn resource_version(&self) -> Result<Option<u64>, ApiError> {
        match self.get("resourceVersion") {
            None | Some("" | "0") => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {v:?}"))),
        }
    }

    /// Whether `dryRun=All` was asked.
    pub fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(path: &str) -> (&'static str, String, String, bool) {
        match parse_path(path).expect("routes") {
            Target::Object {
                kind,
                namespace,
                name,
                status,
            } => (kind.kind, namespace, name, status),
            other => panic!("not an object: {other:?}"),
        }
    }

    #[test]
    fn namespaced_and_cluster_paths_route_to_their_kinds() {
        assert_eq!(
            object("/api/v1/namespaces/default/pods/p/status"),
            ("Pod", "default".into(), "p".into(), true)
        );
        assert_eq!(
            object("/apis/execution.mecatl.dev/v1alpha1/namespaces/ns/executionenvironments/e"),
            ("ExecutionEnvironment", "ns".into(), "e".into(), false)
        );
        assert_eq!(
            object("/apis/node.k8s.io/v1/runtimeclasses/gvisor"),
            ("RuntimeClass", String::new(), "gvisor".into(), false)
        );
        let all = parse_path("/api/v1/pods").expect("routes");
        assert!(matches!(
            all,
            Target::Collection {
                namespace: None,
                ..
            }
        ));
        let ns = parse_path("/api/v1/namespaces/a/configmaps").expect("routes");
        assert!(matches!(ns, Target::Collection { namespace: Some(n), .. } if n == "a"));
        assert_eq!(parse_path("/version").expect("routes"), Target::Version);
    }

    #[test]
    fn unknown_paths_are_404() {
        for path in [
            "/api/v1/namespaces/a/secrets",
            "/api/v1/pods/p",
            "/api/v1/namespaces/a/configmaps/c/status",
            "/api/v1/namespaces/a/pods/p/exec",
            "/apis/node.k8s.io/v1/namespaces/a/runtimeclasses",
            "/apis/apps/v1",
            "/healthz",
        ] {
            let err = parse_path(path).expect_err(path);
            assert_eq!(err.code, 404, "{path}");
        }
    }

    #[test]
    fn queries_parse_flags_numbers_and_resource_versions() {
        let q = Query::parse(Some("&watch=1&resourceVersion=12&limit=5&dryRun=All"));
        assert!(q.flag("watch"));
        assert_eq!(q.resource_version().expect("rv"), Some(12));
        assert_eq!(q.number("limit").expect("limit"), Some(5));
        assert!(q.dry_run());
        let zero = Query::parse(Some("resourceVersion=0"));
        assert_eq!(zero.resource_version().expect("rv"), None);
        assert!(
            Query::parse(Some("resourceVersion=x"))
                .resource_version()
                .is_err()
        );
    }
}
