//! The crate's error type: refusals, and registry credentials that cannot be used.

use crate::refusal::{Refusal, RefusalCode};

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong. No variant ever carries a secret value.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bundle is refused; report `refusal` as the failure detail.
    #[error("{0}")]
    Refused(#[from] Refusal),
    /// A registry credential read from OpenBao cannot be used. `problem` names what is wrong
    /// with it, never the value.
    #[error("registry credential: {problem}")]
    RegistryCredential {
        /// What is wrong, e.g. `json has no password`.
        problem: &'static str,
    },
}

/// The broad class of an [`Error`], for callers that branch.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bundle refusal: report it as `failed` with the refusal as detail.
    Refused,
    /// The registry credential is unusable: private images will not pull.
    RegistryCredential,
}

impl Error {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Refused(_) => ErrorKind::Refused,
            Error::RegistryCredential { .. } => ErrorKind::RegistryCredential,
        }
    }

    /// The refusal, when this error is one.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Error::Refused(r) => Some(r),
            Error::RegistryCredential { .. } => None,
        }
    }

    /// The refusal code, when this error is a refusal.
    pub fn code(&self) -> Option<RefusalCode> {
        self.refusal().map(|r| r.code)
    }
}
