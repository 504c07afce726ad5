//! Label and field selectors: parsing the query-string forms the real API server accepts and
//! matching them against stored objects.

use serde_json::Value;

use super::registry::KindInfo;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`: all requirements must hold. Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// Splits on commas that are not inside parentheses.
fn split_terms(text: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("unbalanced parenthesis in {text:?}"))?;
            }
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced parenthesis in {text:?}"));
    }
    terms.push(&text[start..]);
    Ok(terms)
}

fn is_name_part(s: &str, max: usize) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= max
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253
            && p.split('.').all(|label| {
                is_name_part(label, 63) && !label.contains('_') && label == label.to_lowercase()
            })
    });
    if prefix_ok && is_name_part(name, 63) {
        Ok(())
    } else {
        Err(format!("invalid label key {key:?}"))
    }
}

fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_name_part(value, 63) {
        Ok(())
    } else {
        Err(format!("invalid label value {value:?}"))
    }
}

fn parse_set(key: &str, rest: &str) -> Result<Vec<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set of values for {key:?}"))?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    for value in &values {
        validate_value(value)?;
    }
    Ok(values)
}

fn parse_requirement(term: &str) -> Result<Requirement, String> {
    if let Some(key) = term.strip_prefix('!') {
        let key = key.trim();
        validate_key(key)?;
        return Ok(Requirement::NotExists(key.to_string()));
    }
    for (op, negated) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = term.split_once(op) {
            let (key, value) = (key.trim(), value.trim());
            validate_key(key)?;
            validate_value(value)?;
            let (key, value) = (key.to_string(), value.to_string());
            return Ok(if negated {
                Requirement::NotEquals(key, value)
            } else {
                Requirement::Equals(key, value)
            });
        }
    }
    let mut words = term.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default().trim();
    let rest = words.next().unwrap_or_default().trim_start();
    if rest.is_empty() {
        validate_key(key)?;
        return Ok(Requirement::Exists(key.to_string()));
    }
    validate_key(key)?;
    if let Some(set) = rest.strip_prefix("notin") {
        return Ok(Requirement::NotIn(key.to_string(), parse_set(key, set)?));
    }
    if let Some(set) = rest.strip_prefix("in") {
        return Ok(Requirement::In(key.to_string(), parse_set(key, set)?));
    }
    Err(format!("unable to parse requirement {term:?}"))
}

impl LabelSelector {
    /// Parses the `labelSelector` query value.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for term in split_terms(text)? {
            let term = term.trim();
            if term.is_empty() {
                return Err(format!("empty requirement in label selector {text:?}"));
            }
            requirements.push(parse_requirement(term)?);
        }
        Ok(Self { requirements })
    }

    /// Whether `object`'s `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.requirements.iter().all(|req| match req {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, set) => get(k).is_some_and(|v| set.iter().any(|s| s == v)),
            Requirement::NotIn(k, set) => get(k).is_none_or(|v| set.iter().all(|s| s != v)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: `field=value`, `field==value` and `field!=value` terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` query value, accepting only the fields `kind` supports.
    pub fn parse(text: &str, kind: &KindInfo) -> Result<Self, String> {
        let mut terms = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self { terms });
        }
        for term in text.split(',') {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: {text:?}; can't understand {term:?}"
                ));
            };
            let field = field.trim();
            let supported = matches!(field, "metadata.name" | "metadata.namespace")
                || kind.extra_fields.contains(&field);
            if !supported {
                return Err(format!(
                    "field label not supported: {field} for {}",
                    kind.kind
                ));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self { terms })
    }

    /// Whether `object` satisfies every term (a missing field reads as the empty string).
    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|(field, equal, value)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            let actual = object
                .pointer(&pointer)
                .and_then(Value::as_str)
                .unwrap_or("");
            (actual == value) == *equal
        })
    }
}

/// Which objects a list, watch or delete-collection addresses.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this namespace (`None`: every namespace, or a cluster-scoped kind).
    pub namespace: Option<String>,
    /// The label selector.
    pub labels: LabelSelector,
    /// The field selector.
    pub fields: FieldSelector,
}

impl Filter {
    /// Whether `object` is in the namespace and matches both selectors.
    pub fn matches(&self, object: &Value) -> bool {
        let namespace = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        self.namespace.as_deref().is_none_or(|ns| ns == namespace)
            && self.labels.matches(object)
            && self.fields.matches(object)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kube::apiserver::registry::by_kind;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn equality_and_inequality_requirements_match_labels() {
        let sel = LabelSelector::parse("app=web, tier!=db").expect("parses");
        assert!(sel.matches(&obj(json!({"app": "web"}))));
        assert!(sel.matches(&obj(json!({"app": "web", "tier": "fe"}))));
        assert!(!sel.matches(&obj(json!({"app": "web", "tier": "db"}))));
        assert!(!sel.matches(&obj(json!({"tier": "fe"}))));
        let double = LabelSelector::parse("app==web").expect("parses");
        assert!(double.matches(&obj(json!({"app": "web"}))));
    }

    #[test]
    fn existence_requirements_match_presence_and_absence() {
        let sel = LabelSelector::parse("app,!legacy").expect("parses");
        assert!(sel.matches(&obj(json!({"app": ""}))));
        assert!(!sel.matches(&obj(json!({"app": "x", "legacy": "1"}))));
        assert!(!sel.matches(&obj(json!({}))));
        assert!(!sel.matches(&json!({"metadata": {"name": "no-labels"}})));
    }

    #[test]
    fn set_requirements_match_membership() {
        let sel = LabelSelector::parse("env in (prod, staging),tier notin (db)").expect("parses");
        assert!(sel.matches(&obj(json!({"env": "prod"}))));
        assert!(sel.matches(&obj(json!({"env": "staging", "tier": "web"}))));
        assert!(!sel.matches(&obj(json!({"env": "dev"}))));
        assert!(!sel.matches(&obj(json!({"env": "prod", "tier": "db"}))));
        let notin = LabelSelector::parse("tier notin (db)").expect("parses");
        assert!(notin.matches(&obj(json!({}))));
    }

    #[test]
    fn prefixed_keys_parse_and_an_empty_selector_matches_everything() {
        let sel = LabelSelector::parse("mecatl.dev/environment=e1").expect("parses");
        assert!(sel.matches(&obj(json!({"mecatl.dev/environment": "e1"}))));
        assert!(
            LabelSelector::parse("")
                .expect("parses")
                .matches(&obj(json!({})))
        );
    }

    #[test]
    fn malformed_label_selectors_are_rejected() {
        for bad in [
            "a=b,",
            "env in prod",
            "env in (a",
            "-bad=x",
            "a=b c",
            "x notin",
        ] {
            assert!(
                LabelSelector::parse(bad).is_err(),
                "{bad:?} should not parse"
            );
        }
    }

    #[test]
    fn field_selectors_match_name_and_namespace_and_reject_unknown_fields() {
        let kind = by_kind("ConfigMap").expect("served");
        let sel = FieldSelector::parse("metadata.name=a,metadata.namespace!=other", kind)
            .expect("parses");
        assert!(sel.matches(&obj(json!({}))));
        let other = FieldSelector::parse("metadata.name==b", kind).expect("parses");
        assert!(!other.matches(&obj(json!({}))));
        assert!(FieldSelector::parse("status.phase=Running", kind).is_err());
        let pods = by_kind("Pod").expect("served");
        let phase = FieldSelector::parse("status.phase=Running", pods).expect("parses");
        assert!(phase.matches(&json!({"status": {"phase": "Running"}})));
        assert!(!phase.matches(&json!({"status": {}})));
        assert!(FieldSelector::parse("nonsense", kind).is_err());
    }
}
