//! Binding references (api-security §4.3, store §6): commit, abort, prepare/confirm/cancel
//! delete, reserve successor, release, and the three discovery modes of
//! `ListReferenceIntents`. Shape failures and a caller without `MayAttestOwner` are
//! INVALID_ARGUMENT; the store decides everything else.

use tonic::{Request, Response, Status};

use super::ProviderService;
use super::auth::*;
use crate::api::pb;
use crate::errors::ErrorCode;
use crate::kube::crd::ReferenceState;
use crate::security::Client;
use crate::server::convert;
use crate::server::validate::{self, valid_binding, valid_id};
use crate::store::intents::{MAX_REFERENCES, ReferenceIntent};
use crate::store::{Caller, EnvRef};

/// Which exact mutation a `ReferenceMutationRequest` asks for.
#[derive(Clone, Copy)]
enum Mutation {
    Commit,
    Abort,
    Prepare,
    Confirm,
    Cancel,
}

fn invalid() -> Status {
    refuse(ErrorCode::InvalidArgument)
}

/// The checked (caller, environment) of an owner-bound reference request.
fn owner_bound(
    client: &Client,
    owner: Option<&pb::Owner>,
    environment: Option<&pb::EnvironmentRef>,
) -> Result<(Caller, EnvRef), Status> {
    if !client.policy.may_attest_owner {
        return Err(invalid());
    }
    let owner_hash = validate::owner(owner).ok_or_else(invalid)?;
    let env = validate::env_ref(environment).ok_or_else(invalid)?;
    Ok((caller(client, owner_hash), env))
}

fn state_name(state: ReferenceState) -> &'static str {
    match state {
        ReferenceState::PendingCreate => "PendingCreate",
        ReferenceState::Published => "Published",
        ReferenceState::PendingDelete => "PendingDelete",
    }
}

fn intent(i: &ReferenceIntent, owner: Option<&pb::Owner>) -> pb::ReferenceIntent {
    let owner = match &i.owner {
        Some((issuer, subject)) => Some(pb::Owner {
            issuer: issuer.clone(),
            subject: subject.clone(),
        }),
        None => owner.cloned(),
    };
    pb::ReferenceIntent {
        environment: Some(convert::env_ref(&i.env)),
        binding_id: i.record.binding_id.clone(),
        state: state_name(i.record.state).to_owned(),
        operation_id: i.record.operation_id.clone(),
        source_binding_id: i.record.source_binding_id.clone().unwrap_or_default(),
        created_at: Some(convert::timestamp(i.record.created_at.to_system_time())),
        owner,
    }
}

impl ProviderService {
    async fn mutate_reference(
        &self,
        request: Request<pb::ReferenceMutationRequest>,
        mutation: Mutation,
    ) -> Result<Response<()>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let (caller, env) = owner_bound(&client, r.owner.as_ref(), r.environment.as_ref())?;
        if !valid_binding(&r.binding_id) || !valid_id(&r.operation_id) {
            return Err(invalid());
        }
        let (b, op) = (r.binding_id.as_str(), r.operation_id.as_str());
        let store = &self.store;
        match mutation {
            Mutation::Commit => store.commit_reference(&env, &caller, b, op).await,
            Mutation::Abort => store.abort_reference(&env, &caller, b, op).await,
            Mutation::Prepare => store.prepare_reference_delete(&env, &caller, b, op).await,
            Mutation::Confirm => store.confirm_reference_delete(&env, &caller, b, op).await,
            Mutation::Cancel => store.cancel_reference_delete(&env, &caller, b, op).await,
        }?;
        Ok(Response::new(()))
    }

    pub(super) async fn handle_commit_reference(
        &self,
        request: Request<pb::ReferenceMutationRequest>,
    ) -> Result<Response<()>, Status> {
        self.mutate_reference(request, Mutation::Commit).await
    }

    pub(super) async fn handle_abort_reference(
        &self,
        request: Request<pb::ReferenceMutationRequest>,
    ) -> Result<Response<()>, Status> {
        self.mutate_reference(request, Mutation::Abort).await
    }

    pub(super) async fn handle_prepare_reference_delete(
        &self,
        request: Request<pb::ReferenceMutationRequest>,
    ) -> Result<Response<()>, Status> {
        self.mutate_reference(request, Mutation::Prepare).await
    }

    pub(super) async fn handle_confirm_reference_delete(
        &self,
        request: Request<pb::ReferenceMutationRequest>,
    ) -> Result<Response<()>, Status> {
        self.mutate_reference(request, Mutation::Confirm).await
    }

    pub(super) async fn handle_cancel_reference_delete(
        &self,
        request: Request<pb::ReferenceMutationRequest>,
    ) -> Result<Response<()>, Status> {
        self.mutate_reference(request, Mutation::Cancel).await
    }

    pub(super) async fn handle_release_reference(
        &self,
        request: Request<pb::ReleaseReferenceRequest>,
    ) -> Result<Response<()>, Status> {
        let client = self.client(&request)?;
        let c = request.get_ref().context.as_ref().ok_or_else(invalid)?;
        let (caller, env) = owner_bound(&client, c.owner.as_ref(), c.environment.as_ref())?;
        if !valid_binding(&c.binding_id) {
            return Err(invalid());
        }
        self.store
            .release_reference(&env, &caller, &c.binding_id)
            .await?;
        Ok(Response::new(()))
    }

    pub(super) async fn handle_reserve_successor(
        &self,
        request: Request<pb::ReserveSuccessorRequest>,
    ) -> Result<Response<pb::ReferenceReservationResponse>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let (caller, env) = owner_bound(&client, r.owner.as_ref(), r.environment.as_ref())?;
        let (source, destination) = (&r.source_binding_id, &r.destination_binding_id);
        if !valid_binding(source)
            || !valid_binding(destination)
            || source == destination
            || !valid_id(&r.operation_id)
        {
            return Err(invalid());
        }
        self.store
            .reserve_successor(&env, &caller, source, destination, &r.operation_id)
            .await?;
        Ok(Response::new(pb::ReferenceReservationResponse {
            environment: Some(convert::env_ref(&env)),
        }))
    }

    pub(super) async fn handle_list_reference_intents(
        &self,
        request: Request<pb::ListReferenceIntentsRequest>,
    ) -> Result<Response<pb::ListReferenceIntentsResponse>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let limit = usize::try_from(r.limit)
            .ok()
            .filter(|l| *l <= MAX_REFERENCES)
            .ok_or_else(invalid)?;
        if !client.policy.may_attest_owner {
            return Err(invalid());
        }
        let intents = if r.environment.is_some() || !r.binding_id.is_empty() {
            let (caller, env) = owner_bound(&client, r.owner.as_ref(), r.environment.as_ref())?;
            if !valid_binding(&r.binding_id) {
                return Err(invalid());
            }
            let found = self
                .store
                .find_reference_intent(&env, &caller, &r.binding_id)
                .await?;
            vec![intent(&found, r.owner.as_ref())]
        } else if let Some(owner) = r.owner.as_ref() {
            let owner_hash = validate::owner(Some(owner)).ok_or_else(invalid)?;
            let found = self
                .store
                .list_reference_intents(&caller(&client, owner_hash), limit)
                .await?;
            found.iter().map(|i| intent(i, Some(owner))).collect()
        } else {
            let found = self
                .store
                .list_reference_intents_for_client(&client.uri, limit)
                .await?;
            found.iter().map(|i| intent(i, None)).collect()
        };
        Ok(Response::new(pb::ListReferenceIntentsResponse { intents }))
    }
}
