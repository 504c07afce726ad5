//! The executor seam: the helper wire protocol, the [`ExecutorTransport`] trait the provider
//! calls, and the local transport that runs `execution-helper` as a child process.
//!
//! The pod-exec transport (production) and the simulator's in-memory executor implement the
//! same trait.

pub mod local;
pub mod protocol;
pub mod transport;

pub use local::LocalTransport;
pub use protocol::{
    CommandState, CommandStatus, ErrorCode, ExecutorEnvelope, ExecutorError, ExecutorRequest,
    ExecutorResponse, FileInfo, GrepMatch, Operation,
};
pub use transport::{
    BoxFuture, CancelHandle, CancelSignal, ExecutorTarget, ExecutorTransport, TransportError,
};
