//! The audit line of a data-plane call: one `INFO` event on the target [`TARGET`] when the
//! call is answered, whatever the answer (docs/operating.md, "Audit log").
//!
//! Its fields: `client` (the URI SAN of the peer's leaf certificate, `-` without one),
//! `owner_hash` (the provider's hash of the asserted owner, never the owner itself; `-` when
//! the request names no well-formed owner), `environment` (the environment id, or `-`),
//! `operation` (the RPC method), `action` (the file operation word of a `Files` call, else
//! `-`), `outcome` (the gRPC code of the answer) and `duration_ms`. Nothing else of the
//! request is read: no file contents or paths, no command text, arguments or variables, no
//! grant and no claim token. A stream (`FollowCommand`, `AttachCommand`) is audited when it
//! opens (or is refused); its duration is the time to open. A call whose client goes away
//! before the answer is audited as `Cancelled`.

use std::sync::Arc;

use tonic::{Request, Status};

use crate::api::pb;
use crate::runtime::clock::Clock;
use crate::security::identity::client_identity;
use crate::server::{convert, validate};

/// The tracing target of audit lines.
pub const TARGET: &str = "execution_provider::audit";

/// What a request says about whom it acts for and where.
pub trait AuditSubject {
    /// The asserted owner.
    fn owner(&self) -> Option<&pb::Owner>;
    /// The environment.
    fn environment(&self) -> Option<&pb::EnvironmentRef>;
    /// A finer word for the operation (the file operation of `Files`).
    fn action(&self) -> Option<String> {
        None
    }
}

/// Requests whose subject is their `RequestContext`.
macro_rules! context_subject {
    ($($request:ty),* $(,)?) => {
        $(
            impl AuditSubject for $request {
                fn owner(&self) -> Option<&pb::Owner> {
                    self.context.as_ref().and_then(|c| c.owner.as_ref())
                }
                fn environment(&self) -> Option<&pb::EnvironmentRef> {
                    self.context.as_ref().and_then(|c| c.environment.as_ref())
                }
            }
        )*
    };
}

/// Requests that carry the owner and environment themselves (the run-claim calls).
macro_rules! claim_subject {
    ($($request:ty),* $(,)?) => {
        $(
            impl AuditSubject for $request {
                fn owner(&self) -> Option<&pb::Owner> {
                    self.owner.as_ref()
                }
                fn environment(&self) -> Option<&pb::EnvironmentRef> {
                    self.environment.as_ref()
                }
            }
        )*
    };
}

context_subject!(
    pb::CommandStartRequest,
    pb::CommandQueryRequest,
    pb::CommandStdinRequest,
    pb::CommandSignalRequest,
    pb::CommandResizeRequest,
    pb::ListCommandsRequest,
);
claim_subject!(
    pb::AcquireRunRequest,
    pb::RenewRunRequest,
    pb::ReleaseRunRequest
);

impl AuditSubject for pb::FileRequest {
    fn owner(&self) -> Option<&pb::Owner> {
        self.context.as_ref().and_then(|c| c.owner.as_ref())
    }
    fn environment(&self) -> Option<&pb::EnvironmentRef> {
        self.context.as_ref().and_then(|c| c.environment.as_ref())
    }
    fn action(&self) -> Option<String> {
        convert::file_operation(self.operation).map(|o| o.as_str().to_owned())
    }
}

/// An audited call from its start to its answer.
pub struct AuditCall {
    operation: &'static str,
    action: String,
    client: String,
    owner_hash: String,
    environment: String,
    started: tokio::time::Instant,
    clock: Arc<dyn Clock>,
    written: bool,
}

const NONE: &str = "-";

impl AuditCall {
    /// Starts the audit of `operation` on `request`, read before the handler takes it.
    pub fn begin<T: AuditSubject>(
        operation: &'static str,
        request: &Request<T>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let subject = request.get_ref();
        let mut call = Self::anonymous(operation, request, clock);
        call.action = subject.action().unwrap_or_else(|| NONE.to_owned());
        call.owner_hash = validate::owner(subject.owner()).unwrap_or_else(|| NONE.to_owned());
        call.environment = subject
            .environment()
            .filter(|e| validate::valid_id(&e.id))
            .map_or_else(|| NONE.to_owned(), |e| e.id.clone());
        call
    }

    /// Starts the audit of a call whose subject is not known before it runs (a client stream).
    pub fn anonymous<T>(
        operation: &'static str,
        request: &Request<T>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            operation,
            action: NONE.to_owned(),
            client: peer_identity(request),
            owner_hash: NONE.to_owned(),
            environment: NONE.to_owned(),
            started: clock.monotonic(),
            clock,
            written: false,
        }
    }

    /// Writes the audit line of `answered`.
    pub fn finish<R>(mut self, answered: &Result<R, Status>) {
        let outcome = match answered {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        self.write(outcome);
    }

    fn write(&mut self, outcome: tonic::Code) {
        self.written = true;
        let elapsed = self.clock.monotonic().duration_since(self.started);
        tracing::info!(
            target: TARGET,
            client = %self.client,
            owner_hash = %self.owner_hash,
            environment = %self.environment,
            operation = self.operation,
            action = %self.action,
            outcome = ?outcome,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            "data-plane call"
        );
    }
}

impl Drop for AuditCall {
    /// A call dropped before its answer (its client went away) is audited as `Cancelled`.
    fn drop(&mut self) {
        if !self.written {
            self.write(tonic::Code::Cancelled);
        }
    }
}

/// The URI SAN of the peer's leaf certificate, as presented (the TLS handshake verified the
/// chain; admission is the handler's decision, and its refusal is the outcome).
fn peer_identity<T>(request: &Request<T>) -> String {
    request
        .peer_certs()
        .and_then(|certs| certs.first().and_then(|leaf| client_identity(leaf).ok()))
        .unwrap_or_else(|| NONE.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subject_is_the_owner_hash_and_the_environment_id_only() {
        let request = Request::new(pb::FileRequest {
            context: Some(pb::RequestContext {
                owner: Some(pb::Owner {
                    issuer: "issuer".into(),
                    subject: "alice".into(),
                }),
                environment: Some(pb::EnvironmentRef {
                    id: "exec-1".into(),
                    revision: "r1".into(),
                }),
                ..Default::default()
            }),
            operation: pb::FileOperation::Read as i32,
            ..Default::default()
        });
        let call = AuditCall::begin("Files", &request, Arc::new(crate::runtime::SystemClock));
        assert_eq!(
            call.owner_hash,
            crate::store::naming::owner_hash("issuer", "alice")
        );
        assert!(!call.owner_hash.contains("alice"));
        assert_eq!(
            (call.environment.as_str(), call.action.as_str()),
            ("exec-1", "file.read")
        );
        assert_eq!(call.client, NONE, "no peer certificate outside TLS");
    }
}
