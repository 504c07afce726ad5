//! Tolerations of an execution definition (k8s-executor §3.1): key empty or a qualified name;
//! operator exactly `Exists` or `Equal`; `Exists` has no value; `Equal` needs a key and a label
//! value; effect empty, `NoSchedule`, `PreferNoSchedule` or `NoExecute`; `tolerationSeconds`
//! only with `NoExecute` and within 0..=86400; at most 16, no exact duplicates.

use serde::Deserialize;

use super::names::{is_label_value, is_qualified_name};
use super::spec::{SpecError, refuse};

/// Most tolerations per revision.
pub const MAX_TOLERATIONS: usize = 16;
/// Largest `tolerationSeconds`.
pub const MAX_TOLERATION_SECONDS: i64 = 86_400;

/// One toleration as written (the Kubernetes `Toleration` keys).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TolerationSpec {
    /// Taint key; empty matches every key (with `Exists`).
    #[serde(default)]
    pub key: Option<String>,
    /// `Exists` or `Equal`.
    #[serde(default)]
    pub operator: Option<String>,
    /// Taint value (`Equal` only).
    #[serde(default)]
    pub value: Option<String>,
    /// Taint effect; empty matches every effect.
    #[serde(default)]
    pub effect: Option<String>,
    /// How long a `NoExecute` taint is tolerated.
    #[serde(default)]
    pub toleration_seconds: Option<i64>,
}

/// The operator of a [`Toleration`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TolerationOperator {
    /// Tolerates any value of the key (or every taint when the key is empty).
    Exists,
    /// Tolerates one value of the key.
    Equal,
}

impl TolerationOperator {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exists => "Exists",
            Self::Equal => "Equal",
        }
    }
}

/// The effect of a [`Toleration`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TolerationEffect {
    /// `NoSchedule`.
    NoSchedule,
    /// `PreferNoSchedule`.
    PreferNoSchedule,
    /// `NoExecute`.
    NoExecute,
}

impl TolerationEffect {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

/// A validated toleration.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Toleration {
    /// Taint key; empty only with `Exists` (tolerate every taint).
    pub key: String,
    /// The operator.
    pub operator: TolerationOperator,
    /// The value; empty with `Exists`.
    pub value: String,
    /// The effect; `None` matches every effect.
    pub effect: Option<TolerationEffect>,
    /// Seconds a `NoExecute` taint is tolerated (0..=86400).
    pub toleration_seconds: Option<i64>,
}

pub(super) fn validate_tolerations(
    tolerations: Option<&[TolerationSpec]>,
) -> Result<Vec<Toleration>, SpecError> {
    let tolerations = tolerations.unwrap_or_default();
    if tolerations.len() > MAX_TOLERATIONS {
        return refuse("tolerations", format!("at most {MAX_TOLERATIONS} entries"));
    }
    let mut valid: Vec<Toleration> = Vec::with_capacity(tolerations.len());
    for (i, spec) in tolerations.iter().enumerate() {
        let toleration = validate_toleration(i, spec)?;
        if valid.contains(&toleration) {
            return refuse(
                format!("tolerations[{i}]"),
                "duplicates an earlier toleration",
            );
        }
        valid.push(toleration);
    }
    Ok(valid)
}

fn validate_toleration(i: usize, spec: &TolerationSpec) -> Result<Toleration, SpecError> {
    let field = |name: &str| format!("tolerations[{i}].{name}");
    let key = spec.key.clone().unwrap_or_default();
    let value = spec.value.clone().unwrap_or_default();
    if !key.is_empty() && !is_qualified_name(&key) {
        return refuse(
            field("key"),
            format!("{key:?} must be empty or a qualified name"),
        );
    }
    let operator = match spec.operator.as_deref().unwrap_or_default() {
        "Exists" => TolerationOperator::Exists,
        "Equal" => TolerationOperator::Equal,
        other => {
            return refuse(
                field("operator"),
                format!("{other:?} must be Exists or Equal"),
            );
        }
    };
    match operator {
        TolerationOperator::Exists if !value.is_empty() => {
            return refuse(field("value"), "must be empty with operator Exists");
        }
        TolerationOperator::Equal if key.is_empty() => {
            return refuse(field("key"), "is required with operator Equal");
        }
        TolerationOperator::Equal if !is_label_value(&value) => {
            return refuse(
                field("value"),
                format!("{value:?} is not a valid label value"),
            );
        }
        _ => {}
    }
    let effect = match spec.effect.as_deref().unwrap_or_default() {
        "" => None,
        "NoSchedule" => Some(TolerationEffect::NoSchedule),
        "PreferNoSchedule" => Some(TolerationEffect::PreferNoSchedule),
        "NoExecute" => Some(TolerationEffect::NoExecute),
        other => {
            return refuse(
                field("effect"),
                format!("{other:?} must be empty, NoSchedule, PreferNoSchedule or NoExecute"),
            );
        }
    };
    if let Some(seconds) = spec.toleration_seconds {
        if !(0..=MAX_TOLERATION_SECONDS).contains(&seconds) {
            return refuse(
                field("tolerationSeconds"),
                format!("{seconds} must be between 0 and {MAX_TOLERATION_SECONDS}"),
            );
        }
        if effect != Some(TolerationEffect::NoExecute) {
            return refuse(field("tolerationSeconds"), "requires effect NoExecute");
        }
    }
    Ok(Toleration {
        key,
        operator,
        value,
        effect,
        toleration_seconds: spec.toleration_seconds,
    })
}
