//! Go-style duration strings (`"30s"`, `"5m"`, `"1m30s"`, `"1.5h"`), as `maxCommandDuration` is
//! written, parsed exactly.
//!
//! The grammar is Go's `time.ParseDuration`: an optional sign, then one or more `number unit`
//! pairs (units `ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`; numbers may have a fraction), or the
//! bare string `"0"`. Unlike Go, the value is computed exactly (no rounding of fractions), and
//! the result must be a whole number of milliseconds, because the wire and the revision id carry
//! milliseconds.

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a Go duration.
    #[error("{0:?} is not a duration such as \"30s\", \"5m\" or \"1m30s\"")]
    Malformed(String),
    /// Has a part finer than a millisecond.
    #[error("{0:?} is not a whole number of milliseconds")]
    SubMillisecond(String),
    /// Too large to represent.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

const NANOS_PER_MILLI: i128 = 1_000_000;

/// Parses a Go duration string into signed milliseconds.
pub fn parse_go_duration_millis(text: &str) -> Result<i64, DurationError> {
    let nanos = parse_go_duration_nanos(text)?;
    if nanos % NANOS_PER_MILLI != 0 {
        return Err(DurationError::SubMillisecond(text.to_owned()));
    }
    i64::try_from(nanos / NANOS_PER_MILLI).map_err(|_| DurationError::TooLarge(text.to_owned()))
}

fn unit_nanos(unit: &str) -> Option<i128> {
    Some(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        _ => return None,
    })
}

fn parse_go_duration_nanos(text: &str) -> Result<i128, DurationError> {
    let malformed = || DurationError::Malformed(text.to_owned());
    let too_large = || DurationError::TooLarge(text.to_owned());
    let (negative, mut rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(malformed());
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, after) = rest.split_at(int_len);
        let (frac_part, after) = match after.strip_prefix('.') {
            Some(after) => {
                let frac_len = after.bytes().take_while(u8::is_ascii_digit).count();
                after.split_at(frac_len)
            }
            None => ("", after),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(malformed());
        }
        let unit_len = after
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(after.len(), |(i, _)| i);
        let (unit, after) = after.split_at(unit_len);
        let unit = unit_nanos(unit).ok_or_else(malformed)?;
        // Bound the digits so the exact arithmetic below cannot overflow.
        let int_part = int_part.trim_start_matches('0');
        let frac_part = frac_part.trim_end_matches('0');
        if int_part.len() > 20 || frac_part.len() > 20 {
            return Err(too_large());
        }
        let whole: i128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| malformed())?
        };
        let mut component = whole.checked_mul(unit).ok_or_else(too_large)?;
        if !frac_part.is_empty() {
            let numerator: i128 = frac_part.parse().map_err(|_| malformed())?;
            let denominator = 10_i128.pow(u32::try_from(frac_part.len()).unwrap_or(20));
            let scaled = numerator.checked_mul(unit).ok_or_else(too_large)?;
            if scaled % denominator != 0 {
                return Err(DurationError::SubMillisecond(text.to_owned()));
            }
            component = component
                .checked_add(scaled / denominator)
                .ok_or_else(too_large)?;
        }
        total = total.checked_add(component).ok_or_else(too_large)?;
        rest = after;
    }
    Ok(if negative { -total } else { total })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> i64 {
        parse_go_duration_millis(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn go_durations_convert_to_milliseconds() {
        assert_eq!(ms("30s"), 30_000);
        assert_eq!(ms("5m"), 300_000);
        assert_eq!(ms("1m30s"), 90_000);
        assert_eq!(ms("1h"), 3_600_000);
        assert_eq!(ms("1.5h"), 5_400_000);
        assert_eq!(ms("1h0m0s"), 3_600_000);
        assert_eq!(ms("250ms"), 250);
        assert_eq!(ms("1000us"), 1);
        assert_eq!(ms("1000\u{b5}s"), 1);
        assert_eq!(ms("1000\u{3bc}s"), 1);
        assert_eq!(ms("2000000ns"), 2);
        assert_eq!(ms(".5s"), 500);
        assert_eq!(ms("1.s"), 1_000);
        assert_eq!(ms("0"), 0);
        assert_eq!(ms("-1s"), -1_000);
        assert_eq!(ms("+1s"), 1_000);
        assert_eq!(ms("1m1m"), 120_000);
    }

    #[test]
    fn malformed_durations_are_refused() {
        for text in [
            "", "5", "300", "m", "5 m", "5M", "1d", "1.2.3s", ".s", "-", "s5", "1m 30s", "five",
            "+", "--1s", "1h-1m",
        ] {
            assert!(
                matches!(
                    parse_go_duration_millis(text),
                    Err(DurationError::Malformed(_))
                ),
                "{text:?} should be malformed"
            );
        }
    }

    #[test]
    fn sub_millisecond_and_huge_durations_are_refused() {
        assert!(matches!(
            parse_go_duration_millis("1500us"),
            Err(DurationError::SubMillisecond(_))
        ));
        assert!(matches!(
            parse_go_duration_millis("1ns"),
            Err(DurationError::SubMillisecond(_))
        ));
        assert!(matches!(
            parse_go_duration_millis("0.0001s"),
            Err(DurationError::SubMillisecond(_))
        ));
        assert!(matches!(
            parse_go_duration_millis("999999999999999999999999h"),
            Err(DurationError::TooLarge(_))
        ));
    }
}
