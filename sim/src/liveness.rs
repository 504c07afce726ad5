//! The liveness phase's judgement: after healing, which environments must be serving again,
//! by when, and how long each took to get there (docs/simulation.md, "Liveness").
//!
//! Every environment has a *start point*: the later of the heal and the expiry of the latest
//! operation lease its stored status showed during the phase (as written, in the writing
//! replica's clock, counted from the simulation's epoch). From it, the environment has
//! [`RECOVERY_SECS`] to be *recovered*: Ready, Healthy (not fenced), with no operation and no
//! automatic recovery in flight. Not judged: an environment being deleted, retired, or created
//! by an ensure nobody was told of and nobody retried (the store keeps it uninitialized for the
//! retry), and every environment whose executor node the scenario cut off for good (its
//! executor is unreachable, so a fence there counts as converged). An environment whose
//! template revision is revoked has recovered when it is Ready=False/InvalidTemplate with its
//! executor Pod stopped (fenced or not: there is no revision to recover it into). Pods and
//! PVCs of missing environments must be gone within [`RECOVERY_SECS`] of the heal.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use execution_provider::kube::crd::{
    ConditionStatus, EnvironmentCondition, ExecutionEnvironment, FenceState, LABEL_ENVIRONMENT,
    condition,
};
use execution_provider::reconciler::recovery;
use execution_provider::templates::TemplateRegistry;
use serde_json::Value;

use crate::clock::sim_epoch;
use crate::invariants::Incarnation;

/// Simulated seconds an environment has, from its start point, to be recovered.
pub const RECOVERY_SECS: u64 = 60;
/// The longest an operation lease may keep an environment's start point moving after the heal
/// (a lease renewed for longer is itself a failure to settle).
pub const LEASE_ALLOWANCE_SECS: u64 = 90;
/// The longest the quiet phase can last.
pub const QUIET_PHASE_SECS: u64 = LEASE_ALLOWANCE_SECS + RECOVERY_SECS;

/// Why an environment on a node cut off for good is not judged.
const CUT_OFF: &str = "its executor node is cut off for good";

/// What the judgement makes of one environment at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Recovered (or converged as its revoked revision requires).
    Recovered,
    /// Not judged, and why.
    NotJudged(&'static str),
    /// Not recovered yet: the state it is in.
    Pending(String),
}

/// What the environment must show, given what the run knows about it.
pub struct Judged<'a> {
    /// The stored environment.
    pub env: &'a ExecutionEnvironment,
    /// Whether some ensure of this incarnation was acknowledged to a client.
    pub acknowledged: bool,
    /// Whether its template revision is revoked (or gone) in the registry the replicas run.
    pub revoked: bool,
    /// Whether its executor Pod is running (present and not being deleted).
    pub pod_running: bool,
    /// Whether the scenario cut its executor node off for good.
    pub node_cut: bool,
}

/// The verdict on one environment.
pub fn verdict(judged: &Judged<'_>) -> Verdict {
    let env = judged.env;
    let status = env.status.clone().unwrap_or_default();
    if env.metadata.deletion_timestamp.is_some() {
        return Verdict::NotJudged("being deleted");
    }
    if condition_true(&status.conditions, condition::RETIRED) {
        return Verdict::NotJudged("retired");
    }
    if status.epoch.is_none() && !judged.acknowledged {
        return Verdict::NotJudged("an ensure nobody was told of, kept for its retry");
    }
    if judged.node_cut {
        return Verdict::NotJudged(CUT_OFF);
    }
    if judged.revoked {
        let ready = find(&status.conditions, condition::READY);
        let invalid = ready.is_some_and(|c| {
            c.status == ConditionStatus::False && c.reason == condition::reason::INVALID_TEMPLATE
        });
        return match (invalid, judged.pod_running) {
            (true, false) => Verdict::Recovered,
            (false, _) => Verdict::Pending(format!(
                "revoked, not Ready=False/InvalidTemplate ({})",
                why_not_ready(env)
            )),
            (true, true) => Verdict::Pending("revoked, its executor Pod not stopped".to_owned()),
        };
    }
    if status.fence_state == Some(FenceState::FenceUnknown) {
        return Verdict::Pending(format!("fenced ({})", recovering(&status.conditions)));
    }
    if let Some(op) = status.lifecycle_operation.as_ref() {
        let whose = if recovery::is_recovery(op) {
            "automatic recovery"
        } else {
            "lifecycle operation"
        };
        return Verdict::Pending(format!(
            "{whose} {:?} at {:?} ({})",
            op.type_,
            op.phase,
            why_not_ready(env)
        ));
    }
    if let Some(op) = status.active_operation.as_ref() {
        return Verdict::Pending(format!(
            "operation {} ({}) still held by {}",
            op.id, op.operation, op.holder_id
        ));
    }
    if !condition_true(&status.conditions, condition::READY) {
        return Verdict::Pending(why_not_ready(env));
    }
    Verdict::Recovered
}

fn find<'a>(
    conditions: &'a [EnvironmentCondition],
    kind: &str,
) -> Option<&'a EnvironmentCondition> {
    conditions.iter().find(|c| c.type_ == kind)
}

fn condition_true(conditions: &[EnvironmentCondition], kind: &str) -> bool {
    find(conditions, kind).is_some_and(|c| c.status == ConditionStatus::True)
}

/// The `Recovering` condition as `Recovering=STATUS REASON`, or that there is none.
fn recovering(conditions: &[EnvironmentCondition]) -> String {
    find(conditions, recovery::reason::RECOVERING).map_or_else(
        || "no Recovering condition".to_owned(),
        |c| format!("Recovering={:?} {}", c.status, c.reason),
    )
}

/// An environment's Ready condition as `Ready=STATUS REASON: MESSAGE`, or that its status was
/// never initialized.
fn why_not_ready(env: &ExecutionEnvironment) -> String {
    let Some(status) = env.status.as_ref() else {
        return "status never initialized".to_owned();
    };
    match find(&status.conditions, condition::READY) {
        Some(c) => format!("Ready={:?} {}: {}", c.status, c.reason, c.message),
        None => format!("no Ready condition; epoch {:?}", status.epoch),
    }
}

/// One environment's recovery during the liveness phase: it was not recovered when the phase
/// began, and recovered this long after the heal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// The environment's name.
    pub name: String,
    /// From the heal to the first look that found it recovered (100 ms resolution).
    pub after_heal: Duration,
    /// Its start point, after the heal (zero unless an operation lease outlived the heal).
    pub start: Duration,
}

impl std::fmt::Display for Recovered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:.1} s", self.name, self.after_heal.as_secs_f64())?;
        if !self.start.is_zero() {
            write!(
                f,
                " (lease expired {:.1} s after the heal)",
                self.start.as_secs_f64()
            )?;
        }
        Ok(())
    }
}

/// How one look at the cluster ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// Everything judged has recovered and nothing is orphaned.
    Converged,
    /// Something is still pending, within its deadline.
    Waiting,
    /// A deadline passed: the `LIVENESS:` message.
    Failed(String),
}

/// Per environment incarnation (by UID), what the phase has seen of it.
#[derive(Debug, Default)]
struct Tracked {
    name: String,
    /// The latest operation lease expiry seen, since the epoch.
    lease_expiry: Option<Duration>,
    /// Whether it was ever pending during the phase.
    was_pending: bool,
    /// When it was last found recovered after having been pending.
    recovered_at: Option<Duration>,
}

/// The liveness phase of one run: its heal, the nodes cut for good, and what it has seen.
#[derive(Debug)]
pub struct Liveness {
    heal: Duration,
    cut_nodes: BTreeSet<String>,
    node_of: fn(&str) -> Option<String>,
    tracked: BTreeMap<String, Tracked>,
    /// Names of environments not judged because their node is cut off, seen so far.
    held_by_cut: BTreeSet<String>,
}

/// What a look needs of the cluster.
pub struct Cluster<'a> {
    /// Every stored environment.
    pub envs: &'a [Value],
    /// Every Pod.
    pub pods: &'a [Value],
    /// Every PVC.
    pub pvcs: &'a [Value],
    /// The incarnations some ensure was acknowledged for.
    pub ensured: &'a BTreeSet<Incarnation>,
    /// Whether an environment's template revision is revoked in the registry the replicas
    /// run ([`revoked`]).
    pub revoked: &'a dyn Fn(&Value) -> bool,
}

impl Liveness {
    /// The phase of a run healed at `heal` (since the start), whose executor nodes in
    /// `cut_nodes` stay cut off; `node_of` names an environment's node (None: in process).
    pub fn new(
        heal: Duration,
        cut_nodes: BTreeSet<String>,
        node_of: fn(&str) -> Option<String>,
    ) -> Self {
        Self {
            heal,
            cut_nodes,
            node_of,
            tracked: BTreeMap::new(),
            held_by_cut: BTreeSet::new(),
        }
    }

    /// When the phase gives up at the latest, since the start.
    pub fn end(&self) -> Duration {
        self.heal + Duration::from_secs(QUIET_PHASE_SECS)
    }

    /// Judges the cluster at `now` (since the start).
    pub fn look(&mut self, now: Duration, cluster: &Cluster<'_>) -> Look {
        let mut late = Vec::new();
        let mut pending = 0;
        for value in cluster.envs {
            let Ok(env) = serde_json::from_value::<ExecutionEnvironment>(value.clone()) else {
                late.push(format!("an environment that does not parse: {value}"));
                continue;
            };
            match self.judge(now, value, &env, cluster) {
                Ok(true) => {}
                Ok(false) => pending += 1,
                Err(failure) => late.push(failure),
            }
        }
        let orphans = orphans(cluster, |owner| self.node_cut(owner));
        if !orphans.is_empty() {
            pending += 1;
            if now >= self.heal + Duration::from_secs(RECOVERY_SECS) {
                late.push(format!(
                    "{} within {RECOVERY_SECS} s of the heal",
                    orphans.join(", ")
                ));
            }
        }
        if !late.is_empty() {
            return Look::Failed(format!(
                "LIVENESS: not recovered by the deadline (at {:.1} s, healed at {:.1} s): {}",
                now.as_secs_f64(),
                self.heal.as_secs_f64(),
                late.join("; ")
            ));
        }
        if pending == 0 {
            Look::Converged
        } else {
            Look::Waiting
        }
    }

    /// Whether environment `name`'s executor node is cut off for good.
    fn node_cut(&self, name: &str) -> bool {
        (self.node_of)(name).is_some_and(|node| self.cut_nodes.contains(&node))
    }

    /// Judges one environment: Ok(true) when recovered or not judged, Ok(false) while pending
    /// within its deadline, Err with the failure once its deadline passed.
    fn judge(
        &mut self,
        now: Duration,
        value: &Value,
        env: &ExecutionEnvironment,
        cluster: &Cluster<'_>,
    ) -> Result<bool, String> {
        let name = env.metadata.name.clone().unwrap_or_default();
        let uid = env.metadata.uid.clone().unwrap_or_default();
        let (heal, end, node_cut) = (self.heal, self.end(), self.node_cut(&name));
        let tracked = self.tracked.entry(uid).or_default();
        tracked.name.clone_from(&name);
        let expiry = env
            .status
            .as_ref()
            .and_then(|s| s.active_operation.as_ref())
            .map(|op| since_epoch(op.expires_at.to_system_time()));
        tracked.lease_expiry = tracked.lease_expiry.max(expiry);
        let incarnation = Incarnation {
            name: name.clone(),
            revision: env.spec.revision.clone(),
        };
        let judged = Judged {
            env,
            acknowledged: cluster.ensured.contains(&incarnation),
            revoked: (cluster.revoked)(value),
            pod_running: pod_running(cluster.pods, &name),
            node_cut,
        };
        let start = heal.max(tracked.lease_expiry.unwrap_or_default());
        let deadline = start + Duration::from_secs(RECOVERY_SECS);
        match verdict(&judged) {
            Verdict::Recovered => {
                if tracked.was_pending && tracked.recovered_at.is_none() {
                    tracked.recovered_at = Some(now);
                }
                Ok(true)
            }
            Verdict::NotJudged(why) => {
                if why == CUT_OFF {
                    self.held_by_cut.insert(name);
                }
                Ok(true)
            }
            Verdict::Pending(state) => {
                tracked.was_pending = true;
                tracked.recovered_at = None;
                if now < deadline && now < end {
                    return Ok(false);
                }
                let lease = tracked.lease_expiry.map_or_else(
                    || "no operation lease".to_owned(),
                    |e| format!("its operation lease expired at {:.1} s", e.as_secs_f64()),
                );
                Err(format!(
                    "environment {name} is {state}; deadline {:.1} s = {RECOVERY_SECS} s after \
                     the later of the heal ({:.1} s) and {lease}",
                    deadline.as_secs_f64(),
                    heal.as_secs_f64()
                ))
            }
        }
    }

    /// Every environment that was not recovered when the phase began and recovered during it,
    /// by name.
    pub fn recoveries(&self) -> Vec<Recovered> {
        let mut out: Vec<Recovered> = self
            .tracked
            .values()
            .filter_map(|t| {
                let at = t.recovered_at?;
                let start = t.lease_expiry.unwrap_or_default().max(self.heal) - self.heal;
                Some(Recovered {
                    name: t.name.clone(),
                    after_heal: at.saturating_sub(self.heal),
                    start,
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Environments left unjudged because their executor node stays cut off.
    pub fn held_by_cut(&self) -> &BTreeSet<String> {
        &self.held_by_cut
    }
}

/// `at` as time since the simulation's epoch (zero before it).
fn since_epoch(at: std::time::SystemTime) -> Duration {
    at.duration_since(sim_epoch()).unwrap_or_default()
}

/// Whether the environment's template revision is revoked (or gone) in `templates`.
pub fn revoked(env: &Value, templates: &TemplateRegistry) -> bool {
    let spec = |field: &str| env["spec"][field].as_str().unwrap_or_default();
    templates
        .for_environment(
            spec("templateID"),
            spec("templateRevision"),
            spec("templateDigest"),
        )
        .is_err()
}

/// Whether a Pod of environment `name` is present and not being deleted.
fn pod_running(pods: &[Value], name: &str) -> bool {
    pods.iter().any(|pod| {
        pod["metadata"]["labels"][LABEL_ENVIRONMENT] == name
            && pod["metadata"]["deletionTimestamp"].is_null()
    })
}

/// Pods and PVCs of missing environments, and Pods of an earlier incarnation beside a later
/// one of the same name (PVCs carry no owner reference: the workspace outlives its Pods);
/// none of an environment for which `unjudged` holds (its node is cut off for good, so no
/// kubelet confirms a Pod's end).
pub fn orphans(cluster: &Cluster<'_>, unjudged: impl Fn(&str) -> bool) -> Vec<String> {
    let text = |v: &Value, pointer: &str| {
        v.pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let names: BTreeSet<String> = cluster
        .envs
        .iter()
        .filter_map(|e| text(e, "/metadata/name"))
        .collect();
    let uids: BTreeSet<String> = cluster
        .envs
        .iter()
        .filter_map(|e| text(e, "/metadata/uid"))
        .collect();
    let mut found = Vec::new();
    for (kind, objects) in [
        ("Pod", cluster.pods),
        ("PersistentVolumeClaim", cluster.pvcs),
    ] {
        for object in objects {
            let Some(owner) = object["metadata"]["labels"][LABEL_ENVIRONMENT].as_str() else {
                continue;
            };
            if unjudged(owner) {
                continue;
            }
            if !names.contains(owner) {
                found.push(format!("orphaned {kind} of {owner}"));
            } else if let Some(uid) = text(object, "/metadata/ownerReferences/0/uid")
                && !uids.contains(&uid)
            {
                found.push(format!(
                    "orphaned {kind} of an earlier incarnation of {owner}"
                ));
            }
        }
    }
    found
}

/// The per-seed report line of `recoveries`: how many recovered, the slowest and each one.
pub fn summary(recoveries: &[Recovered], held_by_cut: &BTreeSet<String>) -> String {
    let slowest = recoveries.iter().max_by_key(|r| r.after_heal);
    let mut line = match slowest {
        None => "time to recover: nothing to recover".to_owned(),
        Some(slowest) => format!(
            "time to recover: max {:.1} s after the heal ({}) over {} environment(s): {}",
            slowest.after_heal.as_secs_f64(),
            slowest.name,
            recoveries.len(),
            recoveries
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if !held_by_cut.is_empty() {
        line.push_str(&format!(
            "; not judged (executor node cut off for good): {}",
            held_by_cut.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    line
}
