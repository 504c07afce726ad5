//! A deterministic PKI for the simulation: Ed25519 keys derived from fixed bytes and fixed
//! serial numbers, so certificates are byte-identical in every process (Ed25519 signatures
//! are deterministic and of fixed size, unlike ECDSA) and a replayed seed sees the same TLS
//! traffic shape. It replaces the TLS files of the dev state directory the replicas load.

use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::EncodePrivateKey;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};

/// A certificate and key, PEM.
#[derive(Debug, Clone)]
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// The PKCS#8 private key.
    pub key: String,
}

/// The simulation's certificates.
#[derive(Debug, Clone)]
pub struct SimPki {
    /// The CA that signs every leaf (server and clients).
    pub ca: Pem,
    /// The replicas' server certificate (`localhost`).
    pub server: Pem,
    /// The admitted client (the first platform).
    pub client: Pem,
    /// A second admitted client (another platform), with its own URI SAN.
    pub partner: Pem,
    /// A client the manifest does not admit.
    pub stranger: Pem,
}

fn key(tag: u8) -> KeyPair {
    let signing = SigningKey::from_bytes(&[tag; 32]);
    let der = signing
        .to_pkcs8_der()
        .expect("an Ed25519 key encodes as PKCS#8");
    KeyPair::try_from(der.as_bytes()).expect("rcgen accepts the Ed25519 key")
}

fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    tag: u8,
    name: &str,
    san: SanType,
    usage: ExtendedKeyUsagePurpose,
) -> Pem {
    let key = key(tag);
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("empty SAN list");
    params.serial_number = Some(SerialNumber::from(u64::from(tag)));
    params.subject_alt_names = vec![san];
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![usage];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = params.signed_by(&key, issuer).expect("a leaf certificate");
    Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

/// The parameters of a self-signed CA named `name` with key `tag` as its serial number.
fn ca_params(tag: u8, name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("empty SAN list");
    params.serial_number = Some(SerialNumber::from(u64::from(tag)));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// A CA certificate (a valid trust anchor, so a reload accepts it) that signed no
/// certificate of the simulation: trusting only it distrusts every client, as removing the
/// client CA does (the same bytes every time).
pub fn unrelated_ca() -> String {
    let key = key(6);
    ca_params(6, "execution-provider sim unrelated CA")
        .self_signed(&key)
        .expect("the unrelated CA certificate")
        .pem()
}

impl SimPki {
    /// The PKI (the same bytes every time). `client_uri` and `partner_uri` are the URI SANs
    /// of the two admitted clients.
    pub fn new(client_uri: &str, partner_uri: &str) -> Self {
        let ca_key = key(1);
        let params = ca_params(1, "execution-provider sim CA");
        let ca_cert = params.self_signed(&ca_key).expect("the CA certificate");
        let ca = Pem {
            cert: ca_cert.pem(),
            key: ca_key.serialize_pem(),
        };
        let issuer = Issuer::new(params, ca_key);
        let dns = SanType::DnsName("localhost".try_into().expect("a DNS name"));
        let uri = |u: &str| SanType::URI(u.try_into().expect("a URI"));
        Self {
            server: leaf(
                &issuer,
                2,
                "execution-provider",
                dns,
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            client: leaf(
                &issuer,
                3,
                "sim client",
                uri(client_uri),
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
            partner: leaf(
                &issuer,
                5,
                "sim partner client",
                uri(partner_uri),
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
            stranger: leaf(
                &issuer,
                4,
                "sim stranger",
                uri("spiffe://sim.local/ns/default/stranger"),
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
            ca,
        }
    }
}
