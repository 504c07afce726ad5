//! Hand-driven races: a script of network, host, clock and security actions applied at fixed
//! simulated times on top of a scenario's drawn faults (turmoil's hold/release and partition
//! controls, crash and restart, clock steps, security manifest changes), for the targeted
//! cases of the store, security and reconciler catalogues, and snapshots of the stored
//! environments into the trace so that a test can assert on the state a race left.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;

use crate::driver::Driver;
use crate::world::replica_host;

/// One scripted action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Hold every message between two hosts until released.
    Hold(String, String),
    /// Deliver the held messages between two hosts at once.
    Release(String, String),
    /// Drop every message between two hosts until repaired.
    Partition(String, String),
    /// Drop every message from the first host to the second (the other direction flows)
    /// until repaired.
    PartitionOneWay(String, String),
    /// Repair a partition.
    Repair(String, String),
    /// Crash replica `i` (its memory is lost).
    Crash(u32),
    /// Restart replica `i`.
    Restart(u32),
    /// Step replica `i`'s clock by this many milliseconds (forward when positive).
    ClockStep(u32, i64),
    /// Change the security manifest under the next generation (only in scenarios whose
    /// replicas run the security manager: `revocation-race`, `swarm`).
    Security(Change),
    /// Wait (re-checked every fault tick) until some stored environment holds an
    /// `activeOperation`, record it (`operation live ID on NAME`), then schedule each action
    /// this many milliseconds later. Steps at fixed times do not wait for it.
    WhenOperationLive(Vec<(u64, Action)>),
    /// Like [`Action::WhenOperationLive`], for an `activeOperation` that is a command
    /// (`command.start`); records `command live ID on NAME`.
    WhenCommandLive(Vec<(u64, Action)>),
    /// Every command started from now on runs this many simulated milliseconds before it
    /// takes effect and ends (0: at once, the default); a cancel stops it without its effect.
    /// Such commands are traced by the executor (`started`, `ran`, `cancelled command ID on
    /// NAME`).
    CommandTime(u64),
    /// Refuse (503) every API write whose path contains this text (e.g. the capacity
    /// ledger's ConfigMap name), until [`Action::ApiRestore`].
    ApiOutage(String),
    /// End the API outage.
    ApiRestore,
    /// Like [`Action::WhenOperationLive`], for an environment that is Retired (condition
    /// True) with no lifecycle operation; records `retired on NAME`.
    WhenRetired(Vec<(u64, Action)>),
    /// Record every stored environment in the trace (`snapshot ...` lines, see
    /// [`snapshot_line`]), then each capacity ledger entry (`snapshot ledger KEY=[NAMES]`).
    Snapshot,
    /// Revoke, in the run's templates file, the template revision of the environment the last
    /// waiting step recorded (`... on NAME`), as an operator does; replicas load the file at
    /// their next start (crash and restart them to roll them). Traced `revoked REVISION of
    /// NAME`.
    RevokeRevision,
    /// Hold the kubelet's link to the API server: the node agent's requests wait, so a Pod
    /// being stopped stays Terminating, not yet terminal (and a new Pod does not start),
    /// until [`Action::KubeletRelease`].
    KubeletHold,
    /// Release the kubelet's link: its waiting requests go through.
    KubeletRelease,
    /// Cut executor node `node-I` off for good, as a node that lost its network: the kubelet
    /// stops reporting (its link held, as [`Action::KubeletHold`]; the simulator has one
    /// kubelet, so with several nodes every Pod is frozen) and the node is partitioned from
    /// every replica. Neither the heal nor the liveness phase undoes it, and the liveness
    /// phase does not judge the environments the node serves: their executor is unreachable,
    /// so staying fenced is their honest state. Traced `node node-I cut off for good`.
    CutNodeForGood(u32),
    /// The administrator makes this lifecycle call on the environment the last waiting step
    /// recorded, from the `admin` host (traced there: `CALL NAME eEPOCH -> OUTCOME [CODE]`).
    Admin(crate::workload::AdminCall),
    /// Record every executor Pod and workspace PVC (`snapshot pod NAME env=E uid=U
    /// phase=P deleting=yes|no finalizers=N`, `snapshot pvc NAME env=E uid=U
    /// deleting=yes|no`).
    SnapshotRuntime,
    /// A client call at a fixed time (a top-level step only, never inside a waiting step):
    /// the scripted host it names presents its platform's client identity to the replica it
    /// names (see `workload::scripted`; the world adds the host when it is built, so the call
    /// leaves exactly at its time, not rounded to the tick).
    Call(crate::workload::scripted::Call),
    /// From this time on (a top-level step only), a foreign writer rewrites an environment's
    /// creator just before the API server serves the first status write that carries the
    /// change's marker (see `peer`; armed when the world is built; traced by the API server
    /// host as `peer changed the creator ...`, then `after the peer CODE PUT PATH`).
    CreatorChange(crate::peer::CreatorChange),
}

/// A security manifest change, written under the next generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Every client loses every execution template (a template withdrawn from the policy).
    WithdrawTemplates,
    /// The client CA is replaced by a CA certificate that signed no client (CA removal: no
    /// client certificate verifies any more, like an expired one, while the manifest itself
    /// stays valid, so replicas stay ready and refuse per call).
    DistrustClientCa,
    /// The clients and the client CA of the run's first manifest come back.
    Reinstate,
}

/// An action and when it happens (rounded up to the driver's 100 ms fault tick).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scripted {
    /// Simulated milliseconds after the start.
    pub at: Duration,
    /// What happens.
    pub action: Action,
}

/// The file the distrusting client CA is written to, in the run's security directory.
const DISTRUSTED_CA_FILE: &str = "distrusted-client-ca.pem";

impl Driver<'_> {
    /// Applies every scripted action that is due.
    pub(crate) fn scripted(&mut self, now: Duration, ms: u128) {
        while self.script.first().is_some_and(|s| s.at <= now) {
            let step = self.script.remove(0);
            self.trace
                .record_at(ms, "script", format!("{:?}", step.action));
            match step.action {
                Action::Hold(a, b) => self.sim.hold(a.as_str(), b.as_str()),
                Action::Release(a, b) => self.sim.release(a.as_str(), b.as_str()),
                Action::Partition(a, b) => self.sim.partition(a.as_str(), b.as_str()),
                Action::PartitionOneWay(a, b) => {
                    self.sim.partition_oneway(a.as_str(), b.as_str());
                }
                Action::Repair(a, b) => self.sim.repair(a.as_str(), b.as_str()),
                Action::Crash(i) => self.sim.crash(replica_host(i)),
                Action::Restart(i) => self.sim.bounce(replica_host(i)),
                Action::ClockStep(i, step) => {
                    let stepper = self.steppers.get(i as usize).unwrap_or_else(|| {
                        panic!("the script steps the clock of replica {i}, which does not exist")
                    });
                    stepper.fetch_add(step, Ordering::Relaxed);
                }
                Action::Security(change) => self.change_security(change, ms),
                Action::CommandTime(time) => {
                    self.executor.set_command_time(Duration::from_millis(time));
                    // Commands that run for a while trace their start, end or cancel.
                    self.executor.trace_commands(self.trace.clone());
                }
                Action::ApiOutage(part) => self.outage.begin(&part),
                Action::ApiRestore => self.outage.end(),
                Action::WhenRetired(then) => {
                    let seen = self.find_environment(|status| {
                        let retired = status["conditions"]
                            .as_array()?
                            .iter()
                            .any(|c| c["type"] == "Retired" && c["status"] == "True");
                        (retired && status["lifecycleOperation"].is_null())
                            .then(|| "retired".to_owned())
                    });
                    self.when(now, ms, seen, Action::WhenRetired(then));
                }
                Action::Snapshot => self.snapshot(ms),
                action @ (Action::RevokeRevision
                | Action::KubeletHold
                | Action::KubeletRelease
                | Action::CutNodeForGood(_)
                | Action::Admin(_)
                | Action::SnapshotRuntime) => self.operate(action, ms),
                // The scripted host makes the call itself, at its exact time.
                Action::Call(_) => {}
                // Armed in the API server's fault layer when the world was built.
                Action::CreatorChange(_) => {}
                Action::WhenOperationLive(then) => {
                    let seen = self.find_environment(|status| {
                        let id = status["activeOperation"]["id"].as_str()?;
                        Some(format!("operation live {id}"))
                    });
                    self.when(now, ms, seen, Action::WhenOperationLive(then));
                }
                Action::WhenCommandLive(then) => {
                    let seen = self.find_environment(|status| {
                        let operation = &status["activeOperation"];
                        let id = operation["id"].as_str()?;
                        (operation["operation"] == "command.start")
                            .then(|| format!("command live {id}"))
                    });
                    self.when(now, ms, seen, Action::WhenCommandLive(then));
                }
            }
        }
    }

    fn change_security(&mut self, change: Change, ms: u128) {
        let files = self.security.clone().unwrap_or_else(|| {
            panic!("the script changes the security manifest, but this scenario's replicas run no security manager")
        });
        let mut files = files.lock().expect("security files lock");
        let distrusted = files.tls_dir().join(DISTRUSTED_CA_FILE);
        let generation = files.rotate_with(|manifest, first| match change {
            Change::WithdrawTemplates => {
                if let Some(clients) = manifest["clients"].as_array_mut() {
                    for client in clients {
                        client["executionTemplates"] = Value::Array(Vec::new());
                    }
                }
            }
            Change::DistrustClientCa => {
                // A CA that signed no client as the only trust anchor. It must be a CA
                // certificate: a leaf in the bundle fails the reload (api-security §6.2 bundle
                // check), which makes the replica unready and refuses the TLS handshake
                // instead of distrusting the clients.
                std::fs::write(&distrusted, crate::pki::unrelated_ca())
                    .expect("the distrusting CA file");
                manifest["tls"]["clientCAFile"] = DISTRUSTED_CA_FILE.into();
            }
            Change::Reinstate => {
                manifest["clients"] = first["clients"].clone();
                manifest["tls"] = first["tls"].clone();
            }
        });
        self.trace
            .record_at(ms, "script", format!("security generation {generation}"));
    }

    /// The first stored environment for which `what` says something, as `WHAT on NAME`.
    fn find_environment(&self, what: impl Fn(&Value) -> Option<String>) -> Option<String> {
        self.api
            .objects_of_kind("ExecutionEnvironment")
            .into_iter()
            .find_map(|environment| {
                let seen = what(&environment["status"])?;
                let name = environment["metadata"]["name"].as_str()?;
                Some(format!("{seen} on {name}"))
            })
    }

    /// A waiting step: when its condition was `seen`, record it and schedule its actions
    /// relative to now; otherwise look again at the next tick.
    fn when(&mut self, now: Duration, ms: u128, seen: Option<String>, waiting: Action) {
        let mut steps = match (seen, waiting) {
            (
                Some(what),
                Action::WhenOperationLive(then)
                | Action::WhenCommandLive(then)
                | Action::WhenRetired(then),
            ) => {
                self.trace.record_at(ms, "script", what);
                then.into_iter()
                    .map(|(after, action)| Scripted {
                        at: now + Duration::from_millis(after),
                        action,
                    })
                    .collect()
            }
            (_, waiting) => vec![Scripted {
                at: now + Duration::from_millis(1),
                action: waiting,
            }],
        };
        self.script.append(&mut steps);
        self.script.sort_by_key(|s| s.at);
    }

    fn snapshot(&mut self, ms: u128) {
        for environment in self.api.objects_of_kind("ExecutionEnvironment") {
            self.trace
                .record_at(ms, "script", snapshot_line(&environment));
        }
        let prefix = execution_provider::kube::crd::LEDGER_CONFIGMAP_NAME;
        for map in self.api.objects_of_kind("ConfigMap") {
            let name = map["metadata"]["name"].as_str().unwrap_or_default();
            if !name.starts_with(prefix) {
                continue;
            }
            for (key, names) in crate::invariants::ledger_entries(&map) {
                let names = serde_json::to_string(&names).unwrap_or_default();
                self.trace
                    .record_at(ms, "script", format!("snapshot ledger {key}={names}"));
            }
        }
    }
}

/// One environment as a snapshot line: `snapshot NAME epoch=E grants=G fence=F op=ID
/// lifecycle=TYPE/PHASE ready=STATUS/REASON`.
pub fn snapshot_line(environment: &Value) -> String {
    let status = &environment["status"];
    let text = |v: &Value| match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let ready = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map_or("-".to_owned(), |c| {
            format!("{}/{}", text(&c["status"]), text(&c["reason"]))
        });
    format!(
        "snapshot {} epoch={} grants={} fence={} op={} lifecycle={}/{} ready={ready}",
        text(&environment["metadata"]["name"]),
        text(&status["epoch"]),
        text(&status["grantGeneration"]),
        text(&status["fenceState"]),
        text(&status["activeOperation"]["id"]),
        text(&status["lifecycleOperation"]["type"]),
        text(&status["lifecycleOperation"]["phase"]),
    )
}
