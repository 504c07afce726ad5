//! The reconciler's error enum: why a reconcile or the start-up preflight did not finish, with
//! the stable code of each.

use crate::errors::ErrorCode;
use crate::store::StoreError;

/// Why a reconcile did not finish. Every error leads to a rate-limited retry.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A status write or read failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The Kubernetes API failed on a runtime object.
    #[error("environment {env}: {what}: {source}")]
    Kube {
        /// The environment.
        env: String,
        /// What was being done.
        what: &'static str,
        /// The cause.
        source: Box<kube::Error>,
    },
    /// An existing runtime object does not have exactly the expected shape or identity; it
    /// is never adopted.
    #[error("environment {env}: {what}")]
    Mismatch {
        /// The environment.
        env: String,
        /// What does not match.
        what: String,
    },
    /// The environment is fenced: nothing in flight can be trusted.
    #[error("environment {env}: fenced: {what}")]
    Fenced {
        /// The environment.
        env: String,
        /// Why.
        what: &'static str,
    },
    /// The observation a decision was based on changed before it could be written.
    #[error("environment {env}: {what}")]
    Conflict {
        /// The environment.
        env: String,
        /// What changed.
        what: &'static str,
    },
    /// Two failures of one reconcile: the first, then the one met while recording it.
    #[error("{first}; and then: {then}")]
    Joined {
        /// The failure of the step.
        first: Box<ReconcileError>,
        /// The failure of recording it in the status.
        then: Box<ReconcileError>,
    },
}

impl ReconcileError {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Store(e) => e.code(),
            Self::Kube { .. } => ErrorCode::Internal,
            Self::Mismatch { .. } => ErrorCode::Conflict,
            Self::Fenced { .. } => ErrorCode::FenceUnknown,
            Self::Conflict { .. } => ErrorCode::Conflict,
            Self::Joined { first, .. } => first.code(),
        }
    }

    /// `first`, joined with `then` when recording it failed too.
    pub fn join(first: ReconcileError, then: Result<(), ReconcileError>) -> ReconcileError {
        match then {
            Ok(()) => first,
            Err(then) => Self::Joined {
                first: Box::new(first),
                then: Box::new(then),
            },
        }
    }

    pub(crate) fn mismatch(env: &str, what: impl Into<String>) -> Self {
        Self::Mismatch {
            env: env.to_owned(),
            what: what.into(),
        }
    }

    pub(crate) fn kube(env: &str, what: &'static str) -> impl FnOnce(kube::Error) -> Self {
        let env = env.to_owned();
        move |source| Self::Kube {
            env,
            what,
            source: Box::new(source),
        }
    }
}

/// Why the start-up initialisation failed (k8s-executor §2.1).
#[derive(Debug, Clone, thiserror::Error)]
pub enum InitError {
    /// A RuntimeClass or StorageClass the templates name is missing or unusable.
    #[error("profile preflight: {0}")]
    Preflight(String),
    /// The capacity ledger ConfigMap is missing or cannot be read.
    #[error("capacity ledger: {0}")]
    Ledger(String),
    /// The caches of environments, Pods or PVCs could not be filled.
    #[error("execution environment informer failed to sync: {0}")]
    Cache(String),
}

impl InitError {
    /// The readiness reason this failure is reported as.
    pub fn readiness_reason(&self) -> &'static str {
        match self {
            Self::Preflight(_) => "profile-resource-unavailable",
            Self::Ledger(_) => "capacity-ledger-unavailable",
            Self::Cache(_) => "controller-cache-unavailable",
        }
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::NotReady
    }
}
