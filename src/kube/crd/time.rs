//! `RfcTime`: the timestamp type of every time field in the resource.
//!
//! Kubernetes' own `Time` keeps only whole seconds. Leases and run claims need sub-second
//! expiry, so the resource stores RFC 3339 UTC text with as many fractional digits as the value
//! has (none, up to nanoseconds), which parses back to the identical instant.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::jiff::Timestamp;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An instant, written as RFC 3339 in UTC (`2026-11-29T14:45:00.25Z`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RfcTime(pub Timestamp);

/// Why a text could not be read as an RFC 3339 instant.
#[derive(Debug, thiserror::Error)]
#[error("invalid RFC 3339 timestamp")]
pub struct RfcTimeError;

impl RfcTime {
    /// The instant `t`, clamped to the representable range (years -9999 to 9999).
    #[must_use]
    pub fn from_system_time(t: SystemTime) -> Self {
        let nanos: i128 = match t.duration_since(UNIX_EPOCH) {
            Ok(after) => i128::try_from(after.as_nanos()).unwrap_or(i128::MAX),
            Err(before) => i128::try_from(before.duration().as_nanos()).map_or(i128::MIN, |n| -n),
        };
        let nanos = nanos.clamp(
            Timestamp::MIN.as_nanosecond(),
            Timestamp::MAX.as_nanosecond(),
        );
        Self(Timestamp::from_nanosecond(nanos).expect("clamped into the representable range"))
    }

    /// The same instant as a `SystemTime`.
    #[must_use]
    pub fn to_system_time(self) -> SystemTime {
        let nanos = self.0.as_nanosecond();
        let magnitude = duration_from_nanos(nanos.unsigned_abs());
        if nanos >= 0 {
            UNIX_EPOCH + magnitude
        } else {
            UNIX_EPOCH - magnitude
        }
    }

    /// The instant with its fraction of a second dropped: conditions keep second precision.
    #[must_use]
    pub fn whole_seconds(self) -> Self {
        Self(Timestamp::new(self.0.as_second(), 0).expect("dropping the fraction stays in range"))
    }
}

/// A `Duration` of `nanos` nanoseconds; every jiff timestamp is within `u64` seconds of the epoch.
fn duration_from_nanos(nanos: u128) -> Duration {
    let seconds = u64::try_from(nanos / 1_000_000_000).expect("jiff timestamps fit in u64 seconds");
    let sub = u32::try_from(nanos % 1_000_000_000).expect("a remainder below 1e9 fits in u32");
    Duration::new(seconds, sub)
}

impl From<Timestamp> for RfcTime {
    fn from(t: Timestamp) -> Self {
        Self(t)
    }
}

impl From<SystemTime> for RfcTime {
    fn from(t: SystemTime) -> Self {
        Self::from_system_time(t)
    }
}

impl fmt::Display for RfcTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // jiff prints a `Timestamp` as RFC 3339 in UTC with the shortest exact fraction.
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for RfcTime {
    type Err = RfcTimeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<Timestamp>().map(Self).map_err(|_| RfcTimeError)
    }
}

impl Serialize for RfcTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RfcTime {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for RfcTime {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RfcTime".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "format": "date-time" })
    }
}
