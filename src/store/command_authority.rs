//! Whether a supervised command may still run (docs/commands.md §5.5, §7): a command belongs
//! to the run claim that started it and runs only while that claim is current. The claim's
//! authority lapses when it is released or replaced, expires, is revoked (a new grant
//! generation), when the environment's template revision is withdrawn from the registry or
//! the claim's client loses the template from its policy, and when the environment is fenced,
//! retired, replaced or deleted. [`lapsed_claims`] decides it from one observation;
//! [`CommandWarden`] is what the reconciler calls on every pass of an environment with open
//! command leases, ending the lapsed claims' commands at the supervisor (proven ends, one
//! status write) and asking to look again at the next claim expiry or after
//! [`STANDING_RECHECK`] (a policy withdrawal is no event of the environment).
//!
//! Release and revocation end their commands themselves right after their own write; the
//! warden is the backstop for those (a replica that died between the two) and the only path
//! for the other lapses. Should no replica run it, the supervisor's own claim deadline kills
//! the commands (§5.2), and the next claim's acquisition records their ends.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::cas::{self, Decision};
use super::command_leases as leases;
use super::policy::StandingPolicy;
use super::predicates::{template_retained, valid_claim};
use super::{Store, StoreError};
use crate::errors::ErrorCode;
use crate::kube::crd::{ConditionStatus, ExecutionEnvironment, FenceState, condition};
use crate::reconciler::pod::pod_terminal;

/// How often the reconciler looks again at an environment whose commands still run, for a
/// lapse that is not an event of the environment (a policy withdrawal).
pub const STANDING_RECHECK: Duration = Duration::from_secs(5);

/// Why a claim's commands may no longer run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lapse {
    /// The environment is fenced: nothing in it may run on an unknown outcome.
    Fenced,
    /// A lifecycle operation (replacement, retirement, deletion) is admitted, the environment
    /// is retired, or it is being deleted.
    Lifecycle,
    /// The environment's template revision is revoked, removed or redefined.
    TemplateWithdrawn,
    /// The claim is not the environment's `activeRun` any more (released, or another claim).
    Released,
    /// The grant generation moved past the claim's (RevokeEnvironment).
    Revoked,
    /// The claim's expiry has passed.
    Expired,
    /// The claim's client is no longer admitted, or no longer allowed the template.
    PolicyWithdrawn,
}

/// What one observation says about the open commands.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Standing {
    /// Claims whose commands must end now, and why.
    pub lapsed: Vec<(String, Lapse)>,
    /// When the claim whose commands may go on expires (none: nothing runs on).
    pub expires_at: Option<SystemTime>,
}

/// Decides, from `o` alone, which open commands' claims have lapsed at `now`. `retained`
/// says whether the registry still holds the environment's exact template revision, `policy`
/// what the standing policy says of the current claim's client (`None`: cannot tell, which
/// ends nothing).
pub fn lapsed_claims(
    o: &ExecutionEnvironment,
    now: SystemTime,
    retained: bool,
    policy: Option<bool>,
) -> Standing {
    let claims = leases::open_claims(o);
    if claims.is_empty() {
        return Standing::default();
    }
    let status = o.status.clone().unwrap_or_default();
    let retired = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::RETIRED && c.status == ConditionStatus::True);
    let everything = if status.fence_state != Some(FenceState::Healthy) {
        Some(Lapse::Fenced)
    } else if status.lifecycle_operation.is_some()
        || retired
        || o.metadata.deletion_timestamp.is_some()
    {
        Some(Lapse::Lifecycle)
    } else if !retained {
        Some(Lapse::TemplateWithdrawn)
    } else {
        None
    };
    if let Some(lapse) = everything {
        return Standing {
            lapsed: claims.into_iter().map(|c| (c, lapse)).collect(),
            expires_at: None,
        };
    }
    let current = valid_claim(o);
    let mut standing = Standing::default();
    for claim in claims {
        // A claim is its id (fresh at every acquisition), as at the supervisor, whose
        // `end_claim` and deadlines are per claim id; a lease's whole tuple is compared by
        // every call that reaches it (§7).
        let lapse = match &current {
            Some((run, _)) if run.claim_id == claim => {
                if status.grant_generation != Some(run.grant_generation) {
                    Some(Lapse::Revoked)
                } else if now >= run.expires_at.to_system_time() {
                    Some(Lapse::Expired)
                } else if policy == Some(false) {
                    Some(Lapse::PolicyWithdrawn)
                } else {
                    standing.expires_at = Some(run.expires_at.to_system_time());
                    None
                }
            }
            _ => Some(Lapse::Released),
        };
        if let Some(lapse) = lapse {
            standing.lapsed.push((claim, lapse));
        }
    }
    standing
}

/// The reconciler's hold on supervised commands: the store (for the supervisor and the
/// status writes) and the standing client policy of this replica.
#[derive(Clone)]
pub struct CommandWarden {
    store: Store,
    policy: Arc<dyn StandingPolicy>,
}

/// What one pass of the warden did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Enforced {
    /// It wrote the environment (the caller's observation is stale).
    pub wrote: bool,
    /// Look again after this long (none: no command runs on).
    pub recheck: Option<Duration>,
}

impl CommandWarden {
    /// A warden over `store` judging client policy by `policy`.
    pub fn new(store: Store, policy: Arc<dyn StandingPolicy>) -> Self {
        Self { store, policy }
    }

    /// The store the warden writes with (the reconciler also settles expired operations
    /// through it: [`Store::settle_expired`]).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Ends the commands of every lapsed claim of `o` and records their ends; never fails
    /// (what could not be ended is looked at again after [`STANDING_RECHECK`]).
    pub async fn enforce(&self, o: &ExecutionEnvironment) -> Enforced {
        if leases::none_open(o) {
            return Enforced::default();
        }
        let env = o.metadata.name.clone().unwrap_or_default();
        let now = self.store.now();
        let retained = template_retained(o, &self.store.templates);
        let policy = valid_claim(o)
            .and_then(|(run, _)| self.policy.allows(&run.client_hash, &o.spec.template_id));
        let standing = lapsed_claims(o, now, retained, policy);
        let mut enforced = Enforced {
            wrote: false,
            recheck: standing.expires_at.map(|at| {
                at.duration_since(now)
                    .unwrap_or_default()
                    .min(STANDING_RECHECK)
            }),
        };
        if standing.lapsed.is_empty() {
            return enforced;
        }
        tracing::info!(env, lapsed = ?standing.lapsed, "ending commands whose claim lapsed");
        let claims: Vec<String> = standing.lapsed.into_iter().map(|(c, _)| c).collect();
        match self.store.end_claims_of(o, &claims).await {
            Ok(()) => enforced.wrote = true,
            Err(error) if unreached(&error) => match self.store.end_by_executor_end(o).await {
                Ok(wrote) => {
                    enforced.wrote = wrote;
                    if !wrote {
                        enforced.recheck = Some(STANDING_RECHECK);
                    }
                }
                Err(error) => {
                    tracing::warn!(env, %error, "lapsed commands not recorded yet");
                    enforced.recheck = Some(STANDING_RECHECK);
                }
            },
            Err(error) => {
                tracing::warn!(env, %error, "lapsed commands not ended yet");
                enforced.recheck = Some(STANDING_RECHECK);
            }
        }
        if enforced.wrote && !leases::none_open(o) {
            // The write may have left commands of a standing claim: the next pass, woken by
            // it, decides again.
            enforced.recheck.get_or_insert(STANDING_RECHECK);
        }
        enforced
    }
}

/// The supervisor could not be asked (gone with its Pod, unreachable, none recorded).
pub(super) fn unreached(error: &StoreError) -> bool {
    matches!(
        error.code(),
        ErrorCode::ExecutorUnreachable | ErrorCode::Unimplemented | ErrorCode::NotReady
    )
}

impl Store {
    /// Ends every open command of `claims` at the supervisor and records all their outcomes
    /// in one write (docs/commands.md §5.5).
    pub(super) async fn end_claims_of(
        &self,
        o: &ExecutionEnvironment,
        claims: &[String],
    ) -> Result<(), StoreError> {
        let mut ends = Vec::new();
        for claim in claims {
            ends.extend(self.claim_ends_of(o, claim).await?);
        }
        if ends.is_empty() {
            return Ok(());
        }
        let env = o.metadata.name.clone().unwrap_or_default();
        self.record_ends(&env, ends).await
    }

    /// When the supervisor cannot be asked: if the environment's recorded executor Pod, by
    /// its exact UID, is terminal, its end is every command's end, and every open lease is
    /// recorded ended (reason `ExecutorReplaced`, no receipt: the output went with the Pod)
    /// in one write guarded on that same Pod. Answers whether it wrote.
    pub(super) async fn end_by_executor_end(
        &self,
        o: &ExecutionEnvironment,
    ) -> Result<bool, StoreError> {
        let env = o.metadata.name.clone().unwrap_or_default();
        let Some(recorded) = o.status.as_ref().and_then(|s| s.pod.clone()) else {
            return Ok(false);
        };
        if recorded.name.is_empty() || recorded.uid.is_empty() {
            return Ok(false);
        }
        let pods: Api<Pod> = Api::namespaced(self.kube.clone(), &self.namespace);
        let pod = pods
            .get_opt(&recorded.name)
            .await
            .map_err(|e| StoreError::kube(&env, e))?;
        let ended = pod.is_some_and(|p| {
            p.metadata.uid.as_deref() == Some(recorded.uid.as_str()) && pod_terminal(&p)
        });
        if !ended {
            return Ok(false);
        }
        let now = self.now();
        cas::update_status_from(&self.api, &env, Some(o.clone()), |o| {
            let same_pod = o
                .status
                .as_ref()
                .and_then(|s| s.pod.as_ref())
                .is_some_and(|p| p.uid == recorded.uid);
            if !same_pod || leases::none_open(o) {
                return Ok(Decision::Keep(false));
            }
            let status = o.status.get_or_insert_with(Default::default);
            leases::end_all_by_executor_end(status, now);
            Ok(Decision::Write(true))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::crd::{
        ActiveRun, CommandLease, CommandLeaseState, EnvironmentCondition,
        ExecutionEnvironmentStatus, LifecycleOperation, LifecyclePhase, LifecycleType, RfcTime,
    };
    use std::time::UNIX_EPOCH;

    const NOW: Duration = Duration::from_secs(1_000);

    fn at(d: Duration) -> SystemTime {
        UNIX_EPOCH + d
    }

    fn lease(id: &str, claim: &str) -> CommandLease {
        CommandLease {
            id: id.into(),
            claim_id: claim.into(),
            run_id: "run".into(),
            epoch: 3,
            grant_generation: 2,
            detached: true,
            started_at: RfcTime::from_system_time(at(NOW)),
            state: CommandLeaseState::Running,
            cancel_operation_id: None,
            outcome: None,
        }
    }

    /// Epoch 3, generation 2, claim `claim` expiring at NOW + 60 s, one open lease of it.
    fn env() -> ExecutionEnvironment {
        let mut o = ExecutionEnvironment::new(
            "exec-x",
            serde_json::from_value(serde_json::json!({
                "schemaVersion": 2, "allocationID": "exec-x", "revision": "r", "ownerHash": "o",
                "clientHash": "c", "bindingID": "b", "requestFingerprint": "f", "templateID": "t",
                "templateRevision": "v", "templateDigest": "d", "image": "i", "storageClass": "s",
                "storageSize": "1Gi", "resources": {"cpuRequest": "1", "memoryRequest": "1",
                "cpuLimit": "1", "memoryLimit": "1"}, "desired": "Active"
            }))
            .expect("spec"),
        );
        o.status = Some(ExecutionEnvironmentStatus {
            schema_version: Some(2),
            epoch: Some(3),
            grant_generation: Some(2),
            fence_state: Some(FenceState::Healthy),
            active_run: Some(ActiveRun {
                binding_id: "b".into(),
                run_id: "run".into(),
                claim_id: "claim".into(),
                operation_id: "op".into(),
                owner_hash: "o".into(),
                client_hash: "c".into(),
                epoch: 3,
                grant_generation: 2,
                expires_at: RfcTime::from_system_time(at(NOW + Duration::from_secs(60))),
            }),
            commands: vec![lease("a", "claim")],
            ..ExecutionEnvironmentStatus::default()
        });
        o
    }

    fn status(o: &mut ExecutionEnvironment) -> &mut ExecutionEnvironmentStatus {
        o.status.as_mut().unwrap()
    }

    fn lapse_of(o: &ExecutionEnvironment, retained: bool, policy: Option<bool>) -> Option<Lapse> {
        let standing = lapsed_claims(o, at(NOW), retained, policy);
        assert!(standing.lapsed.len() <= 1, "{standing:?}");
        standing.lapsed.first().map(|(_, lapse)| *lapse)
    }

    #[test]
    fn a_current_claim_keeps_its_commands_until_its_expiry() {
        let o = env();
        let standing = lapsed_claims(&o, at(NOW), true, Some(true));
        assert_eq!(standing.lapsed, vec![]);
        assert_eq!(standing.expires_at, Some(at(NOW + Duration::from_secs(60))));
        // A replica that cannot judge the policy ends nothing.
        assert_eq!(lapse_of(&o, true, None), None);
        // Nothing open: nothing to decide, nothing to look at again.
        let mut idle = env();
        status(&mut idle).commands.clear();
        assert_eq!(
            lapsed_claims(&idle, at(NOW), false, Some(false)),
            Standing::default()
        );
    }

    #[test]
    fn every_lapse_of_the_claim_is_seen() {
        let mut released = env();
        status(&mut released).active_run = None;
        assert_eq!(lapse_of(&released, true, Some(true)), Some(Lapse::Released));

        let mut another = env();
        status(&mut another).active_run.as_mut().unwrap().claim_id = "other".into();
        assert_eq!(lapse_of(&another, true, Some(true)), Some(Lapse::Released));

        let mut revoked = env();
        status(&mut revoked).grant_generation = Some(3);
        assert_eq!(lapse_of(&revoked, true, Some(true)), Some(Lapse::Revoked));

        let mut expired = env();
        status(&mut expired).active_run.as_mut().unwrap().expires_at =
            RfcTime::from_system_time(at(NOW));
        assert_eq!(lapse_of(&expired, true, Some(true)), Some(Lapse::Expired));

        assert_eq!(
            lapse_of(&env(), true, Some(false)),
            Some(Lapse::PolicyWithdrawn)
        );
    }

    #[test]
    fn every_lapse_of_the_environment_ends_every_claim() {
        assert_eq!(
            lapse_of(&env(), false, Some(true)),
            Some(Lapse::TemplateWithdrawn)
        );

        let mut fenced = env();
        status(&mut fenced).fence_state = Some(FenceState::FenceUnknown);
        assert_eq!(lapse_of(&fenced, true, Some(true)), Some(Lapse::Fenced));

        let mut replacing = env();
        status(&mut replacing).lifecycle_operation = Some(LifecycleOperation {
            id: "op".into(),
            type_: LifecycleType::ReplaceExecutor,
            phase: LifecyclePhase::Quiescing,
            expected_epoch: None,
            expected_pod_uid: None,
            expected_pvc_uid: None,
            created_at: RfcTime::from_system_time(at(NOW)),
        });
        assert_eq!(
            lapse_of(&replacing, true, Some(true)),
            Some(Lapse::Lifecycle)
        );

        let mut retired = env();
        status(&mut retired).conditions.push(EnvironmentCondition {
            type_: condition::RETIRED.into(),
            status: ConditionStatus::True,
            reason: "Retired".into(),
            message: String::new(),
            observed_generation: 1,
            last_transition_time: RfcTime::from_system_time(at(NOW)),
        });
        assert_eq!(lapse_of(&retired, true, Some(true)), Some(Lapse::Lifecycle));

        // Two claims' commands (an earlier claim's left open): the earlier one lapses alone
        // while the environment stands, both when it does not.
        let mut two = env();
        status(&mut two).commands.push(lease("b", "earlier"));
        let standing = lapsed_claims(&two, at(NOW), true, Some(true));
        assert_eq!(standing.lapsed, vec![("earlier".into(), Lapse::Released)]);
        let standing = lapsed_claims(&two, at(NOW), false, Some(true));
        assert_eq!(standing.lapsed.len(), 2);
        assert_eq!(standing.expires_at, None);
    }

    /// A transport no command ever reaches (the executor's end decides without it).
    struct NoExecutor;

    impl crate::executor::ExecutorTransport for NoExecutor {
        fn execute<'a>(
            &'a self,
            _target: &'a crate::executor::ExecutorTarget,
            _request: crate::executor::ExecutorRequest,
            _cancel: crate::executor::CancelSignal,
        ) -> crate::executor::BoxFuture<
            'a,
            Result<crate::executor::ExecutorEnvelope, crate::executor::TransportError>,
        > {
            Box::pin(async { Err(crate::executor::TransportError::Unsupported) })
        }
    }

    /// §5.5: when the recorded executor Pod, by its exact UID, is terminal, its end is every
    /// open command's end, written in one CAS guarded on that Pod; another Pod's end, or the
    /// Pod still running, ends nothing.
    #[tokio::test]
    async fn the_recorded_pods_end_ends_every_open_lease_and_another_pods_does_not() {
        use crate::kube::apiserver::ApiServer;
        use crate::kube::crd::ObjectIdentity;
        use crate::runtime::clock::OffsetClock;
        use crate::runtime::{Runtime, SeededIds};
        use kube::api::PostParams;

        let clock = Arc::new(OffsetClock::starting_at(at(NOW)));
        let server = ApiServer::in_memory(clock.clone(), Arc::new(SeededIds::new(1)));
        let client = server.client("execution");
        let templates = crate::templates::TemplateRegistry::from_yaml_str(
            include_str!("../../fixtures/templates.yaml"),
            "templates.yaml",
        )
        .expect("the fixture loads");
        let runtime = Runtime {
            clock,
            ids: Arc::new(SeededIds::new(2)),
        };
        let store = Store::new(
            client.clone(),
            "execution",
            Arc::new(templates),
            Arc::new(NoExecutor),
            runtime,
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), "execution");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "executor-x"},
            "spec": {"containers": [{"name": "executor", "image": "i"}]},
            "status": {"phase": "Running"}
        }))
        .expect("a pod");
        let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
        let uid = pod.metadata.uid.clone().unwrap();
        let envs: Api<ExecutionEnvironment> = Api::namespaced(client, "execution");
        let mut o = env();
        let recorded = o.status.take();
        envs.create(&PostParams::default(), &o).await.unwrap();
        let mut o = envs.get("exec-x").await.unwrap();
        o.status = recorded;
        status(&mut o).pod = Some(ObjectIdentity {
            name: "executor-x".into(),
            uid: "another-pods-uid".into(),
        });
        let o = envs
            .replace_status("exec-x", &PostParams::default(), &o)
            .await
            .unwrap();
        let open = |o: &ExecutionEnvironment| o.status.as_ref().unwrap().commands[0].state;

        // Another Pod's UID: that Pod's end proves nothing about the recorded one.
        let mut terminal = pods.get("executor-x").await.unwrap();
        terminal.status = Some(
            serde_json::from_value(serde_json::json!({
                "phase": "Failed",
                "containerStatuses": [{
                    "name": "executor", "image": "i", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"terminated": {"exitCode": 137}}
                }]
            }))
            .expect("a terminal status"),
        );
        pods.replace_status("executor-x", &PostParams::default(), &terminal)
            .await
            .unwrap();
        assert!(!store.end_by_executor_end(&o).await.unwrap());
        let o = envs.get("exec-x").await.unwrap();
        assert_eq!(open(&o), CommandLeaseState::Running);

        // The recorded Pod by its exact UID, terminal: every open lease ends in one write.
        let mut o = o;
        status(&mut o).pod.as_mut().unwrap().uid = uid;
        let o = envs
            .replace_status("exec-x", &PostParams::default(), &o)
            .await
            .unwrap();
        assert!(store.end_by_executor_end(&o).await.unwrap());
        let ended = envs.get("exec-x").await.unwrap();
        let lease = &ended.status.as_ref().unwrap().commands[0];
        assert_eq!(lease.state, CommandLeaseState::Ended, "{lease:?}");
        assert_eq!(
            lease.outcome.as_ref().map(|o| o.reason),
            Some(crate::kube::crd::CommandEndReason::ExecutorReplaced)
        );
    }
}
