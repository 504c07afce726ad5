//! The run-claim actions of a client: acquire, renew (and replay the renewal, §10.12) and
//! release, the claim board that workers of one platform and owner share (where stale claims
//! come from), and the §10.5 probes with another platform's claims.

use execution_provider::api::pb;
use rand::RngExt;

use super::{Session, absent_environment, outcome, proves_nothing, same_refusal};

impl Session {
    pub(super) async fn acquire(&mut self, binding: &str) {
        let env = self.bindings[binding].env.clone();
        let run_id = self.next_id("run");
        let operation_id = self.next_id("acquire");
        let request = pb::AcquireRunRequest {
            environment: env,
            owner: Some(self.spec.owner.clone()),
            binding_id: binding.to_owned(),
            operation_id: operation_id.clone(),
            run_id,
            ttl_millis: 30_000,
        };
        let result = self.client().acquire_run(request).await;
        self.trace(format!("acquire {binding} -> {}", outcome(&result)));
        self.note_refusal(&operation_id, &result);
        if let Ok(claim) = result {
            let claim = claim.into_inner();
            let key = self.board_key(binding);
            let mut board = self.record.claims.lock().expect("claims lock");
            board.entry(key).or_default().push(claim);
        }
    }

    pub(super) fn board_key(&self, binding: &str) -> String {
        format!(
            "{}/{}/{binding}",
            self.spec.platform, self.spec.owner.subject
        )
    }

    pub(super) fn shared_claims(&self, binding: &str) -> Vec<pb::RunClaimResponse> {
        let board = self.record.claims.lock().expect("claims lock");
        board
            .get(&self.board_key(binding))
            .cloned()
            .unwrap_or_default()
    }

    /// The claim to use: usually the newest, sometimes an older one (a stale epoch).
    pub(super) fn claim(&mut self, binding: &str) -> Option<pb::RunClaimResponse> {
        let claims = self.shared_claims(binding);
        let n = claims.len();
        if n == 0 {
            return None;
        }
        let stale = n > 1 && self.rng.random_bool(self.spec.stale_claim_rate);
        let i = if stale {
            self.rng.random_range(0..n - 1)
        } else {
            n - 1
        };
        Some(claims[i].clone())
    }

    pub(super) fn context(
        &self,
        binding: &str,
        claim: &pb::RunClaimResponse,
    ) -> pb::RequestContext {
        pb::RequestContext {
            environment: claim.environment.clone(),
            owner: Some(self.spec.owner.clone()),
            binding_id: binding.to_owned(),
            epoch: claim.epoch,
            grant: claim.grant.clone(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            grant_generation: claim.grant_generation,
        }
    }

    pub(super) async fn renew(&mut self, binding: &str) {
        let Some(claim) = self.claim(binding) else {
            return self.acquire(binding).await;
        };
        let request = pb::RenewRunRequest {
            environment: claim.environment.clone(),
            owner: Some(self.spec.owner.clone()),
            binding_id: binding.to_owned(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            epoch: claim.epoch,
            operation_id: self.next_id("renew"),
            ttl_millis: 30_000,
            grant_generation: claim.grant_generation,
        };
        let result = self.client().renew_run(request.clone()).await;
        self.trace(format!(
            "renew {binding} e{} -> {}",
            claim.epoch,
            outcome(&result)
        ));
        self.note_refusal(&request.operation_id, &result);
        if let Ok(first) = result {
            self.replay_renewal(binding, request, first.into_inner())
                .await;
        }
    }

    /// §10.12: replaying an applied renewal returns the recorded expiry without extending
    /// it, and the same operation id with another TTL is refused.
    pub(super) async fn replay_renewal(
        &mut self,
        binding: &str,
        request: pb::RenewRunRequest,
        first: pb::RunClaimResponse,
    ) {
        let replay = self.client().renew_run(request.clone()).await;
        self.trace(format!("renew replay {binding} -> {}", outcome(&replay)));
        if let Ok(again) = replay
            && again.get_ref().expires_at != first.expires_at
        {
            self.unexpected(format!(
                "§10.12 replaying renewal {} moved the expiry {:?} -> {:?}",
                request.operation_id,
                first.expires_at,
                again.get_ref().expires_at
            ));
        }
        let altered = pb::RenewRunRequest {
            ttl_millis: request.ttl_millis + 1_000,
            ..request
        };
        let result = self.client().renew_run(altered.clone()).await;
        self.trace(format!(
            "renew same id, other ttl {binding} -> {}",
            outcome(&result)
        ));
        if result.is_ok() {
            self.unexpected(format!(
                "§10.12 renewal id {} was reused for another request and accepted",
                altered.operation_id
            ));
        }
    }

    pub(super) async fn release(&mut self, binding: &str) {
        let Some(claim) = self.claim(binding) else {
            return;
        };
        let request = pb::ReleaseRunRequest {
            environment: claim.environment.clone(),
            owner: Some(self.spec.owner.clone()),
            binding_id: binding.to_owned(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            epoch: claim.epoch,
            operation_id: self.next_id("release"),
            grant_generation: claim.grant_generation,
        };
        let operation_id = request.operation_id.clone();
        let result = self.client().release_run(request).await;
        self.note_refusal(&operation_id, &result);
        self.trace(format!(
            "release {binding} e{} -> {}",
            claim.epoch,
            outcome(&result)
        ));
    }
}

impl Session {
    /// §10.5 across clients: the newest claim of a random binding of another platform (its
    /// environment, owner, binding, epoch, grant, run and claim ids), presented by this
    /// client to read a file and to acquire a run, must be refused exactly like the same
    /// requests naming an absent environment (code, message and details). Success is a
    /// violation.
    pub(super) async fn foreign_probe(&mut self) {
        let mine = format!("{}/", self.spec.platform);
        let foreign: Vec<(String, pb::RunClaimResponse)> = {
            let board = self.record.claims.lock().expect("claims lock");
            board
                .iter()
                .filter(|(key, _)| !key.starts_with(&mine))
                .filter_map(|(key, claims)| Some((key.clone(), claims.last()?.clone())))
                .collect()
        };
        if foreign.is_empty() {
            return;
        }
        let (key, claim) = foreign[self.side_rng.random_range(0..foreign.len())].clone();
        let mut parts = key.splitn(3, '/').skip(1);
        let (Some(subject), Some(binding)) = (parts.next(), parts.next()) else {
            return;
        };
        let owner = pb::Owner {
            issuer: self.spec.owner.issuer.clone(),
            subject: subject.to_owned(),
        };
        let mut context = self.context(binding, &claim);
        context.owner = Some(owner.clone());
        let read = pb::FileRequest {
            context: Some(context),
            operation: pb::FileOperation::Read as i32,
            path: "f0.txt".to_owned(),
            ..pb::FileRequest::default()
        };
        let mut absent_read = read.clone();
        if let Some(context) = absent_read.context.as_mut() {
            context.environment = Some(absent_environment());
        }
        let result = self.client().files(read).await.map(drop);
        let probe = self.client().files(absent_read).await.map(drop);
        self.judge_foreign(
            "read a file with another platform's claim",
            binding,
            &result,
            &probe,
        );
        let acquire = pb::AcquireRunRequest {
            environment: claim.environment.clone(),
            owner: Some(owner),
            binding_id: binding.to_owned(),
            operation_id: self.next_id("foreign-acquire"),
            run_id: self.next_id("run"),
            ttl_millis: 30_000,
        };
        let absent_acquire = pb::AcquireRunRequest {
            environment: Some(absent_environment()),
            operation_id: self.next_id("foreign-acquire"),
            ..acquire.clone()
        };
        let result = self.client().acquire_run(acquire.clone()).await.map(drop);
        self.note_refusal(&acquire.operation_id, &result);
        let probe = self.client().acquire_run(absent_acquire).await.map(drop);
        self.judge_foreign(
            "acquire another platform's environment",
            binding,
            &result,
            &probe,
        );
    }

    /// Traces a cross-platform probe and records a violation when it succeeded or was
    /// refused otherwise than its absent twin (answers the client cannot know prove nothing).
    fn judge_foreign(
        &self,
        what: &str,
        binding: &str,
        result: &Result<(), tonic::Status>,
        absent: &Result<(), tonic::Status>,
    ) {
        self.trace(format!("invalid: {what} {binding} -> {}", outcome(result)));
        let leak = match (result, absent) {
            (Ok(()), _) => Some("it succeeded".to_owned()),
            (Err(r), Err(a)) if !proves_nothing(r) && !proves_nothing(a) => (!same_refusal(r, a))
                .then(|| {
                    format!(
                        "refused {:?} {:?}, unlike an absent environment ({:?} {:?})",
                        r.code(),
                        r.message(),
                        a.code(),
                        a.message()
                    )
                }),
            _ => None,
        };
        if let Some(leak) = leak {
            self.unexpected(format!(
                "§10.5 {}: {what} {binding}: {leak}",
                self.spec.host
            ));
        }
    }
}
