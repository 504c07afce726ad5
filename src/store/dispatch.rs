//! The claimed and fenced dispatch of file operations and commands: an admission write
//! records the in-flight operation, a re-read confirms it before anything is sent, the
//! executor runs it, and a completion write clears it only when the outcome is known.
//! An unknown outcome fences the environment and keeps the operation on record.

use super::cas::{self, Decision};
use super::predicates::{
    active, claim_current, creator_matches, env_ref, healthy, published, ready, schema_current,
    template_retained,
};
use super::{Caller, ClaimContext, OPERATION_TTL, Store, StoreError};
use crate::errors::ErrorCode;
use crate::executor::protocol::{ExecutorRequest, ExecutorResponse, Operation};
use crate::executor::transport::{CancelSignal, ExecutorTarget, TransportError};
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
    /// Runs one helper request under the caller's current run claim.
    pub async fn execute(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        mut request: ExecutorRequest,
    ) -> Result<ExecutorResponse, StoreError> {
        let env = rc.env.id.clone();
        let operation_id = self.runtime.ids.hex(16);
        let pod_name = self.admit(caller, rc, &mut request, &operation_id).await?;
        self.confirm_before_dispatch(caller, rc, &operation_id)
            .await?;
        let target = ExecutorTarget {
            namespace: self.namespace.clone(),
            pod_name,
            environment: env.clone(),
        };
        let operation = request.operation.clone();
        let outcome = classify(
            &operation,
            self.executor
                .execute(&target, request, CancelSignal::never())
                .await,
        );
        self.complete(rc, &operation_id, &outcome).await?;
        match outcome {
            Outcome::Done(response) => Ok(*response),
            Outcome::Refused(code) => Err(StoreError::Executor { env, code }),
            Outcome::Unknown => Err(StoreError::fence(
                &env,
                "termination unconfirmed; environment fenced",
            )),
        }
    }

    /// The admission write: every gate in order, then `activeOperation`. Returns the Pod.
    async fn admit(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        request: &mut ExecutorRequest,
        operation_id: &str,
    ) -> Result<String, StoreError> {
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
            self.apply_template_bounds(o, request)?;
            if !published(o, &rc.binding_id) {
                return Err(StoreError::not_found(env, "published reference not found"));
            }
            if !claim_current(o, rc, now) {
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
            Ok(Decision::Write(pod))
        })
        .await
    }

    /// Template bounds: payload sizes and the command timeout (0 means the template maximum).
    fn apply_template_bounds(
        &self,
        o: &ExecutionEnvironment,
        request: &mut ExecutorRequest,
    ) -> Result<(), StoreError> {
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
            if request.timeout_ms <= 0 {
                request.timeout_ms = max_ms;
            } else if request.timeout_ms > max_ms {
                return Err(StoreError::InvalidArgument(
                    "command timeout exceeds the template bound",
                ));
            }
        }
        Ok(())
    }

    /// Re-reads after admission: the operation must still be ours and the claim current. If
    /// not, the environment is fenced at once (DECISIONS 11) and nothing is dispatched.
    async fn confirm_before_dispatch(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        operation_id: &str,
    ) -> Result<(), StoreError> {
        let env = &rc.env.id;
        let current = match cas::get(&self.api, env).await {
            Ok(Some(o)) => {
                creator_matches(&o, caller)
                    && claim_current(&o, rc, self.now())
                    && self.operation_is_ours(&o, operation_id)
            }
            _ => false,
        };
        if current {
            return Ok(());
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
    ) -> Result<(), StoreError> {
        let env = &rc.env.id;
        let terminal = !matches!(outcome, Outcome::Unknown);
        let now = self.now();
        let authority_kept = cas::update_status(&self.api, env, |o| {
            if !self.operation_is_ours(o, operation_id) {
                return Err(StoreError::fence(env, "could not persist terminal state"));
            }
            let current = claim_current(o, rc, now) && schema_current(o);
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
