//! The gRPC server: the execution service, the standard health service and server
//! reflection (as `grpc.reflection.v1` and `v1alpha`), served over mTLS through the network
//! seam. Health and reflection answer only authorized identities and hold a limiter slot for
//! as long as their answer streams ([`guard`]).
//!
//! The health service answers SERVING for the execution service and for the whole server
//! (`""`) exactly while the security authority is ready (api-security §6.5): NOT_SERVING while
//! it is withdrawn (a refused generation, drift, a failed reload, a stale or foreign ledger
//! observation, an expired server certificate). Readiness is sampled every
//! [`HEALTH_POLL_INTERVAL`], since expiry and staleness change with time alone.
//!
//! Every call of the execution service is counted and timed by [`RpcMetricsLayer`] and runs in
//! its own span ([`RpcTraceLayer`]), a child of the caller's when its metadata carries W3C
//! trace context.
//!
//! HTTP/2 connection settings follow §7: at most 64 streams per connection, keepalive pings
//! after 2 min idle with a 20 s timeout, and a maximum connection age of 30 min plus 2 min of
//! grace, so clients reconnect (and re-handshake against the current TLS material) regularly.

pub mod command_convert;
pub mod connections;
pub mod convert;
pub mod file_rules;
pub mod guard;
pub mod handlers;
pub mod limiter;
pub mod status;
pub mod validate;

use std::future::Future;
use std::time::Duration;

use tonic::server::NamedService;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tower::Layer as _;

use crate::api::FILE_DESCRIPTOR_SET;
use crate::api::pb::execution_provider_service_server::ExecutionProviderServiceServer;
use crate::metrics::{RpcMetrics, RpcMetricsLayer};
use crate::runtime::net::Net;
use crate::runtime::tls::{ConnectionGate, mtls_incoming};
use crate::security::Security;
use crate::telemetry::traces::rpc::RpcTraceLayer;
pub use connections::ConnectionBounds;
use guard::Authorized;
pub use handlers::ProviderService;

/// Largest gRPC message in either direction.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;
/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 streams per connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 64;
/// Idle time after which the server pings a connection.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(120);
/// How long a keepalive ping may go unanswered.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// A connection is asked to go away after this age.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(30 * 60);
/// In-flight calls may finish for this long after the connection age is reached.
pub const MAX_CONNECTION_AGE_GRACE: Duration = Duration::from_secs(2 * 60);
/// How often the health service samples the security authority's readiness.
pub const HEALTH_POLL_INTERVAL: Duration = Duration::from_millis(200);

type ExecutionServer = ExecutionProviderServiceServer<ProviderService>;

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
    metrics: &RpcMetrics,
    connections: ConnectionBounds,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    report_readiness(&health, security.ready()).await;
    let tracker = tokio::spawn(track_readiness(health, security.clone()));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let execution = RpcTraceLayer::new(metrics.clone()).layer(
        RpcMetricsLayer::new(metrics.clone()).layer(
            ExecutionServer::new(service)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        ),
    );
    let (max_connections, max_handshakes) = connections.resolve();
    let gate = ConnectionGate::new(max_connections, max_handshakes);
    let incoming = mtls_incoming::<N>(listener, security.server_tls(), HANDSHAKE_TIMEOUT, gate);
    let served = Server::builder()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_connection_age(MAX_CONNECTION_AGE)
        .max_connection_age_grace(MAX_CONNECTION_AGE_GRACE)
        .add_service(execution)
        .add_service(Authorized::new(health_service, security.clone()))
        .add_service(Authorized::new(reflection, security.clone()))
        .add_service(Authorized::new(reflection_v1alpha, security.clone()))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    tracker.abort();
    served?;
    Ok(())
}

/// Sets the execution service and the whole server to SERVING or NOT_SERVING.
async fn report_readiness(health: &HealthReporter, ready: bool) {
    let status = if ready {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    health.set_service_status("", status).await;
    health
        .set_service_status(<ExecutionServer as NamedService>::NAME, status)
        .await;
}

/// Keeps the health statuses equal to the security authority's readiness.
async fn track_readiness(health: HealthReporter, security: Security) {
    let mut last = security.ready();
    let mut poll = tokio::time::interval(HEALTH_POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        poll.tick().await;
        let ready = security.ready();
        if ready != last {
            tracing::info!(ready, "security readiness changed");
            report_readiness(&health, ready).await;
            last = ready;
        }
    }
}
