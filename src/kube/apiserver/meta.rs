//! Object metadata helpers: reading and writing `metadata` fields of JSON objects, RFC 3339
//! timestamps, UUID-shaped uids, `generateName` suffixes and name validation.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use crate::runtime::IdSource;

/// `metadata.<field>` as a string, if present and a string.
pub fn get_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

/// `metadata.<field>` as a non-empty string.
pub fn non_empty<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    get_str(object, field).filter(|s| !s.is_empty())
}

/// The `metadata` map, created if missing or not an object.
pub fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = Value::Object(Map::new());
    }
    let map = object.as_object_mut().expect("object was just ensured");
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut().expect("metadata was just ensured")
}

/// `metadata.finalizers` as strings (missing means none).
pub fn finalizers(object: &Value) -> Vec<String> {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Drops null and empty collection values from `metadata`, as the real server's typed storage
/// does, so equal objects compare equal.
pub fn normalize(object: &mut Value) {
    let meta = meta_mut(object);
    meta.retain(|_, v| match v {
        Value::Null => false,
        Value::Array(items) => !items.is_empty(),
        Value::Object(map) => !map.is_empty(),
        _ => true,
    });
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// An RFC 3339 UTC timestamp with whole seconds, the form Kubernetes stores.
pub fn rfc3339(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let secs = i64::try_from(secs).unwrap_or(i64::MAX / 2);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A random version-4 UUID string.
pub fn uuid(ids: &dyn IdSource) -> String {
    let mut b = [0u8; 16];
    ids.fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The 5-character random suffix the real server appends to `generateName`.
pub fn name_suffix(ids: &dyn IdSource) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut b = [0u8; 5];
    ids.fill(&mut b);
    b.iter()
        .map(|x| char::from(ALPHABET[usize::from(*x) % ALPHABET.len()]))
        .collect()
}

/// Checks a DNS-1123 subdomain name (what every served kind requires).
pub fn validate_name(name: &str) -> Result<(), String> {
    let label_ok = |label: &str| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b.first().is_some_and(u8::is_ascii_alphanumeric)
            && b.last().is_some_and(u8::is_ascii_alphanumeric)
    };
    if name.len() <= 253 && name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!(
            "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case \
             alphanumeric characters, '-' or '.', and must start and end with an alphanumeric \
             character"
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::runtime::SeededIds;

    #[test]
    fn timestamps_are_rfc3339_utc_seconds() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_796_083_200 + 3_723);
        assert_eq!(rfc3339(t), "2026-12-01T01:02:03Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
        let frac = UNIX_EPOCH + Duration::from_millis(1_500);
        assert_eq!(rfc3339(frac), "1970-01-01T00:00:01Z");
    }

    #[test]
    fn uids_are_uuid_shaped_and_deterministic_for_a_seed() {
        let a = uuid(&SeededIds::new(1));
        assert_eq!(a, uuid(&SeededIds::new(1)));
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            vec![8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
    }

    #[test]
    fn name_suffixes_use_the_real_alphabet() {
        let s = name_suffix(&SeededIds::new(3));
        assert_eq!(s.len(), 5);
        assert!(s.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)));
    }

    #[test]
    fn names_must_be_dns_subdomains() {
        for good in ["a", "env-1", "a.b-c.d", "0abc"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", "A", "-a", "a-", "a..b", "a_b", &"x".repeat(254)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn normalize_drops_empty_metadata_collections() {
        let mut obj = json!({"metadata": {"name": "a", "labels": {}, "finalizers": [], "annotations": null, "uid": "u"}});
        normalize(&mut obj);
        assert_eq!(obj, json!({"metadata": {"name": "a", "uid": "u"}}));
        assert_eq!(finalizers(&obj), Vec::<String>::new());
    }
}
