//! Delete and delete-collection: `DeleteOptions` preconditions (uid, resourceVersion), and
//! finalizers holding an object (with `deletionTimestamp` set) until an update empties them.
//! Propagation policies are accepted and ignored: there is no garbage collector, and no
//! graceful Pod termination (deletion is immediate, as for an unscheduled Pod).

use serde_json::Value;

use super::{
    meta,
    read::list_document,
    registry::KindInfo,
    selector::Filter,
    status::{self, ApiError},
    store::{Change, ObjectKey, Store},
    write::{Ctx, apply, existing},
};

/// The parts of a `DeleteOptions` body the server honours.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `dryRun: ["All"]`.
    pub dry_run: bool,
}

impl DeleteOptions {
    /// Parses a DELETE body (empty means defaults).
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
        let precondition = |field: &str| {
            value
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let dry_run = value
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|modes| modes.iter().any(|m| m == "All"));
        Ok(Self {
            uid: precondition("uid"),
            resource_version: precondition("resourceVersion"),
            dry_run,
        })
    }
}

fn check_preconditions(
    kind: &KindInfo,
    current: &Value,
    options: &DeleteOptions,
) -> Result<(), ApiError> {
    let name = meta::get_str(current, "name").unwrap_or_default();
    let checks = [
        ("UID", "uid", &options.uid),
        (
            "ResourceVersion",
            "resourceVersion",
            &options.resource_version,
        ),
    ];
    for (label, field, expected) in checks {
        let actual = meta::get_str(current, field).unwrap_or_default();
        if let Some(expected) = expected
            && expected != actual
        {
            let why = format!(
                "Precondition failed: {label} in precondition: {expected}, {label} in object meta: {actual}"
            );
            return Err(ApiError::conflict(kind, name, &why));
        }
    }
    Ok(())
}

/// Deletes one object; returns the object as the response shows it (removed, or marked for
/// deletion while finalizers remain).
fn delete_object(
    store: &mut Store,
    ctx: &Ctx<'_>,
    kind: &KindInfo,
    key: ObjectKey,
    options: &DeleteOptions,
) -> Result<(Value, bool), ApiError> {
    let current = existing(store, kind, &key)?.clone();
    check_preconditions(kind, &current, options)?;
    if !meta::finalizers(&current).is_empty() {
        if meta::non_empty(&current, "deletionTimestamp").is_some() {
            return Ok((current, false));
        }
        let mut marked = current;
        let m = meta::meta_mut(&mut marked);
        let now = meta::rfc3339(ctx.clock.wall());
        m.insert("deletionTimestamp".to_string(), Value::String(now));
        m.insert("deletionGracePeriodSeconds".to_string(), Value::from(0));
        return Ok((apply(store, ctx, key, Change::Update(marked))?, false));
    }
    Ok((apply(store, ctx, key, Change::Remove(current))?, true))
}

/// DELETE of one object: the object, or a `Status` of `Success` for kinds that answer so.
pub fn delete(
    store: &mut Store,
    ctx: &Ctx<'_>,
    kind: &KindInfo,
    key: ObjectKey,
    options: &DeleteOptions,
) -> Result<Value, ApiError> {
    let (object, removed) = delete_object(store, ctx, kind, key, options)?;
    if removed && !kind.returns_deleted_object {
        let name = meta::get_str(&object, "name").unwrap_or_default();
        let uid = meta::get_str(&object, "uid").unwrap_or_default();
        return Ok(status::deleted(kind, name, uid));
    }
    Ok(object)
}

/// DELETE of a collection: deletes every matching object and lists them.
pub fn delete_collection(
    store: &mut Store,
    ctx: &Ctx<'_>,
    kind: &KindInfo,
    filter: &Filter,
    options: &DeleteOptions,
) -> Result<Value, ApiError> {
    let keys: Vec<ObjectKey> = store
        .objects(kind.kind, filter.namespace.as_deref())
        .filter(|(_, object)| filter.matches(object))
        .map(|(key, _)| key.clone())
        .collect();
    let mut items = Vec::with_capacity(keys.len());
    for key in keys {
        items.push(delete_object(store, ctx, kind, key, options)?.0);
    }
    Ok(list_document(kind, items, store.resource_version(), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delete_options_read_preconditions_and_dry_run() {
        let body = br#"{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"],
            "preconditions":{"uid":"u1","resourceVersion":"7"},"propagationPolicy":"Foreground"}"#;
        let options = DeleteOptions::parse(body).expect("parses");
        assert_eq!(
            options,
            DeleteOptions {
                uid: Some("u1".to_string()),
                resource_version: Some("7".to_string()),
                dry_run: true,
            }
        );
        assert_eq!(
            DeleteOptions::parse(b"").expect("empty"),
            DeleteOptions::default()
        );
        assert_eq!(DeleteOptions::parse(b"{nope").expect_err("bad").code, 400);
    }
}
