//! The store side of the administrator lifecycle (store §7.3-7.6, 7.8): admission of
//! ReplaceExecutor and RetireEnvironment (with a durable proof that an exact, not-Ready
//! executor already terminated), RecoverEnvironment (clears FenceUnknown only on proof of the
//! exact Pod's termination), DeleteRetiredEnvironment, and MigrateEnvironment, which refuses
//! every environment because the only schema this provider knows is the current one
//! (DECISIONS 3). The reconciler drives the admitted phases.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::Api;

use super::admin::{
    AdminRequest, admin_subject, condition_true, exact_admin_subject, expired_exact_claim, idle,
    proof_matches, proof_op_matches, replacement_receipt,
};
use super::cas::{self, Decision};
use super::intents::parse_references;
use super::{Store, StoreError};
use crate::kube::crd::{
    ConditionStatus, EnvironmentCondition, ExecutionEnvironment, FenceState, LifecycleOperation,
    LifecyclePhase, LifecycleType, RfcTime, TerminalPodPhase, TerminationProof, condition,
};
use crate::metrics::lifecycle::OutcomeLabels;
use crate::reconciler::pod::pod_terminal;

fn check_identity_args(q: &AdminRequest) -> Result<(), StoreError> {
    if q.expected_epoch < 1
        || q.expected_epoch > i64::MAX as u64
        || q.expected_pod_uid.is_empty()
        || q.expected_pvc_uid.is_empty()
        || q.operation_id.is_empty()
    {
        return Err(StoreError::InvalidArgument("lifecycle identity required"));
    }
    Ok(())
}

/// Sets the Ready condition False with `reason`, keeping the transition time when unchanged.
fn set_not_ready(o: &mut ExecutionEnvironment, reason: &str, now: &RfcTime) {
    let generation = o.metadata.generation.unwrap_or(0);
    let status = o.status.get_or_insert_with(Default::default);
    let previous = status
        .conditions
        .iter()
        .position(|c| c.type_ == condition::READY);
    let transition = match previous.map(|i| &status.conditions[i]) {
        Some(c) if c.status == ConditionStatus::False => c.last_transition_time,
        _ => *now,
    };
    if let Some(i) = previous {
        status.conditions.remove(i);
    }
    status.conditions.push(EnvironmentCondition {
        type_: condition::READY.to_owned(),
        status: ConditionStatus::False,
        reason: reason.to_owned(),
        message: "administrator lifecycle in progress".to_owned(),
        observed_generation: generation,
        last_transition_time: transition,
    });
}

impl Store {
    /// ReplaceExecutor.
    pub async fn replace_executor(&self, q: &AdminRequest) -> Result<(), StoreError> {
        self.start_lifecycle(q, LifecycleType::ReplaceExecutor)
            .await
    }

    /// RetireEnvironment (exact): only an unreferenced environment can be retired.
    pub async fn retire_environment(&self, q: &AdminRequest) -> Result<(), StoreError> {
        self.start_lifecycle(q, LifecycleType::RetireEnvironment)
            .await
    }

    async fn start_lifecycle(
        &self,
        q: &AdminRequest,
        kind: LifecycleType,
    ) -> Result<(), StoreError> {
        check_identity_args(q)?;
        // Commands of a claim that has lapsed (expired, the one case a lifecycle may take the
        // claim over) end first, proven and recorded (docs/commands.md §5.5): admission
        // needs every lease ended (C4). A current claim's commands are left alone, and its
        // live claim refuses the admission below.
        self.end_lapsed_commands(q).await?;
        self.persist_observed_terminal_proof(q).await?;
        let now = self.now();
        let stamp = RfcTime::from_system_time(now);
        let env = &q.env.id;
        cas::update_status(&self.api, env, |o| {
            admin_subject(o, q)?;
            if kind == LifecycleType::ReplaceExecutor && replacement_receipt(o, q) {
                return Ok(Decision::Keep(()));
            }
            exact_admin_subject(o, q)?;
            let retired = condition_true(o, condition::RETIRED);
            if kind == LifecycleType::RetireEnvironment && retired {
                return if proof_op_matches(o, q) {
                    Ok(Decision::Keep(()))
                } else {
                    Err(StoreError::conflict(
                        env,
                        "already retired by another operation",
                    ))
                };
            }
            let status = o.status.clone().unwrap_or_default();
            if let Some(op) = &status.lifecycle_operation {
                let same = op.id == q.operation_id
                    && op.type_ == kind
                    && op.expected_pod_uid.as_deref() == Some(q.expected_pod_uid.as_str())
                    && op.expected_pvc_uid.as_deref() == Some(q.expected_pvc_uid.as_str())
                    && op.expected_epoch == Some(q.expected_epoch);
                return if same {
                    Ok(Decision::Keep(()))
                } else {
                    Err(StoreError::conflict(
                        env,
                        "another lifecycle operation is active",
                    ))
                };
            }
            if retired {
                return Err(StoreError::conflict(env, "environment is retired"));
            }
            let ready = condition_true(o, condition::READY);
            if !idle(o, q, now) || (!ready && !proof_matches(o, q)) {
                return Err(StoreError::conflict(env, "not healthy and idle"));
            }
            if kind == LifecycleType::RetireEnvironment && !parse_references(o)?.is_empty() {
                return Err(StoreError::conflict(
                    env,
                    "environment still has references",
                ));
            }
            parse_references(o)?;
            let reclaim = expired_exact_claim(o, q, now);
            set_not_ready(o, condition::reason::QUIESCING, &stamp);
            let status = o.status.get_or_insert_with(Default::default);
            if reclaim {
                status.active_run = None;
            }
            status.lifecycle_operation = Some(LifecycleOperation {
                id: q.operation_id.clone(),
                type_: kind,
                phase: LifecyclePhase::Quiescing,
                expected_epoch: Some(q.expected_epoch),
                expected_pod_uid: Some(q.expected_pod_uid.clone()),
                expected_pvc_uid: Some(q.expected_pvc_uid.clone()),
                created_at: stamp,
            });
            Ok(Decision::Write(()))
        })
        .await
    }

    /// The administrator's exact subject only: the commands of every claim but the current,
    /// unexpired one end at the supervisor, or, when it cannot be asked and the exact
    /// executor Pod is terminal, by that Pod's end. Nothing open costs one read.
    async fn end_lapsed_commands(&self, q: &AdminRequest) -> Result<(), StoreError> {
        let env = &q.env.id;
        let o = cas::get(&self.api, env)
            .await?
            .ok_or_else(|| StoreError::not_found(env, "environment not found"))?;
        admin_subject(&o, q)?;
        if super::command_leases::none_open(&o) || exact_admin_subject(&o, q).is_err() {
            return Ok(());
        }
        match self.end_stale_claims_of(&o).await {
            Err(error) if super::command_authority::unreached(&error) => {
                self.end_by_executor_end(&o).await.map(drop)
            }
            answer => answer,
        }
    }

    /// Before admitting a lifecycle on a not-Ready environment: if its exact executor Pod has
    /// terminated on its own, record that durably (the proof admission requires).
    async fn persist_observed_terminal_proof(&self, q: &AdminRequest) -> Result<(), StoreError> {
        let env = &q.env.id;
        let now = self.now();
        let o = cas::get(&self.api, env)
            .await?
            .ok_or_else(|| StoreError::not_found(env, "environment not found"))?;
        admin_subject(&o, q)?;
        if replacement_receipt(&o, q) {
            return Ok(());
        }
        exact_admin_subject(&o, q)?;
        let admitted = o
            .status
            .as_ref()
            .is_some_and(|s| s.lifecycle_operation.is_some());
        if admitted
            || condition_true(&o, condition::READY)
            || condition_true(&o, condition::RETIRED)
            || proof_op_matches(&o, q)
        {
            // Admission decides: an in-progress replay, or a conflict.
            return Ok(());
        }
        if !idle(&o, q, now) {
            return Err(StoreError::conflict(env, "not healthy and idle"));
        }
        if proof_matches(&o, q) {
            return Ok(());
        }
        let phase = self
            .observe_terminal(&o, q)
            .await?
            .ok_or_else(|| StoreError::conflict(env, "terminal proof unavailable"))?;
        self.write_proof(q, phase, false).await
    }

    /// The exact Pod's terminal phase and the exact PVC, or `None` when either cannot be
    /// proven (missing, foreign UID, still running).
    async fn observe_terminal(
        &self,
        o: &ExecutionEnvironment,
        q: &AdminRequest,
    ) -> Result<Option<TerminalPodPhase>, StoreError> {
        let env = &q.env.id;
        let status = o.status.clone().unwrap_or_default();
        let (Some(pod), Some(pvc)) = (status.pod, status.pvc) else {
            return Ok(None);
        };
        let pods: Api<Pod> = Api::namespaced(self.kube.clone(), &self.namespace);
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.kube.clone(), &self.namespace);
        let kube = |e| StoreError::kube(env, e);
        let pod = pods.get_opt(&pod.name).await.map_err(kube)?;
        let pvc = pvcs.get_opt(&pvc.name).await.map_err(kube)?;
        let pod_ok = pod.as_ref().is_some_and(|p| {
            p.metadata.uid.as_deref() == Some(q.expected_pod_uid.as_str()) && pod_terminal(p)
        });
        let pvc_ok = pvc
            .as_ref()
            .is_some_and(|p| p.metadata.uid.as_deref() == Some(q.expected_pvc_uid.as_str()));
        if !pod_ok || !pvc_ok {
            return Ok(None);
        }
        let phase = pod.and_then(|p| p.status).and_then(|s| s.phase);
        Ok(Some(match phase.as_deref() {
            Some("Succeeded") => TerminalPodPhase::Succeeded,
            _ => TerminalPodPhase::Failed,
        }))
    }

    /// Writes the termination proof; with `recover`, also clears the operation, the run and
    /// the fence (RecoverEnvironment).
    async fn write_proof(
        &self,
        q: &AdminRequest,
        phase: TerminalPodPhase,
        recover: bool,
    ) -> Result<(), StoreError> {
        let env = &q.env.id;
        let now = self.now();
        cas::update_status(&self.api, env, |o| {
            exact_admin_subject(o, q)?;
            if proof_op_matches(o, q) {
                return Ok(Decision::Keep(()));
            }
            if recover {
                if o.status.as_ref().and_then(|s| s.fence_state) != Some(FenceState::FenceUnknown) {
                    return Err(StoreError::conflict(env, "environment is not fenced"));
                }
            } else if condition_true(o, condition::READY) {
                return Ok(Decision::Keep(()));
            } else if !idle(o, q, now) {
                return Err(StoreError::conflict(env, "not healthy and idle"));
            }
            let status = o.status.get_or_insert_with(Default::default);
            status.termination_proof = Some(TerminationProof {
                operation_id: q.operation_id.clone(),
                pod_uid: q.expected_pod_uid.clone(),
                pvc_uid: q.expected_pvc_uid.clone(),
                epoch: q.expected_epoch,
                pod_phase: phase,
                observed_at: RfcTime::from_system_time(now),
            });
            if recover {
                // The exact Pod's end is proven: every supervised command ended with it.
                super::command_leases::end_all_by_executor_end(status, now);
                status.active_operation = None;
                status.active_run = None;
                status.fence_state = Some(FenceState::Healthy);
                // The `Recovering` condition said why the fence stayed (ManualRecovery,
                // ExecutorIdentityLost, TerminationUnconfirmed); with the fence gone it is stale.
                let recovering = crate::reconciler::recovery::reason::RECOVERING;
                status.conditions.retain(|c| c.type_ != recovering);
            }
            Ok(Decision::Write(()))
        })
        .await
    }

    /// RecoverEnvironment: clears FenceUnknown only on proof that the exact executor Pod is
    /// terminal and the exact PVC is present. A missing, foreign or running Pod proves
    /// nothing (`fence_unknown`) and nothing changes.
    pub async fn recover_environment(&self, q: &AdminRequest) -> Result<(), StoreError> {
        let result = self.recover(q).await;
        let outcome = OutcomeLabels::of(result.as_ref().err().map(StoreError::code));
        self.metrics.recovery(outcome);
        if result.is_ok() {
            let recovered = crate::telemetry::events::EnvironmentEvent::RecoveredByAdministrator;
            self.events.record_named(&q.env.id, None, recovered);
        }
        result
    }

    async fn recover(&self, q: &AdminRequest) -> Result<(), StoreError> {
        check_identity_args(q)?;
        let env = &q.env.id;
        let o = cas::get(&self.api, env)
            .await?
            .ok_or_else(|| StoreError::not_found(env, "environment not found"))?;
        exact_admin_subject(&o, q)?;
        if proof_op_matches(&o, q) {
            return Ok(());
        }
        if o.status.as_ref().and_then(|s| s.fence_state) != Some(FenceState::FenceUnknown) {
            return Err(StoreError::conflict(env, "environment is not fenced"));
        }
        let phase = self
            .observe_terminal(&o, q)
            .await?
            .ok_or_else(|| StoreError::fence(env, "recovery proof unavailable"))?;
        self.write_proof(q, phase, true).await
    }

    /// DeleteRetiredEnvironment: admits the deletion of a retired, unreferenced, run-free,
    /// operation-free environment whose workspace PVC has the expected UID. A failure logs
    /// one bounded WARN record (api-security §3): exactly the fields `message`, `operation`,
    /// `reason` (a class, never the error's text) and `environment`.
    pub async fn delete_retired_environment(&self, q: &AdminRequest) -> Result<(), StoreError> {
        let result = self.admit_retired_delete(q).await;
        if let Err(error) = &result {
            tracing::warn!(
                operation = "delete_retired",
                reason = error.diagnostic_class(),
                environment = q.env.id.as_str(),
                "execution backend failure"
            );
        }
        result
    }

    async fn admit_retired_delete(&self, q: &AdminRequest) -> Result<(), StoreError> {
        if q.expected_pvc_uid.is_empty() || q.operation_id.is_empty() {
            return Err(StoreError::InvalidArgument("retained identity required"));
        }
        let env = &q.env.id;
        let stamp = RfcTime::from_system_time(self.now());
        cas::update_status(&self.api, env, |o| {
            admin_subject(o, q)?;
            let status = o.status.clone().unwrap_or_default();
            if status.pvc.as_ref().map(|p| p.uid.as_str()) != Some(q.expected_pvc_uid.as_str()) {
                return Err(StoreError::conflict(env, "retained identity changed"));
            }
            if let Some(op) = &status.lifecycle_operation {
                return if op.id == q.operation_id
                    && op.type_ == LifecycleType::DeleteRetiredEnvironment
                {
                    Ok(Decision::Keep(()))
                } else {
                    Err(StoreError::conflict(
                        env,
                        "another lifecycle operation is active",
                    ))
                };
            }
            let safe = parse_references(o)?.is_empty()
                && status
                    .active_run
                    .as_ref()
                    .is_none_or(|r| r.claim_id.is_empty())
                && status.active_operation.is_none()
                && super::command_leases::none_open(o)
                && condition_true(o, condition::RETIRED)
                && condition_true(o, condition::EXECUTOR_TERMINATED);
            if !safe {
                return Err(StoreError::conflict(
                    env,
                    "not safely retained and unreferenced",
                ));
            }
            o.status
                .get_or_insert_with(Default::default)
                .lifecycle_operation = Some(LifecycleOperation {
                id: q.operation_id.clone(),
                type_: LifecycleType::DeleteRetiredEnvironment,
                phase: LifecyclePhase::DeletingPvc,
                expected_epoch: None,
                expected_pod_uid: None,
                expected_pvc_uid: Some(q.expected_pvc_uid.clone()),
                created_at: stamp,
            });
            Ok(Decision::Write(()))
        })
        .await
    }

    /// MigrateEnvironment: the only schema this provider knows is the current one, so every
    /// environment either is already current (conflict: nothing to migrate from the expected
    /// schema) or is of a schema it does not know (refused as not ready). Never rewrites.
    pub async fn migrate_environment(
        &self,
        q: &AdminRequest,
        expected_schema: u32,
    ) -> Result<(), StoreError> {
        if expected_schema > 1
            || q.operation_id.is_empty()
            || q.expected_pod_uid.is_empty()
            || q.expected_pvc_uid.is_empty()
        {
            return Err(StoreError::InvalidArgument("migration arguments invalid"));
        }
        let env = &q.env.id;
        let o = cas::get(&self.api, env)
            .await?
            .ok_or_else(|| StoreError::not_found(env, "environment not found"))?;
        match admin_subject(&o, q) {
            Ok(()) => Err(StoreError::conflict(
                env,
                "environment is not at the expected schema",
            )),
            Err(StoreError::NotReady { .. }) => {
                Err(StoreError::not_ready(env, "unknown schema refused"))
            }
            Err(e) => Err(e),
        }
    }
}
