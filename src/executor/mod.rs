//! The executor seam: the helper wire protocol, the [`ExecutorTransport`] trait the provider
//! calls, and the local transport that runs `execution-helper` as a child process.
//!
//! The pod-exec transport ([`PodExecutor`], production) and the simulator's in-memory executor
//! implement the same trait; [`HelperExecBackend`] lets the in-process API server run the local
//! helper behind `pods/exec`.

pub mod dev_executor;
pub mod environment_end;
pub mod exec_backend;
pub mod local;
pub mod local_supervisor;
pub mod pod_exec;
pub mod pod_relay;
pub mod protocol;
pub mod sandbox_networks;
pub mod supervisor_client;
pub mod supervisor_protocol;
pub mod transport;

pub use dev_executor::DevExecutor;
pub use exec_backend::HelperExecBackend;
pub use local::LocalTransport;
pub use pod_exec::PodExecutor;
pub use protocol::{
    CommandState, CommandStatus, ErrorCode, ExecutorEnvelope, ExecutorError, ExecutorRequest,
    ExecutorResponse, FileInfo, GrepMatch, Operation,
};
pub use transport::{
    BoxFuture, CancelHandle, CancelSignal, ExecutorTarget, ExecutorTransport, SupervisorSession,
    SupervisorTarget, TransportError,
};
