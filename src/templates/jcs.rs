//! A small RFC 8785 (JSON Canonicalization Scheme) serializer for the values templates hash:
//! strings, safe integers, booleans, null, arrays and objects.
//!
//! - Objects: members sorted by their names compared as UTF-16 code units; no whitespace.
//! - Strings: `"` and `\` escaped; U+0008, U+0009, U+000A, U+000C, U+000D as `\b \t \n \f \r`;
//!   every other control character below U+0020 as `\u00xx` (lowercase hex); everything else,
//!   non-ASCII included, written as UTF-8 unchanged.
//! - Numbers: only integers of magnitude ≤ 2^53 − 1, written as ES6 does (plain decimal, `-0`
//!   does not occur). Anything else is refused rather than approximated.

use std::cmp::Ordering;
use std::fmt::Write as _;

use serde_json::{Number, Value};

/// Largest integer every IEEE-754 double represents exactly (2^53 − 1).
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// A value outside what this serializer supports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JcsError {
    /// A fraction, or an integer beyond ±(2^53 − 1).
    #[error("number {0} is not a safe integer")]
    UnsupportedNumber(String),
}

/// The canonical JSON text of `value`.
pub fn to_canonical_json(value: &Value) -> Result<String, JcsError> {
    let mut out = String::new();
    write_value(&mut out, value)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value) -> Result<(), JcsError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n)?,
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item)?;
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|a, b| utf16_order(a.0, b.0));
            out.push('{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, name);
                out.push(':');
                write_value(out, member)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

fn utf16_order(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

fn write_number(out: &mut String, n: &Number) -> Result<(), JcsError> {
    let safe = if let Some(u) = n.as_u64() {
        u <= MAX_SAFE_INTEGER
    } else if let Some(i) = n.as_i64() {
        i.unsigned_abs() <= MAX_SAFE_INTEGER
    } else {
        false
    };
    if !safe {
        return Err(JcsError::UnsupportedNumber(n.to_string()));
    }
    // Safe integers print the same in Rust and in ES6.
    write!(out, "{n}").expect("writing to a String cannot fail");
    Ok(())
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if c < '\u{20}' => {
                write!(out, "\\u{:04x}", u32::from(c)).expect("writing to a String cannot fail");
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn jcs(value: Value) -> String {
        to_canonical_json(&value).unwrap()
    }

    #[test]
    fn object_members_are_sorted_without_whitespace() {
        assert_eq!(
            jcs(json!({"b": [1, true, null], "a": {"d": "x", "c": -5}})),
            r#"{"a":{"c":-5,"d":"x"},"b":[1,true,null]}"#
        );
        assert_eq!(jcs(json!({})), "{}");
        assert_eq!(jcs(json!([])), "[]");
    }

    #[test]
    fn member_names_sort_by_utf16_code_units() {
        // U+E000 is one code unit 0xE000; U+1F600 is the surrogate pair 0xD83D 0xDE00, which
        // sorts first in UTF-16 although it sorts last in UTF-8.
        let value = json!({"\u{e000}": 1, "\u{1f600}": 2, "a": 3, "A": 4});
        assert_eq!(
            jcs(value),
            "{\"A\":4,\"a\":3,\"\u{1f600}\":2,\"\u{e000}\":1}"
        );
    }

    #[test]
    fn strings_use_minimal_escapes() {
        assert_eq!(
            jcs(json!("q\"b\\\u{8}\t\n\u{c}\r\u{1}\u{1f}\u{7f}é<>&/")),
            "\"q\\\"b\\\\\\b\\t\\n\\f\\r\\u0001\\u001f\u{7f}é<>&/\""
        );
    }

    #[test]
    fn only_safe_integers_are_numbers() {
        assert_eq!(jcs(json!(9_007_199_254_740_991_u64)), "9007199254740991");
        assert_eq!(jcs(json!(-9_007_199_254_740_991_i64)), "-9007199254740991");
        assert_eq!(jcs(json!(0)), "0");
        assert!(to_canonical_json(&json!(9_007_199_254_740_992_u64)).is_err());
        assert!(to_canonical_json(&json!(1.5)).is_err());
    }
}
