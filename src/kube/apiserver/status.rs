//! Errors as the real API server reports them: `metav1.Status` objects with the HTTP code, a
//! machine-readable `reason` and the real server's message wording.

use serde_json::{Value, json};

use super::registry::KindInfo;

/// A failed request, rendered as a `metav1.Status` of `Failure`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status code, repeated in the `code` field.
    pub code: u16,
    /// The `StatusReason`, e.g. `NotFound` or `Conflict`.
    pub reason: &'static str,
    /// The human-readable message.
    pub message: String,
    /// `details` (name, group, kind, causes), when the error is about one object.
    pub details: Option<Value>,
}

fn details(kind: &KindInfo, name: &str) -> Option<Value> {
    Some(json!({"name": name, "group": kind.group, "kind": kind.plural}))
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String, details: Option<Value>) -> Self {
        Self {
            code,
            reason,
            message,
            details,
        }
    }

    /// 404 for an object that does not exist.
    pub fn not_found(kind: &KindInfo, name: &str) -> Self {
        let message = format!("{} \"{name}\" not found", kind.group_resource());
        Self::new(404, "NotFound", message, details(kind, name))
    }

    /// 404 for a path the server does not serve.
    pub fn unknown_path() -> Self {
        let message = "the server could not find the requested resource".to_string();
        Self::new(404, "NotFound", message, None)
    }

    /// 409 for a create of an existing object.
    pub fn already_exists(kind: &KindInfo, name: &str) -> Self {
        let message = format!("{} \"{name}\" already exists", kind.group_resource());
        Self::new(409, "AlreadyExists", message, details(kind, name))
    }

    /// 409 for a write whose preconditions (resourceVersion, uid) do not hold.
    pub fn conflict(kind: &KindInfo, name: &str, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            kind.group_resource()
        );
        Self::new(409, "Conflict", message, details(kind, name))
    }

    /// 409 for a stale `metadata.resourceVersion`.
    pub fn stale(kind: &KindInfo, name: &str) -> Self {
        Self::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 for an object that fails validation; `field` and `why` form the cause.
    pub fn invalid(kind: &KindInfo, name: &str, field: &str, why: &str) -> Self {
        let message = format!(
            "{} \"{name}\" is invalid: {field}: {why}",
            kind.group_kind()
        );
        let details = json!({
            "name": name,
            "group": kind.group,
            "kind": kind.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": why, "field": field}],
        });
        Self::new(422, "Invalid", message, Some(details))
    }

    /// 422 for a patch that cannot be applied.
    pub fn unprocessable(message: String) -> Self {
        Self::new(422, "Invalid", message, None)
    }

    /// 410 for a resourceVersion or continue token older than the server remembers.
    pub fn expired(message: String) -> Self {
        Self::new(410, "Expired", message, None)
    }

    /// 504 for a resourceVersion newer than the server has.
    pub fn too_large_resource_version(asked: u64, current: u64) -> Self {
        let message =
            format!("Too large resource version: {asked}, current resource version: {current}");
        let details = json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1});
        Self::new(504, "Timeout", message, Some(details))
    }

    /// 400 for a malformed request.
    pub fn bad_request(message: String) -> Self {
        Self::new(400, "BadRequest", message, None)
    }

    /// 405 for a verb the path does not support.
    pub fn method_not_allowed(method: &str) -> Self {
        let message =
            format!("the server does not allow this method on the requested resource ({method})");
        Self::new(405, "MethodNotAllowed", message, None)
    }

    /// 415 for a patch type the server does not implement.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        let message = format!(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json (got {content_type:?})"
        );
        Self::new(415, "UnsupportedMediaType", message, None)
    }

    /// 500 for a failure inside the server (e.g. the state file could not be written).
    pub fn internal(message: String) -> Self {
        let message = format!("Internal error occurred: {message}");
        Self::new(500, "InternalError", message, None)
    }

    /// The `metav1.Status` JSON object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// The `Status` of `Success` a DELETE answers with for kinds that do not return the object.
pub fn deleted(kind: &KindInfo, name: &str, uid: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": kind.group, "kind": kind.plural, "uid": uid},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::apiserver::registry::by_kind;

    #[test]
    fn a_conflict_renders_as_a_failure_status_with_code_and_reason() {
        let kind = by_kind("ConfigMap").expect("served");
        let status = ApiError::stale(kind, "a").to_status();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["code"], 409);
        assert_eq!(status["reason"], "Conflict");
        assert_eq!(status["details"]["name"], "a");
        assert!(
            status["message"]
                .as_str()
                .expect("message")
                .starts_with("Operation cannot be fulfilled on configmaps \"a\"")
        );
    }

    #[test]
    fn invalid_names_the_group_kind_and_the_field() {
        let kind = by_kind("ExecutionEnvironment").expect("served");
        let err = ApiError::invalid(kind, "e", "metadata.name", "bad");
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "ExecutionEnvironment.execution.mecatl.dev \"e\" is invalid: metadata.name: bad"
        );
    }
}
