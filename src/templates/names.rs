//! Kubernetes name rules used by templates: DNS-1123 labels and subdomains, qualified names
//! (label and annotation keys) and label values.

/// Longest DNS-1123 label.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest DNS-1123 subdomain.
pub const MAX_SUBDOMAIN_LEN: usize = 253;

/// A DNS-1123 label: 1..=63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn is_dns1123_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_LABEL_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// A DNS-1123 subdomain whose every dot-separated part is a DNS-1123 label; ≤253 bytes.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SUBDOMAIN_LEN && s.split('.').all(is_dns1123_label)
}

/// The name part of a qualified name: 1..=63 of `[A-Za-z0-9_.-]`, starting and ending
/// alphanumeric.
fn is_qualified_name_part(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_LABEL_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// A Kubernetes qualified name (a label or annotation key): `name` or `prefix/name`, where the
/// prefix is a DNS-1123 subdomain and the name is 1..=63 of `[A-Za-z0-9_.-]` with alphanumeric
/// ends.
pub fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        None => is_qualified_name_part(s),
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_qualified_name_part(name),
    }
}

/// A Kubernetes label value: empty, or a qualified-name part (≤63, `[A-Za-z0-9_.-]`,
/// alphanumeric ends).
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_are_lowercase_alphanumeric_with_inner_dashes() {
        for ok in ["a", "default", "a-b", "0", "x".repeat(63).as_str()] {
            assert!(is_dns1123_label(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a.b",
            "a_b",
            "x".repeat(64).as_str(),
            "ä",
        ] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
    }

    #[test]
    fn dns_subdomains_are_dotted_labels() {
        assert!(is_dns1123_subdomain("registry-creds"));
        assert!(is_dns1123_subdomain("a.b.example"));
        for bad in ["", "a..b", ".a", "a.", "A.b", "a/b", &"x".repeat(64)] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
        let long = [
            "x".repeat(63),
            "y".repeat(63),
            "z".repeat(63),
            "w".repeat(61),
        ]
        .join(".");
        assert_eq!(long.len(), 253);
        assert!(is_dns1123_subdomain(&long));
        assert!(!is_dns1123_subdomain(&format!("{long}a")));
    }

    #[test]
    fn qualified_names_allow_one_subdomain_prefix() {
        for ok in [
            "zone",
            "kubernetes.io/arch",
            "node-role.kubernetes.io/worker",
            "a_b.c-D",
            "example.com/Name_1",
        ] {
            assert!(is_qualified_name(ok), "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "a/b/c",
            "-a",
            "a-",
            "Example.com/a",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(!is_qualified_name(bad), "{bad}");
        }
    }

    #[test]
    fn label_values_may_be_empty() {
        assert!(is_label_value(""));
        assert!(is_label_value("amd64"));
        assert!(is_label_value("A.b_c-1"));
        assert!(!is_label_value("-a"));
        assert!(!is_label_value("a/b"));
        assert!(!is_label_value(&"x".repeat(64)));
    }
}
