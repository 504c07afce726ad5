//! The one place a refusal becomes a gRPC status: the gRPC code of each stable error code, a
//! generic message, and an `ErrorDetail{code, retryable}` in `grpc-status-details-bin`.
//!
//! The core layers report [`ErrorCode`]s and [`WireError`]s only; they never see `tonic` or the
//! generated protobuf types. A retryable conflict goes out as ABORTED with `retryable: true`
//! (DECISIONS 7). Clients read the detail back with [`error_detail`].

use prost::Message;

use crate::api::ERROR_DETAIL_TYPE_URL;
use crate::api::pb::ErrorDetail;
use crate::errors::{ErrorCode, WireError};
use crate::store::StoreError;

/// The generic message every refusal carries.
pub const GENERIC_MESSAGE: &str = "execution provider request failed";
/// The message of `fence_unknown`, which asks the client to verify termination itself.
pub const FENCE_UNKNOWN_MESSAGE: &str =
    "execution provider request failed; verify termination independently or use external fencing";

/// The gRPC code a stable error code travels as.
pub fn grpc_code(code: ErrorCode) -> tonic::Code {
    match code {
        ErrorCode::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorCode::Unauthenticated => tonic::Code::Unauthenticated,
        ErrorCode::PermissionDenied => tonic::Code::PermissionDenied,
        ErrorCode::NotFound => tonic::Code::NotFound,
        ErrorCode::AlreadyExists => tonic::Code::AlreadyExists,
        ErrorCode::Conflict | ErrorCode::VersionMismatch | ErrorCode::DirectoryNotEmpty => {
            tonic::Code::Aborted
        }
        ErrorCode::NotReady => tonic::Code::Unavailable,
        ErrorCode::FenceUnknown | ErrorCode::ClaimExpired => tonic::Code::FailedPrecondition,
        ErrorCode::ResourceExhausted => tonic::Code::ResourceExhausted,
        ErrorCode::Internal => tonic::Code::Internal,
        ErrorCode::Unimplemented => tonic::Code::Unimplemented,
        ErrorCode::CommandNotFound => tonic::Code::NotFound,
        ErrorCode::CommandLimit | ErrorCode::StreamLimit | ErrorCode::StdinFull => {
            tonic::Code::ResourceExhausted
        }
        ErrorCode::CommandEnded => tonic::Code::FailedPrecondition,
        ErrorCode::ExecutorUnreachable => tonic::Code::Unavailable,
    }
}

/// The gRPC status of a refusal: generic message plus `ErrorDetail{code, retryable}`. Only
/// `not_ready`, `unauthenticated`, conflicts and the transient command bounds (`stream_limit`,
/// `stdin_full`, `executor_unreachable`) keep `retryable: true`; anything else flagged
/// retryable is sent as not retryable.
pub fn refusal_status(refusal: WireError) -> tonic::Status {
    let retryable = refusal.retryable
        && matches!(
            refusal.code,
            ErrorCode::NotReady
                | ErrorCode::Unauthenticated
                | ErrorCode::Conflict
                | ErrorCode::StreamLimit
                | ErrorCode::StdinFull
                | ErrorCode::ExecutorUnreachable
        );
    let message = if refusal.code == ErrorCode::FenceUnknown {
        FENCE_UNKNOWN_MESSAGE
    } else {
        GENERIC_MESSAGE
    };
    let code = grpc_code(refusal.code);
    let status = RpcStatus {
        code: code as i32,
        message: message.to_owned(),
        details: vec![ErrorDetail::new(refusal.code.as_str(), retryable).to_any()],
    };
    tonic::Status::with_details(code, message, status.encode_to_vec().into())
}

impl From<WireError> for tonic::Status {
    fn from(refusal: WireError) -> Self {
        refusal_status(refusal)
    }
}

impl From<StoreError> for tonic::Status {
    fn from(e: StoreError) -> Self {
        refusal_status(e.wire())
    }
}

/// `google.rpc.Status`, the standard carrier of error details in `grpc-status-details-bin`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    /// The gRPC code.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// The message.
    #[prost(string, tag = "2")]
    pub message: String,
    /// The details.
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<prost_types::Any>,
}

/// Reads the `ErrorDetail` of a status, as a client does.
pub fn error_detail(status: &tonic::Status) -> Option<ErrorDetail> {
    let rpc = RpcStatus::decode(status.details()).ok()?;
    rpc.details
        .iter()
        .find(|any| any.type_url == ERROR_DETAIL_TYPE_URL)
        .and_then(|any| ErrorDetail::decode(any.value.as_slice()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::ALL_CODES;

    #[test]
    fn a_status_carries_a_generic_message_and_the_detail() {
        let status = refusal_status(WireError::retryable(ErrorCode::Conflict));
        assert_eq!(status.code(), tonic::Code::Aborted);
        assert_eq!(status.message(), GENERIC_MESSAGE);
        let detail = error_detail(&status).unwrap();
        assert_eq!((detail.code.as_str(), detail.retryable), ("conflict", true));
    }

    #[test]
    fn only_transient_codes_stay_retryable() {
        let status = refusal_status(WireError::retryable(ErrorCode::NotFound));
        assert!(!error_detail(&status).unwrap().retryable);
        let fence = refusal_status(WireError::fatal(ErrorCode::FenceUnknown));
        assert_eq!(fence.code(), tonic::Code::FailedPrecondition);
        assert_eq!(fence.message(), FENCE_UNKNOWN_MESSAGE);
    }

    #[test]
    fn every_code_round_trips_through_a_status() {
        for code in ALL_CODES {
            let status = refusal_status(WireError::fatal(code));
            assert_eq!(status.code(), grpc_code(code));
            assert_eq!(error_detail(&status).unwrap().code, code.as_str());
        }
    }
}
