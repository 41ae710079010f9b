//! Errors of the OpenBao client, each classified by what the caller should do next.
//!
//! OpenBao answers failures with `{"errors": [...]}` and an HTTP status. The client keeps both
//! (see [`Error::status`] and [`Error::errors`]) and sorts every failure into an [`ErrorKind`].
//! No variant ever carries a token, a JWT or a secret value: response bodies are only kept as
//! OpenBao's own `errors[]` strings, and decoding failures keep the decoder's category and
//! position, never the offending text.

use std::fmt;

use monky_http::{CertificateRefusal, CertificateTime};

use monky_vocab::{KvPathRefused, PathRefusal};

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a caller should do about an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Network failure, timeout, TLS failure, 5xx, 429, a sealed OpenBao or a body that is not
    /// JSON: trying again later may succeed.
    Temporary,
    /// 403: the token is expired, revoked or unknown, or its policy does not cover the path.
    PermissionDenied,
    /// 404: the path or version does not exist, or the version was deleted or destroyed.
    NotFound,
    /// 400 at login: the JWT was refused (signature, audience, expiry, bound claims, role).
    LoginRejected,
    /// Refused locally before any request, or any other 4xx, or a JSON answer of the wrong shape.
    Refused,
    /// The server's certificate is expired or not yet valid by this machine's clock: either the
    /// clock is wrong or the certificate is; waiting does not fix either.
    CertificateTime,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Temporary => "temporary",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::NotFound => "not found",
            ErrorKind::LoginRejected => "login rejected",
            ErrorKind::Refused => "refused",
            ErrorKind::CertificateTime => "certificate time",
        })
    }
}

/// Why a KV v2 read found nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Absence {
    /// The path or the requested version does not exist (`404` with an empty `errors` list).
    Missing,
    /// The version was soft-deleted at the given time (`404` with a full envelope whose
    /// `metadata.deletion_time` is set); it can be undeleted.
    Deleted {
        /// OpenBao's `deletion_time`, RFC 3339.
        deletion_time: String,
    },
    /// The version was destroyed (`404` with `metadata.destroyed = true`); it is gone for good.
    Destroyed,
}

/// An error talking to OpenBao, or a request refused locally.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configured OpenBao address cannot be used.
    #[error("invalid openbao address {addr}: {reason}")]
    InvalidAddress {
        /// The address as configured.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The CA bundle cannot be used as a trust root.
    #[error("invalid ca bundle: {reason}")]
    CaBundle {
        /// What is wrong with it.
        reason: String,
    },

    /// The HTTP client could not be built.
    #[error("cannot build the openbao http client")]
    Build {
        /// monky-http's error: reqwest's, or its runtime's.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A mount or role name that would not stay one path segment.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// Which parameter (`mount`, `role`).
        what: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A KV path from a manifest was refused before any request was sent.
    #[error("kv path {path:?} refused: {reason}")]
    PathRefused {
        /// The path as given.
        path: String,
        /// Why it was refused.
        reason: PathRefusal,
    },

    /// The connection check refused the peer; nothing of the request (and so no token) was
    /// sent.
    #[error("request to {url} not sent: {reason}")]
    ConnectionCheck {
        /// The URL (never carries a token).
        url: String,
        /// The check's refusal, as it reads.
        reason: String,
        /// reqwest's error, whose chain holds the check's own error.
        #[source]
        source: reqwest::Error,
    },

    /// The request did not complete: connection, timeout, or reading the body.
    #[error("request to {url} failed")]
    Network {
        /// The URL (never carries a token).
        url: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },

    /// The answer's body could not be read to its end (cut, reset, timed out).
    #[error("reading the answer of {url} failed")]
    BodyRead {
        /// The URL.
        url: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The TLS handshake failed because the server's certificate was rejected.
    #[error("tls certificate of {url} rejected: {reason}")]
    Tls {
        /// The URL.
        url: String,
        /// Why, typed.
        refusal: CertificateRefusal,
        /// The verifier's reason, for a person.
        reason: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },

    /// The TLS handshake failed because the server's certificate is expired or not yet valid
    /// by this machine's clock.
    #[error("tls certificate of {url} is {problem} by this machine's clock: {reason}")]
    CertificateTime {
        /// The URL.
        url: String,
        /// Expired or not yet valid.
        problem: CertificateTime,
        /// The verifier's reason (with the times when it names them).
        reason: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },

    /// OpenBao is sealed (503 `Vault is sealed`).
    #[error("openbao at {url} is sealed (status {status})")]
    Sealed {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// OpenBao's `errors[]`.
        errors: Vec<String>,
    },

    /// OpenBao failed or is overloaded (5xx other than sealed, or 429).
    #[error("openbao unavailable at {url} (status {status}): {}", summary(.errors))]
    Unavailable {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// OpenBao's `errors[]`.
        errors: Vec<String>,
    },

    /// 403: the token is not valid, or its policy does not allow the path.
    #[error("permission denied at {url} (status {status}): {}", summary(.errors))]
    PermissionDenied {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// OpenBao's `errors[]`, verbatim.
        errors: Vec<String>,
        /// `true` when OpenBao used its multi-error form (`1 error occurred:\n\t* permission
        /// denied\n\n`), which its ACL check produces; `false` for the plain
        /// `permission denied` it answers for an expired, revoked or unknown token.
        multi_error: bool,
    },

    /// 400 at login: the JWT was refused.
    #[error("login at auth/{mount} as role {role} rejected (status {status}): {}", summary(.errors))]
    LoginRejected {
        /// The auth mount.
        mount: String,
        /// The role.
        role: String,
        /// The HTTP status.
        status: u16,
        /// OpenBao's `errors[]`, verbatim.
        errors: Vec<String>,
    },

    /// 404: nothing at the path, or the version was deleted or destroyed.
    #[error("{path}{} {}", version_suffix(*.version), absence_text(.absence))]
    NotFound {
        /// The API path (below `/v1/`).
        path: String,
        /// The version asked for, `None` for the latest.
        version: Option<u64>,
        /// The version OpenBao reported in the envelope of a deleted or destroyed version.
        found_version: Option<u64>,
        /// Why nothing was returned.
        absence: Absence,
        /// The HTTP status (404).
        status: u16,
        /// OpenBao's `errors[]` (empty for a missing path).
        errors: Vec<String>,
    },

    /// Any other refusal by OpenBao (other 4xx, or a redirect, which is never followed).
    #[error("request to {url} refused (status {status}): {}", summary(.errors))]
    Rejected {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// OpenBao's `errors[]`.
        errors: Vec<String>,
    },

    /// The answer could not be decoded.
    #[error("unexpected answer from {url} (status {status}): {detail}")]
    UnexpectedBody {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// `true` if the body was JSON but of the wrong shape; `false` if it was not JSON at all
        /// (a proxy page, say).
        json: bool,
        /// The decoder's category and position; never the body's text.
        detail: String,
    },

    /// The secret document has no string `value`.
    #[error("secret {path}{} has no string `value`", version_suffix(*.version))]
    MissingValue {
        /// The API path.
        path: String,
        /// The version asked for.
        version: Option<u64>,
    },
}

impl From<KvPathRefused> for Error {
    /// A manifest path [`KvPath::parse`](monky_vocab::KvPath::parse) refused, as this client's
    /// refusal, so a parse and a read chain with `?`.
    fn from(e: KvPathRefused) -> Self {
        Error::PathRefused {
            path: e.path,
            reason: e.reason,
        }
    }
}

impl Error {
    /// How the caller should treat this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Network { .. }
            | Error::BodyRead { .. }
            | Error::Tls { .. }
            | Error::Sealed { .. }
            | Error::Unavailable { .. } => ErrorKind::Temporary,
            Error::UnexpectedBody { json, .. } => {
                if *json {
                    ErrorKind::Refused
                } else {
                    ErrorKind::Temporary
                }
            }
            Error::CertificateTime { .. } => ErrorKind::CertificateTime,
            Error::PermissionDenied { .. } => ErrorKind::PermissionDenied,
            Error::NotFound { .. } => ErrorKind::NotFound,
            Error::LoginRejected { .. } => ErrorKind::LoginRejected,
            Error::InvalidAddress { .. }
            | Error::CaBundle { .. }
            | Error::Build { .. }
            | Error::InvalidName { .. }
            | Error::PathRefused { .. }
            | Error::ConnectionCheck { .. }
            | Error::Rejected { .. }
            | Error::MissingValue { .. } => ErrorKind::Refused,
        }
    }

    /// The connection check's own error, when it refused the connection
    /// ([`BaoClientBuilder::connection_check`](crate::BaoClientBuilder::connection_check)); the
    /// caller downcasts it to its own type.
    pub fn check_refusal(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Error::ConnectionCheck { source, .. } => monky_http::connect::refusal_in(source),
            _ => None,
        }
    }

    /// The HTTP status OpenBao answered with, if the request got that far.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Sealed { status, .. }
            | Error::Unavailable { status, .. }
            | Error::PermissionDenied { status, .. }
            | Error::LoginRejected { status, .. }
            | Error::NotFound { status, .. }
            | Error::Rejected { status, .. }
            | Error::UnexpectedBody { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// OpenBao's own `errors[]` strings, verbatim; empty when there were none.
    pub fn errors(&self) -> &[String] {
        match self {
            Error::Sealed { errors, .. }
            | Error::Unavailable { errors, .. }
            | Error::PermissionDenied { errors, .. }
            | Error::LoginRejected { errors, .. }
            | Error::NotFound { errors, .. }
            | Error::Rejected { errors, .. } => errors,
            _ => &[],
        }
    }

    /// Why a KV read found nothing, for [`ErrorKind::NotFound`].
    pub fn absence(&self) -> Option<&Absence> {
        match self {
            Error::NotFound { absence, .. } => Some(absence),
            _ => None,
        }
    }

    /// Which way the server's certificate missed this machine's clock, for
    /// [`ErrorKind::CertificateTime`].
    pub fn certificate_time(&self) -> Option<CertificateTime> {
        match self {
            Error::CertificateTime { problem, .. } => Some(*problem),
            _ => None,
        }
    }

    /// Why a path was refused locally, for [`Error::PathRefused`].
    pub fn path_refusal(&self) -> Option<PathRefusal> {
        match self {
            Error::PathRefused { reason, .. } => Some(*reason),
            _ => None,
        }
    }
}

/// One line for OpenBao's `errors[]`: whitespace runs (the multi-error form's `\n\t* `)
/// collapse to one space.
fn summary(errors: &[String]) -> String {
    if errors.is_empty() {
        return "no error text".to_owned();
    }
    errors
        .iter()
        .map(|e| e.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("; ")
}

fn version_suffix(version: Option<u64>) -> String {
    match version {
        Some(v) => format!(" version {v}"),
        None => String::new(),
    }
}

fn absence_text(absence: &Absence) -> String {
    match absence {
        Absence::Missing => "not found".to_owned(),
        Absence::Deleted { deletion_time } => format!("was deleted at {deletion_time}"),
        Absence::Destroyed => "was destroyed".to_owned(),
    }
}

/// A decoding failure described without any of the decoded text.
pub(crate) fn describe_json_error(err: &serde_json::Error) -> String {
    let category = match err.classify() {
        serde_json::error::Category::Io => "io error",
        serde_json::error::Category::Syntax => "not json",
        serde_json::error::Category::Data => "json of an unexpected shape",
        serde_json::error::Category::Eof => "truncated json",
    };
    format!("{category} at line {} column {}", err.line(), err.column())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_error_text_is_one_line_in_display() {
        let err = Error::PermissionDenied {
            url: "https://bao.example.test:8200/v1/monky/data/a/see/b".into(),
            status: 403,
            errors: vec!["1 error occurred:\n\t* permission denied\n\n".into()],
            multi_error: true,
        };
        assert_eq!(
            err.to_string(),
            "permission denied at https://bao.example.test:8200/v1/monky/data/a/see/b \
             (status 403): 1 error occurred: * permission denied"
        );
        assert_eq!(
            err.errors()[0],
            "1 error occurred:\n\t* permission denied\n\n"
        );
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert_eq!(err.status(), Some(403));
    }

    #[test]
    fn not_found_says_which_absence() {
        let check = |absence: Absence, version: Option<u64>, expected: &str| {
            let err = Error::NotFound {
                path: "monky/data/env-a/see/pg".into(),
                version,
                found_version: version,
                absence,
                status: 404,
                errors: vec![],
            };
            assert_eq!(err.to_string(), expected);
            assert_eq!(err.kind(), ErrorKind::NotFound);
        };
        check(Absence::Missing, None, "monky/data/env-a/see/pg not found");
        check(
            Absence::Deleted {
                deletion_time: "2026-09-05T07:40:00Z".into(),
            },
            Some(2),
            "monky/data/env-a/see/pg version 2 was deleted at 2026-09-05T07:40:00Z",
        );
        check(
            Absence::Destroyed,
            Some(1),
            "monky/data/env-a/see/pg version 1 was destroyed",
        );
    }

    #[test]
    fn json_error_description_never_quotes_the_input() {
        let secret = "s.AAAAAAAAAAAAAAAAAAAAAAAA";
        let err = serde_json::from_str::<u64>(&format!("\"{secret}\"")).unwrap_err();
        assert!(
            err.to_string().contains(secret),
            "serde itself quotes the input"
        );
        let described = describe_json_error(&err);
        assert!(!described.contains(secret));
        assert!(described.starts_with("json of an unexpected shape"));
    }
}
