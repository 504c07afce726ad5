//! The wire error model: stable `ErrorDetail.code` values, their gRPC codes, and the one place
//! that turns them into a `tonic::Status` with a generic message and an `ErrorDetail`.
//!
//! Every layer has its own error enum with a `code()` returning an [`ErrorCode`]; backend and
//! Kubernetes messages never reach the wire. A retryable conflict goes out as ABORTED with
//! `retryable: true` (DECISIONS 7).

use prost::Message;

use crate::api::pb::ErrorDetail;

/// The generic message every refusal carries.
pub const GENERIC_MESSAGE: &str = "execution provider request failed";
/// The message of `fence_unknown`, which asks the client to verify termination itself.
pub const FENCE_UNKNOWN_MESSAGE: &str =
    "execution provider request failed; verify termination independently or use external fencing";
use crate::api::ERROR_DETAIL_TYPE_URL;

/// The closed set of stable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorCode {
    /// The request is malformed.
    InvalidArgument,
    /// The caller is not authenticated.
    Unauthenticated,
    /// The caller may not do this.
    PermissionDenied,
    /// No such environment (or not the caller's).
    NotFound,
    /// The target already exists.
    AlreadyExists,
    /// Another writer won, or the state does not allow this now.
    Conflict,
    /// A compare-and-swap version did not match.
    VersionMismatch,
    /// A directory to remove is not empty.
    DirectoryNotEmpty,
    /// The provider is not ready.
    NotReady,
    /// An operation's outcome is unknown; the environment is fenced.
    FenceUnknown,
    /// A replayed run-claim acquisition names an expired claim.
    ClaimExpired,
    /// A bound was exceeded.
    ResourceExhausted,
    /// An internal failure.
    Internal,
    /// The RPC is not implemented yet.
    Unimplemented,
}

impl ErrorCode {
    /// The stable string in `ErrorDetail.code`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidArgument => "invalid_argument",
            Self::Unauthenticated => "unauthenticated",
            Self::PermissionDenied => "permission_denied",
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::Conflict => "conflict",
            Self::VersionMismatch => "version_mismatch",
            Self::DirectoryNotEmpty => "directory_not_empty",
            Self::NotReady => "not_ready",
            Self::FenceUnknown => "fence_unknown",
            Self::ClaimExpired => "claim_expired",
            Self::ResourceExhausted => "resource_exhausted",
            Self::Internal => "internal",
            Self::Unimplemented => "unimplemented",
        }
    }

    /// Parses a stable code; unknown codes are `None`.
    pub fn parse(code: &str) -> Option<Self> {
        ALL_CODES.into_iter().find(|c| c.as_str() == code)
    }

    /// The gRPC code this error travels as.
    pub fn grpc(self) -> tonic::Code {
        match self {
            Self::InvalidArgument => tonic::Code::InvalidArgument,
            Self::Unauthenticated => tonic::Code::Unauthenticated,
            Self::PermissionDenied => tonic::Code::PermissionDenied,
            Self::NotFound => tonic::Code::NotFound,
            Self::AlreadyExists => tonic::Code::AlreadyExists,
            Self::Conflict | Self::VersionMismatch | Self::DirectoryNotEmpty => {
                tonic::Code::Aborted
            }
            Self::NotReady => tonic::Code::Unavailable,
            Self::FenceUnknown | Self::ClaimExpired => tonic::Code::FailedPrecondition,
            Self::ResourceExhausted => tonic::Code::ResourceExhausted,
            Self::Internal => tonic::Code::Internal,
            Self::Unimplemented => tonic::Code::Unimplemented,
        }
    }
}

const ALL_CODES: [ErrorCode; 14] = [
    ErrorCode::InvalidArgument,
    ErrorCode::Unauthenticated,
    ErrorCode::PermissionDenied,
    ErrorCode::NotFound,
    ErrorCode::AlreadyExists,
    ErrorCode::Conflict,
    ErrorCode::VersionMismatch,
    ErrorCode::DirectoryNotEmpty,
    ErrorCode::NotReady,
    ErrorCode::FenceUnknown,
    ErrorCode::ClaimExpired,
    ErrorCode::ResourceExhausted,
    ErrorCode::Internal,
    ErrorCode::Unimplemented,
];

/// A refusal as it goes on the wire: a code and whether retrying may help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireError {
    /// The stable code.
    pub code: ErrorCode,
    /// Whether the same request may succeed later.
    pub retryable: bool,
}

impl WireError {
    /// A refusal that retrying will not fix.
    pub fn fatal(code: ErrorCode) -> Self {
        Self {
            code,
            retryable: false,
        }
    }

    /// A refusal that may succeed on retry.
    pub fn retryable(code: ErrorCode) -> Self {
        Self {
            code,
            retryable: true,
        }
    }

    /// The gRPC status: generic message plus `ErrorDetail{code, retryable}`. Only
    /// `not_ready`, `unauthenticated` and conflicts keep `retryable: true`; anything else
    /// flagged retryable is sent as not retryable.
    pub fn into_status(self) -> tonic::Status {
        let retryable = self.retryable
            && matches!(
                self.code,
                ErrorCode::NotReady | ErrorCode::Unauthenticated | ErrorCode::Conflict
            );
        let detail = ErrorDetail {
            code: self.code.as_str().to_owned(),
            retryable,
        };
        let message = if self.code == ErrorCode::FenceUnknown {
            FENCE_UNKNOWN_MESSAGE
        } else {
            GENERIC_MESSAGE
        };
        let any = prost_types::Any {
            type_url: ERROR_DETAIL_TYPE_URL.to_owned(),
            value: detail.encode_to_vec(),
        };
        let status = RpcStatus {
            code: self.code.grpc() as i32,
            message: message.to_owned(),
            details: vec![any],
        };
        tonic::Status::with_details(self.code.grpc(), message, status.encode_to_vec().into())
    }
}

impl From<WireError> for tonic::Status {
    fn from(e: WireError) -> Self {
        e.into_status()
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

    #[test]
    fn every_code_round_trips_through_its_string() {
        for code in ALL_CODES {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
        }
        assert_eq!(ErrorCode::parse("bogus"), None);
    }

    #[test]
    fn a_status_carries_a_generic_message_and_the_detail() {
        let status = WireError::retryable(ErrorCode::Conflict).into_status();
        assert_eq!(status.code(), tonic::Code::Aborted);
        assert_eq!(status.message(), GENERIC_MESSAGE);
        let detail = error_detail(&status).unwrap();
        assert_eq!((detail.code.as_str(), detail.retryable), ("conflict", true));
    }

    #[test]
    fn only_transient_codes_stay_retryable() {
        let status = WireError::retryable(ErrorCode::NotFound).into_status();
        assert!(!error_detail(&status).unwrap().retryable);
        let fence = WireError::fatal(ErrorCode::FenceUnknown).into_status();
        assert_eq!(fence.code(), tonic::Code::FailedPrecondition);
        assert_eq!(fence.message(), FENCE_UNKNOWN_MESSAGE);
    }
}
