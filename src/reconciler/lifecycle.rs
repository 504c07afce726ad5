//! The reconciler side of the admin lifecycle (k8s-executor §2.8): an admitted
//! `ReplaceExecutor` or `RetireEnvironment` moves through Quiescing → WaitingForTermination →
//! RemovingPodFinalizer → WaitingForPodDeletion → CreatingReplacement (replace) or retirement.
//! Every transition is a status write guarded by the runtime observation, the termination
//! proof is durable before the Pod's finalizer is touched, and any identity that no longer
//! matches fences the environment instead of guessing.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};

use super::error::ReconcileError;
use super::pod::{ensure_pod, pod_ready, pod_terminal};
use super::status::{fence_error, guarded};
use super::{Context, Next, WAITING_REQUEUE, recovery, retained};
use crate::kube::crd::{
    EXECUTOR_FINALIZER, ExecutionEnvironment, FenceState, LastReplacement, LifecycleOperation,
    LifecyclePhase, LifecycleType, ObjectIdentity, TerminalPodPhase, TerminationProof, condition,
    pod_name, pvc_name,
};
use crate::metrics::FenceReason;
use crate::telemetry::events::EnvironmentEvent;
use crate::templates::TemplateRevision;

use condition::reason;

/// The environment with its lifecycle operation, as one reconcile saw them.
struct Step<'a> {
    envs: &'a Api<ExecutionEnvironment>,
    ctx: &'a Context,
    env: &'a ExecutionEnvironment,
    op: &'a LifecycleOperation,
    name: String,
}

/// Moves the admitted lifecycle operation on by one step.
pub async fn reconcile_lifecycle(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    revision: Option<&TemplateRevision>,
) -> Result<Next, ReconcileError> {
    let status = env.status.clone().unwrap_or_default();
    let Some(op) = status.lifecycle_operation.as_ref() else {
        return Ok(Next::Wait);
    };
    let step = Step {
        envs,
        ctx,
        env,
        op,
        name: env.metadata.name.clone().unwrap_or_default(),
    };
    if op.id.is_empty()
        || op
            .expected_pvc_uid
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    {
        return Err(step
            .fence("lifecycle operation identity is malformed")
            .await);
    }
    if op.type_ == LifecycleType::DeleteRetiredEnvironment {
        return retained::reconcile_retained_delete(envs, ctx, env, op).await;
    }
    if op.type_ == LifecycleType::ReplaceExecutor && revision.is_none() {
        return Err(step.fence("replacement profile is unavailable").await);
    }
    if !step.identities_match() {
        return Err(step
            .fence("lifecycle operation no longer matches the exact executor and workspace")
            .await);
    }
    step.check_workspace().await?;
    match op.phase {
        LifecyclePhase::Quiescing => step.quiesce().await,
        LifecyclePhase::WaitingForTermination => step.await_termination().await,
        LifecyclePhase::RemovingPodFinalizer => step.remove_finalizer().await,
        LifecyclePhase::WaitingForPodDeletion => step.await_deletion().await,
        LifecyclePhase::CreatingReplacement => match revision {
            Some(revision) => step.finish_replacement(revision).await,
            None => Err(step.fence("replacement profile is unavailable").await),
        },
        LifecyclePhase::DeletingPvc | LifecyclePhase::ReleasingSlot => {
            Err(step.fence("unknown lifecycle phase").await)
        }
    }
}

impl Step<'_> {
    async fn fence(&self, what: &'static str) -> ReconcileError {
        if recovery::is_recovery(self.op) && self.fenced() {
            // An automatic recovery that cannot prove the end gives up and says why; the
            // environment stays fenced, and an administrator's lifecycle is not blocked by it.
            let fenced = ReconcileError::Fenced {
                env: self.name.clone(),
                what,
            };
            let abandoned = guarded(self.envs, self.ctx, self.env, |w| {
                w.status.lifecycle_operation = None;
                w.condition(
                    recovery::reason::RECOVERING,
                    false,
                    recovery::reason::EXECUTOR_IDENTITY_LOST,
                    what,
                );
            })
            .await;
            if abandoned.is_ok() {
                self.ctx.record_event(self.env, recovery::gave_up(what));
            }
            return ReconcileError::join(fenced, abandoned);
        }
        fence_error(self.envs, self.ctx, self.env, FenceReason::Lifecycle, what).await
    }

    fn step_event<'a>(&'a self, phase: LifecyclePhase, pod: &'a str) -> EnvironmentEvent<'a> {
        EnvironmentEvent::LifecycleStep {
            kind: self.op.type_,
            phase,
            automatic: recovery::is_recovery(self.op),
            pod: (pod, self.expected_pod_uid()),
        }
    }

    fn fenced(&self) -> bool {
        self.env.status.as_ref().and_then(|s| s.fence_state) == Some(FenceState::FenceUnknown)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.ctx.client.clone(), &self.ctx.config.namespace)
    }

    fn expected_pod_uid(&self) -> &str {
        self.op.expected_pod_uid.as_deref().unwrap_or_default()
    }

    /// The recorded proof is for exactly this operation's Pod, PVC and epoch.
    fn proof_matches(&self) -> bool {
        let proof = self
            .env
            .status
            .as_ref()
            .and_then(|s| s.termination_proof.as_ref());
        proof.is_some_and(|p| {
            p.operation_id == self.op.id
                && p.pod_uid == self.expected_pod_uid()
                && Some(&p.pvc_uid) == self.op.expected_pvc_uid.as_ref()
                && Some(p.epoch) == self.op.expected_epoch
        })
    }

    fn identities_match(&self) -> bool {
        let status = self.env.status.clone().unwrap_or_default();
        let pod_uid = status
            .pod
            .as_ref()
            .map(|p| p.uid.as_str())
            .unwrap_or_default();
        let pod_ok = if self.op.phase == LifecyclePhase::CreatingReplacement {
            pod_uid.is_empty() && self.proof_matches()
        } else {
            pod_uid == self.expected_pod_uid()
        };
        !self.expected_pod_uid().is_empty()
            && self.op.expected_epoch.is_some_and(|e| e > 0)
            && pod_ok
            && status.pvc.as_ref().map(|p| &p.uid) == self.op.expected_pvc_uid.as_ref()
            && status.epoch == self.op.expected_epoch
    }

    async fn check_workspace(&self) -> Result<(), ReconcileError> {
        let api = Api::<PersistentVolumeClaim>::namespaced(
            self.ctx.client.clone(),
            &self.ctx.config.namespace,
        );
        let pvc = api
            .get_opt(&pvc_name(&self.name))
            .await
            .map_err(ReconcileError::kube(&self.name, "read PVC"))?;
        if pvc.and_then(|p| p.metadata.uid) != self.op.expected_pvc_uid {
            return Err(self
                .fence("authoritative workspace identity is unavailable")
                .await);
        }
        Ok(())
    }

    async fn set_phase(
        &self,
        next: LifecyclePhase,
        mut extra: impl FnMut(&mut super::status::Write<'_>),
    ) -> Result<Next, ReconcileError> {
        guarded(self.envs, self.ctx, self.env, |w| {
            if let Some(op) = w.status.lifecycle_operation.as_mut() {
                op.phase = next;
            }
            extra(w);
        })
        .await?;
        let pod = pod_name(&self.name);
        self.ctx.record_event(self.env, self.step_event(next, &pod));
        Ok(Next::Wait)
    }

    async fn read_pod(&self) -> Result<Option<Pod>, ReconcileError> {
        self.pods()
            .get_opt(&pod_name(&self.name))
            .await
            .map_err(ReconcileError::kube(&self.name, "read Pod"))
    }

    async fn delete_pod(&self, grace: Option<u32>) -> Result<(), ReconcileError> {
        let params = DeleteParams {
            grace_period_seconds: grace,
            preconditions: Some(Preconditions {
                uid: Some(self.expected_pod_uid().to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.pods().delete(&pod_name(&self.name), &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(ReconcileError::kube(&self.name, "delete Pod")(e)),
        }
    }

    fn is_expected(&self, pod: &Pod) -> bool {
        pod.metadata.uid.as_deref() == Some(self.expected_pod_uid())
    }

    async fn quiesce(&self) -> Result<Next, ReconcileError> {
        match self.read_pod().await? {
            Some(pod) if self.is_expected(&pod) => {}
            _ => {
                return Err(self
                    .fence("executor disappeared before durable terminal proof")
                    .await);
            }
        }
        self.delete_pod(Some(30)).await?;
        self.set_phase(LifecyclePhase::WaitingForTermination, |_| {})
            .await
    }

    async fn await_termination(&self) -> Result<Next, ReconcileError> {
        let pod = match self.read_pod().await? {
            None => {
                return Err(self
                    .fence("executor disappeared before durable terminal proof")
                    .await);
            }
            Some(pod) if !self.is_expected(&pod) => {
                return Err(self.fence("executor UID changed during quiescing").await);
            }
            Some(pod) => pod,
        };
        let recovering = recovery::is_recovery(self.op);
        if !pod_terminal(&pod) && recovering {
            return recovery::awaiting_end(self.envs, self.ctx, self.env, &pod).await;
        }
        if !pod_terminal(&pod) {
            guarded(self.envs, self.ctx, self.env, |w| {
                w.ready(
                    false,
                    reason::AWAITING_TERMINAL_EXECUTOR,
                    "waiting for the executor Pod to terminate",
                );
            })
            .await?;
            return Ok(Next::After(WAITING_REQUEUE));
        }
        let phase = match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => TerminalPodPhase::Succeeded,
            _ => TerminalPodPhase::Failed,
        };
        let proof = TerminationProof {
            operation_id: self.op.id.clone(),
            pod_uid: self.expected_pod_uid().to_owned(),
            pvc_uid: self.op.expected_pvc_uid.clone().unwrap_or_default(),
            epoch: self.op.expected_epoch.unwrap_or_default(),
            pod_phase: phase,
            observed_at: crate::kube::crd::RfcTime::from_system_time(self.ctx.runtime.clock.wall()),
        };
        let now = self.ctx.runtime.clock.wall();
        self.set_phase(LifecyclePhase::RemovingPodFinalizer, |w| {
            w.status.termination_proof = Some(proof.clone());
            if recovering && w.status.fence_state == Some(FenceState::FenceUnknown) {
                recovery::clear_fence_on_proof(w, now);
            }
        })
        .await
    }

    async fn remove_finalizer(&self) -> Result<Next, ReconcileError> {
        if !self.proof_matches() {
            return Err(self
                .fence("termination proof does not match the lifecycle operation")
                .await);
        }
        if let Some(mut pod) = self.read_pod().await? {
            if !self.is_expected(&pod) || !pod_terminal(&pod) {
                return Err(self.fence("executor is not the exact terminal Pod").await);
            }
            let finalizers = pod.metadata.finalizers.get_or_insert_with(Vec::new);
            if finalizers.iter().any(|f| f == EXECUTOR_FINALIZER) {
                finalizers.retain(|f| f != EXECUTOR_FINALIZER);
                match self
                    .pods()
                    .replace(&pod_name(&self.name), &PostParams::default(), &pod)
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        return Err(ReconcileError::kube(&self.name, "remove Pod finalizer")(e));
                    }
                }
            }
        }
        self.set_phase(LifecyclePhase::WaitingForPodDeletion, |_| {})
            .await
    }

    async fn await_deletion(&self) -> Result<Next, ReconcileError> {
        if !self.proof_matches() {
            return Err(self
                .fence("termination proof does not match the lifecycle operation")
                .await);
        }
        match self.read_pod().await? {
            Some(pod) if self.is_expected(&pod) => {
                self.delete_pod(None).await?;
                return Ok(Next::After(WAITING_REQUEUE));
            }
            Some(_) => {
                return Err(self
                    .fence("unexpected executor occupies the retained name")
                    .await);
            }
            None => {}
        }
        match self.op.type_ {
            LifecycleType::RetireEnvironment => self.finish_retirement().await,
            _ => {
                self.set_phase(LifecyclePhase::CreatingReplacement, |w| {
                    w.status.pod = None;
                })
                .await
            }
        }
    }

    async fn finish_retirement(&self) -> Result<Next, ReconcileError> {
        guarded(self.envs, self.ctx, self.env, |w| {
            w.status.lifecycle_operation = None;
            w.condition(
                condition::EXECUTOR_TERMINATED,
                true,
                reason::TERMINAL_POD_PROOF,
                "the executor Pod was proven terminal and removed",
            );
            w.condition(
                condition::RETIRED,
                true,
                reason::WORKSPACE_RETAINED,
                "the environment is retired; its workspace is retained",
            );
            w.ready(false, reason::RETAINED, "retired; workspace retained");
        })
        .await?;
        self.ctx.record_event(self.env, EnvironmentEvent::Retired);
        Ok(Next::Wait)
    }

    async fn finish_replacement(
        &self,
        revision: &TemplateRevision,
    ) -> Result<Next, ReconcileError> {
        let pod = ensure_pod(self.envs, self.env, revision.execution(), self.ctx).await?;
        if !pod_ready(&pod) {
            guarded(self.envs, self.ctx, self.env, |w| {
                w.ready(
                    false,
                    reason::REPLACEMENT_STARTING,
                    "waiting for the replacement executor",
                );
            })
            .await?;
            return Ok(Next::PodNotReady);
        }
        let previous_epoch = self.op.expected_epoch.unwrap_or_default();
        let receipt = LastReplacement {
            operation_id: self.op.id.clone(),
            previous_pod_uid: self.expected_pod_uid().to_owned(),
            replacement_pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
            pvc_uid: self.op.expected_pvc_uid.clone().unwrap_or_default(),
            previous_epoch,
            replacement_epoch: previous_epoch + 1,
        };
        let identity = ObjectIdentity {
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        };
        guarded(self.envs, self.ctx, self.env, |w| {
            w.status.epoch = Some(previous_epoch + 1);
            w.status.pod = Some(identity.clone());
            w.status.last_replacement = Some(receipt.clone());
            w.status.lifecycle_operation = None;
            w.ready(
                true,
                reason::REPLACEMENT_READY,
                "the replacement executor is ready",
            );
            if recovery::is_recovery(self.op) {
                w.condition(
                    recovery::reason::RECOVERING,
                    false,
                    recovery::reason::RECOVERED,
                    "a new executor serves the workspace; the previous one's end is recorded",
                );
            }
        })
        .await?;
        let automatic = recovery::is_recovery(self.op);
        let epoch = previous_epoch + 1;
        let replaced = EnvironmentEvent::ExecutorReplaced { epoch, automatic };
        self.ctx.record_event(self.env, replaced);
        Ok(Next::Wait)
    }
}
