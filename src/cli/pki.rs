//! A development PKI: one CA, a server certificate for localhost and a client certificate
//! whose URI SAN is the client identity. For `dev` mode and tests only.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate and its key, both PEM.
#[derive(Debug, Clone)]
pub struct PemPair {
    /// The certificate.
    pub cert: String,
    /// The private key (PKCS#8).
    pub key: String,
}

/// A CA that can issue leaves.
pub struct DevCa {
    /// The CA certificate and key.
    pub pem: PemPair,
    issuer: Issuer<'static, KeyPair>,
}

/// Why certificate generation failed.
#[derive(Debug, thiserror::Error)]
#[error("certificate generation failed: {0}")]
pub struct PkiError(#[from] rcgen::Error);

/// The common name of the development CA.
pub const DEV_CA_NAME: &str = "execution-provider dev CA";

fn ca_params(common_name: &str) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

impl DevCa {
    /// Reloads a CA made by [`DevCa::generate`] with `common_name` from its PEM files, to
    /// issue more leaves.
    pub fn load(common_name: &str, cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let key = KeyPair::from_pem(key_pem)?;
        Ok(Self {
            pem: PemPair {
                cert: cert_pem.to_owned(),
                key: key_pem.to_owned(),
            },
            issuer: Issuer::new(ca_params(common_name)?, key),
        })
    }

    /// A new self-signed CA named `common_name`.
    pub fn generate(common_name: &str) -> Result<Self, PkiError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let params = ca_params(common_name)?;
        let cert = params.self_signed(&key)?;
        let pem = PemPair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        };
        Ok(Self {
            pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// A server certificate for `localhost` and `127.0.0.1`.
    pub fn server(&self) -> Result<PemPair, PkiError> {
        self.server_for(std::net::IpAddr::from([127, 0, 0, 1]))
    }

    /// A server certificate for `localhost`, `127.0.0.1` and `ip`.
    pub fn server_for(&self, ip: std::net::IpAddr) -> Result<PemPair, PkiError> {
        let mut sans = vec![
            SanType::DnsName("localhost".try_into()?),
            SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])),
        ];
        if !ip.is_unspecified() && ip != std::net::IpAddr::from([127, 0, 0, 1]) {
            sans.push(SanType::IpAddress(ip));
        }
        self.leaf(
            "execution-provider",
            sans,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate whose only URI SAN is `uri`.
    pub fn client(&self, uri: &str) -> Result<PemPair, PkiError> {
        let sans = vec![SanType::URI(uri.try_into()?)];
        self.leaf(
            "execution-provider client",
            sans,
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    fn leaf(
        &self,
        common_name: &str,
        sans: Vec<SanType>,
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<PemPair, PkiError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = sans;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(PemPair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}
