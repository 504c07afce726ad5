//! Conversions between wire messages and store/executor types. Strings come from decoded
//! JSON and so are valid UTF-8; integers are clamped to their wire width.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::api::pb;
use crate::executor::protocol::{self as helper, ExecutorRequest, Operation};
use crate::kube::crd::{
    ActiveOperation, ConditionStatus, EnvironmentCondition, FenceState, LifecyclePhase,
    ObjectIdentity,
};
use crate::store::describe::Description;
use crate::store::{Allocation, EnvRef, RunClaim};

/// The helper operation of a wire file operation (`None` for UNSPECIFIED or unknown values).
pub fn file_operation(value: i32) -> Option<Operation> {
    use pb::FileOperation as F;
    Some(match F::try_from(value).ok()? {
        F::Unspecified => return None,
        F::Read => Operation::FileRead,
        F::ResolveAuthority => Operation::FileResolveAuthority,
        F::Stat => Operation::FileStat,
        F::Create => Operation::FileCreate,
        F::Replace => Operation::FileReplace,
        F::List => Operation::FileList,
        F::Remove => Operation::FileRemove,
        F::Rename => Operation::FileRename,
        F::Copy => Operation::FileCopy,
        F::Glob => Operation::FileGlob,
        F::Grep => Operation::FileGrep,
    })
}

/// The helper request of a validated wire file request.
pub fn file_request(operation: Operation, req: &pb::FileRequest) -> ExecutorRequest {
    ExecutorRequest {
        path: req.path.clone(),
        destination: req.destination.clone(),
        pattern: req.pattern.clone(),
        data: req.data.clone(),
        version: String::from_utf8_lossy(&req.version).into_owned(),
        limit: i64::from(req.limit),
        ..ExecutorRequest::new(operation)
    }
}

/// A wire timestamp.
pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(since.subsec_nanos()).unwrap_or(0),
    }
}

fn rfc3339(text: &str) -> Option<prost_types::Timestamp> {
    let ts: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(prost_types::Timestamp {
        seconds: ts.as_second(),
        nanos: ts.subsec_nanosecond(),
    })
}

fn clamp_i32(v: i64) -> i32 {
    i32::try_from(v).unwrap_or(if v < 0 { i32::MIN } else { i32::MAX })
}

/// The wire environment reference.
pub fn env_ref(env: &EnvRef) -> pb::EnvironmentRef {
    pb::EnvironmentRef {
        id: env.id.clone(),
        revision: env.revision.clone(),
    }
}

/// The wire allocation.
pub fn allocation(a: &Allocation) -> pb::EnsureEnvironmentResponse {
    pb::EnsureEnvironmentResponse {
        environment: Some(env_ref(&a.env)),
        epoch: a.epoch,
        ready: a.ready,
        grant_generation: a.grant_generation,
    }
}

/// The wire run claim.
pub fn run_claim(c: &RunClaim, grant: String) -> pb::RunClaimResponse {
    pb::RunClaimResponse {
        environment: Some(env_ref(&c.env)),
        binding_id: c.binding_id.clone(),
        run_id: c.run_id.clone(),
        claim_id: c.claim_id.clone(),
        epoch: c.epoch,
        grant_generation: c.grant_generation,
        grant,
        expires_at: Some(timestamp(c.expires_at)),
    }
}

fn file_info(info: &helper::FileInfo) -> pb::FileInfo {
    pb::FileInfo {
        name: info.name.clone(),
        size: info.size,
        mode: info.mode,
        mod_time: rfc3339(&info.mod_time),
        is_dir: info.is_dir,
    }
}

/// The wire file response.
pub fn file_response(r: &helper::ExecutorResponse) -> pb::FileResponse {
    pb::FileResponse {
        data: r.data.clone(),
        version: r.version.as_bytes().to_vec(),
        info: r.info.as_ref().map(file_info),
        entries: r.entries.iter().map(file_info).collect(),
        paths: r.paths.clone(),
        matches: r
            .matches
            .iter()
            .map(|m| pb::GrepMatch {
                path: m.path.clone(),
                line: clamp_i32(m.line),
                text: m.text.clone(),
            })
            .collect(),
        authority_target: r.authority_target.clone(),
        authority_workspace: r.authority_workspace.clone(),
    }
}

/// The wire command state.
pub fn command_state(state: helper::CommandState) -> pb::CommandState {
    match state {
        helper::CommandState::Running => pb::CommandState::Running,
        helper::CommandState::Succeeded => pb::CommandState::Succeeded,
        helper::CommandState::Failed => pb::CommandState::Failed,
        helper::CommandState::Cancelled => pb::CommandState::Cancelled,
        helper::CommandState::FenceUnknown => pb::CommandState::FenceUnknown,
    }
}

/// The wire command result.
pub fn command_status(c: &helper::CommandStatus) -> pb::CommandStatusResponse {
    pb::CommandStatusResponse {
        command_id: c.command_id.clone(),
        state: command_state(c.state) as i32,
        exit_code: c.exit_code,
        stdout: c.stdout.clone(),
        stderr: c.stderr.clone(),
        next_offset: c.next_offset,
        truncated: c.truncated,
        terminal_receipt: c.terminal_receipt.clone(),
        ..Default::default()
    }
}

/// The wire description of an environment.
pub fn description(d: &Description) -> pb::DescribeEnvironmentResponse {
    let identity = |o: &ObjectIdentity| pb::ObjectIdentity {
        name: o.name.clone(),
        uid: o.uid.clone(),
    };
    let (reason, message) = d.not_ready.clone().unwrap_or_default();
    pb::DescribeEnvironmentResponse {
        environment: Some(env_ref(&d.env)),
        binding_id: d.binding_id.clone(),
        template_id: d.template_id.clone(),
        template_revision: d.template_revision.clone(),
        phase: d.phase.as_str().to_owned(),
        ready: d.ready,
        fence_state: d.fence_state.map(fence_word).unwrap_or_default().to_owned(),
        reason,
        message,
        epoch: d.epoch,
        grant_generation: d.grant_generation,
        pod: d.pod.as_ref().map(identity),
        pvc: d.pvc.as_ref().map(identity),
        operations: d.operations.iter().map(operation_lease).collect(),
        run_claim: d.claim.as_ref().map(|c| pb::RunClaimSummary {
            binding_id: c.binding_id.clone(),
            run_id: c.run_id.clone(),
            epoch: c.epoch,
            grant_generation: c.grant_generation,
            expires_at: Some(timestamp(c.expires_at)),
            expired: c.expired,
        }),
        lifecycle: d.lifecycle.as_ref().map(|l| pb::LifecycleStep {
            operation_id: l.id.clone(),
            r#type: format!("{:?}", l.type_),
            phase: lifecycle_phase_word(l.phase).to_owned(),
        }),
        conditions: d.conditions.iter().map(condition).collect(),
        schema_version: d.schema_version,
        deleting: d.deleting,
    }
}

fn fence_word(f: FenceState) -> &'static str {
    match f {
        FenceState::Healthy => "Healthy",
        FenceState::FenceUnknown => "FenceUnknown",
    }
}

fn lifecycle_phase_word(p: LifecyclePhase) -> &'static str {
    match p {
        LifecyclePhase::Quiescing => "Quiescing",
        LifecyclePhase::WaitingForTermination => "WaitingForTermination",
        LifecyclePhase::RemovingPodFinalizer => "RemovingPodFinalizer",
        LifecyclePhase::WaitingForPodDeletion => "WaitingForPodDeletion",
        LifecyclePhase::CreatingReplacement => "CreatingReplacement",
        LifecyclePhase::DeletingPvc => "DeletingPVC",
        LifecyclePhase::ReleasingSlot => "ReleasingSlot",
    }
}

fn operation_lease(op: &ActiveOperation) -> pb::OperationLease {
    pb::OperationLease {
        operation_id: op.id.clone(),
        operation: op.operation.clone(),
        run_id: op.run_id.clone(),
        epoch: op.epoch,
        holder_id: op.holder_id.clone(),
        started_at: Some(timestamp(op.started_at.to_system_time())),
        expires_at: Some(timestamp(op.expires_at.to_system_time())),
    }
}

fn condition(c: &EnvironmentCondition) -> pb::EnvironmentCondition {
    let status = match c.status {
        ConditionStatus::True => "True",
        ConditionStatus::False => "False",
        ConditionStatus::Unknown => "Unknown",
    };
    pb::EnvironmentCondition {
        r#type: c.type_.clone(),
        status: status.to_owned(),
        reason: c.reason.clone(),
        message: c.message.clone(),
        last_transition_time: Some(timestamp(c.last_transition_time.to_system_time())),
    }
}
