//! Fuzzes strict grant decoding and full verification against a fixed keyring: no input may
//! panic, and nothing but the genuine token may verify.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use execution_provider::runtime::SeededIds;
use execution_provider::security::grant::{self, GrantBinding, GrantEnvironment};
use execution_provider::security::keys::{self, Keyring};
use execution_provider::security::SecurityManifest;
use libfuzzer_sys::fuzz_target;

fn keyring() -> &'static Keyring {
    static RING: OnceLock<Keyring> = OnceLock::new();
    RING.get_or_init(|| {
        let (pem, print) = keys::generate(&SeededIds::new(1));
        let text = format!(
            r#"{{"version":1,"generation":1,"tls":{{"certificateFile":"s","privateKeyFile":"k","clientCAFile":"c"}},"clients":[{{"uri":"spiffe://c/a"}}],"issuer":"i","audience":"a","activeKeyID":"k1","grantTTL":"5m","clockSkew":"0s","keys":[{{"id":"k1","version":1,"file":"k1.key","publicKeySHA256":"{print}","activateAt":"2000-01-01T00:00:00Z","verifyUntil":"2200-01-01T00:00:00Z","state":"active"}}]}}"#
        );
        let manifest = SecurityManifest::parse(text.as_bytes()).expect("fixture manifest");
        Keyring::load(&manifest, |_| Ok::<_, keys::KeyringError>(pem.clone().into_bytes()))
            .expect("fixture keyring")
    })
}

fn binding() -> GrantBinding {
    GrantBinding {
        client: "spiffe://c/a".into(),
        owner: "o".into(),
        binding_id: "b".into(),
        run_id: "r".into(),
        claim_id: "c".into(),
        environment: GrantEnvironment { id: "e".into(), revision: "v".into() },
        epoch: 1,
        grant_generation: 1,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(token) = std::str::from_utf8(data) else { return };
    let _ = grant::decode(token);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    let _ = grant::verify(keyring(), token, &binding(), "file.read", now);
});
