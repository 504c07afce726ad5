//! The stable error codes of the core: the closed set every layer (store, reconciler, executor,
//! security) reports its refusals in, and whether a refusal may succeed on retry.
//!
//! Every layer has its own error enum with a `code()` returning an [`ErrorCode`]. This module
//! knows nothing of gRPC or protobuf: only `crate::server::status` turns a code into a
//! `tonic::Status` carrying an `ErrorDetail`, so backend and Kubernetes messages never reach the
//! wire and the core does not depend on the generated types.

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
    /// No command of this id for this claim (unknown, foreign, or of an earlier claim).
    CommandNotFound,
    /// The environment already runs its most concurrent commands.
    CommandLimit,
    /// The output streams' bound is reached.
    StreamLimit,
    /// The command's stdin buffer is full.
    StdinFull,
    /// The command has ended (or has no stdin pipe, or no terminal).
    CommandEnded,
    /// The executor's supervisor could not be reached; nothing was changed.
    ExecutorUnreachable,
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
            Self::CommandNotFound => "command_not_found",
            Self::CommandLimit => "command_limit",
            Self::StreamLimit => "stream_limit",
            Self::StdinFull => "stdin_full",
            Self::CommandEnded => "command_ended",
            Self::ExecutorUnreachable => "executor_unreachable",
        }
    }

    /// Parses a stable code; unknown codes are `None`.
    pub fn parse(code: &str) -> Option<Self> {
        ALL_CODES.into_iter().find(|c| c.as_str() == code)
    }
}

/// Every code, in declaration order.
pub const ALL_CODES: [ErrorCode; 20] = [
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
    ErrorCode::CommandNotFound,
    ErrorCode::CommandLimit,
    ErrorCode::StreamLimit,
    ErrorCode::StdinFull,
    ErrorCode::CommandEnded,
    ErrorCode::ExecutorUnreachable,
];

/// A refusal as the server will send it: a code and whether retrying may help.
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
}
