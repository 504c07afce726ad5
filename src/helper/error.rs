//! The helper's errors and their mapping to the closed wire code set (k8s-executor §4.3).

use std::io;

use crate::executor::protocol::{ErrorCode, ExecutorError};

/// Message of every internal error: raw OS or library messages never leave the helper.
pub const INTERNAL_MESSAGE: &str = "executor operation failed";
/// Message of a generic request bound violation.
pub const BOUNDS_MESSAGE: &str = "executor request exceeds configured bounds";

/// Why a helper operation did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The request is malformed or asks for something the helper does not do.
    #[error("{0}")]
    InvalidArgument(String),
    /// The path (or a symlink on it) leads outside the workspace, or cannot be verified.
    #[error("path is outside workspace")]
    OutsideWorkspace,
    /// The file does not exist.
    #[error("file not found")]
    NotFound,
    /// The destination exists.
    #[error("destination already exists")]
    AlreadyExists,
    /// The directory is not empty.
    #[error("directory not empty")]
    NotEmpty,
    /// The current content does not have the expected version.
    #[error("version mismatch")]
    VersionMismatch,
    /// A bound was exceeded.
    #[error("{0}")]
    ResourceExhausted(&'static str),
    /// A mutating operation did not finish before its deadline: whether it took effect is
    /// unknown.
    #[error("executor operation did not finish in time")]
    Unfinished,
    /// Anything else; the detail stays in the helper.
    #[error("{INTERNAL_MESSAGE}")]
    Internal(String),
}

impl HelperError {
    /// An internal error with a detail that is never sent.
    pub fn internal(detail: impl Into<String>) -> Self {
        HelperError::Internal(detail.into())
    }

    /// The stable wire code.
    pub fn code(&self) -> ErrorCode {
        match self {
            HelperError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            HelperError::OutsideWorkspace => ErrorCode::PermissionDenied,
            HelperError::NotFound => ErrorCode::NotFound,
            HelperError::AlreadyExists => ErrorCode::AlreadyExists,
            HelperError::NotEmpty => ErrorCode::Conflict,
            HelperError::VersionMismatch => ErrorCode::VersionMismatch,
            HelperError::ResourceExhausted(_) => ErrorCode::ResourceExhausted,
            HelperError::Unfinished => ErrorCode::FenceUnknown,
            HelperError::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The structured error sent on the wire.
    pub fn to_wire(&self) -> ExecutorError {
        ExecutorError::new(self.code(), self.to_string())
    }
}

impl From<io::Error> for HelperError {
    fn from(error: io::Error) -> Self {
        match error.kind() {
            io::ErrorKind::NotFound => HelperError::NotFound,
            io::ErrorKind::AlreadyExists => HelperError::AlreadyExists,
            io::ErrorKind::DirectoryNotEmpty => HelperError::NotEmpty,
            // The confined directory handle reports an escape as a synthesised (non-OS)
            // permission error; a real EACCES from the kernel stays internal.
            io::ErrorKind::PermissionDenied if error.raw_os_error().is_none() => {
                HelperError::OutsideWorkspace
            }
            _ if error.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error()) => {
                HelperError::OutsideWorkspace
            }
            _ => HelperError::Internal(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_to_the_spec_codes() {
        let code = |e: io::Error| HelperError::from(e).code();
        assert_eq!(code(io::ErrorKind::NotFound.into()), ErrorCode::NotFound);
        assert_eq!(
            code(io::ErrorKind::AlreadyExists.into()),
            ErrorCode::AlreadyExists
        );
        assert_eq!(
            code(io::ErrorKind::DirectoryNotEmpty.into()),
            ErrorCode::Conflict
        );
        assert_eq!(
            code(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "a path led outside"
            )),
            ErrorCode::PermissionDenied
        );
        assert_eq!(code(io::Error::from_raw_os_error(13)), ErrorCode::Internal);
        assert_eq!(
            code(io::Error::from_raw_os_error(18)),
            ErrorCode::PermissionDenied
        );
    }

    #[test]
    fn internal_errors_never_leak_their_detail() {
        let wire = HelperError::internal("open /secret: EIO").to_wire();
        assert_eq!(wire.code, ErrorCode::Internal);
        assert_eq!(wire.message, INTERNAL_MESSAGE);
    }
}
