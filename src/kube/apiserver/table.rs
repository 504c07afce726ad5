//! Server-side printing: a `meta.k8s.io/v1` `Table` instead of the object or list, when the
//! client asks for one in its `Accept` header (`kubectl get` does). The columns are `Name`,
//! then the kind's printer columns (for the ExecutionEnvironment CRD, its
//! `additionalPrinterColumns`, evaluated as JSONPath; other kinds get `Age`), as the real
//! server's CRD table convertor prints them: `date` columns become ages relative to now.
//! Rows carry the object's metadata (`includeObject=PartialObjectMetadata`, the default), the
//! whole object (`Object`) or nothing (`None`).

use std::{sync::LazyLock, time::SystemTime};

use kube::CustomResourceExt;
use serde_json::{Value, json};
use serde_json_path::JsonPath;

use super::{registry::KindInfo, status::ApiError};
use crate::kube::crd::ExecutionEnvironment;

/// One printed column.
#[derive(Debug)]
struct Column {
    name: String,
    type_: String,
    format: String,
    description: String,
    priority: i32,
    path: Option<JsonPath>,
}

/// What each row carries besides its cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// No object.
    None,
    /// A `PartialObjectMetadata` (the default).
    Metadata,
    /// The whole object.
    Object,
}

/// A request for tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableRequest {
    /// What rows carry.
    pub include_object: IncludeObject,
}

impl TableRequest {
    /// Whether `accept` asks for a `meta.k8s.io/v1` Table (clients list alternatives; any entry
    /// naming one is enough), with the `includeObject` query value.
    pub fn from_request(
        accept: &str,
        include_object: Option<&str>,
    ) -> Result<Option<Self>, ApiError> {
        let wants_table = accept.split(',').any(|entry| {
            let params: Vec<&str> = entry.split(';').map(str::trim).collect();
            ["as=Table", "g=meta.k8s.io", "v=v1"]
                .iter()
                .all(|p| params.contains(p))
        });
        if !wants_table {
            return Ok(None);
        }
        let include_object = match include_object.unwrap_or("") {
            "" | "PartialObjectMetadata" => IncludeObject::Metadata,
            "Object" => IncludeObject::Object,
            "None" => IncludeObject::None,
            other => {
                return Err(ApiError::bad_request(format!(
                    "unsupported includeObject {other:?}: use Object, PartialObjectMetadata or None"
                )));
            }
        };
        Ok(Some(Self { include_object }))
    }
}

fn name_column() -> Column {
    Column {
        name: "Name".to_string(),
        type_: "string".to_string(),
        format: "name".to_string(),
        description: "Name must be unique within a namespace.".to_string(),
        priority: 0,
        path: None,
    }
}

fn age_column() -> Column {
    Column {
        name: "Age".to_string(),
        type_: "date".to_string(),
        format: String::new(),
        description: "The time since the object was created.".to_string(),
        priority: 0,
        path: JsonPath::parse("$.metadata.creationTimestamp").ok(),
    }
}

/// The ExecutionEnvironment's printer columns, from its CRD.
static ENVIRONMENT_COLUMNS: LazyLock<Vec<Column>> = LazyLock::new(|| {
    let crd = ExecutionEnvironment::crd();
    let printed = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.additional_printer_columns.clone())
        .unwrap_or_default();
    let mut columns = vec![name_column()];
    columns.extend(printed.into_iter().map(|c| Column {
        // The CRD's paths are JSONPath without the root `$`.
        path: JsonPath::parse(&format!("${}", c.json_path)).ok(),
        name: c.name,
        type_: c.type_,
        format: c.format.unwrap_or_default(),
        description: c.description.unwrap_or_default(),
        priority: c.priority.unwrap_or(0),
    }));
    columns
});

static DEFAULT_COLUMNS: LazyLock<Vec<Column>> = LazyLock::new(|| vec![name_column(), age_column()]);

fn columns(kind: &KindInfo) -> &'static [Column] {
    if kind.kind == "ExecutionEnvironment" {
        &ENVIRONMENT_COLUMNS
    } else {
        &DEFAULT_COLUMNS
    }
}

/// The real server's short ages (`45s`, `3m20s`, `5h12m`, `3d4h`, `2y30d`).
fn human_duration(seconds: i64) -> String {
    let (minutes, hours, days) = (seconds / 60, seconds / 3600, seconds / 86_400);
    match seconds {
        s if s < -1 => "<invalid>".to_string(),
        s if s < 0 => "0s".to_string(),
        s if s < 120 => format!("{s}s"),
        s if minutes < 10 && s % 60 == 0 => format!("{minutes}m"),
        s if minutes < 10 => format!("{minutes}m{}s", s % 60),
        _ if minutes < 180 => format!("{minutes}m"),
        _ if hours < 8 && minutes % 60 == 0 => format!("{hours}h"),
        _ if hours < 8 => format!("{hours}h{}m", minutes % 60),
        _ if hours < 48 => format!("{hours}h"),
        _ if hours < 192 && hours % 24 == 0 => format!("{days}d"),
        _ if hours < 192 => format!("{days}d{}h", hours % 24),
        _ if days < 730 => format!("{days}d"),
        _ if days < 2920 && days % 365 == 0 => format!("{}y", days / 365),
        _ if days < 2920 => format!("{}y{}d", days / 365, days % 365),
        _ => format!("{}y", days / 365),
    }
}

fn age(timestamp: &str, now: SystemTime) -> Value {
    let Ok(created) = timestamp.parse::<k8s_openapi::jiff::Timestamp>() else {
        return json!("<unknown>");
    };
    let now = match now.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        Err(_) => 0,
    };
    json!(human_duration(now - created.as_second()))
}

fn cell(column: &Column, object: &Value, now: SystemTime) -> Value {
    let Some(path) = &column.path else {
        return object["metadata"]["name"].clone();
    };
    let Some(found) = path.query(object).first() else {
        return Value::Null;
    };
    match (column.type_.as_str(), found) {
        ("date", Value::String(timestamp)) => age(timestamp, now),
        _ => found.clone(),
    }
}

fn row(kind: &KindInfo, object: &Value, request: TableRequest, now: SystemTime) -> Value {
    let cells: Vec<Value> = columns(kind).iter().map(|c| cell(c, object, now)).collect();
    let mut row = json!({"cells": cells});
    match request.include_object {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            row["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": object["metadata"],
            });
        }
        IncludeObject::Object => row["object"] = object.clone(),
    }
    row
}

fn column_definitions(kind: &KindInfo) -> Vec<Value> {
    columns(kind)
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": c.type_,
                "format": c.format,
                "description": c.description,
                "priority": c.priority,
            })
        })
        .collect()
}

/// A Table of `objects` with the list metadata `metadata`; `headers` says whether it carries
/// the column definitions (a watch sends them with its first event only).
pub fn table(
    kind: &KindInfo,
    objects: &[Value],
    metadata: Value,
    request: TableRequest,
    now: SystemTime,
    headers: bool,
) -> Value {
    let definitions = if headers {
        column_definitions(kind)
    } else {
        Vec::new()
    };
    let rows: Vec<Value> = objects.iter().map(|o| row(kind, o, request, now)).collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

/// The Table for a GET answer: one object, or a `<Kind>List`.
pub fn from_answer(
    kind: &KindInfo,
    answer: &Value,
    request: TableRequest,
    now: SystemTime,
) -> Value {
    match answer.get("items").and_then(Value::as_array) {
        Some(items) => table(kind, items, answer["metadata"].clone(), request, now, true),
        None => {
            let metadata = json!({"resourceVersion": answer["metadata"]["resourceVersion"]});
            table(
                kind,
                std::slice::from_ref(answer),
                metadata,
                request,
                now,
                true,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::kube::apiserver::registry::by_kind;

    #[test]
    fn only_a_v1_table_accept_entry_asks_for_a_table() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        let asked = TableRequest::from_request(kubectl, None).expect("valid");
        assert_eq!(
            asked,
            Some(TableRequest {
                include_object: IncludeObject::Metadata
            })
        );
        assert_eq!(
            TableRequest::from_request("application/json", None).expect("valid"),
            None
        );
        let beta_only = "application/json;as=Table;v=v1beta1;g=meta.k8s.io";
        assert_eq!(
            TableRequest::from_request(beta_only, None).expect("valid"),
            None
        );
        let err = TableRequest::from_request(kubectl, Some("Everything")).expect_err("bad");
        assert_eq!(err.code, 400);
    }

    #[test]
    fn environments_print_their_crd_columns_and_ages() {
        let kind = by_kind("ExecutionEnvironment").expect("served");
        let created = "2026-01-01T00:00:00Z";
        let object = json!({
            "metadata": {"name": "exec-1", "namespace": "execution", "creationTimestamp": created},
            "status": {"epoch": 3, "conditions": [
                {"type": "Other", "status": "False", "reason": "Nope"},
                {"type": "Ready", "status": "True", "reason": "Ready"}]},
        });
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600 + 3 * 3600 + 120);
        let request = TableRequest {
            include_object: IncludeObject::Metadata,
        };
        let table = from_answer(kind, &object, request, now);
        let names: Vec<&str> = table["columnDefinitions"]
            .as_array()
            .expect("columns")
            .iter()
            .map(|c| c["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["Name", "Phase", "Ready", "Epoch", "Age"]);
        assert_eq!(
            table["rows"][0]["cells"],
            json!(["exec-1", "Ready", "True", 3, "3h2m"])
        );
        assert_eq!(table["rows"][0]["object"]["metadata"]["name"], "exec-1");
        let bare = json!({"metadata": {"name": "exec-2"}});
        let table = from_answer(kind, &bare, request, now);
        assert_eq!(
            table["rows"][0]["cells"],
            json!(["exec-2", null, null, null, null])
        );
    }

    #[test]
    fn ages_read_like_the_real_servers() {
        let cases = [
            (5, "5s"),
            (119, "119s"),
            (300, "5m"),
            (310, "5m10s"),
            (1800, "30m"),
            (4 * 3600 + 60, "4h1m"),
            (30 * 3600, "30h"),
            (3 * 86_400 + 7200, "3d2h"),
            (100 * 86_400, "100d"),
            (3 * 365 * 86_400 + 86_400, "3y1d"),
        ];
        for (seconds, printed) in cases {
            assert_eq!(human_duration(seconds), printed, "{seconds}");
        }
    }
}
