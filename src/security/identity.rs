//! Client identity: exactly one canonical URI SAN in the leaf certificate (CN and DNS SANs are
//! ignored). The canonical form lowercases scheme and host and keeps the path as given.

use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::{FromDer, X509Certificate};

/// Why a certificate does not name a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The certificate is not valid DER X.509.
    #[error("certificate does not parse")]
    Unparseable,
    /// The certificate has no URI SAN, or more than one.
    #[error("certificate must carry exactly one URI SAN, found {0}")]
    UriSanCount(usize),
    /// The URI SAN is not an acceptable identity.
    #[error("URI SAN is not a canonical client identity")]
    BadUri,
}

/// The canonical client URI named by a leaf certificate in DER form.
pub fn client_identity(leaf_der: &[u8]) -> Result<String, IdentityError> {
    let (_, cert) = X509Certificate::from_der(leaf_der).map_err(|_| IdentityError::Unparseable)?;
    let mut uris = Vec::new();
    for ext in cert.extensions() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext.parsed_extension() {
            for name in &san.general_names {
                if let GeneralName::URI(uri) = name {
                    uris.push(*uri);
                }
            }
        }
    }
    match uris.as_slice() {
        [uri] => canonical_client_uri(uri),
        other => Err(IdentityError::UriSanCount(other.len())),
    }
}

/// Canonicalises a client URI: a non-empty scheme and host, no userinfo, query or fragment;
/// scheme and host lowercased, the path kept byte for byte.
pub fn canonical_client_uri(raw: &str) -> Result<String, IdentityError> {
    if raw.contains(['?', '#']) || raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(IdentityError::BadUri);
    }
    let (scheme, rest) = raw.split_once("://").ok_or(IdentityError::BadUri)?;
    let scheme_ok = scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok {
        return Err(IdentityError::BadUri);
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(IdentityError::BadUri);
    }
    Ok(format!(
        "{}://{}{}",
        scheme.to_ascii_lowercase(),
        authority.to_ascii_lowercase(),
        path
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with_sans(sans: Vec<rcgen::SanType>) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = sans;
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn uri(s: &str) -> rcgen::SanType {
        rcgen::SanType::URI(s.try_into().unwrap())
    }

    #[test]
    fn one_uri_san_is_the_identity_in_canonical_form() {
        let der = cert_with_sans(vec![uri("SPIFFE://Cluster/ns/Platform")]);
        assert_eq!(
            client_identity(&der).unwrap(),
            "spiffe://cluster/ns/Platform"
        );
    }

    #[test]
    fn zero_or_two_uri_sans_are_refused() {
        let none = cert_with_sans(vec![rcgen::SanType::DnsName(
            "a.example".try_into().unwrap(),
        )]);
        assert_eq!(client_identity(&none), Err(IdentityError::UriSanCount(0)));
        let two = cert_with_sans(vec![uri("spiffe://a/x"), uri("spiffe://a/y")]);
        assert_eq!(client_identity(&two), Err(IdentityError::UriSanCount(2)));
    }

    #[test]
    fn userinfo_query_fragment_and_missing_host_are_refused() {
        for bad in [
            "spiffe://user@host/x",
            "spiffe://host/x?q=1",
            "spiffe://host/x#f",
            "spiffe:///x",
            "no-scheme/x",
            "1x://host/x",
        ] {
            assert_eq!(
                canonical_client_uri(bad),
                Err(IdentityError::BadUri),
                "{bad}"
            );
        }
    }
}
