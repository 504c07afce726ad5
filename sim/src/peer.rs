//! A foreign writer for hand-driven races: just before the API server serves the status write
//! that carries a given text (e.g. a scripted acquire's run id), a peer rewrites the creator
//! recorded in that environment's spec (another platform's client, or another owner), so the
//! replica's compare-and-swap loses (409) and its retry reads the new creator. No provider
//! code changes a creator (the environment name is derived from it), so only such a writer
//! (an operator editing the resource) can make the subject change between two attempts
//! (CASRetryRechecksSubject, spec/store.md §12; `tests/store_creator_race.rs` at store level).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use execution_provider::kube::apiserver::ApiServer;
use execution_provider::kube::crd::ExecutionEnvironment;
use execution_provider::store::naming::{client_hash, owner_hash};
use kube::api::{Api, PostParams};

use crate::trace::Trace;
use crate::world::{NAMESPACE, PARTNER_CLIENT_URI};

/// Who the environment belongs to after the peer's write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewCreator {
    /// The second platform's client (same owner).
    Client,
    /// The owner `mallory` (same client).
    Owner,
}

/// A creator change armed on the status write whose body contains `marker`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatorChange {
    /// Text only the targeted write carries (a run id, an operation id).
    pub marker: String,
    /// The new creator.
    pub creator: NewCreator,
}

/// The armed changes of a run, each from its time on; each fires once.
#[derive(Debug, Clone, Default)]
pub struct Peer(Arc<Mutex<Vec<(Duration, CreatorChange)>>>);

impl Peer {
    /// Arms `change` from simulated time `from` on.
    pub fn arm(&self, from: Duration, change: CreatorChange) {
        self.0.lock().expect("peer lock").push((from, change));
    }

    /// Whether any change waits for its write (only then are status write bodies read).
    pub fn armed(&self) -> bool {
        !self.0.lock().expect("peer lock").is_empty()
    }

    /// Called before the API server serves a write to `path` with `body`: when it is a
    /// status write carrying an armed marker, rewrites that environment's creator first
    /// (traced `peer changed the creator (KIND) of NAME before PUT PATH`). Returns whether
    /// it did.
    pub async fn before_write(
        &self,
        api: &ApiServer,
        path: &str,
        body: &[u8],
        trace: &Trace,
    ) -> bool {
        let Some(name) = path
            .strip_suffix("/status")
            .and_then(|p| p.rsplit_once("/executionenvironments/"))
            .map(|(_, name)| name.to_owned())
        else {
            return false;
        };
        let now = turmoil::sim_elapsed().unwrap_or_default();
        let change = {
            let mut armed = self.0.lock().expect("peer lock");
            let text = String::from_utf8_lossy(body);
            let due = armed
                .iter()
                .position(|(from, c)| *from <= now && text.contains(&c.marker));
            due.map(|i| armed.remove(i).1)
        };
        let Some(change) = change else {
            return false;
        };
        let environments: Api<ExecutionEnvironment> =
            Api::namespaced(api.client(NAMESPACE), NAMESPACE);
        let mut env = environments.get(&name).await.expect("the peer reads");
        match change.creator {
            NewCreator::Client => env.spec.client_hash = client_hash(PARTNER_CLIENT_URI),
            NewCreator::Owner => {
                env.spec.owner_hash = owner_hash("https://issuer.sim", "mallory");
            }
        }
        environments
            .replace(&name, &PostParams::default(), &env)
            .await
            .expect("the peer writes");
        trace.record(
            "apiserver",
            format!(
                "peer changed the creator ({:?}) of {name} before PUT {path}",
                change.creator
            ),
        );
        true
    }
}
