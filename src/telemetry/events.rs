//! Kubernetes Events on an `ExecutionEnvironment` (docs/operating.md, "Events"): fences with
//! their reason, recoveries (automatic and administrative), and the steps of the admin
//! lifecycle, published through kube's events [`Recorder`] on the provider's one
//! `kube::Client` (the Kubernetes seam: the in-process API server in `dev` and tests).
//!
//! Best effort by construction: [`EventRecorder::record`] never waits and never fails. It
//! hands the event to a task of its own, at most [`MAX_IN_FLIGHT`] at once (beyond that the
//! event is dropped and a warning logged), each bounded by [`PUBLISH_TIMEOUT`]; a failed or
//! timed-out write is logged and forgotten. The reconcile and the store never see it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource as _;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::Semaphore;

use crate::kube::crd::{ExecutionEnvironment, LifecyclePhase, LifecycleType};
use crate::metrics::FenceReason;

/// The reporting controller of every event.
pub const REPORTER: &str = "execution-provider";
/// Most event writes in flight at once.
pub const MAX_IN_FLIGHT: usize = 32;
/// The longest one event write may take.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest note the Events API accepts.
const MAX_NOTE_BYTES: usize = 1024;

/// Event reasons (the `reason` field), one per kind of event.
pub mod reason {
    /// Warning: the environment was fenced (FenceUnknown written); the action is the cause.
    pub const FENCED: &str = "Fenced";
    /// The reconciler admitted the automatic recovery of a fenced environment.
    pub const RECOVERY_STARTED: &str = "RecoveryStarted";
    /// Warning: the automatic recovery cannot proceed; the action is the `Recovering` reason.
    pub const RECOVERY_BLOCKED: &str = "RecoveryBlocked";
    /// The fence was lifted on proof: a new executor serves (automatic), or an administrator's
    /// `RecoverEnvironment` recorded the exact Pod's end.
    pub const RECOVERED: &str = "Recovered";
    /// A lifecycle operation moved to the phase named by the action.
    pub const LIFECYCLE_STEP: &str = "LifecycleStep";
    /// `ReplaceExecutor` finished: a new executor at the next epoch.
    pub const EXECUTOR_REPLACED: &str = "ExecutorReplaced";
    /// `RetireEnvironment` finished: executor gone, workspace retained.
    pub const RETIRED: &str = "Retired";
}

/// What happened to an environment.
#[derive(Debug, Clone, Copy)]
pub enum EnvironmentEvent<'a> {
    /// FenceUnknown was written for `reason`.
    Fenced(FenceReason),
    /// The automatic recovery was admitted.
    RecoveryStarted,
    /// The automatic recovery stopped: `why` (a `Recovering` reason) and its message.
    RecoveryBlocked { why: &'a str, message: &'a str },
    /// An administrator's `RecoverEnvironment` lifted the fence on proof.
    RecoveredByAdministrator,
    /// The lifecycle operation `kind` on the executor Pod `pod` (name, UID) moved to `phase`.
    /// The Pod is the event's related object, so the steps of two operations stay apart.
    LifecycleStep {
        kind: LifecycleType,
        phase: LifecyclePhase,
        automatic: bool,
        pod: (&'a str, &'a str),
    },
    /// A replacement finished at `epoch`; `automatic` when it ended an automatic recovery.
    ExecutorReplaced { epoch: u64, automatic: bool },
    /// The retirement finished.
    Retired,
}

impl EnvironmentEvent<'_> {
    /// The event to publish.
    pub fn event(&self) -> Event {
        let secondary = match *self {
            Self::LifecycleStep { pod, .. } => Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: Some(pod.0.to_owned()),
                uid: Some(pod.1.to_owned()),
                ..ObjectReference::default()
            }),
            _ => None,
        };
        let (type_, reason, action, note) = match *self {
            Self::Fenced(cause) => (
                EventType::Warning,
                reason::FENCED,
                camel_case(cause.as_str()),
                format!(
                    "fenced ({}): what the executor did can no longer be proven; data-plane calls \
                     answer FENCE_UNKNOWN until a recovery proves the executor's end",
                    cause.as_str()
                ),
            ),
            Self::RecoveryStarted => (
                EventType::Normal,
                reason::RECOVERY_STARTED,
                "AutomaticRecovery".to_owned(),
                "deleting the exact executor Pod to prove its end".to_owned(),
            ),
            Self::RecoveryBlocked { why, message } => (
                EventType::Warning,
                reason::RECOVERY_BLOCKED,
                why.to_owned(),
                message.to_owned(),
            ),
            Self::RecoveredByAdministrator => (
                EventType::Normal,
                reason::RECOVERED,
                "RecoverEnvironment".to_owned(),
                "the exact executor Pod's end is proven; the fence is lifted".to_owned(),
            ),
            Self::LifecycleStep {
                kind,
                phase,
                automatic,
                ..
            } => (
                EventType::Normal,
                reason::LIFECYCLE_STEP,
                format!("{phase:?}"),
                format!(
                    "{kind:?}{}: now {phase:?}",
                    if automatic {
                        " (automatic recovery)"
                    } else {
                        ""
                    }
                ),
            ),
            Self::ExecutorReplaced { epoch, automatic } => (
                EventType::Normal,
                if automatic {
                    reason::RECOVERED
                } else {
                    reason::EXECUTOR_REPLACED
                },
                if automatic {
                    "AutomaticRecovery"
                } else {
                    "ReplaceExecutor"
                }
                .to_owned(),
                format!("a new executor serves the workspace at epoch {epoch}"),
            ),
            Self::Retired => (
                EventType::Normal,
                reason::RETIRED,
                "RetireEnvironment".to_owned(),
                "the executor Pod was proven terminal and removed; the workspace is retained"
                    .to_owned(),
            ),
        };
        Event {
            type_,
            reason: reason.to_owned(),
            note: Some(bounded(note)),
            action,
            secondary,
        }
    }
}

/// `lease_expired` → `LeaseExpired`.
fn camel_case(snake: &str) -> String {
    snake
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

fn bounded(mut note: String) -> String {
    if note.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    note
}

/// Publishes [`EnvironmentEvent`]s, or does nothing when disabled (the default: tests and
/// tools without an event sink, and the simulator).
#[derive(Clone, Default)]
pub struct EventRecorder(Option<Arc<Inner>>);

struct Inner {
    recorder: Recorder,
    namespace: String,
    in_flight: Arc<Semaphore>,
}

impl EventRecorder {
    /// Events in `namespace` through `client`, reported by [`REPORTER`] from `instance` (the
    /// replica's Pod name, when known).
    pub fn new(client: kube::Client, namespace: &str, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: REPORTER.to_owned(),
            instance,
        };
        Self(Some(Arc::new(Inner {
            recorder: Recorder::new(client, reporter),
            namespace: namespace.to_owned(),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        })))
    }

    /// A recorder that publishes nothing.
    pub fn disabled() -> Self {
        Self(None)
    }

    /// Records `event` about `env` (as observed), best effort.
    pub fn record(&self, env: &ExecutionEnvironment, event: EnvironmentEvent<'_>) {
        let Some(inner) = &self.0 else { return };
        let mut reference = env.object_ref(&());
        reference
            .namespace
            .get_or_insert_with(|| inner.namespace.clone());
        self.publish(reference, event.event());
    }

    /// Records `event` about the environment named `name` (with its UID when known).
    pub fn record_named(&self, name: &str, uid: Option<String>, event: EnvironmentEvent<'_>) {
        let Some(inner) = &self.0 else { return };
        let reference = ObjectReference {
            api_version: Some(ExecutionEnvironment::api_version(&()).into_owned()),
            kind: Some(ExecutionEnvironment::kind(&()).into_owned()),
            name: Some(name.to_owned()),
            namespace: Some(inner.namespace.clone()),
            uid,
            ..ObjectReference::default()
        };
        self.publish(reference, event.event());
    }

    fn publish(&self, reference: ObjectReference, mut event: Event) {
        let Some(inner) = self.0.clone() else { return };
        if let Some(related) = event.secondary.as_mut() {
            related
                .namespace
                .get_or_insert_with(|| inner.namespace.clone());
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(permit) = inner.in_flight.clone().try_acquire_owned() else {
            tracing::warn!(reason = %event.reason, "Event dropped: too many event writes in flight");
            return;
        };
        runtime.spawn(async move {
            let _permit = permit;
            let published = inner.recorder.publish(&event, &reference);
            match tokio::time::timeout(PUBLISH_TIMEOUT, published).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(reason = %event.reason, %error, "could not write an Event");
                }
                Err(_) => tracing::warn!(reason = %event.reason, "writing an Event timed out"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_reasons_become_actions_and_notes_stay_within_the_api_bound() {
        let fenced = EnvironmentEvent::Fenced(FenceReason::LeaseExpired).event();
        assert_eq!(
            (fenced.reason.as_str(), fenced.action.as_str()),
            (reason::FENCED, "LeaseExpired")
        );
        assert_eq!(fenced.type_, EventType::Warning);
        let long = "é".repeat(800);
        let blocked = EnvironmentEvent::RecoveryBlocked {
            why: "ManualRecovery",
            message: &long,
        }
        .event();
        assert!(blocked.note.unwrap().len() <= MAX_NOTE_BYTES);
    }
}
