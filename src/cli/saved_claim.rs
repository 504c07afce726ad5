//! The run claim `client run acquire` or `client exec --detach` leaves held, saved per binding in the state directory
//! (`<state-dir>/claims/<digest of the binding>.json`, mode 0600: it holds a grant), so that
//! `logs`, `attach`, `kill`, `ps`, `run renew` and `run release` find it without the five claim
//! flags, and a later `exec` or `file` call reuses it while it has not expired.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::session::Claim;

/// One saved claim, with the environment it was taken on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedClaim {
    binding: String,
    environment_id: String,
    run_id: String,
    claim_id: String,
    epoch: u64,
    grant_generation: u64,
    grant: String,
    expires_at_unix_millis: i64,
}

/// The saved claims of one state directory.
#[derive(Debug, Clone)]
pub struct SavedClaims {
    dir: PathBuf,
}

impl SavedClaims {
    /// The claims saved under `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.join("claims"),
        }
    }

    fn path(&self, binding: &str) -> PathBuf {
        let digest = hex::encode(sha2::Sha256::digest(binding.as_bytes()));
        self.dir.join(format!("{}.json", &digest[..32]))
    }

    /// Saves `claim` as the binding's held claim on `environment_id` (replacing any other).
    pub fn save(&self, binding: &str, environment_id: &str, claim: &Claim) -> anyhow::Result<()> {
        let saved = SavedClaim {
            binding: binding.to_owned(),
            environment_id: environment_id.to_owned(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            epoch: claim.epoch,
            grant_generation: claim.grant_generation,
            grant: claim.grant.clone(),
            expires_at_unix_millis: claim.expires_unix_millis,
        };
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        let path = self.path(binding);
        let partial = path.with_extension("json.partial");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)
            .with_context(|| format!("cannot write {}", partial.display()))?;
        file.write_all(&serde_json::to_vec_pretty(&saved)?)?;
        file.sync_all()?;
        std::fs::rename(&partial, &path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    }

    /// The binding's saved claim on `environment_id`, whatever its expiry.
    pub fn load(&self, binding: &str, environment_id: &str) -> Option<Claim> {
        let bytes = std::fs::read(self.path(binding)).ok()?;
        let saved: SavedClaim = serde_json::from_slice(&bytes).ok()?;
        if saved.binding != binding || saved.environment_id != environment_id {
            return None;
        }
        Some(Claim {
            run_id: saved.run_id,
            claim_id: saved.claim_id,
            epoch: saved.epoch,
            grant_generation: saved.grant_generation,
            grant: saved.grant,
            expires_unix_millis: saved.expires_at_unix_millis,
        })
    }

    /// The binding's saved claim if it has not expired at `now`.
    pub fn load_current(
        &self,
        binding: &str,
        environment_id: &str,
        now: SystemTime,
    ) -> Option<Claim> {
        self.load(binding, environment_id)
            .filter(|c| !expired(c, now))
    }

    /// Forgets the binding's saved claim when it is `claim_id`.
    pub fn forget(&self, binding: &str, claim_id: &str) {
        let path = self.path(binding);
        let named = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<SavedClaim>(&b).ok())
            .is_some_and(|s| s.claim_id == claim_id);
        if named {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Whether `claim` has expired at `now` (a claim of unknown expiry never has).
fn expired(claim: &Claim, now: SystemTime) -> bool {
    let Ok(ms) = u64::try_from(claim.expires_unix_millis) else {
        return false;
    };
    ms > 0 && SystemTime::UNIX_EPOCH + Duration::from_millis(ms) <= now
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(expires: i64) -> Claim {
        Claim {
            run_id: "run-1".into(),
            claim_id: "c1".into(),
            epoch: 3,
            grant_generation: 1,
            grant: "g".into(),
            expires_unix_millis: expires,
        }
    }

    #[test]
    fn a_saved_claim_is_found_for_its_binding_and_environment_until_it_expires() {
        let tmp = tempfile::tempdir().unwrap();
        let saved = SavedClaims::new(tmp.path());
        saved.save("b/1", "env-1", &claim(10_000)).unwrap();
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(
            saved
                .load_current("b/1", "env-1", at(9_999))
                .unwrap()
                .claim_id,
            "c1"
        );
        assert!(
            saved.load_current("b/1", "env-1", at(10_000)).is_none(),
            "expired"
        );
        assert!(saved.load("b/1", "env-2").is_none(), "another environment");
        assert!(saved.load("b/2", "env-1").is_none(), "another binding");
        let mode = std::fs::metadata(saved.path("b/1")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        saved.forget("b/1", "other");
        assert!(
            saved.load("b/1", "env-1").is_some(),
            "another claim id is kept"
        );
        saved.forget("b/1", "c1");
        assert!(saved.load("b/1", "env-1").is_none());
    }
}
