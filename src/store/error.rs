//! The store's error enum: what failed, on which environment, and the stable wire code.

use crate::errors::{ErrorCode, WireError};

/// A refusal or failure of a store operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The request is malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// No such environment for this creator and owner (indistinguishable from absent).
    #[error("environment {env} not found: {reason}")]
    NotFound {
        /// The environment name.
        env: String,
        /// Why (never sent to the client).
        reason: &'static str,
    },
    /// The binding already belongs to another template.
    #[error("environment {env} already exists: {reason}")]
    AlreadyExists {
        /// The environment name.
        env: String,
        /// Why.
        reason: &'static str,
    },
    /// The state does not allow this now, or another writer won.
    #[error("environment {env} conflict: {reason}")]
    Conflict {
        /// The environment name.
        env: String,
        /// Why.
        reason: &'static str,
        /// Whether retrying the same request may succeed.
        retryable: bool,
    },
    /// The environment cannot serve this yet (not ready, fenced, transitioning).
    #[error("environment {env} not ready: {reason}")]
    NotReady {
        /// The environment name.
        env: String,
        /// Why.
        reason: &'static str,
        /// Whether retrying may succeed.
        retryable: bool,
    },
    /// An operation's outcome is unknown; the environment is fenced.
    #[error("environment {env} fenced: {reason}")]
    FenceUnknown {
        /// The environment name.
        env: String,
        /// Why.
        reason: &'static str,
    },
    /// A replayed acquisition names a claim that has already expired (DECISIONS 9).
    #[error("environment {env}: replayed run claim has expired")]
    ClaimExpired {
        /// The environment name.
        env: String,
    },
    /// A bound was exceeded.
    #[error("environment {env}: {reason}")]
    ResourceExhausted {
        /// The environment name.
        env: String,
        /// Why.
        reason: &'static str,
    },
    /// The executor answered with a typed (controlled) error.
    #[error("environment {env}: executor refused the operation ({code:?})")]
    Executor {
        /// The environment name.
        env: String,
        /// The executor's code.
        code: ErrorCode,
    },
    /// A supervised command's refusal (docs/commands.md §6 codes): unknown or foreign id,
    /// command limit, ended, stdin full, supervisor unreachable.
    #[error("environment {env}: command refused: {reason}")]
    Command {
        /// The environment name.
        env: String,
        /// The command code.
        code: ErrorCode,
        /// Why.
        reason: &'static str,
        /// Whether retrying may succeed.
        retryable: bool,
    },
    /// The Kubernetes API failed.
    #[error("environment {env}: kubernetes API failed: {source}")]
    Kube {
        /// The environment name.
        env: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

impl StoreError {
    /// The stable wire code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Self::NotFound { .. } => ErrorCode::NotFound,
            Self::AlreadyExists { .. } => ErrorCode::AlreadyExists,
            Self::Conflict { .. } => ErrorCode::Conflict,
            Self::NotReady { .. } => ErrorCode::NotReady,
            Self::FenceUnknown { .. } => ErrorCode::FenceUnknown,
            Self::ClaimExpired { .. } => ErrorCode::ClaimExpired,
            Self::ResourceExhausted { .. } => ErrorCode::ResourceExhausted,
            Self::Executor { code, .. } | Self::Command { code, .. } => *code,
            Self::Kube { .. } => ErrorCode::Internal,
        }
    }

    /// The refusal as it goes on the wire.
    pub fn wire(&self) -> WireError {
        let retryable = match self {
            Self::Conflict { retryable, .. }
            | Self::NotReady { retryable, .. }
            | Self::Command { retryable, .. } => *retryable,
            _ => false,
        };
        WireError {
            code: self.code(),
            retryable,
        }
    }

    /// The bounded class of this failure for diagnostics (api-security §3): the controlled
    /// code of a typed refusal, or the class of a Kubernetes API failure (`other` when it has
    /// none). Never derived from the error's text.
    pub fn diagnostic_class(&self) -> &'static str {
        let Self::Kube { source, .. } = self else {
            return self.code().as_str();
        };
        let kube::Error::Api(status) = source else {
            return "other";
        };
        match (status.code, status.reason.as_str()) {
            (409, "AlreadyExists") => "already_exists",
            (409, _) => "conflict",
            (400 | 422, _) => "invalid",
            (401, _) => "unauthorized",
            (403, _) => "forbidden",
            (404, _) => "not_found",
            (408 | 504, _) => "timeout",
            (429, _) => "rate_limited",
            (503, _) => "unavailable",
            _ => "other",
        }
    }

    pub(crate) fn command(env: &str, code: ErrorCode, reason: &'static str) -> Self {
        let retryable = matches!(code, ErrorCode::StdinFull | ErrorCode::ExecutorUnreachable);
        Self::Command {
            env: env.to_owned(),
            code,
            reason,
            retryable,
        }
    }

    pub(crate) fn not_found(env: &str, reason: &'static str) -> Self {
        Self::NotFound {
            env: env.to_owned(),
            reason,
        }
    }

    pub(crate) fn conflict(env: &str, reason: &'static str) -> Self {
        Self::Conflict {
            env: env.to_owned(),
            reason,
            retryable: false,
        }
    }

    pub(crate) fn not_ready(env: &str, reason: &'static str) -> Self {
        Self::NotReady {
            env: env.to_owned(),
            reason,
            retryable: false,
        }
    }

    pub(crate) fn fence(env: &str, reason: &'static str) -> Self {
        Self::FenceUnknown {
            env: env.to_owned(),
            reason,
        }
    }

    pub(crate) fn kube(env: &str, source: kube::Error) -> Self {
        Self::Kube {
            env: env.to_owned(),
            source,
        }
    }
}
