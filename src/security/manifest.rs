//! The security manifest (JSON, decoded strictly): the TLS file names, the client allowlist
//! with each client's policy, and the grant signing parameters and keyring (DECISIONS 4; the
//! era-A fields of api-security §6.1, validated in [`super::keys`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::identity::canonical_client_uri;
use super::keys::{self, ManifestKey};
use super::policy::{ClientPolicy, SecuritySnapshot};
use crate::server::limiter::LimiterBounds;

/// Largest manifest accepted.
pub const MAX_MANIFEST_BYTES: usize = 8 * 1024 * 1024;
const MAX_CLIENTS: usize = 256;
const MAX_ADMINISTRATOR_FOR: usize = 256;
const MAX_TEMPLATES: usize = 64;

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Not strict JSON of the expected shape.
    #[error("security manifest does not decode: {0}")]
    Decode(#[from] serde_json::Error),
    /// Larger than [`MAX_MANIFEST_BYTES`].
    #[error("security manifest exceeds {MAX_MANIFEST_BYTES} bytes")]
    TooLarge,
    /// Decodes but breaks a rule.
    #[error("security manifest is invalid: {0}")]
    Invalid(String),
}

/// The manifest file, exactly as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityManifest {
    /// Format version; must be 1.
    pub version: u32,
    /// Monotonic authority generation, 1..2^63-1.
    pub generation: u64,
    /// TLS file names (basenames in the TLS directory).
    pub tls: TlsFiles,
    /// The client allowlist.
    pub clients: Vec<ManifestClient>,
    /// `iss` of every grant.
    pub issuer: String,
    /// `aud` of every grant.
    pub audience: String,
    /// The key that signs grants.
    #[serde(rename = "activeKeyID")]
    pub active_key_id: String,
    /// Grant lifetime, a Go duration (`5m`), 0 < x <= 5m.
    #[serde(rename = "grantTTL")]
    pub grant_ttl: String,
    /// Widens the accepted lifetime ceiling only, 0 <= x < grantTTL.
    #[serde(rename = "clockSkew")]
    pub clock_skew: String,
    /// The grant keys, 1..64.
    pub keys: Vec<ManifestKey>,
    /// Bounds of the RPC limiter (optional; `serve`/`dev` flags win). Not part of the
    /// authority digest: a per-replica operating bound, applied on the next reload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimiterBounds>,
}

/// TLS material, by basename.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsFiles {
    /// The server certificate chain (PEM).
    pub certificate_file: String,
    /// The server private key (PEM).
    pub private_key_file: String,
    /// The CA bundle client certificates must chain to (PEM).
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: String,
}

/// One admitted client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ManifestClient {
    /// Canonical client URI (the certificate's URI SAN).
    pub uri: String,
    /// May attest owners (data plane).
    #[serde(default)]
    pub may_attest_owner: bool,
    /// May call the admin lifecycle.
    #[serde(default)]
    pub administrator: bool,
    /// Creators this admin may administer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub administrator_for: Vec<String>,
    /// Templates this client may use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub execution_templates: Vec<String>,
}

impl SecurityManifest {
    /// Decodes and validates a manifest.
    pub fn parse(bytes: &[u8]) -> Result<Self, ManifestError> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge);
        }
        let manifest: Self = serde_json::from_slice(bytes)?;
        manifest.validate()?;
        Ok(manifest)
    }

    fn validate(&self) -> Result<(), ManifestError> {
        let invalid = |m: &str| Err(ManifestError::Invalid(m.to_owned()));
        if self.version != 1 {
            return invalid("version must be 1");
        }
        if self.generation == 0 || self.generation > i64::MAX as u64 {
            return invalid("generation must be in 1..2^63-1");
        }
        for name in [
            &self.tls.certificate_file,
            &self.tls.private_key_file,
            &self.tls.client_ca_file,
        ] {
            if !is_basename(name) {
                return invalid("tls files must be plain file names");
            }
        }
        if self.clients.is_empty() || self.clients.len() > MAX_CLIENTS {
            return invalid("clients must have 1..256 entries");
        }
        let mut seen = BTreeSet::new();
        for client in &self.clients {
            let uri = canonical_client_uri(&client.uri)
                .map_err(|_| ManifestError::Invalid("client uri is not canonical".into()))?;
            if uri != client.uri || !seen.insert(uri) {
                return invalid("client uris must be canonical and unique");
            }
            client.validate()?;
        }
        if let Some(limits) = self.limits {
            limits
                .resolve()
                .map_err(|e| ManifestError::Invalid(e.to_string()))?;
        }
        keys::validate(self)
    }

    /// The allowlist this manifest admits.
    pub fn snapshot(&self) -> SecuritySnapshot {
        let clients: BTreeMap<_, _> = self
            .clients
            .iter()
            .map(|c| {
                let policy = ClientPolicy {
                    may_attest_owner: c.may_attest_owner,
                    administrator: c.administrator,
                    administrator_for: c.administrator_for.clone(),
                    execution_templates: c.execution_templates.clone(),
                };
                (c.uri.clone(), policy)
            })
            .collect();
        SecuritySnapshot {
            generation: self.generation,
            clients,
        }
    }
}

impl ManifestClient {
    fn validate(&self) -> Result<(), ManifestError> {
        let invalid = |m: &str| Err(ManifestError::Invalid(m.to_owned()));
        if !self.administrator_for.is_empty() && !self.administrator {
            return invalid("administratorFor requires administrator");
        }
        if self.administrator_for.len() > MAX_ADMINISTRATOR_FOR {
            return invalid("administratorFor has more than 256 entries");
        }
        let mut creators = BTreeSet::new();
        for creator in &self.administrator_for {
            let wildcard = creator.contains(['*', '?'])
                || creator.contains("%2a")
                || creator.contains("%2A")
                || creator.contains("%3f")
                || creator.contains("%3F");
            let canonical = canonical_client_uri(creator).ok();
            if wildcard || canonical.as_deref() != Some(creator) || !creators.insert(creator) {
                return invalid("administratorFor entries must be unique canonical URIs");
            }
        }
        if !self.execution_templates.is_empty() && !self.may_attest_owner {
            return invalid("executionTemplates requires mayAttestOwner");
        }
        if self.execution_templates.len() > MAX_TEMPLATES {
            return invalid("executionTemplates has more than 64 entries");
        }
        let mut templates = BTreeSet::new();
        for id in &self.execution_templates {
            if !is_dns_label(id) || !templates.insert(id) {
                return invalid("executionTemplates entries must be unique DNS labels");
            }
        }
        Ok(())
    }
}

/// A plain file name: no directory part, not `.` or `..`.
pub fn is_basename(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// A DNS-1123 label: 1..63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const SIGNING: &str = r#""issuer":"execution-provider","audience":"execution-provider","activeKeyID":"k1","grantTTL":"5m","clockSkew":"0s","keys":[{"id":"k1","version":1,"file":"grant.key","publicKeySHA256":"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff","activateAt":"2020-01-01T00:00:00Z","verifyUntil":"2100-01-01T00:00:00Z","state":"active"}]"#;

    fn manifest(clients: &str) -> String {
        format!(
            r#"{{"version":1,"generation":3,"tls":{{"certificateFile":"server.pem","privateKeyFile":"server.key","clientCAFile":"clients.pem"}},"clients":{clients},{SIGNING}}}"#
        )
    }

    #[test]
    fn a_valid_manifest_admits_its_clients() {
        let text = manifest(
            r#"[{"uri":"spiffe://cluster/ns/platform","mayAttestOwner":true,"executionTemplates":["default"]}]"#,
        );
        let snapshot = SecurityManifest::parse(text.as_bytes()).unwrap().snapshot();
        let client = snapshot.admit("spiffe://cluster/ns/platform").unwrap();
        assert!(client.policy.may_use_template("default"));
        assert!(snapshot.admit("spiffe://cluster/ns/other").is_none());
    }

    /// The generation is 1..=2^63-1 (it is compared as a signed count elsewhere): both ends
    /// are admitted, 0 and 2^63 are refused.
    #[test]
    fn the_generation_is_admitted_exactly_in_1_to_2_pow_63_minus_1() {
        let ok = r#"[{"uri":"spiffe://c/a","mayAttestOwner":true}]"#;
        let with = |generation: u64| {
            manifest(ok).replacen(
                "\"generation\":3",
                &format!("\"generation\":{generation}"),
                1,
            )
        };
        for admitted in [1, i64::MAX as u64] {
            let text = with(admitted);
            assert!(
                SecurityManifest::parse(text.as_bytes()).is_ok(),
                "{admitted}"
            );
        }
        for refused in [0, i64::MAX as u64 + 1, u64::MAX] {
            let text = with(refused);
            assert!(
                matches!(
                    SecurityManifest::parse(text.as_bytes()),
                    Err(ManifestError::Invalid(_))
                ),
                "{refused}"
            );
        }
    }

    #[test]
    fn unknown_fields_duplicate_keys_and_trailing_values_are_refused() {
        let ok = r#"[{"uri":"spiffe://c/a","mayAttestOwner":true}]"#;
        let unknown = manifest(ok).replacen("\"version\":1", "\"version\":1,\"surprise\":\"x\"", 1);
        let duplicate = manifest(ok).replacen("\"version\":1", "\"version\":1,\"version\":1", 1);
        let trailing = format!("{} {{}}", manifest(ok));
        for bad in [unknown, duplicate, trailing] {
            assert!(
                matches!(
                    SecurityManifest::parse(bad.as_bytes()),
                    Err(ManifestError::Decode(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_manifest_of_8_mib_decodes_and_one_byte_more_is_refused_before_decoding() {
        let ok = r#"[{"uri":"spiffe://c/a","mayAttestOwner":true}]"#;
        let mut padded = manifest(ok).into_bytes();
        assert!(SecurityManifest::parse(&padded).is_ok());
        // api-security §6.1: a body of exactly 8 MiB decodes; one byte more is refused.
        padded.resize(8 << 20, b' ');
        assert!(SecurityManifest::parse(&padded).is_ok());
        padded.push(b' ');
        assert!(matches!(
            SecurityManifest::parse(&padded),
            Err(ManifestError::TooLarge)
        ));
    }

    #[test]
    fn policy_rules_are_enforced() {
        for clients in [
            r#"[]"#,
            r#"[{"uri":"spiffe://c/a","administratorFor":["spiffe://c/b"]}]"#,
            r#"[{"uri":"spiffe://c/a","administrator":true,"administratorFor":["spiffe://c/*"]}]"#,
            r#"[{"uri":"spiffe://c/a","executionTemplates":["default"]}]"#,
            r#"[{"uri":"spiffe://c/a","mayAttestOwner":true,"executionTemplates":["Bad_Id"]}]"#,
            r#"[{"uri":"spiffe://c/a"},{"uri":"spiffe://c/a"}]"#,
            r#"[{"uri":"SPIFFE://c/a"}]"#,
        ] {
            let text = manifest(clients);
            assert!(
                matches!(
                    SecurityManifest::parse(text.as_bytes()),
                    Err(ManifestError::Invalid(_))
                ),
                "{clients}"
            );
        }
    }

    #[test]
    fn administrator_for_scopes_follow_the_catalogue() {
        let admin = |scope: &str| {
            manifest(&format!(
                r#"[{{"uri":"spiffe://c/a","administrator":true{scope}}}]"#
            ))
        };
        for ok in [
            "",
            r#","administratorFor":[]"#,
            r#","administratorFor":["spiffe://c/b"]"#,
        ] {
            assert!(
                SecurityManifest::parse(admin(ok).as_bytes()).is_ok(),
                "{ok}"
            );
        }
        let not_admin = manifest(r#"[{"uri":"spiffe://c/a","administratorFor":["spiffe://c/b"]}]"#);
        assert!(SecurityManifest::parse(not_admin.as_bytes()).is_err());
        for bad in [
            r#"["spiffe://c/b","spiffe://c/b"]"#,
            r#"["*"]"#,
            r#"["spiffe://c/%2A"]"#,
            r#"["spiffe://C/b"]"#,
            r#"["spiffe://c/b?x=1"]"#,
            r#"["spiffe://c/b#f"]"#,
            r#"["spiffe://u@c/b"]"#,
            r#"["/ns/b"]"#,
        ] {
            let text = admin(&format!(r#","administratorFor":{bad}"#));
            assert!(SecurityManifest::parse(text.as_bytes()).is_err(), "{bad}");
        }
        let unknown = admin(r#","administratorFor":[],"wildcard":true"#);
        assert!(matches!(
            SecurityManifest::parse(unknown.as_bytes()),
            Err(ManifestError::Decode(_))
        ));
        let scopes = |n: usize| {
            let list: Vec<String> = (0..n).map(|i| format!(r#""spiffe://c/s{i}""#)).collect();
            admin(&format!(r#","administratorFor":[{}]"#, list.join(",")))
        };
        assert!(SecurityManifest::parse(scopes(256).as_bytes()).is_ok());
        assert!(SecurityManifest::parse(scopes(257).as_bytes()).is_err());
    }

    #[test]
    fn grant_signing_fields_are_validated() {
        let clients = r#"[{"uri":"spiffe://c/a","mayAttestOwner":true}]"#;
        let invalid = [
            (r#""activeKeyID":"k1""#, r#""activeKeyID":"k9""#),
            (r#""grantTTL":"5m""#, r#""grantTTL":"6m""#),
            (r#""grantTTL":"5m""#, r#""grantTTL":"0s""#),
            (r#""clockSkew":"0s""#, r#""clockSkew":"5m""#),
            (r#""issuer":"execution-provider""#, r#""issuer":"""#),
            (r#""file":"grant.key""#, r#""file":"../grant.key""#),
            (r#""version":1,"file""#, r#""version":0,"file""#),
            (r#""state":"active""#, r#""state":"verify-only""#),
            (
                r#""verifyUntil":"2100-01-01T00:00:00Z""#,
                r#""verifyUntil":"2019-01-01T00:00:00Z""#,
            ),
            (r#""publicKeySHA256":"00"#, r#""publicKeySHA256":"zz"#),
        ];
        for (from, to) in invalid {
            let text = manifest(clients).replacen(from, to, 1);
            assert_ne!(text, manifest(clients), "{from}");
            assert!(
                matches!(
                    SecurityManifest::parse(text.as_bytes()),
                    Err(ManifestError::Invalid(_))
                ),
                "{to}"
            );
        }
        let limits = [
            (r#"{"maxConcurrentRPCs":0}"#, false),
            (r#"{"maxConcurrentRPCs":4097}"#, false),
            (
                r#"{"maxConcurrentRPCs":8,"maxConcurrentRPCsPerClient":9}"#,
                false,
            ),
            (r#"{"maxConcurrentRPCsPerClient":0}"#, false),
            (
                r#"{"maxConcurrentRPCs":8,"maxConcurrentRPCsPerClient":8}"#,
                true,
            ),
            (r#"{}"#, true),
        ];
        for (bounds, valid) in limits {
            let text = manifest(clients).replacen(
                r#""version":1,"#,
                &format!(r#""version":1,"limits":{bounds},"#),
                1,
            );
            assert_eq!(
                SecurityManifest::parse(text.as_bytes()).is_ok(),
                valid,
                "{bounds}"
            );
        }
        let unknown = manifest(clients).replacen(
            r#""version":1,"#,
            r#""version":1,"limits":{"queue":1},"#,
            1,
        );
        assert!(matches!(
            SecurityManifest::parse(unknown.as_bytes()),
            Err(ManifestError::Decode(_))
        ));
        let unknown_state =
            manifest(clients).replacen(r#""state":"active""#, r#""state":"retired""#, 1);
        assert!(matches!(
            SecurityManifest::parse(unknown_state.as_bytes()),
            Err(ManifestError::Decode(_))
        ));
    }
}
