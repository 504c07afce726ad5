//! What happens outside the provider under a script, as an operator and a node do it: the
//! run's in-memory copy of its templates file, in which an operator revokes every revision and then rolls the
//! replicas (each replica loads the registry once per start, as `serve` does), and the
//! kubelet's link to the API server, which a script can hold so that an executor Pod being
//! stopped stays Terminating, not yet terminal, until the link is released.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use execution_provider::kube::apiserver::{ApiServer, ResponseBody};
use execution_provider::kube::crd::LABEL_ENVIRONMENT;
use execution_provider::templates::TemplateRegistry;
use http::{Request, Response};
use tokio::sync::watch;

use crate::driver::Driver;
use crate::script::{Action, Scripted};
use crate::world::replica_host;

/// The run's templates: the file an operator edits and the registry a replica starting now
/// loads from it. Each run has its own (runs share the process's material).
#[derive(Clone)]
pub struct RunTemplates {
    current: Arc<Mutex<(String, Arc<TemplateRegistry>)>>,
}

impl RunTemplates {
    /// The run's templates, starting as `registry`, loaded from the file at `path`.
    pub fn new(registry: Arc<TemplateRegistry>, path: &Path) -> Self {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("the templates file {}: {e}", path.display()));
        Self {
            current: Arc::new(Mutex::new((text, registry))),
        }
    }

    /// The registry a replica starting now loads.
    pub fn current(&self) -> Arc<TemplateRegistry> {
        self.current.lock().expect("templates lock").1.clone()
    }

    /// Rewrites the run's in-memory copy of the templates file with `revision` marked `revoked: true`, and no longer the
    /// default of its template (a revoked revision cannot be one), as an operator revokes
    /// it; its id stays (the revoked flag is not part of the definition the id pins).
    pub fn revoke(&self, revision: &str) {
        let mut current = self.current.lock().expect("templates lock");
        let text = revoked_text(&current.0, revision);
        let registry = TemplateRegistry::from_yaml_str(&text, "sim templates (revoked)")
            .unwrap_or_else(|e| panic!("the templates file revoking {revision} is refused: {e}"));
        let revoked = registry
            .templates()
            .values()
            .filter_map(|t| t.revisions().get(revision))
            .all(|r| r.is_revoked());
        assert!(revoked, "{revision} is not revoked in the rewritten file");
        *current = (text, Arc::new(registry));
    }
}

/// `text` with `revoked: true` under the key of `revision` and no `default: REVISION` line.
fn revoked_text(text: &str, revision: &str) -> String {
    let key = format!("{revision}:");
    let default = format!("default: {revision}");
    let mut out = String::with_capacity(text.len() + 64);
    let mut found = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed == default {
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if trimmed == key {
            let indent = line.len() - line.trim_start().len();
            out.push_str(&" ".repeat(indent + 2));
            out.push_str("revoked: true\n");
            found = true;
        }
    }
    assert!(found, "the templates file has no revision {revision}");
    out
}

/// The kubelet's link to the API server: while held, every request the node agent makes
/// waits (a Pod being stopped is not reported terminated, a new Pod not started), and
/// goes through when released.
#[derive(Clone)]
pub struct KubeletLink {
    open: Arc<watch::Sender<bool>>,
}

impl Default for KubeletLink {
    fn default() -> Self {
        Self {
            open: Arc::new(watch::Sender::new(true)),
        }
    }
}

impl KubeletLink {
    /// A link for a run of `script`, if the script ever holds it (otherwise the node agent
    /// talks to the API server directly, as in every other run).
    pub fn for_script(script: &[Scripted]) -> Option<Self> {
        fn holds(action: &Action) -> bool {
            match action {
                Action::KubeletHold | Action::KubeletRelease | Action::CutNodeForGood(_) => true,
                Action::WhenOperationLive(then)
                | Action::WhenCommandLive(then)
                | Action::WhenRetired(then) => then.iter().any(|(_, a)| holds(a)),
                _ => false,
            }
        }
        script.iter().any(|s| holds(&s.action)).then(Self::default)
    }

    /// Holds the link.
    pub fn hold(&self) {
        self.open.send_replace(false);
    }

    /// Releases the link: the waiting requests go through.
    pub fn release(&self) {
        self.open.send_replace(true);
    }

    /// A `kube::Client` for the node agent, to `api` through this link.
    pub fn client(&self, api: &ApiServer, namespace: &str) -> kube::Client {
        let service = ThroughLink {
            api: api.clone(),
            open: self.open.subscribe(),
        };
        kube::Client::new(service, namespace)
    }
}

/// The API server behind a [`KubeletLink`].
#[derive(Clone)]
struct ThroughLink {
    api: ApiServer,
    open: watch::Receiver<bool>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, Infallible>> + Send>>;

impl tower::Service<Request<kube::client::Body>> for ThroughLink {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let mut api = self.api.clone();
        let mut open = self.open.clone();
        Box::pin(async move {
            // The sender lives as long as the run; if it is gone, the link is simply open.
            let _ = open.wait_for(|open| *open).await;
            tower::Service::call(&mut api, request).await
        })
    }
}

impl Driver<'_> {
    /// Applies a scripted operator, kubelet, administrator or runtime-snapshot action.
    pub(crate) fn operate(&mut self, action: Action, ms: u128) {
        match action {
            Action::RevokeRevision => {
                let name = self.subject();
                let revision = self
                    .environment(&name)
                    .and_then(|e| e["spec"]["templateRevision"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| panic!("{name} has no template revision to revoke"));
                self.templates.revoke(&revision);
                self.trace
                    .record_at(ms, "script", format!("revoked {revision} of {name}"));
            }
            Action::KubeletHold | Action::KubeletRelease => {
                let link = self
                    .kubelet
                    .as_ref()
                    .expect("a run whose script holds the kubelet has its link");
                if action == Action::KubeletHold {
                    link.hold();
                } else {
                    link.release();
                }
            }
            Action::CutNodeForGood(node) => {
                assert!(
                    node < self.nodes,
                    "the script cuts node-{node}, which does not exist"
                );
                self.kubelet
                    .as_ref()
                    .expect("a run whose script cuts a node has the kubelet's link")
                    .hold();
                let host = crate::node::node_host(node);
                for i in 0..self.replicas {
                    self.sim.partition(replica_host(i), host.as_str());
                }
                self.trace
                    .record_at(ms, "script", format!("node {host} cut off for good"));
                self.cut_nodes.insert(host);
            }
            Action::Admin(call) => {
                let name = self.subject();
                self.admin.issue(&mut self.sim, call, &name);
            }
            Action::SnapshotRuntime => self.snapshot_runtime(ms),
            other => unreachable!("not an operator action: {other:?}"),
        }
    }

    /// The environment the last waiting step recorded (`... on NAME` in a script line).
    fn subject(&self) -> String {
        self.trace
            .lines()
            .iter()
            .rev()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                let (_ms, actor) = (words.next()?, words.next()?);
                let rest: Vec<&str> = words.collect();
                let on = rest.iter().rposition(|w| *w == "on")?;
                // `operation live ID on NAME`, `command live ID on NAME`, `retired on NAME`.
                let waited = rest.get(1) == Some(&"live") || rest.first() == Some(&"retired");
                (actor == "script" && waited && on + 2 == rest.len())
                    .then(|| rest[on + 1].to_owned())
            })
            .next()
            .expect(
                "an administrator or revocation step after a waiting step that saw an environment",
            )
    }

    fn environment(&self, name: &str) -> Option<serde_json::Value> {
        self.api
            .objects_of_kind("ExecutionEnvironment")
            .into_iter()
            .find(|e| e["metadata"]["name"] == name)
    }

    fn snapshot_runtime(&mut self, ms: u128) {
        let text = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_owned();
        let deleting = |o: &serde_json::Value| {
            if o["metadata"]["deletionTimestamp"].is_null() {
                "no"
            } else {
                "yes"
            }
        };
        for pod in self.api.objects_of_kind("Pod") {
            let finalizers = pod["metadata"]["finalizers"].as_array().map_or(0, Vec::len);
            let line = format!(
                "snapshot pod {} env={} uid={} phase={} deleting={} finalizers={finalizers}",
                text(&pod["metadata"]["name"]),
                text(&pod["metadata"]["labels"][LABEL_ENVIRONMENT]),
                text(&pod["metadata"]["uid"]),
                text(&pod["status"]["phase"]),
                deleting(&pod),
            );
            self.trace.record_at(ms, "script", line);
        }
        for pvc in self.api.objects_of_kind("PersistentVolumeClaim") {
            let line = format!(
                "snapshot pvc {} env={} uid={} deleting={}",
                text(&pvc["metadata"]["name"]),
                text(&pvc["metadata"]["labels"][LABEL_ENVIRONMENT]),
                text(&pvc["metadata"]["uid"]),
                deleting(&pvc),
            );
            self.trace.record_at(ms, "script", line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoking_marks_the_revision_and_drops_it_as_the_default() {
        let text = "templates:\n  a:\n    default: v1-ab\n    revisions:\n      v1-ab:\n        execution: {}\n  b:\n    default: v1-cd\n    revisions:\n      v1-cd:\n        execution: {}\n";
        assert_eq!(
            revoked_text(text, "v1-ab"),
            "templates:\n  a:\n    revisions:\n      v1-ab:\n        revoked: true\n        execution: {}\n  b:\n    default: v1-cd\n    revisions:\n      v1-cd:\n        execution: {}\n"
        );
    }
}
