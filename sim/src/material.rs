//! The material every host of a run shares, built once per process: a dev state directory
//! (manifest and templates as `dev` makes them) whose TLS files are the deterministic
//! simulation PKI, whose manifest admits a second platform client, and whose templates are the
//! dev fixture (its limit lowered to [`CAPACITY`]) plus [`SECOND_TEMPLATE`]; and the client
//! identities presented over mTLS.

use std::path::PathBuf;
use std::sync::Arc;

use execution_provider::cli::state_dir::{DEV_CLIENT_URI, StateDir};
use execution_provider::runtime::tls::{self, Identity};
use execution_provider::templates::{TemplateError, TemplateRegistry};

use crate::pki::SimPki;
use crate::world::{CAPACITY, PARTNER_CLIENT_URI, SECOND_CAPACITY, SECOND_TEMPLATE};

/// Material every host of a run shares (built once, outside the simulation).
pub(crate) struct Material {
    pub(crate) state: StateDir,
    _dir: tempfile::TempDir,
    /// The admitted clients, one per platform: the dev client, then the partner.
    pub(crate) clients: Vec<Identity>,
    /// A client certificate the manifest does not admit.
    pub(crate) stranger: Identity,
    /// The CA of the replicas' server certificate.
    pub(crate) server_cas: Vec<rustls::pki_types::CertificateDer<'static>>,
    pub(crate) templates: Arc<TemplateRegistry>,
}

fn read(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn identity(pem: &crate::pki::Pem, what: &str) -> Identity {
    Identity::from_pem(pem.cert.as_bytes(), pem.key.as_bytes(), what)
        .unwrap_or_else(|e| panic!("the {what} identity: {e}"))
}

/// A dev state directory (manifest and templates as `dev` makes them) whose TLS files are
/// replaced by the deterministic simulation PKI, whose manifest admits a second platform
/// client, and whose templates are the dev fixture (its limit lowered to [`CAPACITY`]) plus
/// [`SECOND_TEMPLATE`].
fn material() -> Material {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let state = StateDir::open_or_init(&dir.path().join("state")).expect("a dev state directory");
    let manifest = read(state.manifest_path());
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&manifest).expect("a JSON manifest");
    let tls_file = |key: &str| {
        let name = manifest
            .pointer(&format!("/tls/{key}"))
            .and_then(|v| v.as_str())
            .unwrap_or_else(|| panic!("the manifest names its {key}"));
        state.security_dir().join(name)
    };
    let pki = SimPki::new(DEV_CLIENT_URI, PARTNER_CLIENT_URI);
    let write = |path: PathBuf, text: &str| {
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    };
    write(tls_file("certificateFile"), &pki.server.cert);
    write(tls_file("privateKeyFile"), &pki.server.key);
    write(tls_file("clientCAFile"), &pki.ca.cert);
    admit_partner(&mut manifest);
    let manifest = serde_json::to_vec_pretty(&manifest).expect("the manifest serializes");
    std::fs::write(state.manifest_path(), manifest).expect("the manifest is written");
    let server_cas =
        tls::certificates_from_pem(pki.ca.cert.as_bytes(), "sim CA").expect("the sim CA");
    let fixture = String::from_utf8(read(state.templates_path())).expect("UTF-8 templates");
    write(state.templates_path(), &sim_templates(&fixture));
    let templates =
        Arc::new(TemplateRegistry::load(state.templates_path()).expect("the templates"));
    Material {
        state,
        _dir: dir,
        clients: vec![
            identity(&pki.client, "sim client"),
            identity(&pki.partner, "sim partner client"),
        ],
        stranger: identity(&pki.stranger, "stranger"),
        server_cas,
        templates,
    }
}

/// Every admitted client may use both templates; the second platform's client is admitted
/// exactly like the dev client (attests owners, administers its own environments).
fn admit_partner(manifest: &mut serde_json::Value) {
    let clients = manifest
        .pointer_mut("/clients")
        .and_then(|c| c.as_array_mut())
        .expect("the manifest lists its clients");
    for client in clients.iter_mut() {
        client["executionTemplates"] = serde_json::json!(["default", SECOND_TEMPLATE]);
    }
    let mut partner = clients.first().cloned().expect("the dev client");
    partner["uri"] = PARTNER_CLIENT_URI.into();
    clients.push(partner);
}

/// The dev fixture's template with `maxEnvironments` lowered to [`CAPACITY`], and a second,
/// smaller template [`SECOND_TEMPLATE`] (another runtime class and storage class, limit
/// [`SECOND_CAPACITY`]); each revision id re-pinned to its changed execution definition.
fn sim_templates(fixture: &str) -> String {
    let edit = |text: &str, from: &str, to: &str| {
        let edited = text.replacen(from, to, 1);
        assert_ne!(edited, text, "the fixture template names `{from}`");
        edited
    };
    let limited = edit(
        fixture,
        "maxEnvironments: 100",
        &format!("maxEnvironments: {CAPACITY}"),
    );
    let (_, first) = limited
        .split_once("templates:\n")
        .expect("the fixture lists its templates");
    let revision = first
        .split_once("    default: ")
        .and_then(|(_, rest)| rest.lines().next())
        .expect("the fixture names its default revision")
        .to_owned();
    // A placeholder revision of its own, re-pinned below.
    let mut second = first.replace(&revision, &format!("v1-{}", "0".repeat(64)));
    for (from, to) in [
        ("  default:\n", format!("  {SECOND_TEMPLATE}:\n")),
        ("name: Default sandbox", "name: Compact sandbox".to_owned()),
        (
            "description: A gVisor-isolated workspace with a 1Gi persistent volume.",
            "description: A runc workspace with a 256Mi volume on fast storage.".to_owned(),
        ),
        ("storageClass: standard", "storageClass: fast".to_owned()),
        ("storageSize: 1Gi", "storageSize: 256Mi".to_owned()),
        (
            "runtimeClassName: gvisor",
            "runtimeClassName: runc".to_owned(),
        ),
        (
            &format!("maxEnvironments: {CAPACITY}"),
            format!("maxEnvironments: {SECOND_CAPACITY}"),
        ),
    ] {
        second = edit(&second, from, &to);
    }
    let mut templates = format!("{limited}{second}");
    // Each revision id pins its execution definition: re-pin what the edits changed.
    loop {
        match TemplateRegistry::from_yaml_str(&templates, "sim templates") {
            Err(TemplateError::RevisionMismatch {
                revision, expected, ..
            }) => templates = templates.replace(&revision, &expected),
            Err(other) => panic!("the simulator's templates: {other}"),
            Ok(_) => return templates,
        }
    }
}

/// The material of this process (built once: key generation is the slow part).
pub(crate) fn shared_material() -> Arc<Material> {
    static MATERIAL: std::sync::OnceLock<Arc<Material>> = std::sync::OnceLock::new();
    MATERIAL.get_or_init(|| Arc::new(material())).clone()
}
