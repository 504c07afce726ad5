//! Kubernetes resource quantities, parsed exactly and compared by value (DECISIONS 14).
//!
//! Grammar (the Kubernetes one):
//!
//! ```text
//! quantity  = [sign] number [suffix]
//! number    = digits | digits "." digits | digits "." | "." digits
//! suffix    = binary | decimal | exponent
//! binary    = Ki | Mi | Gi | Ti | Pi | Ei          (powers of 1024)
//! decimal   = n | u | m | k | M | G | T | P | E    (powers of 1000)
//! exponent  = ("e" | "E") [sign] digits            (a power of ten)
//! ```
//!
//! The value is held exactly as a whole number of nano-units in an `i128`, so `0.1`, `100m`
//! and `1e-1` are the same quantity, and `1Gi` is exactly 1 073 741 824. Two choices that differ
//! from the Kubernetes library, which rounds instead: a value finer than one nano-unit
//! (`0.0000000001`) is refused as too precise, and a value whose magnitude does not fit
//! (beyond about 1.7·10²⁹) is refused as too large. Neither is a sensible resource amount.
//!
//! Equality and ordering of [`Quantity`] are by value only; [`Quantity::as_str`] keeps the text
//! exactly as written (the revision id hashes that text, and Pods are built from it).

use std::cmp::Ordering;
use std::fmt;

/// The decimal exponent of one nano-unit, negated: a unit is 10^9 nano-units.
const NANO_EXPONENT: i32 = 9;
/// The largest accepted decimal exponent magnitude; anything beyond cannot fit or is all zero.
const MAX_EXPONENT: i32 = 64;

/// Why a quantity string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string is empty.
    #[error("quantity is empty")]
    Empty,
    /// The string does not follow the quantity grammar.
    #[error("quantity {0:?} is not a valid Kubernetes quantity")]
    Malformed(String),
    /// The value does not fit in the exact representation.
    #[error("quantity {0:?} is too large")]
    TooLarge(String),
    /// The value has a non-zero part finer than one nano-unit.
    #[error("quantity {0:?} is more precise than 1n")]
    TooPrecise(String),
}

/// A parsed Kubernetes quantity: the text as written and its exact value.
#[derive(Clone)]
pub struct Quantity {
    text: String,
    nanos: i128,
}

impl Quantity {
    /// Parses a quantity string.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let nanos = parse_nanos(text)?;
        Ok(Self {
            text: text.to_owned(),
            nanos,
        })
    }

    /// The text exactly as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The exact value in nano-units (`1` is 1 000 000 000, `1m` is 1 000 000).
    pub fn nano_units(&self) -> i128 {
        self.nanos
    }

    /// Whether the value is strictly greater than zero.
    pub fn is_positive(&self) -> bool {
        self.nanos > 0
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl fmt::Debug for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Quantity({:?} = {}n)", self.text, self.nanos)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The scale a suffix applies: a power of ten and a power of two.
#[derive(Clone, Copy)]
struct Scale {
    pow10: i32,
    pow2: u32,
}

fn parse_nanos(text: &str) -> Result<i128, QuantityError> {
    if text.is_empty() {
        return Err(QuantityError::Empty);
    }
    let malformed = || QuantityError::Malformed(text.to_owned());
    let (negative, rest) = match text.as_bytes()[0] {
        b'+' => (false, &text[1..]),
        b'-' => (true, &text[1..]),
        _ => (false, text),
    };
    let number_len = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = rest.split_at(number_len);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if frac_part.contains('.') || (int_part.is_empty() && frac_part.is_empty()) {
        return Err(malformed());
    }
    let scale = parse_suffix(suffix).ok_or_else(malformed)?;

    // mantissa · 10^(pow10 - fraction digits) · 2^pow2, in nano-units.
    let frac_part = frac_part.trim_end_matches('0');
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(0);
    }
    let too_large = || QuantityError::TooLarge(text.to_owned());
    let too_precise = || QuantityError::TooPrecise(text.to_owned());
    // 38 decimal digits always fit in an i128.
    if digits.len() > 38 {
        return Err(too_large());
    }
    let mantissa: i128 = digits.parse().map_err(|_| malformed())?;
    let mantissa = 2_i128
        .checked_pow(scale.pow2)
        .and_then(|p| mantissa.checked_mul(p))
        .ok_or_else(too_large)?;
    let frac_len = i32::try_from(frac_part.len()).map_err(|_| too_precise())?;
    let exponent = scale.pow10 + NANO_EXPONENT - frac_len;
    let magnitude = if exponent >= 0 {
        10_i128
            .checked_pow(exponent.unsigned_abs())
            .and_then(|p| mantissa.checked_mul(p))
            .ok_or_else(too_large)?
    } else {
        let divisor = 10_i128
            .checked_pow(exponent.unsigned_abs())
            .ok_or_else(too_precise)?;
        if mantissa % divisor != 0 {
            return Err(too_precise());
        }
        mantissa / divisor
    };
    Ok(if negative { -magnitude } else { magnitude })
}

fn parse_suffix(suffix: &str) -> Option<Scale> {
    let decimal = |pow10| Some(Scale { pow10, pow2: 0 });
    let binary = |pow2| Some(Scale { pow10: 0, pow2 });
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            let exponent = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            let digits = exponent
                .strip_prefix('+')
                .or_else(|| exponent.strip_prefix('-'))
                .unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let digits = digits.trim_start_matches('0');
            // A longer exponent is out of range either way; treat it as the bound, which the
            // caller turns into "too large" or "too precise".
            let value: i32 = if digits.len() > 4 {
                MAX_EXPONENT + 1
            } else {
                digits.parse().unwrap_or(0).min(MAX_EXPONENT + 1)
            };
            let value = if exponent.starts_with('-') {
                -value
            } else {
                value
            };
            decimal(value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NANOS_PER_UNIT: i128 = 1_000_000_000;

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn a_tenth_equals_one_hundred_milli_units() {
        assert_eq!(q("0.1"), q("100m"));
        assert_eq!(q(".1"), q("1e-1"));
        assert_eq!(q("100m").nano_units(), 100_000_000);
        assert_eq!(q("0.1").as_str(), "0.1");
    }

    #[test]
    fn decimal_and_binary_suffixes_scale_exactly() {
        let cases: [(&str, i128); 18] = [
            ("1", NANOS_PER_UNIT),
            ("1n", 1),
            ("1u", 1_000),
            ("250m", 250_000_000),
            ("1k", 1_000 * NANOS_PER_UNIT),
            ("500M", 500_000_000 * NANOS_PER_UNIT),
            ("1G", 1_000_000_000 * NANOS_PER_UNIT),
            ("1T", 10_i128.pow(12) * NANOS_PER_UNIT),
            ("1P", 10_i128.pow(15) * NANOS_PER_UNIT),
            ("1E", 10_i128.pow(18) * NANOS_PER_UNIT),
            ("1Ki", 1024 * NANOS_PER_UNIT),
            ("128Mi", 128 * (1 << 20) * NANOS_PER_UNIT),
            ("2Gi", 2 * (1 << 30) * NANOS_PER_UNIT),
            ("1Ti", (1 << 40) * NANOS_PER_UNIT),
            ("1Pi", (1 << 50) * NANOS_PER_UNIT),
            ("1Ei", (1 << 60) * NANOS_PER_UNIT),
            ("1.5Gi", 3 * (1 << 29) * NANOS_PER_UNIT),
            ("0.3Ki", 307_200_000_000),
        ];
        for (text, nanos) in cases {
            assert_eq!(q(text).nano_units(), nanos, "{text}");
        }
    }

    #[test]
    fn exponent_forms_are_powers_of_ten() {
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1E3"), q("1000"));
        assert_eq!(q("12e+2"), q("1.2k"));
        assert_eq!(q("5e-3"), q("5m"));
        assert_eq!(q("1e0"), q("1"));
    }

    #[test]
    fn quantities_compare_by_value_not_by_text() {
        assert!(q("1Gi") > q("1G"));
        assert!(q("1000Mi") < q("1Gi"));
        assert_eq!(q("1024Mi"), q("1Gi"));
        assert_eq!(q("1000M"), q("1G"));
        assert_eq!(q("1.0"), q("1"));
        assert_eq!(q("1."), q("1000m"));
        assert!(q("2M") > q("1M"));
        assert!(q("999m") < q("1"));
    }

    #[test]
    fn signs_zero_and_leading_zeros_parse() {
        assert_eq!(q("-1").nano_units(), -NANOS_PER_UNIT);
        assert_eq!(q("+1"), q("1"));
        assert_eq!(q("0").nano_units(), 0);
        assert_eq!(q("0Gi").nano_units(), 0);
        assert_eq!(q("-0"), q("0"));
        assert_eq!(q("007"), q("7"));
        assert!(!q("0").is_positive());
        assert!(!q("-5m").is_positive());
        assert!(q("1n").is_positive());
    }

    #[test]
    fn malformed_quantities_are_refused() {
        assert_eq!(Quantity::parse(""), Err(QuantityError::Empty));
        for text in [
            "abc", "1Gb", "1gi", "1 Gi", " 1", "1K", "1.2.3", ".", "-", "+", "Gi", "1e", "1e+",
            "1ee2", "1e2.5", "1Gi1", "--1", "1mi", "0x10", "1_000", "1,5", "∞",
        ] {
            assert!(
                matches!(Quantity::parse(text), Err(QuantityError::Malformed(_))),
                "{text:?} should be malformed"
            );
        }
    }

    #[test]
    fn out_of_range_quantities_are_refused() {
        assert!(matches!(
            Quantity::parse("1e40"),
            Err(QuantityError::TooLarge(_))
        ));
        assert!(matches!(
            Quantity::parse("1e99999999"),
            Err(QuantityError::TooLarge(_))
        ));
        assert!(matches!(
            Quantity::parse("0.0000000001"),
            Err(QuantityError::TooPrecise(_))
        ));
        assert!(matches!(
            Quantity::parse("1e-99999999"),
            Err(QuantityError::TooPrecise(_))
        ));
        assert!(matches!(
            Quantity::parse("1.5n"),
            Err(QuantityError::TooPrecise(_))
        ));
        // Zero is zero however it is scaled.
        assert_eq!(q("0e-99999").nano_units(), 0);
    }

    fn suffix_strategy() -> impl Strategy<Value = (&'static str, i128)> {
        prop::sample::select(vec![
            ("m", 1_000_000_i128),
            ("", NANOS_PER_UNIT),
            ("k", 1_000 * NANOS_PER_UNIT),
            ("M", 1_000_000 * NANOS_PER_UNIT),
            ("G", 1_000_000_000 * NANOS_PER_UNIT),
            ("Ki", 1024 * NANOS_PER_UNIT),
            ("Mi", 1_048_576 * NANOS_PER_UNIT),
            ("Gi", 1_073_741_824 * NANOS_PER_UNIT),
        ])
    }

    proptest! {
        #[test]
        fn an_integer_with_a_suffix_has_the_scaled_value(
            n in 0_i64..1_000_000_000,
            (suffix, unit) in suffix_strategy(),
        ) {
            let parsed = q(&format!("{n}{suffix}"));
            prop_assert_eq!(parsed.nano_units(), i128::from(n) * unit);
        }

        #[test]
        fn milli_units_equal_their_decimal_spelling(milli in 0_i64..10_000_000) {
            let decimal = format!("{}.{:03}", milli / 1000, milli % 1000);
            prop_assert_eq!(q(&format!("{milli}m")), q(&decimal));
            prop_assert_eq!(q(&format!("{milli}e-3")), q(&decimal));
        }

        #[test]
        fn ordering_matches_the_ordering_of_values(
            a in 0_i64..1_000_000,
            b in 0_i64..1_000_000,
            (sa, ua) in suffix_strategy(),
            (sb, ub) in suffix_strategy(),
        ) {
            let left = q(&format!("{a}{sa}"));
            let right = q(&format!("{b}{sb}"));
            prop_assert_eq!(left.cmp(&right), (i128::from(a) * ua).cmp(&(i128::from(b) * ub)));
        }

        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,12}") {
            let _ = Quantity::parse(&text);
        }
    }
}
