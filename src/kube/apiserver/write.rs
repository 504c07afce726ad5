//! Create, replace and patch, on the main resource and on the `/status` subresource, with the
//! real server's rules: server-managed metadata, resourceVersion and uid preconditions, status
//! ignored by the main resource, generation bumps on spec changes, no-op writes that do not
//! bump the resourceVersion, and no new finalizers on an object being deleted.

use serde_json::{Map, Value};

use super::{
    meta,
    patch::{json_patch, merge_patch},
    registry::KindInfo,
    status::ApiError,
    store::{Change, ObjectKey, Store},
};
use crate::runtime::{Clock, IdSource};

/// What a write needs besides the store.
pub struct Ctx<'a> {
    /// Timestamps.
    pub clock: &'a dyn Clock,
    /// Uids and generated names.
    pub ids: &'a dyn IdSource,
    /// `dryRun=All`: validate and answer, but store nothing.
    pub dry_run: bool,
}

/// Metadata the server owns: a client's values are replaced by the stored ones.
const SERVER_FIELDS: [&str; 6] = [
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "resourceVersion",
];

/// Commits `change`, or in dry-run mode answers what would be stored.
pub fn apply(
    store: &mut Store,
    ctx: &Ctx<'_>,
    key: ObjectKey,
    change: Change,
) -> Result<Value, ApiError> {
    if ctx.dry_run {
        let (Change::Create(o) | Change::Update(o) | Change::Remove(o)) = change;
        return Ok(o);
    }
    store.commit(key, change)
}

/// The stored object a path names, or 404.
pub fn existing<'s>(
    store: &'s Store,
    kind: &KindInfo,
    key: &ObjectKey,
) -> Result<&'s Value, ApiError> {
    store
        .get(key)
        .ok_or_else(|| ApiError::not_found(kind, &key.name))
}

/// Checks the body's apiVersion, kind, namespace and (if given) name against the request, and
/// fills them in.
fn identify(
    kind: &KindInfo,
    body: &mut Value,
    namespace: &str,
    name: Option<&str>,
) -> Result<(), ApiError> {
    let Value::Object(map) = body else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object".to_string(),
        ));
    };
    let api_version = kind.api_version();
    for (field, expected) in [("apiVersion", api_version.as_str()), ("kind", kind.kind)] {
        match map.get(field).and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != expected => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({given}) does not match the expected {field} ({expected})"
                )));
            }
            _ => {
                map.insert(field.to_string(), Value::String(expected.to_string()));
            }
        }
    }
    let m = meta::meta_mut(body);
    if kind.namespaced {
        match m.get("namespace").and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != namespace => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request".to_string(),
                ));
            }
            _ => m.insert(
                "namespace".to_string(),
                Value::String(namespace.to_string()),
            ),
        };
    } else {
        m.remove("namespace");
    }
    if let Some(name) = name {
        match m.get("name").and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({given}) does not match the name on the URL ({name})"
                )));
            }
            _ => m.insert("name".to_string(), Value::String(name.to_string())),
        };
    }
    Ok(())
}

/// Creates an object in `namespace` (empty for cluster-scoped kinds).
pub fn create(
    store: &mut Store,
    ctx: &Ctx<'_>,
    kind: &'static KindInfo,
    namespace: &str,
    mut body: Value,
) -> Result<Value, ApiError> {
    identify(kind, &mut body, namespace, None)?;
    if meta::non_empty(&body, "resourceVersion").is_some() {
        return Err(ApiError::internal(
            "resourceVersion should not be set on objects to be created".to_string(),
        ));
    }
    let name = match meta::non_empty(&body, "name") {
        Some(name) => name.to_string(),
        None => match meta::non_empty(&body, "generateName") {
            Some(prefix) => format!("{prefix}{}", meta::name_suffix(ctx.ids)),
            None => {
                let why = "Required value: name or generateName is required";
                return Err(ApiError::invalid(kind, "", "metadata.name", why));
            }
        },
    };
    meta::validate_name(&name)
        .map_err(|why| ApiError::invalid(kind, &name, "metadata.name", &why))?;
    let key = ObjectKey {
        kind: kind.kind,
        namespace: namespace.to_string(),
        name: name.clone(),
    };
    if store.get(&key).is_some() {
        return Err(ApiError::already_exists(kind, &name));
    }
    let m = meta::meta_mut(&mut body);
    for field in SERVER_FIELDS {
        m.remove(field);
    }
    m.insert("name".to_string(), Value::String(name));
    m.insert("uid".to_string(), Value::String(meta::uuid(ctx.ids)));
    let created = meta::rfc3339(ctx.clock.wall());
    m.insert("creationTimestamp".to_string(), Value::String(created));
    if kind.generation {
        m.insert("generation".to_string(), Value::from(1));
    }
    if kind.status_subresource {
        let map = body
            .as_object_mut()
            .expect("identify checked the body is an object");
        match kind.initial_status {
            Some(status) => {
                let status =
                    serde_json::from_str(status).expect("registry statuses are valid JSON");
                map.insert("status".to_string(), status)
            }
            None => map.remove("status"),
        };
    }
    meta::normalize(&mut body);
    apply(store, ctx, key, Change::Create(body))
}

/// Checks the body's resourceVersion and uid preconditions against the stored object.
fn preconditions(
    kind: &KindInfo,
    current: &Value,
    body: &Value,
    unconditional: bool,
) -> Result<(), ApiError> {
    let name = meta::get_str(current, "name").unwrap_or_default();
    match meta::non_empty(body, "resourceVersion") {
        Some(rv) => {
            if rv.parse::<u64>().is_err() {
                return Err(ApiError::bad_request(format!(
                    "invalid resource version {rv:?}"
                )));
            }
            if Some(rv) != meta::get_str(current, "resourceVersion") {
                return Err(ApiError::stale(kind, name));
            }
        }
        None if !unconditional => {
            let why = "Invalid value: 0x0: must be specified for an update";
            return Err(ApiError::invalid(
                kind,
                name,
                "metadata.resourceVersion",
                why,
            ));
        }
        None => {}
    }
    let current_uid = meta::get_str(current, "uid").unwrap_or_default();
    match meta::non_empty(body, "uid") {
        Some(uid) if uid != current_uid => Err(ApiError::conflict(
            kind,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {current_uid}"
            ),
        )),
        _ => Ok(()),
    }
}

/// Everything but metadata and status: what `generation` tracks.
fn spec_part(object: &Value) -> Map<String, Value> {
    let mut map = object.as_object().cloned().unwrap_or_default();
    for field in ["metadata", "status", "apiVersion", "kind"] {
        map.remove(field);
    }
    map
}

/// The object a main-resource update of `current` with `body` stores.
fn main_update(
    kind: &KindInfo,
    current: &Value,
    mut body: Value,
    unconditional: bool,
) -> Result<Value, ApiError> {
    preconditions(kind, current, &body, unconditional)?;
    let current_meta = current
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let m = meta::meta_mut(&mut body);
    for field in SERVER_FIELDS {
        match current_meta.get(field) {
            Some(value) => m.insert(field.to_string(), value.clone()),
            None => m.remove(field),
        };
    }
    if kind.status_subresource {
        let map = body
            .as_object_mut()
            .expect("metadata was just set on an object");
        match current.get("status") {
            Some(status) => map.insert("status".to_string(), status.clone()),
            None => map.remove("status"),
        };
    }
    if meta::non_empty(current, "deletionTimestamp").is_some() {
        let old = meta::finalizers(current);
        let added: Vec<String> = meta::finalizers(&body)
            .into_iter()
            .filter(|f| !old.contains(f))
            .collect();
        if !added.is_empty() {
            let name = meta::get_str(current, "name").unwrap_or_default();
            let why = format!(
                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
            );
            return Err(ApiError::invalid(kind, name, "metadata.finalizers", &why));
        }
    }
    if kind.generation && spec_part(&body) != spec_part(current) {
        let generation = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta::meta_mut(&mut body).insert("generation".to_string(), Value::from(generation + 1));
    }
    Ok(body)
}

/// The object a `/status` update of `current` with `body` stores: only `status` changes.
fn status_update(
    kind: &KindInfo,
    current: &Value,
    body: &Value,
    unconditional: bool,
) -> Result<Value, ApiError> {
    preconditions(kind, current, body, unconditional)?;
    let mut updated = current.clone();
    let map = updated
        .as_object_mut()
        .expect("stored objects are JSON objects");
    match body.get("status") {
        Some(status) => map.insert("status".to_string(), status.clone()),
        None => map.remove("status"),
    };
    Ok(updated)
}

/// Stores `updated` unless it equals `current`; removes it if it is being deleted and has no
/// finalizers left.
fn finish(
    store: &mut Store,
    ctx: &Ctx<'_>,
    key: ObjectKey,
    current: Value,
    mut updated: Value,
) -> Result<Value, ApiError> {
    meta::normalize(&mut updated);
    if updated == current {
        return Ok(current);
    }
    let done = meta::non_empty(&updated, "deletionTimestamp").is_some()
        && meta::finalizers(&updated).is_empty();
    let change = if done {
        Change::Remove(updated)
    } else {
        Change::Update(updated)
    };
    apply(store, ctx, key, change)
}

/// PUT of an object or of its `/status`.
pub fn replace(
    store: &mut Store,
    ctx: &Ctx<'_>,
    kind: &'static KindInfo,
    key: ObjectKey,
    status: bool,
    mut body: Value,
) -> Result<Value, ApiError> {
    identify(kind, &mut body, &key.namespace, Some(&key.name))?;
    let current = existing(store, kind, &key)?.clone();
    let updated = if status {
        status_update(kind, &current, &body, kind.unconditional_update)?
    } else {
        main_update(kind, &current, body, kind.unconditional_update)?
    };
    finish(store, ctx, key, current, updated)
}

/// PATCH of an object or of its `/status`, as a merge patch or a JSON patch.
pub fn patch(
    store: &mut Store,
    ctx: &Ctx<'_>,
    kind: &'static KindInfo,
    key: ObjectKey,
    status: bool,
    content_type: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let current = existing(store, kind, &key)?.clone();
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the patch is not valid JSON: {e}")))?;
    let media_type = content_type.split(';').next().unwrap_or("").trim();
    let mut patched = match media_type {
        "application/merge-patch+json" => {
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "a merge patch must be a JSON object".to_string(),
                ));
            }
            let mut patched = current.clone();
            merge_patch(&mut patched, &patch);
            patched
        }
        "application/json-patch+json" => json_patch(&current, &patch).map_err(|e| {
            ApiError::unprocessable(format!("the JSON patch could not be applied: {e}"))
        })?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    identify(kind, &mut patched, &key.namespace, Some(&key.name))?;
    let updated = if status {
        status_update(kind, &current, &patched, true)?
    } else {
        main_update(kind, &current, patched, true)?
    };
    finish(store, ctx, key, current, updated)
}
