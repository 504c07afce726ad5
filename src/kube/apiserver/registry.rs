//! The static registry of the kinds the in-process API server serves, with the per-kind
//! behaviour the real API server has (scope, status subresource, generation, delete answer).

/// One served kind and how the real API server treats it.
#[derive(Debug, PartialEq, Eq)]
pub struct KindInfo {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version within the group.
    pub version: &'static str,
    /// The resource name in URLs.
    pub plural: &'static str,
    /// The `kind` field of objects.
    pub kind: &'static str,
    /// Namespaced (`true`) or cluster-scoped.
    pub namespaced: bool,
    /// Whether `/status` is a subresource: the main resource then ignores `status`.
    pub status_subresource: bool,
    /// Whether `metadata.generation` is maintained (set to 1, bumped on spec changes).
    pub generation: bool,
    /// Whether a PUT without `metadata.resourceVersion` is accepted (custom resources refuse it).
    pub unconditional_update: bool,
    /// Whether DELETE answers with the object (otherwise with a `Status` of `Success`).
    pub returns_deleted_object: bool,
    /// The `status` a created object gets (JSON text); `None` drops any given status.
    pub initial_status: Option<&'static str>,
    /// Field-selector fields beyond `metadata.name` and `metadata.namespace`.
    pub extra_fields: &'static [&'static str],
    /// The short names discovery advertises (`kubectl get execenv`).
    pub short_names: &'static [&'static str],
}

impl KindInfo {
    /// `group/version`, or just `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural` or `plural.group`, as used in the real API server's messages.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `Kind` or `Kind.group`, as used in `Invalid` messages.
    pub fn group_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }
}

/// Every kind the server serves.
pub static KINDS: &[KindInfo] = &[
    KindInfo {
        group: "execution.mecatl.dev",
        version: "v1alpha1",
        plural: "executionenvironments",
        kind: "ExecutionEnvironment",
        namespaced: true,
        status_subresource: true,
        generation: true,
        unconditional_update: false,
        returns_deleted_object: true,
        initial_status: None,
        extra_fields: &[],
        short_names: &["execenv"],
    },
    KindInfo {
        group: "",
        version: "v1",
        plural: "pods",
        kind: "Pod",
        namespaced: true,
        status_subresource: true,
        generation: true,
        unconditional_update: true,
        returns_deleted_object: true,
        initial_status: Some(r#"{"phase":"Pending"}"#),
        extra_fields: &["spec.nodeName", "spec.serviceAccountName", "status.phase"],
        short_names: &["po"],
    },
    KindInfo {
        group: "",
        version: "v1",
        plural: "persistentvolumeclaims",
        kind: "PersistentVolumeClaim",
        namespaced: true,
        status_subresource: true,
        generation: false,
        unconditional_update: true,
        returns_deleted_object: true,
        initial_status: Some(r#"{"phase":"Pending"}"#),
        extra_fields: &[],
        short_names: &["pvc"],
    },
    KindInfo {
        group: "",
        version: "v1",
        plural: "configmaps",
        kind: "ConfigMap",
        namespaced: true,
        status_subresource: false,
        generation: false,
        unconditional_update: true,
        returns_deleted_object: false,
        initial_status: None,
        extra_fields: &[],
        short_names: &["cm"],
    },
    KindInfo {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        generation: false,
        unconditional_update: true,
        returns_deleted_object: false,
        initial_status: None,
        extra_fields: &[],
        short_names: &["ev"],
    },
    KindInfo {
        group: "node.k8s.io",
        version: "v1",
        plural: "runtimeclasses",
        kind: "RuntimeClass",
        namespaced: false,
        status_subresource: false,
        generation: false,
        unconditional_update: true,
        returns_deleted_object: false,
        initial_status: None,
        extra_fields: &[],
        short_names: &[],
    },
    KindInfo {
        group: "storage.k8s.io",
        version: "v1",
        plural: "storageclasses",
        kind: "StorageClass",
        namespaced: false,
        status_subresource: false,
        generation: false,
        unconditional_update: true,
        returns_deleted_object: true,
        initial_status: None,
        extra_fields: &[],
        short_names: &["sc"],
    },
];

/// The kind served at `group/version/plural`.
pub fn by_resource(group: &str, version: &str, plural: &str) -> Option<&'static KindInfo> {
    KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)
}

/// The kind with this `apiVersion` and `kind`.
pub fn by_api_version_kind(api_version: &str, kind: &str) -> Option<&'static KindInfo> {
    KINDS
        .iter()
        .find(|k| k.kind == kind && k.api_version() == api_version)
}

/// The kind whose `kind` field is `kind` (kinds are unique in this registry).
pub fn by_kind(kind: &str) -> Option<&'static KindInfo> {
    KINDS.iter().find(|k| k.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_unique_and_found_by_resource_and_by_api_version() {
        for (i, a) in KINDS.iter().enumerate() {
            for b in &KINDS[i + 1..] {
                assert_ne!(a.kind, b.kind);
            }
            assert_eq!(by_resource(a.group, a.version, a.plural), Some(a));
            assert_eq!(by_api_version_kind(&a.api_version(), a.kind), Some(a));
            if let Some(status) = a.initial_status {
                serde_json::from_str::<serde_json::Value>(status).expect("valid initial status");
            }
        }
        assert_eq!(by_resource("", "v1", "secrets"), None);
    }

    #[test]
    fn names_for_messages_follow_the_real_server() {
        let pods = by_kind("Pod").expect("pods served");
        assert_eq!(pods.api_version(), "v1");
        assert_eq!(pods.group_resource(), "pods");
        let env = by_kind("ExecutionEnvironment").expect("CR served");
        assert_eq!(env.api_version(), "execution.mecatl.dev/v1alpha1");
        assert_eq!(
            env.group_resource(),
            "executionenvironments.execution.mecatl.dev"
        );
        assert_eq!(
            env.group_kind(),
            "ExecutionEnvironment.execution.mecatl.dev"
        );
    }
}
