//! The driver of one run: steps the simulation, applies the seed's faults between steps,
//! runs the invariant checker whenever the stored state changed, then heals everything and
//! waits for convergence (the liveness phase).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use execution_provider::kube::apiserver::ApiServer;
use rand::RngExt;
use rand::rngs::StdRng;

use crate::apifaults::ApiRates;
use crate::authority::SecurityFiles;
use crate::executor::MemExecutor;
use crate::faults::FaultPlan;
use crate::invariants::{Checker, Incarnation};
use crate::liveness::{Cluster, Liveness, Look};
use crate::node::node_host;
use crate::trace::Trace;
use crate::world::{API_HOST, TICK_MS, replica_host};
use crate::writes::WriteLog;

/// Steps the simulation and applies faults.
pub(crate) struct Driver<'a> {
    pub(crate) sim: turmoil::Sim<'a>,
    pub(crate) rng: StdRng,
    pub(crate) plan: FaultPlan,
    pub(crate) steppers: Vec<Arc<std::sync::atomic::AtomicI64>>,
    pub(crate) trace: Trace,
    pub(crate) api: ApiServer,
    pub(crate) replicas: u32,
    /// Executor node hosts (0: the executor is in process).
    pub(crate) nodes: u32,
    pub(crate) clients: Vec<String>,
    pub(crate) down: Vec<(u32, Duration)>,
    /// Crashed executor nodes and when they restart.
    pub(crate) nodes_down: Vec<(u32, Duration)>,
    /// Cut links: the two hosts, when the cut ends, and whether messages are held (delivered
    /// all at once when it ends) rather than dropped.
    pub(crate) partitions: Vec<(String, String, Duration, bool)>,
    pub(crate) checker: Checker,
    pub(crate) writes: WriteLog,
    pub(crate) security: Option<Arc<Mutex<SecurityFiles>>>,
    /// When to write the good manifest back after a rollback attempt.
    pub(crate) restore_at: Option<Duration>,
    /// Hand-driven actions still to apply, in time order.
    pub(crate) script: Vec<crate::script::Scripted>,
    pub(crate) last_rv: u64,
    /// The executor (for the scripted command time).
    pub(crate) executor: MemExecutor,
    /// The API server's scripted outage.
    pub(crate) outage: crate::apifaults::ApiOutage,
    pub(crate) host_error: Option<String>,
    /// The run's templates file, as the script's operator edits it.
    pub(crate) templates: crate::operator::RunTemplates,
    /// The kubelet's link to the API server, when the script holds it.
    pub(crate) kubelet: Option<crate::operator::KubeletLink>,
    /// The administrator's desk, for the script's lifecycle calls.
    pub(crate) admin: crate::workload::AdminDesk,
    /// Executor nodes the script cut off for good (kept cut through the heal).
    pub(crate) cut_nodes: BTreeSet<String>,
    /// The largest clock step any replica's clock has accumulated (its absolute value, ms).
    pub(crate) max_clock_steps_ms: i64,
}

/// Faults are considered every this many simulated milliseconds.
const FAULT_TICK_MS: u64 = 100;
const _: () = assert!(
    FAULT_TICK_MS.is_multiple_of(TICK_MS),
    "steps land on every fault tick"
);

impl Driver<'_> {
    fn ms(&self) -> u128 {
        self.sim.elapsed().as_millis()
    }

    /// One simulation step, then the invariant check if anything was written. Returns
    /// whether every client finished (or a host failed).
    fn step(&mut self) -> bool {
        let finished = match self.sim.step() {
            Ok(finished) => finished,
            Err(error) => {
                self.host_error = Some(error.to_string());
                return true;
            }
        };
        let written = self.writes.drain();
        if !written.is_empty() {
            self.checker.observe_writes(&written);
        }
        let rv = self.api.resource_version();
        if rv != self.last_rv {
            self.last_rv = rv;
            let envs = self.api.objects_of_kind("ExecutionEnvironment");
            let configmaps = self.api.objects_of_kind("ConfigMap");
            self.checker.observe_state(&envs, &configmaps);
        }
        finished
    }

    pub(crate) fn workload(&mut self) {
        loop {
            if self.step() {
                return;
            }
            if self.ms().is_multiple_of(u128::from(FAULT_TICK_MS)) {
                self.faults();
            }
        }
    }

    fn chance(&mut self, per_sec: f64) -> bool {
        let p = per_sec * FAULT_TICK_MS as f64 / 1000.0;
        p > 0.0 && self.rng.random_bool(p.min(1.0))
    }

    fn faults(&mut self) {
        let now = self.sim.elapsed();
        let ms = self.ms();
        let due: Vec<u32> = self
            .down
            .iter()
            .filter(|(_, until)| *until <= now)
            .map(|(i, _)| *i)
            .collect();
        self.scripted(now, ms);
        for i in due {
            self.down.retain(|(j, _)| *j != i);
            self.trace
                .record_at(ms, "world", format!("restart replica-{i}"));
            self.sim.bounce(replica_host(i));
        }
        let healed: Vec<(String, String, bool)> = self
            .partitions
            .iter()
            .filter(|(_, _, until, _)| *until <= now)
            .map(|(a, b, _, held)| (a.clone(), b.clone(), *held))
            .collect();
        for (a, b, held) in healed {
            self.partitions.retain(|(x, y, _, _)| !(x == &a && y == &b));
            self.mend(ms, &a, &b, held);
        }
        if self.chance(self.plan.crash_per_sec) {
            let i = self.rng.random_range(0..self.replicas);
            if !self.down.iter().any(|(j, _)| *j == i) {
                self.trace
                    .record_at(ms, "world", format!("crash replica-{i}"));
                self.sim.crash(replica_host(i));
                let until = now + Duration::from_millis(self.plan.downtime_ms);
                self.down.push((i, until));
            }
        }
        if self.chance(self.plan.partition_per_sec) {
            self.partition(now, ms);
        }
        if self.chance(self.plan.clock_step_per_sec) && !self.steppers.is_empty() {
            let i = self.rng.random_range(0..self.steppers.len());
            let step = self.rng.random_range(-1_000..=1_000);
            let stepped = self.steppers[i].fetch_add(step, Ordering::Relaxed) + step;
            self.max_clock_steps_ms = self.max_clock_steps_ms.max(stepped.abs());
            self.trace
                .record_at(ms, "world", format!("clock step replica-{i} {step}ms"));
        }
        self.authority(now, ms);
        self.node_faults(now, ms);
        if self.chance(self.plan.compact_per_sec) {
            self.trace
                .record_at(ms, "world", "compact (watches get 410)");
            self.api.compact();
        }
    }

    /// Executor node crashes and restarts: the workspaces survive (they are the node's disk),
    /// the calls in flight die with the process.
    fn node_faults(&mut self, now: Duration, ms: u128) {
        let due: Vec<u32> = self
            .nodes_down
            .iter()
            .filter(|(_, until)| *until <= now)
            .map(|(i, _)| *i)
            .collect();
        for i in due {
            self.nodes_down.retain(|(j, _)| *j != i);
            self.trace
                .record_at(ms, "world", format!("restart {}", node_host(i)));
            self.sim.bounce(node_host(i));
        }
        if self.nodes == 0 || !self.chance(self.plan.node_crash_per_sec) {
            return;
        }
        let i = self.rng.random_range(0..self.nodes);
        if !self.nodes_down.iter().any(|(j, _)| *j == i) {
            self.trace
                .record_at(ms, "world", format!("crash {}", node_host(i)));
            self.sim.crash(node_host(i));
            // The commands of the node end with it.
            self.executor.commands().node_crashed(&node_host(i), ms);
            let until = now + Duration::from_millis(self.plan.downtime_ms);
            self.nodes_down.push((i, until));
        }
    }

    /// Ends a cut: held messages are delivered at once, a partition is repaired.
    fn mend(&mut self, ms: u128, a: &str, b: &str, held: bool) {
        if held {
            self.trace
                .record_at(ms, "world", format!("release {a} {b}"));
            self.sim.release(a, b);
        } else {
            self.trace.record_at(ms, "world", format!("repair {a} {b}"));
            self.sim.repair(a, b);
        }
    }

    fn partition(&mut self, now: Duration, ms: u128) {
        let replica = replica_host(self.rng.random_range(0..self.replicas));
        let other = if self.nodes > 0 && self.rng.random_bool(1.0 / 3.0) {
            node_host(self.rng.random_range(0..self.nodes))
        } else if self.rng.random_bool(0.5) {
            API_HOST.to_owned()
        } else {
            let c = self.rng.random_range(0..self.clients.len());
            self.clients[c].clone()
        };
        if self
            .partitions
            .iter()
            .any(|(a, b, _, _)| a == &replica && b == &other)
        {
            return;
        }
        let until = now + Duration::from_millis(self.plan.partition_ms);
        let held = self.rng.random_bool(1.0 / 3.0);
        if held {
            // Messages wait and then arrive all at once, late: stale observations and
            // answers to calls their sender gave up on.
            self.trace
                .record_at(ms, "world", format!("hold {replica} {other}"));
            self.sim.hold(replica.as_str(), other.as_str());
        } else if self.plan.one_way && self.rng.random_bool(0.5) {
            // A node link is cut in either direction (requests lost, or answers lost).
            let (from, to) = if other.starts_with("node-") && self.rng.random_bool(0.5) {
                (other.as_str(), replica.as_str())
            } else {
                (replica.as_str(), other.as_str())
            };
            self.trace
                .record_at(ms, "world", format!("partition one-way {from} -> {to}"));
            self.sim.partition_oneway(from, to);
        } else {
            self.trace
                .record_at(ms, "world", format!("partition {replica} {other}"));
            self.sim.partition(replica.as_str(), other.as_str());
        }
        self.partitions.push((replica, other, until, held));
    }

    /// Security manifest faults: a rotation to the next generation, or a rollback attempt
    /// that is written back after a drawn time.
    fn authority(&mut self, now: Duration, ms: u128) {
        let Some(files) = self.security.clone() else {
            return;
        };
        let files = files.lock().expect("security files lock");
        if self.restore_at.is_some_and(|at| at <= now) {
            self.restore_at = None;
            files.restore();
            self.trace.record_at(
                ms,
                "world",
                format!("security restore generation {}", files.generation()),
            );
        }
        drop(files);
        if self.restore_at.is_some() || !self.chance(self.plan.security_per_sec) {
            return;
        }
        let Some(files) = self.security.clone() else {
            return;
        };
        let mut files = files.lock().expect("security files lock");
        if self.rng.random_bool(0.5) {
            let generation = files.rotate();
            self.trace.record_at(
                ms,
                "world",
                format!("security rotate to generation {generation}"),
            );
        } else {
            let what = files.attempt_rollback();
            self.trace
                .record_at(ms, "world", format!("security {what} attempted"));
            self.restore_at = Some(now + Duration::from_millis(self.plan.partition_ms));
        }
    }

    /// Stops every fault and restarts every replica.
    pub(crate) fn heal(&mut self, rates: &Arc<Mutex<ApiRates>>, executor: &MemExecutor) {
        let ms = self.ms();
        self.trace
            .record_at(ms, "world", "heal: faults off, replicas restarted");
        self.plan = self.plan.calm();
        *rates.lock().expect("rates lock") = ApiRates::default();
        executor.set_crash_rate(0.0);
        for (a, b, _, held) in std::mem::take(&mut self.partitions) {
            self.mend(ms, &a, &b, held);
        }
        self.down.clear();
        for (i, _) in std::mem::take(&mut self.nodes_down) {
            self.trace
                .record_at(ms, "world", format!("restart {}", node_host(i)));
            self.sim.bounce(node_host(i));
        }
        if let Some(files) = &self.security {
            files.lock().expect("security files lock").restore();
            self.restore_at = None;
        }
        // A kubelet the script held reports again, unless its node is cut off for good.
        if let Some(kubelet) = self.kubelet.as_ref().filter(|_| self.cut_nodes.is_empty()) {
            kubelet.release();
        }
        for i in 0..self.replicas {
            self.sim.bounce(replica_host(i));
        }
    }

    /// The quiet phase after healing (`crate::liveness`): looks at the cluster every fault
    /// tick until every judged environment has recovered and nothing is orphaned, or until
    /// some environment's deadline passes. Returns the `LIVENESS:` failure, if any, and what
    /// the phase saw (each environment's time to recover).
    pub(crate) fn liveness(
        &mut self,
        ensured: &Mutex<BTreeSet<Incarnation>>,
    ) -> (Option<String>, Liveness) {
        let mut phase = Liveness::new(
            self.sim.elapsed(),
            self.cut_nodes.clone(),
            crate::world::executor_node_of,
        );
        loop {
            for _ in 0..FAULT_TICK_MS / TICK_MS {
                self.step();
            }
            if self.host_error.is_some() {
                return (None, phase);
            }
            let ensured = ensured.lock().expect("ensured lock").clone();
            let templates = self.templates.current();
            let revoked = |env: &serde_json::Value| crate::liveness::revoked(env, &templates);
            let (envs, pods, pvcs) = (
                self.api.objects_of_kind("ExecutionEnvironment"),
                self.api.objects_of_kind("Pod"),
                self.api.objects_of_kind("PersistentVolumeClaim"),
            );
            let cluster = Cluster {
                envs: &envs,
                pods: &pods,
                pvcs: &pvcs,
                ensured: &ensured,
                revoked: &revoked,
            };
            let now = self.sim.elapsed();
            match phase.look(now, &cluster) {
                Look::Waiting => {}
                Look::Converged => {
                    let ms = self.ms();
                    self.trace.record_at(ms, "world", "liveness: converged");
                    for recovered in phase.recoveries() {
                        self.trace.record_at(
                            ms,
                            "world",
                            format!("liveness: recovered {recovered}"),
                        );
                    }
                    return (None, phase);
                }
                Look::Failed(why) => return (Some(why), phase),
            }
        }
    }
}
