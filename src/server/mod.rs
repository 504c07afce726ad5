//! The gRPC server: the execution service, the standard health service and server
//! reflection, served over mTLS through the network seam.

pub mod convert;
pub mod file_rules;
pub mod handlers;
pub mod limiter;
pub mod validate;

use std::future::Future;
use std::time::Duration;

use tonic::transport::Server;

use crate::api::FILE_DESCRIPTOR_SET;
use crate::api::pb::execution_provider_service_server::ExecutionProviderServiceServer;
use crate::runtime::net::Net;
use crate::runtime::tls::mtls_incoming;
use crate::security::Security;
pub use handlers::ProviderService;

/// Largest gRPC message in either direction.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;
/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The reflection service could not be built.
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves `service` on `listener` until `shutdown` completes, then drains in-flight calls.
pub async fn serve<N: Net>(
    listener: N::Listener,
    service: ProviderService,
    security: &Security,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ExecutionProviderServiceServer<ProviderService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let execution = ExecutionProviderServiceServer::new(service)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let incoming = mtls_incoming::<N>(listener, security.server_tls(), HANDSHAKE_TIMEOUT);
    Server::builder()
        .max_concurrent_streams(64)
        .add_service(execution)
        .add_service(health_service)
        .add_service(reflection)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}
