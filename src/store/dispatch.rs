//! The claimed and fenced dispatch of file operations and commands: an admission write
//! records the in-flight operation, its response (the server's state right after the write)
//! confirms it before anything is sent, the executor runs it under the operation lease, and
//! a completion write clears it only when the outcome is known.
//! An unknown outcome fences the environment and keeps the operation on record.
//!
//! Cost: uncontended, a call makes one read and two writes in all. The read is the
//! validation's ([`Store::validate_run_claim_under`]), and the admission write starts from it;
//! the confirmation before dispatch checks the admission write's response (the post-write
//! state, with its `resourceVersion`) instead of reading again; the completion write starts
//! from the newest object this dispatch wrote (admission or last renewal). Each lease renewal
//! of a long call adds one write. A refusal decided on a cached object is re-decided on a
//! fresh read ([`cas::update_status_observed`]), so no check is weakened by the saving.

use tracing::Instrument as _;

use super::cas::{self, Decision};
use super::lease::{OperationLease, authority_current, lease_current, op_matches};
use super::policy::{PolicyCheck, SharedPolicyCheck, unchecked};
use super::predicates::{
    active, claim_current, creator_matches, env_ref, healthy, published, ready, schema_current,
    template_retained,
};
use super::validate::ValidatedClaim;
use super::{Caller, ClaimContext, OPERATION_TTL, Store, StoreError};
use crate::errors::ErrorCode;
use crate::executor::protocol::{ExecutorRequest, ExecutorResponse, Operation};
use crate::executor::transport::{ExecutorTarget, TransportError};
use crate::kube::crd::{ActiveOperation, ExecutionEnvironment, FenceState, RfcTime};
use crate::metrics::FenceReason;
use crate::telemetry::events::EnvironmentEvent;
use crate::telemetry::traces::executor::operation_word;
use crate::telemetry::traces::record_store_outcome;

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
    /// Runs one helper request under the caller's current run claim, without a prior
    /// validation and without a security layer (the admission write makes every check).
    pub async fn execute(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        request: ExecutorRequest,
    ) -> Result<ExecutorResponse, StoreError> {
        self.dispatch(caller, rc, None, unchecked(), request).await
    }

    /// Runs one helper request under a claim [`Store::validate_run_claim_under`] just found
    /// current: the admission starts from that observation, and the caller's policy check is
    /// asked again before dispatch, at every lease renewal and at completion (§8.2).
    pub async fn execute_validated(
        &self,
        claim: ValidatedClaim,
        request: ExecutorRequest,
    ) -> Result<ExecutorResponse, StoreError> {
        let ValidatedClaim {
            caller,
            rc,
            observed,
            policy,
        } = claim;
        self.dispatch(&caller, &rc, Some(observed), policy, request)
            .await
    }

    /// [`Store::admit_and_dispatch`]; inside a traced call, the span `store.dispatch`.
    async fn dispatch(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        known: Option<ExecutionEnvironment>,
        policy: SharedPolicyCheck,
        request: ExecutorRequest,
    ) -> Result<ExecutorResponse, StoreError> {
        let span = crate::child_span!(
            "store.dispatch",
            environment = %rc.env.id,
            executor.operation = operation_word(&request.operation),
            store.outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty
        );
        let result = self
            .admit_and_dispatch(caller, rc, known, policy, request)
            .instrument(span.clone())
            .await;
        record_store_outcome(&span, &result);
        result
    }

    /// Admission, confirmation, then the dispatch and its completion write in their own
    /// task (in the caller's span): a caller that goes away (cancelled RPC) neither abandons
    /// the helper call nor skips the completion write.
    async fn admit_and_dispatch(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        known: Option<ExecutionEnvironment>,
        policy: SharedPolicyCheck,
        mut request: ExecutorRequest,
    ) -> Result<ExecutorResponse, StoreError> {
        let env = rc.env.id.clone();
        let operation_id = self.runtime.ids.hex(16);
        let admission = self
            .admit(caller, rc, known, &mut request, &operation_id)
            .await;
        let ((pod_name, bounds), written) = match admission {
            Ok(admitted) => admitted,
            Err(error @ StoreError::Kube { .. }) => {
                // The write may have landed without its answer (DECISIONS 11: fence at once).
                self.fence(&env, &operation_id).await;
                return Err(error);
            }
            Err(error) => return Err(error),
        };
        let confirmed =
            self.confirm_before_dispatch(caller, rc, &operation_id, written, policy.as_ref());
        let confirmed = match confirmed {
            Ok(object) => object,
            Err(error) => {
                self.fence(&env, &operation_id).await;
                return Err(error);
            }
        };
        let store = self.clone();
        let rc = rc.clone();
        let admitted = Admitted {
            operation_id,
            pod_name,
            bounds,
            latest: confirmed,
            policy,
        };
        tokio::spawn(
            async move { store.dispatch_admitted(&rc, request, admitted).await }.in_current_span(),
        )
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
        let lease = OperationLease {
            rc,
            operation_id: &operation_id,
            policy: admitted.policy.as_ref(),
            latest: std::sync::Mutex::new(admitted.latest),
        };
        let (result, lease_lost) = self.dispatch_under_lease(&target, request, &lease).await;
        let outcome = if lease_lost {
            Outcome::Unknown
        } else {
            bounded(classify(&operation, result), admitted.bounds)
        };
        self.complete(&lease, &outcome).await?;
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

    /// The admission write: every gate in order, then `activeOperation`. Returns the Pod.
    async fn admit(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        known: Option<ExecutionEnvironment>,
        request: &mut ExecutorRequest,
        operation_id: &str,
    ) -> Result<((String, Bounds), ExecutionEnvironment), StoreError> {
        let env = &rc.env.id;
        let now = self.now();
        let holder = self.holder_id.clone();
        cas::update_status_observed(&self.api, env, known, |o| {
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

    /// Confirms after admission, on the admission write's response (the server's state
    /// right after the write): the operation must still be ours, its lease and the claim
    /// current, and the caller's policy still in force. If not, the caller fences at once
    /// (DECISIONS 11) and nothing is dispatched.
    fn confirm_before_dispatch(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        operation_id: &str,
        written: ExecutionEnvironment,
        policy: &dyn PolicyCheck,
    ) -> Result<ExecutionEnvironment, StoreError> {
        let now = self.now();
        let confirmed = creator_matches(&written, caller)
            && lease_current(&written, rc, operation_id, &self.holder_id, now)
            && authority_current(&written, rc, &self.templates, now)
            && policy.current(&written.spec.template_id);
        if confirmed {
            Ok(written)
        } else {
            Err(StoreError::fence(
                &rc.env.id,
                "identity changed before dispatch",
            ))
        }
    }

    fn operation_is_ours(&self, o: &ExecutionEnvironment, operation_id: &str) -> bool {
        o.status
            .as_ref()
            .and_then(|s| s.active_operation.as_ref())
            .is_some_and(|op| op.id == operation_id && op.holder_id == self.holder_id)
    }

    /// The completion write, from the newest object this dispatch wrote: clear the operation
    /// when its outcome is known and the lease, the claim and the caller's policy are still
    /// current; otherwise fence and keep it on record.
    async fn complete(
        &self,
        lease: &OperationLease<'_>,
        outcome: &Outcome,
    ) -> Result<(), StoreError> {
        let (rc, operation_id) = (lease.rc, lease.operation_id);
        let env = &rc.env.id;
        let terminal = !matches!(outcome, Outcome::Unknown);
        let now = self.now();
        let authority_kept = cas::update_status_from(&self.api, env, Some(lease.latest()), |o| {
            if !op_matches(o, rc, operation_id, &self.holder_id) {
                return Err(StoreError::fence(env, "could not persist terminal state"));
            }
            let current = lease_current(o, rc, operation_id, &self.holder_id, now)
                && authority_current(o, rc, &self.templates, now)
                && lease.policy.current(&o.spec.template_id);
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
        let mut uid = None;
        let result = cas::update_status(&self.api, env, |o| {
            if !self.operation_is_ours(o, operation_id) {
                return Ok(Decision::Keep(false));
            }
            uid.clone_from(&o.metadata.uid);
            let status = o.status.get_or_insert_with(Default::default);
            let fresh = status.fence_state != Some(FenceState::FenceUnknown);
            status.fence_state = Some(FenceState::FenceUnknown);
            Ok(Decision::Write(fresh))
        })
        .await;
        match result {
            Ok(true) => {
                self.metrics.fence(FenceReason::OutcomeUnknown);
                let fenced = EnvironmentEvent::Fenced(FenceReason::OutcomeUnknown);
                self.events.record_named(env, uid, fenced);
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(env, %error, "could not record the fence"),
        }
    }
}

/// What admission established for the dispatch.
struct Admitted {
    operation_id: String,
    pod_name: String,
    bounds: Bounds,
    /// The confirmed post-admission object: renewals and the completion start from it.
    latest: ExecutionEnvironment,
    /// The caller's policy check, asked at every renewal and at completion.
    policy: SharedPolicyCheck,
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
