//! Reads: get, and list with selectors, `limit` and `continue` pages. A list carries the
//! store's resourceVersion; a continue token is only valid while that resourceVersion holds
//! (the server keeps no snapshots), otherwise the page request answers 410 Expired.

use serde_json::{Value, json};

use super::{
    registry::KindInfo,
    selector::Filter,
    status::ApiError,
    store::{ObjectKey, Store},
};

/// A list request.
#[derive(Debug)]
pub struct ListRequest<'a> {
    /// Which objects.
    pub filter: Filter,
    /// The page size, if any.
    pub limit: Option<u64>,
    /// The `continue` token of the previous page.
    pub continue_token: Option<&'a str>,
    /// The `resourceVersion` asked for (only checked for being in the future).
    pub resource_version: Option<u64>,
}

/// GET of one object.
pub fn get(store: &Store, kind: &KindInfo, key: &ObjectKey) -> Result<Value, ApiError> {
    store
        .get(key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(kind, &key.name))
}

/// A `<Kind>List` document.
pub fn list_document(
    kind: &KindInfo,
    items: Vec<Value>,
    resource_version: u64,
    next: Option<(String, usize)>,
) -> Value {
    let mut metadata = json!({"resourceVersion": resource_version.to_string()});
    if let Some((token, remaining)) = next {
        metadata["continue"] = Value::String(token);
        metadata["remainingItemCount"] = Value::from(remaining);
    }
    json!({
        "apiVersion": kind.api_version(),
        "kind": format!("{}List", kind.kind),
        "metadata": metadata,
        "items": items,
    })
}

fn parse_token(token: &str, current: u64) -> Result<(String, String), ApiError> {
    let mut parts = token.splitn(3, '/');
    let (Some(rv), Some(namespace), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(ApiError::bad_request(format!(
            "invalid continue token {token:?}"
        )));
    };
    let rv: u64 = rv
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid continue token {token:?}")))?;
    if rv != current {
        return Err(ApiError::expired(
            "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter."
                .to_string(),
        ));
    }
    Ok((namespace.to_string(), name.to_string()))
}

/// LIST of a collection.
pub fn list(store: &Store, kind: &KindInfo, request: &ListRequest<'_>) -> Result<Value, ApiError> {
    let current = store.resource_version();
    if let Some(asked) = request.resource_version
        && asked > current
    {
        return Err(ApiError::too_large_resource_version(asked, current));
    }
    let after = request
        .continue_token
        .filter(|t| !t.is_empty())
        .map(|t| parse_token(t, current))
        .transpose()?;
    let matching = store
        .objects(kind.kind, request.filter.namespace.as_deref())
        .filter(|(key, _)| {
            after
                .as_ref()
                .is_none_or(|(ns, name)| (&key.namespace, &key.name) > (ns, name))
        })
        .filter(|(_, object)| request.filter.matches(object));
    let limit = request
        .limit
        .filter(|l| *l > 0)
        .map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
    let mut items = Vec::new();
    let mut last = None;
    let mut remaining = 0usize;
    for (key, object) in matching {
        if items.len() < limit {
            items.push(object.clone());
            last = Some(key);
        } else {
            remaining += 1;
        }
    }
    let next = (remaining > 0)
        .then(|| last.map(|k| (format!("{current}/{}/{}", k.namespace, k.name), remaining)))
        .flatten();
    Ok(list_document(kind, items, current, next))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::kube::apiserver::{registry::by_kind, store::Change};

    fn store_with(names: &[&str]) -> Store {
        let mut store = Store::new(0, BTreeMap::new(), None);
        for name in names {
            let key = ObjectKey {
                kind: "ConfigMap",
                namespace: "ns".to_string(),
                name: name.to_string(),
            };
            let object = json!({"metadata": {"name": name, "namespace": "ns"}});
            store.commit(key, Change::Create(object)).expect("commit");
        }
        store
    }

    fn names(list: &Value) -> Vec<&str> {
        list["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| i["metadata"]["name"].as_str().expect("name"))
            .collect()
    }

    #[test]
    fn pages_follow_continue_tokens_to_the_end() {
        let store = store_with(&["a", "b", "c"]);
        let kind = by_kind("ConfigMap").expect("served");
        let mut request = ListRequest {
            filter: Filter::default(),
            limit: Some(2),
            continue_token: None,
            resource_version: None,
        };
        let first = list(&store, kind, &request).expect("first page");
        assert_eq!(names(&first), vec!["a", "b"]);
        assert_eq!(first["metadata"]["remainingItemCount"], 1);
        let token = first["metadata"]["continue"]
            .as_str()
            .expect("token")
            .to_string();
        request.continue_token = Some(&token);
        let second = list(&store, kind, &request).expect("second page");
        assert_eq!(names(&second), vec!["c"]);
        assert!(second["metadata"].get("continue").is_none());
        assert_eq!(second["metadata"]["resourceVersion"], "3");
    }

    #[test]
    fn a_continue_token_from_an_older_resource_version_is_expired() {
        let store = store_with(&["a"]);
        let kind = by_kind("ConfigMap").expect("served");
        let request = ListRequest {
            filter: Filter::default(),
            limit: None,
            continue_token: Some("0/ns/a"),
            resource_version: None,
        };
        assert_eq!(list(&store, kind, &request).expect_err("expired").code, 410);
        let future = ListRequest {
            continue_token: None,
            resource_version: Some(9),
            ..request
        };
        assert_eq!(list(&store, kind, &future).expect_err("too new").code, 504);
    }
}
