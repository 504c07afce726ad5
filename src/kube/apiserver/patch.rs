//! The two patch formats the server applies: JSON merge patch (RFC 7386) and JSON patch
//! (RFC 6902, with JSON pointers per RFC 6901). A JSON patch applies all operations or none.

use serde_json::{Map, Value};

/// Applies a JSON merge patch to `target` in place.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(map) = target else {
        unreachable!("target was just made an object");
    };
    for (key, value) in fields {
        if value.is_null() {
            map.remove(key);
        } else {
            merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Splits a JSON pointer into unescaped reference tokens.
fn tokens(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let rest = pointer
        .strip_prefix('/')
        .ok_or_else(|| format!("JSON pointer {pointer:?} must start with '/'"))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// Parses an array index token (no sign, no leading zeros); `-` means "after the last".
fn index(token: &str, len: usize, allow_end: bool) -> Result<usize, String> {
    if token == "-" && allow_end {
        return Ok(len);
    }
    let canonical = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    let i = canonical
        .then(|| token.parse::<usize>().ok())
        .flatten()
        .ok_or_else(|| format!("bad array index {token:?}"))?;
    if i < len || (allow_end && i == len) {
        Ok(i)
    } else {
        Err(format!("array index {i} out of bounds"))
    }
}

fn get<'a>(doc: &'a Value, path: &[String]) -> Result<&'a Value, String> {
    let mut node = doc;
    for token in path {
        node = match node {
            Value::Object(map) => map.get(token),
            Value::Array(items) => items.get(index(token, items.len(), false)?),
            _ => None,
        }
        .ok_or_else(|| format!("path /{} does not exist", path.join("/")))?;
    }
    Ok(node)
}

fn parent_mut<'a>(doc: &'a mut Value, path: &[String]) -> Result<&'a mut Value, String> {
    let mut node = doc;
    for token in path {
        node = match node {
            Value::Object(map) => map.get_mut(token),
            Value::Array(items) => {
                let i = index(token, items.len(), false)?;
                items.get_mut(i)
            }
            _ => None,
        }
        .ok_or_else(|| format!("path /{} does not exist", path.join("/")))?;
    }
    Ok(node)
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((last, parent)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    match parent_mut(doc, parent)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(items) => {
            let i = index(last, items.len(), true)?;
            items.insert(i, value);
            Ok(())
        }
        _ => Err(format!(
            "cannot add at /{}: parent is not a container",
            path.join("/")
        )),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, String> {
    let Some((last, parent)) = path.split_last() else {
        return Err("cannot remove the whole document".to_string());
    };
    let missing = || format!("path /{} does not exist", path.join("/"));
    match parent_mut(doc, parent)? {
        Value::Object(map) => map.remove(last).ok_or_else(missing),
        Value::Array(items) => {
            let i = index(last, items.len(), false)?;
            Ok(items.remove(i))
        }
        _ => Err(missing()),
    }
}

fn field<'a>(op: &'a Value, name: &str) -> Result<&'a Value, String> {
    op.get(name)
        .ok_or_else(|| format!("JSON patch operation lacks {name:?}: {op}"))
}

fn pointer_field(op: &Value, name: &str) -> Result<Vec<String>, String> {
    let text = field(op, name)?
        .as_str()
        .ok_or_else(|| format!("JSON patch {name:?} must be a string"))?;
    tokens(text)
}

fn apply_one(doc: &mut Value, op: &Value) -> Result<(), String> {
    let name = field(op, "op")?
        .as_str()
        .ok_or_else(|| "JSON patch \"op\" must be a string".to_string())?;
    let path = pointer_field(op, "path")?;
    match name {
        "add" => add(doc, &path, field(op, "value")?.clone()),
        "remove" => remove(doc, &path).map(drop),
        "replace" => {
            let value = field(op, "value")?.clone();
            *parent_mut(doc, &path)? = value;
            Ok(())
        }
        "move" => {
            let from = pointer_field(op, "from")?;
            if path.len() > from.len() && path.starts_with(&from) {
                return Err("cannot move a value into one of its children".to_string());
            }
            let value = remove(doc, &from)?;
            add(doc, &path, value)
        }
        "copy" => {
            let value = get(doc, &pointer_field(op, "from")?)?.clone();
            add(doc, &path, value)
        }
        "test" => {
            let expected = field(op, "value")?;
            if get(doc, &path)? == expected {
                Ok(())
            } else {
                Err(format!("test failed at /{}", path.join("/")))
            }
        }
        other => Err(format!("unknown JSON patch operation {other:?}")),
    }
}

/// Applies a JSON patch (an array of operations) to a copy of `doc`.
pub fn json_patch(doc: &Value, patch: &Value) -> Result<Value, String> {
    let ops = patch
        .as_array()
        .ok_or_else(|| "a JSON patch must be an array of operations".to_string())?;
    let mut result = doc.clone();
    for op in ops {
        apply_one(&mut result, op)?;
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386_examples() {
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
        ];
        for (mut target, patch, expected) in cases {
            merge_patch(&mut target, &patch);
            assert_eq!(target, expected, "patch {patch}");
        }
    }

    #[test]
    fn json_patch_applies_every_operation() {
        let doc = json!({"foo": ["bar", "baz"], "a/b": 1, "m~n": 2, "x": {"y": 1}});
        let patch = json!([
            {"op": "add", "path": "/foo/1", "value": "qux"},
            {"op": "add", "path": "/foo/-", "value": "end"},
            {"op": "remove", "path": "/a~1b"},
            {"op": "replace", "path": "/m~0n", "value": 3},
            {"op": "copy", "from": "/x", "path": "/z"},
            {"op": "move", "from": "/x/y", "path": "/w"},
            {"op": "test", "path": "/foo/0", "value": "bar"},
        ]);
        let result = json_patch(&doc, &patch).expect("applies");
        assert_eq!(
            result,
            json!({"foo": ["bar", "qux", "baz", "end"], "m~n": 3, "x": {}, "z": {"y": 1}, "w": 1})
        );
    }

    #[test]
    fn a_failing_json_patch_changes_nothing() {
        let doc = json!({"a": 1});
        for patch in [
            json!([{"op": "replace", "path": "/a", "value": 2}, {"op": "test", "path": "/a", "value": 1}]),
            json!([{"op": "remove", "path": "/missing"}]),
            json!([{"op": "add", "path": "/list/0", "value": 1}]),
            json!([{"op": "add", "path": "a", "value": 1}]),
            json!([{"op": "frobnicate", "path": "/a"}]),
            json!([{"op": "move", "from": "/a", "path": "/a/b"}]),
            json!({"op": "add"}),
        ] {
            assert!(json_patch(&doc, &patch).is_err(), "{patch} should fail");
        }
        assert_eq!(doc, json!({"a": 1}));
    }

    #[test]
    fn array_indices_are_strict() {
        let doc = json!({"l": [0, 1]});
        for bad in ["/l/01", "/l/2", "/l/-1", "/l/x"] {
            let patch = json!([{"op": "replace", "path": bad, "value": 9}]);
            assert!(json_patch(&doc, &patch).is_err(), "{bad} should fail");
        }
        let ok = json!([{"op": "add", "path": "/l/2", "value": 2}, {"op": "add", "path": "", "value": {"new": true}}]);
        assert_eq!(
            json_patch(&doc, &ok).expect("applies"),
            json!({"new": true})
        );
    }
}
