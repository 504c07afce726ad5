//! The claimed and fenced dispatch of file operations and commands: an admission write
//! records the in-flight operation, a re-read confirms it before anything is sent, the
//! executor runs it, and a completion write clears it only when the outcome is known.
//! An unknown outcome fences the environment and keeps the operation on record.

use super::cas::{self, Decision};
use super::lease::{authority_current, lease_current, op_matches};
use super::predicates::{
    active, claim_current, creator_matches, env_ref, healthy, published, ready, schema_current,
    template_retained,
};
use super::{Caller, ClaimContext, OPERATION_TTL, Store, StoreError};
use crate::errors::ErrorCode;
use crate::executor::protocol::ExecutorEnvelope;
use crate::executor::protocol::{ExecutorRequest, ExecutorResponse, Operation};
use crate::executor::transport::{CancelHandle, ExecutorTarget, TransportError};
use crate::kube::crd::{ActiveOperation, ExecutionEnvironment, FenceState, RfcTime};

/// How an executor call ended, before the completion write.
enum Outcome {
    /// A response whose effect is fully known.
    Done(Box<ExecutorResponse>),
    /// A typed refusal from the helper: nothing uncertain happened.
    Refused(ErrorCode),
    /// The outcome is unknown (transport failure, or a command without a terminal receipt).
    Unknown,
}

impl Store {
    /// Runs one helper request under the caller's current run claim. Once admitted, the
    /// dispatch and its completion write run in their own task: a caller that goes away
    /// (cancelled RPC) neither abandons the helper call nor skips the completion write.
    pub async fn execute(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        mut request: ExecutorRequest,
    ) -> Result<ExecutorResponse, StoreError> {
        let env = rc.env.id.clone();
        let operation_id = self.runtime.ids.hex(16);
        let (pod_name, bounds) = self.admit(caller, rc, &mut request, &operation_id).await?;
        let confirmed = self
            .confirm_before_dispatch(caller, rc, &operation_id)
            .await?;
        let store = self.clone();
        let rc = rc.clone();
        let admitted = Admitted {
            operation_id,
            pod_name,
            bounds,
            confirmed,
        };
        tokio::spawn(async move { store.dispatch_admitted(&rc, request, admitted).await })
            .await
            .unwrap_or_else(|_| Err(StoreError::fence(&env, "dispatch task failed")))
    }

    /// Dispatches an admitted, confirmed operation and writes its completion.
    async fn dispatch_admitted(
        &self,
        rc: &ClaimContext,
        request: ExecutorRequest,
        admitted: Admitted,
    ) -> Result<ExecutorResponse, StoreError> {
        let env = rc.env.id.clone();
        let operation_id = admitted.operation_id;
        let target = ExecutorTarget {
            namespace: self.namespace.clone(),
            pod_name: admitted.pod_name,
            environment: env.clone(),
        };
        let operation = request.operation.clone();
        let (result, lease_lost) = self
            .dispatch_under_lease(&target, request, rc, &operation_id)
            .await;
        let outcome = if lease_lost {
            Outcome::Unknown
        } else {
            bounded(classify(&operation, result), admitted.bounds)
        };
        self.complete(rc, &operation_id, &outcome, admitted.confirmed)
            .await?;
        match outcome {
            Outcome::Done(response) => Ok(*response),
            Outcome::Refused(code) => Err(StoreError::Executor { env, code }),
            Outcome::Unknown if lease_lost => Err(StoreError::fence(&env, "lease renewal failed")),
            Outcome::Unknown => Err(StoreError::fence(
                &env,
                "termination unconfirmed; environment fenced",
            )),
        }
    }

    /// Runs the executor call while renewing the operation lease. When a renewal fails the
    /// call is asked to stop (its cancel signal fires) and is still awaited to its end, so
    /// the lease stays on record while the helper may be live. Returns the executor result
    /// and whether the lease was lost.
    async fn dispatch_under_lease(
        &self,
        target: &ExecutorTarget,
        request: ExecutorRequest,
        rc: &ClaimContext,
        operation_id: &str,
    ) -> (Result<ExecutorEnvelope, TransportError>, bool) {
        let (handle, signal) = CancelHandle::new();
        let call = self.executor.execute(target, request, signal);
        tokio::pin!(call);
        let renewal = self.renew_until_lost(rc, operation_id);
        tokio::pin!(renewal);
        let mut lost = false;
        loop {
            tokio::select! {
                result = &mut call => return (result, lost),
                _ = &mut renewal, if !lost => {
                    lost = true;
                    handle.cancel();
                }
            }
        }
    }

    /// The admission write: every gate in order, then `activeOperation`. Returns the Pod.
    async fn admit(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        request: &mut ExecutorRequest,
        operation_id: &str,
    ) -> Result<(String, Bounds), StoreError> {
        let env = &rc.env.id;
        let now = self.now();
        let holder = self.holder_id.clone();
        cas::update_status(&self.api, env, |o| {
            if !creator_matches(o, caller) {
                return Err(StoreError::not_found(env, "creator or owner differs"));
            }
            if !schema_current(o) {
                return Err(StoreError::not_ready(env, "incompatible schema"));
            }
            let status = o.status.clone().unwrap_or_default();
            if !template_retained(o, &self.templates) || status.lifecycle_operation.is_some() {
                return Err(StoreError::not_ready(
                    env,
                    "template revoked or lifecycle in progress",
                ));
            }
            let bounds = self.apply_template_bounds(o, request)?;
            if !published(o, &rc.binding_id) {
                return Err(StoreError::not_found(env, "published reference not found"));
            }
            // The simulator's canary build removes exactly this check; the simulator must
            // then find a seed where a stale claim's operation is admitted.
            if cfg!(not(feature = "sim-canary")) && !claim_current(o, rc, now) {
                return Err(StoreError::conflict(env, "run claim is not current"));
            }
            if env_ref(o) != rc.env || !active(o) || !ready(o) || !healthy(o) {
                return Err(StoreError::not_ready(env, "not ready at requested epoch"));
            }
            if status.active_operation.is_some() {
                return Err(StoreError::Conflict {
                    env: env.clone(),
                    reason: "environment already has an active operation",
                    retryable: true,
                });
            }
            let pod = status.pod.map(|p| p.name).unwrap_or_default();
            if pod.is_empty() {
                return Err(StoreError::NotReady {
                    env: env.clone(),
                    reason: "executor pod not recorded",
                    retryable: true,
                });
            }
            o.status
                .get_or_insert_with(Default::default)
                .active_operation = Some(ActiveOperation {
                id: operation_id.to_owned(),
                operation: request.operation.as_str().to_owned(),
                started_at: RfcTime::from_system_time(now),
                claim_id: rc.claim_id.clone(),
                run_id: rc.run_id.clone(),
                epoch: rc.epoch,
                holder_id: holder.clone(),
                renewed_at: RfcTime::from_system_time(now),
                expires_at: RfcTime::from_system_time(now + OPERATION_TTL),
            });
            Ok(Decision::Write((pod, bounds)))
        })
        .await
    }

    /// Template bounds: payload sizes and the command timeout (0 means the template maximum).
    fn apply_template_bounds(
        &self,
        o: &ExecutionEnvironment,
        request: &mut ExecutorRequest,
    ) -> Result<Bounds, StoreError> {
        let env = o.metadata.name.as_deref().unwrap_or_default();
        let revision = self
            .templates
            .retained_revision(&o.spec.template_id, &o.spec.template_revision)
            .map_err(|_| StoreError::not_ready(env, "template definition unavailable"))?;
        let spec = revision.execution();
        let too_large = |reason| StoreError::ResourceExhausted {
            env: env.to_owned(),
            reason,
        };
        if request.data.len() as u64 > spec.max_file_bytes() {
            return Err(too_large("file data exceeds the template bound"));
        }
        if request.command.len() as u64 > spec.max_command_bytes() {
            return Err(too_large("command exceeds the template bound"));
        }
        if request.operation == Operation::CommandStart {
            let max_ms = i64::try_from(spec.max_command_duration_millis()).unwrap_or(i64::MAX);
            // DECISIONS 12: `limit` carries the output cap of command.start (see protocol.rs).
            request.limit = i64::try_from(spec.max_command_bytes()).unwrap_or(i64::MAX);
            if request.timeout_ms <= 0 {
                request.timeout_ms = max_ms;
            } else if request.timeout_ms > max_ms {
                return Err(StoreError::InvalidArgument(
                    "command timeout exceeds the template bound",
                ));
            }
        }
        Ok(Bounds {
            max_file_bytes: spec.max_file_bytes(),
            max_command_bytes: spec.max_command_bytes(),
        })
    }

    /// Re-reads after admission: the operation must still be ours and the claim current. If
    /// not, the environment is fenced at once (DECISIONS 11) and nothing is dispatched.
    async fn confirm_before_dispatch(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        operation_id: &str,
    ) -> Result<ExecutionEnvironment, StoreError> {
        let env = &rc.env.id;
        if let Ok(Some(o)) = cas::get(&self.api, env).await {
            let now = self.now();
            if creator_matches(&o, caller)
                && lease_current(&o, rc, operation_id, &self.holder_id, now)
                && authority_current(&o, rc, &self.templates, now)
            {
                return Ok(o);
            }
        }
        self.fence(env, operation_id).await;
        Err(StoreError::fence(env, "identity changed before dispatch"))
    }

    fn operation_is_ours(&self, o: &ExecutionEnvironment, operation_id: &str) -> bool {
        o.status
            .as_ref()
            .and_then(|s| s.active_operation.as_ref())
            .is_some_and(|op| op.id == operation_id && op.holder_id == self.holder_id)
    }

    /// The completion write: clear the operation when its outcome is known and the claim is
    /// still current; otherwise fence and keep it on record.
    async fn complete(
        &self,
        rc: &ClaimContext,
        operation_id: &str,
        outcome: &Outcome,
        confirmed: ExecutionEnvironment,
    ) -> Result<(), StoreError> {
        let env = &rc.env.id;
        let terminal = !matches!(outcome, Outcome::Unknown);
        let now = self.now();
        let authority_kept = cas::update_status_from(&self.api, env, Some(confirmed), |o| {
            if !op_matches(o, rc, operation_id, &self.holder_id) {
                return Err(StoreError::fence(env, "could not persist terminal state"));
            }
            let current = lease_current(o, rc, operation_id, &self.holder_id, now)
                && authority_current(o, rc, &self.templates, now);
            let status = o.status.get_or_insert_with(Default::default);
            if terminal && current {
                status.active_operation = None;
            } else {
                status.fence_state = Some(FenceState::FenceUnknown);
            }
            Ok(Decision::Write(current))
        })
        .await
        .map_err(|_| StoreError::fence(env, "could not persist terminal state"))?;
        if terminal && !authority_kept {
            return Err(StoreError::fence(
                env,
                "operation authority changed before completion",
            ));
        }
        Ok(())
    }

    /// Marks the environment FenceUnknown, best effort (the reconciler fences an abandoned
    /// operation when its lease expires).
    async fn fence(&self, env: &str, operation_id: &str) {
        let result = cas::update_status(&self.api, env, |o| {
            if !self.operation_is_ours(o, operation_id) {
                return Ok(Decision::Keep(()));
            }
            o.status.get_or_insert_with(Default::default).fence_state =
                Some(FenceState::FenceUnknown);
            Ok(Decision::Write(()))
        })
        .await;
        if let Err(error) = result {
            tracing::warn!(env, %error, "could not record the fence");
        }
    }
}

/// What admission established for the dispatch.
struct Admitted {
    operation_id: String,
    pod_name: String,
    bounds: Bounds,
    confirmed: ExecutionEnvironment,
}

/// The template's bounds on what an executor may answer.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    max_file_bytes: u64,
    max_command_bytes: u64,
}

/// Applies the template bounds to a known outcome: file data beyond `maxFileBytes` is a
/// controlled `resource_exhausted` (the result is discarded, nothing is fenced); command output
/// beyond `maxCommandBytes` is cut at the bound and marked truncated (DECISIONS 12).
fn bounded(outcome: Outcome, bounds: Bounds) -> Outcome {
    let Outcome::Done(mut response) = outcome else {
        return outcome;
    };
    if response.data.len() as u64 > bounds.max_file_bytes {
        return Outcome::Refused(ErrorCode::ResourceExhausted);
    }
    if let Some(command) = response.command.as_mut() {
        let limit = usize::try_from(bounds.max_command_bytes).unwrap_or(usize::MAX);
        if command.stdout.len() + command.stderr.len() > limit {
            command.stdout.truncate(limit);
            command.stderr.truncate(limit - command.stdout.len());
            command.truncated = true;
        }
    }
    Outcome::Done(response)
}

/// Sorts an executor result into known, refused and unknown outcomes.
fn classify(
    operation: &Operation,
    result: Result<crate::executor::protocol::ExecutorEnvelope, TransportError>,
) -> Outcome {
    let envelope = match result {
        Ok(envelope) => envelope,
        Err(TransportError::RequestTooLarge { .. }) => {
            return Outcome::Refused(ErrorCode::ResourceExhausted);
        }
        Err(_) => return Outcome::Unknown,
    };
    match envelope.into_outcome() {
        Some(Ok(response)) => {
            let receipt_missing = *operation == Operation::CommandStart
                && response
                    .command
                    .as_ref()
                    .is_none_or(|c| c.terminal_receipt.is_empty());
            if receipt_missing {
                Outcome::Unknown
            } else {
                Outcome::Done(Box::new(response))
            }
        }
        Some(Err(error)) => match ErrorCode::parse(error.code.as_str()) {
            Some(ErrorCode::FenceUnknown) | None => Outcome::Unknown,
            Some(code) => Outcome::Refused(code),
        },
        None => Outcome::Unknown,
    }
}
