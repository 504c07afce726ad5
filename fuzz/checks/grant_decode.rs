//! The `grant_decode` fuzz check: strict grant decoding and full verification against a fixed
//! keyring. No input may panic, and nothing but a genuine token for the fixed binding verifies.
//!
//! Shared by the fuzz target, the seed generator (`fuzz/examples/seeds.rs`) and the replay of
//! `fuzz/regressions/grant_decode/` in `tests/security_grants.rs`.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use execution_provider::runtime::SeededIds;
use execution_provider::security::SecurityManifest;
use execution_provider::security::grant::{self, GrantBinding, GrantEnvironment};
use execution_provider::security::keys::{self, Keyring};

/// The operation every verification asks for.
pub const OPERATION: &str = "file.read";

/// The instant every verification happens at, inside the fixture key's window.
pub fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000)
}

/// The keyring every verification uses: key `k1` made from seed 1.
pub fn keyring() -> &'static Keyring {
    static RING: OnceLock<Keyring> = OnceLock::new();
    RING.get_or_init(|| fixture_keyring(1))
}

/// A keyring with one active key `k1` made from `seed`, loaded through the production manifest
/// and keyring code.
pub fn fixture_keyring(seed: u64) -> Keyring {
    let (pem, print) = keys::generate(&SeededIds::new(seed));
    let text = format!(
        r#"{{"version":1,"generation":1,"tls":{{"certificateFile":"s","privateKeyFile":"k","clientCAFile":"c"}},"clients":[{{"uri":"spiffe://c/a"}}],"issuer":"i","audience":"a","activeKeyID":"k1","grantTTL":"5m","clockSkew":"0s","keys":[{{"id":"k1","version":1,"file":"k1.key","publicKeySHA256":"{print}","activateAt":"2000-01-01T00:00:00Z","verifyUntil":"2200-01-01T00:00:00Z","state":"active"}}]}}"#
    );
    let manifest = SecurityManifest::parse(text.as_bytes()).expect("fixture manifest");
    Keyring::load(&manifest, |_| {
        Ok::<_, keys::KeyringError>(pem.clone().into_bytes())
    })
    .expect("fixture keyring")
}

/// The binding every verification expects.
pub fn binding() -> GrantBinding {
    GrantBinding {
        client: "spiffe://c/a".into(),
        owner: "o".into(),
        binding_id: "b".into(),
        run_id: "r".into(),
        claim_id: "c".into(),
        environment: GrantEnvironment {
            id: "e".into(),
            revision: "v".into(),
        },
        epoch: 1,
        grant_generation: 1,
    }
}

/// Decodes and verifies `data` as a grant token; panics only on a bug.
pub fn check(data: &[u8]) {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    let _ = grant::decode(token);
    let _ = grant::verify(keyring(), token, &binding(), OPERATION, now());
}
