//! The operation lease (store §8): `status.activeOperation` is the durable mutual exclusion of
//! one executor dispatch, held by one store instance (`holderID`, fresh per replica process)
//! under one run claim, until `expiresAt`. The holder renews it every `OPERATION_TTL / 3`
//! while the executor runs; a renewal that fails (authority lost, lease taken, persistence
//! error, or the caller's client policy withdrawn: §8.2 `policyCurrent`, asked through the
//! dispatch's [`PolicyCheck`]) cancels the executor call, and the dispatch then fences the
//! environment.
//!
//! Start-up never touches operation ownership: nothing here runs except inside a dispatch.

use std::sync::Mutex;
use std::time::SystemTime;

use super::cas::{self, Decision};
use super::policy::{NoPolicyCheck, PolicyCheck};
use super::predicates::{claim_current, healthy, schema_current, template_retained};
use super::{ClaimContext, OPERATION_TTL, Store, StoreError};
use crate::executor::protocol::{ExecutorEnvelope, ExecutorRequest};
use crate::executor::transport::{CancelHandle, ExecutorTarget, TransportError};
use crate::kube::crd::{ExecutionEnvironment, RfcTime};
use crate::metrics::lifecycle::OutcomeLabels;
use crate::templates::TemplateRegistry;

/// How often the holder renews: a third of the lease.
pub const RENEW_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

const _: () = assert!(RENEW_PERIOD.as_secs() * 3 == OPERATION_TTL.as_secs());

/// The in-flight operation is exactly ours: same id, holder, claim, run and epoch.
pub fn op_matches(o: &ExecutionEnvironment, rc: &ClaimContext, op_id: &str, holder: &str) -> bool {
    o.status
        .as_ref()
        .and_then(|s| s.active_operation.as_ref())
        .is_some_and(|op| {
            op.id == op_id
                && op.holder_id == holder
                && op.claim_id == rc.claim_id
                && op.run_id == rc.run_id
                && op.epoch == rc.epoch
        })
}

/// Our lease is current: it is ours, the environment is healthy and it has not expired.
pub fn lease_current(
    o: &ExecutionEnvironment,
    rc: &ClaimContext,
    op_id: &str,
    holder: &str,
    now: SystemTime,
) -> bool {
    op_matches(o, rc, op_id, holder)
        && healthy(o)
        && o.status
            .as_ref()
            .and_then(|s| s.active_operation.as_ref())
            .is_some_and(|op| now < op.expires_at.to_system_time())
}

/// The authority the operation was admitted under still holds: schema current, template
/// retained, and the exact claim current at the operation's epoch and generation.
pub fn authority_current(
    o: &ExecutionEnvironment,
    rc: &ClaimContext,
    templates: &TemplateRegistry,
    now: SystemTime,
) -> bool {
    let run_epoch = o
        .status
        .as_ref()
        .and_then(|s| s.active_run.as_ref())
        .map(|r| r.epoch);
    schema_current(o)
        && template_retained(o, templates)
        && claim_current(o, rc, now)
        && run_epoch == Some(rc.epoch)
}

/// One dispatch's hold on its lease: whose operation, under which claim and policy, and the
/// newest object this dispatch wrote (each renewal and the completion start from it, so an
/// uncontended renewal costs one write and no read).
pub(super) struct OperationLease<'a> {
    pub rc: &'a ClaimContext,
    pub operation_id: &'a str,
    pub policy: &'a dyn PolicyCheck,
    pub latest: Mutex<ExecutionEnvironment>,
}

impl OperationLease<'_> {
    /// The newest object this dispatch wrote.
    pub fn latest(&self) -> ExecutionEnvironment {
        self.latest.lock().expect("lease object lock").clone()
    }

    fn record(&self, written: ExecutionEnvironment) {
        *self.latest.lock().expect("lease object lock") = written;
    }
}

impl Store {
    /// One renewal by this store (as holder) without a security layer: requires the lease
    /// and the authority to be current, then extends the lease to `now + OPERATION_TTL`.
    pub async fn renew_operation_lease(
        &self,
        rc: &ClaimContext,
        op_id: &str,
    ) -> Result<(), StoreError> {
        self.renew_from(rc, op_id, &NoPolicyCheck, None)
            .await
            .map(drop)
    }

    /// One renewal starting from `known` (when given): lease, authority and the caller's
    /// policy must all be current (§8.3). Returns the written object.
    async fn renew_from(
        &self,
        rc: &ClaimContext,
        op_id: &str,
        policy: &dyn PolicyCheck,
        known: Option<ExecutionEnvironment>,
    ) -> Result<ExecutionEnvironment, StoreError> {
        let env = &rc.env.id;
        let now = self.now();
        let renewed = cas::update_status_observed(&self.api, env, known, |o| {
            if !lease_current(o, rc, op_id, &self.holder_id, now)
                || !authority_current(o, rc, &self.templates, now)
                || !policy.current(&o.spec.template_id)
            {
                return Err(StoreError::fence(env, "lease renewal failed"));
            }
            let status = o.status.get_or_insert_with(Default::default);
            if let Some(op) = status.active_operation.as_mut() {
                op.renewed_at = RfcTime::from_system_time(now);
                op.expires_at = RfcTime::from_system_time(now + OPERATION_TTL);
            }
            Ok(Decision::Write(()))
        })
        .await;
        let outcome = OutcomeLabels::of(renewed.as_ref().err().map(StoreError::code));
        self.metrics.renewal(outcome);
        let ((), written) = renewed?;
        Ok(written)
    }

    /// Renews every [`RENEW_PERIOD`] until a renewal fails, and returns that failure. The
    /// dispatch drops this future when the executor call finishes first.
    async fn renew_until_lost(&self, lease: &OperationLease<'_>) -> StoreError {
        loop {
            tokio::time::sleep(RENEW_PERIOD).await;
            let renewal = self
                .renew_from(
                    lease.rc,
                    lease.operation_id,
                    lease.policy,
                    Some(lease.latest()),
                )
                .await;
            match renewal {
                Ok(written) => lease.record(written),
                Err(error) => {
                    tracing::warn!(env = %lease.rc.env.id, %error, "operation lease lost; cancelling");
                    return error;
                }
            }
        }
    }

    /// Runs the executor call while renewing the operation lease. When a renewal fails the
    /// call is asked to stop (its cancel signal fires) and is still awaited to its end, so
    /// the lease stays on record while the helper may be live. Returns the executor result
    /// and whether the lease was lost.
    pub(super) async fn dispatch_under_lease(
        &self,
        target: &ExecutorTarget,
        request: ExecutorRequest,
        lease: &OperationLease<'_>,
    ) -> (Result<ExecutorEnvelope, TransportError>, bool) {
        let (handle, signal) = CancelHandle::new();
        let call = self
            .executor
            .execute_operation(target, lease.operation_id, request, signal);
        tokio::pin!(call);
        let renewal = self.renew_until_lost(lease);
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
}
