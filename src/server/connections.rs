//! Bounds on connections to the mTLS port (api-security §7, issue 15 item 3): at most
//! `--max-connections` established connections (default 1,024) and at most
//! `--max-tls-handshakes` TLS handshakes in progress (default 64). A connection beyond either
//! bound is closed at once after `accept`; nothing queues. A connection's place is held from
//! its `accept` until it closes, a handshake's from its `accept` until the handshake ends
//! (at most the handshake timeout).

/// Default bound on open connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default bound on TLS handshakes in progress.
pub const DEFAULT_MAX_TLS_HANDSHAKES: usize = 64;
/// The largest bound accepted for either.
pub const MAX_BOUND: usize = 65_536;

/// The configured connection bounds; an absent bound takes its default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
pub struct ConnectionBounds {
    /// Bound on open connections to the mTLS port (1..65536; default 1024).
    #[arg(
        long = "max-connections",
        env = "EXECUTION_PROVIDER_MAX_CONNECTIONS",
        value_parser = parse_bound
    )]
    pub connections: Option<usize>,
    /// Bound on TLS handshakes in progress on the mTLS port (1..65536; default 64).
    #[arg(
        long = "max-tls-handshakes",
        env = "EXECUTION_PROVIDER_MAX_TLS_HANDSHAKES",
        value_parser = parse_bound
    )]
    pub handshakes: Option<usize>,
}

impl ConnectionBounds {
    /// The effective `(connections, handshakes)` bounds, defaults filled in.
    pub fn resolve(self) -> (usize, usize) {
        (
            self.connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
            self.handshakes.unwrap_or(DEFAULT_MAX_TLS_HANDSHAKES),
        )
    }
}

fn parse_bound(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=MAX_BOUND).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{text}` must be a whole number in 1..={MAX_BOUND}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_bounds_take_the_defaults_and_flags_are_range_checked() {
        assert_eq!(ConnectionBounds::default().resolve(), (1024, 64));
        let set = ConnectionBounds {
            connections: Some(8),
            handshakes: Some(2),
        };
        assert_eq!(set.resolve(), (8, 2));
        assert_eq!(parse_bound("65536"), Ok(65_536));
        for bad in ["0", "65537", "-1", "x"] {
            assert!(parse_bound(bad).is_err(), "{bad}");
        }
    }
}
