//! The gRPC handlers: authenticate, authorize, validate, call the store, map errors. Thin by
//! design; every decision about state lives in the store.
//!
//! The service trait is implemented here once, delegating each RPC to a `handle_*` method in
//! the file of its group: [`catalog`], [`allocation`], [`claims`], [`references`], [`admin`],
//! [`describe`], [`data_plane`], [`commands`] and [`attach`]; [`auth`] holds the authentication and shape
//! checks they share.
//!
//! Every data-plane call (files, commands, run claims) writes one audit line when it is
//! answered ([`crate::telemetry::audit`]).

mod admin;
mod allocation;
mod attach;
mod auth;
mod catalog;
mod claims;
mod commands;
mod data_plane;
mod describe;
mod references;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::api::pb;
use crate::api::pb::execution_provider_service_server::ExecutionProviderService;
use crate::runtime::clock::Clock;
use crate::security::Security;
use crate::server::limiter::RpcLimiter;
use crate::store::Store;
use crate::telemetry::audit::AuditCall;

/// Capabilities every template offers.
pub const CAPABILITIES: [&str; 2] = ["filesystem", "foreground-command"];

/// The service: the store and the security state.
#[derive(Clone)]
pub struct ProviderService {
    store: Store,
    security: Security,
    /// Times the audited calls.
    clock: Arc<dyn Clock>,
    /// The bound of open output streams, apart from the unary limiter (docs/commands.md §6).
    streams: RpcLimiter,
}

impl ProviderService {
    /// A service over `store`, authorizing against `security`.
    pub fn new(store: Store, security: Security) -> Self {
        let streams = RpcLimiter::new(
            commands::MAX_COMMAND_STREAMS,
            commands::MAX_COMMAND_STREAMS_PER_CLIENT,
        )
        .expect("the stream bounds are valid");
        Self {
            clock: store.clock(),
            store,
            security,
            streams,
        }
    }
}

type RpcFuture<'a, T> = Pin<Box<dyn Future<Output = Result<Response<T>, Status>> + Send + 'a>>;

/// Implements each trait method by handing the request to its `handle_*` method.
macro_rules! delegate {
    ($($method:ident => $handler:ident($req:ty) -> $resp:ty;)*) => {
        $(
            fn $method<'life0, 'async_trait>(
                &'life0 self,
                request: Request<$req>,
            ) -> RpcFuture<'async_trait, $resp>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(self.$handler(request))
            }
        )*
    };
}

/// [`delegate!`] for the data-plane calls: each answer also writes the call's audit line.
macro_rules! delegate_audited {
    ($($method:ident => $handler:ident($req:ty) -> $resp:ty, $name:literal;)*) => {
        $(
            fn $method<'life0, 'async_trait>(
                &'life0 self,
                request: Request<$req>,
            ) -> RpcFuture<'async_trait, $resp>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async move {
                    let audit = AuditCall::begin($name, &request, self.clock.clone());
                    let answered = self.$handler(request).await;
                    audit.finish(&answered);
                    answered
                })
            }
        )*
    };
}

impl ExecutionProviderService for ProviderService {
    delegate! {
        validate_profile => handle_validate_profile(pb::ValidateProfileRequest) -> pb::ValidateProfileResponse;
        list_execution_templates => handle_list_execution_templates(pb::ListExecutionTemplatesRequest) -> pb::ListExecutionTemplatesResponse;
        validate_template => handle_validate_template(pb::ValidateTemplateRequest) -> pb::ValidateTemplateResponse;
        ensure_environment => handle_ensure_environment(pb::EnsureEnvironmentRequest) -> pb::EnsureEnvironmentResponse;
        ensure_template => handle_ensure_template(pb::EnsureTemplateRequest) -> pb::EnsureEnvironmentResponse;
        attach_environment => handle_attach_environment(pb::AttachEnvironmentRequest) -> pb::AttachEnvironmentResponse;
        commit_reference => handle_commit_reference(pb::ReferenceMutationRequest) -> ();
        abort_reference => handle_abort_reference(pb::ReferenceMutationRequest) -> ();
        prepare_reference_delete => handle_prepare_reference_delete(pb::ReferenceMutationRequest) -> ();
        confirm_reference_delete => handle_confirm_reference_delete(pb::ReferenceMutationRequest) -> ();
        cancel_reference_delete => handle_cancel_reference_delete(pb::ReferenceMutationRequest) -> ();
        reserve_successor => handle_reserve_successor(pb::ReserveSuccessorRequest) -> pb::ReferenceReservationResponse;
        list_reference_intents => handle_list_reference_intents(pb::ListReferenceIntentsRequest) -> pb::ListReferenceIntentsResponse;
        release_reference => handle_release_reference(pb::ReleaseReferenceRequest) -> ();
        retire_environment => handle_retire_environment(pb::RetireEnvironmentRequest) -> ();
        replace_executor => handle_replace_executor(pb::ReplaceExecutorRequest) -> ();
        recover_environment => handle_recover_environment(pb::RecoverEnvironmentRequest) -> ();
        delete_retired_environment => handle_delete_retired_environment(pb::DeleteRetiredEnvironmentRequest) -> ();
        revoke_environment => handle_revoke_environment(pb::RevokeEnvironmentRequest) -> pb::RevokeEnvironmentResponse;
        migrate_environment => handle_migrate_environment(pb::MigrateEnvironmentRequest) -> ();
        describe_environment => handle_describe_environment(pb::DescribeEnvironmentRequest) -> pb::DescribeEnvironmentResponse;
    }

    delegate_audited! {
        acquire_run => handle_acquire_run(pb::AcquireRunRequest) -> pb::RunClaimResponse, "AcquireRun";
        renew_run => handle_renew_run(pb::RenewRunRequest) -> pb::RunClaimResponse, "RenewRun";
        release_run => handle_release_run(pb::ReleaseRunRequest) -> (), "ReleaseRun";
        files => handle_files(pb::FileRequest) -> pb::FileResponse, "Files";
        start_command => handle_start_command(pb::CommandStartRequest) -> pb::CommandStartResponse, "StartCommand";
        command_status => handle_command_status(pb::CommandQueryRequest) -> pb::CommandStatusResponse, "CommandStatus";
        cancel_command => handle_cancel_command(pb::CommandQueryRequest) -> pb::CommandStatusResponse, "CancelCommand";
        write_command_stdin => handle_write_command_stdin(pb::CommandStdinRequest) -> pb::CommandStdinResponse, "WriteCommandStdin";
        signal_command => handle_signal_command(pb::CommandSignalRequest) -> pb::CommandStatusResponse, "SignalCommand";
        resize_command => handle_resize_command(pb::CommandResizeRequest) -> (), "ResizeCommand";
        list_commands => handle_list_commands(pb::ListCommandsRequest) -> pb::ListCommandsResponse, "ListCommands";
    }

    type FollowCommandStream = commands::OutputEvents;

    fn follow_command<'life0, 'async_trait>(
        &'life0 self,
        request: Request<pb::CommandQueryRequest>,
    ) -> RpcFuture<'async_trait, Self::FollowCommandStream>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let audit = AuditCall::begin("FollowCommand", &request, self.clock.clone());
            let answered = self.handle_follow_command(request).await;
            audit.finish(&answered);
            answered
        })
    }

    type AttachCommandStream = commands::OutputEvents;

    fn attach_command<'life0, 'async_trait>(
        &'life0 self,
        request: Request<tonic::Streaming<pb::CommandAttachInput>>,
    ) -> RpcFuture<'async_trait, Self::AttachCommandStream>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            // The subject arrives in the stream's first input, which the handler reads.
            let audit = AuditCall::anonymous("AttachCommand", &request, self.clock.clone());
            let answered = self.handle_attach_command(request).await;
            audit.finish(&answered);
            answered
        })
    }
}
