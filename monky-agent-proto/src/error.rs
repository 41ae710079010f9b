//! The client's error type and the classification callers branch on.

use std::time::Duration;

use url::Url;

use crate::wire::ErrorCode;
use monky_http::CertificateTime;

/// Result of client calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a failed call should be treated by its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Try again later: network, timeout, 429, 5xx, or a body that is not JSON (a proxy page).
    Temporary,
    /// 403 `AGENT_ENV_MISMATCH`: the token belongs to another environment; never retried.
    EnvMismatch,
    /// 401: the bearer is unknown, revoked or its grant was superseded.
    Unauthenticated,
    /// Any other 4xx, a response of the wrong shape, or a local refusal.
    Refused,
}

const LEASE_SHAPE: &ErrorCode = &ErrorCode::LeaseShape;
const CHECKIN_INVALID: &ErrorCode = &ErrorCode::CheckinInvalid;
const LEASE_INVALID: &ErrorCode = &ErrorCode::LeaseInvalid;
const BUNDLE_TOO_LARGE: &ErrorCode = &ErrorCode::BundleTooLarge;

/// A failed tenancy call. Messages never contain the bearer token or a grant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The base URL cannot be used for agent calls.
    #[error("invalid tenancy base url {url}: {reason}")]
    BaseUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The CA bundle cannot be used as a trust root: it does not parse, or holds no
    /// certificate.
    #[error("invalid tenancy ca bundle: {reason}")]
    CaBundle {
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the tenancy http client")]
    Build {
        /// monky-http's error: reqwest's, or its runtime's.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A bundle URL from checkin points away from tenancy, or does not parse.
    #[error("refusing bundle url {url}: {reason}")]
    BundleUrl {
        /// The URL as received.
        url: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The request did not produce a response: connect, TLS, timeout or a broken exchange.
    #[error("request to {url} failed")]
    Transport {
        /// The URL called (the original, not the mapped address).
        url: Box<Url>,
        /// reqwest's error.
        #[source]
        source: reqwest::Error,
    },
    /// The connection check refused the peer; nothing of the request was sent.
    #[error("request to {url} not sent: {reason}")]
    ConnectionCheck {
        /// The URL called.
        url: Box<Url>,
        /// The check's refusal, as it reads.
        reason: String,
        /// reqwest's error, whose chain holds the check's own error.
        #[source]
        source: reqwest::Error,
    },
    /// Reading the response body failed part way.
    #[error("reading the response from {url} failed")]
    Read {
        /// The URL called.
        url: Box<Url>,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// Tenancy answered with an error status and a JSON body.
    #[error("tenancy answered {status} from {url}: {} {detail}", code.as_ref().map_or("(no code)", ErrorCode::as_str))]
    Status {
        /// The URL called.
        url: Box<Url>,
        /// HTTP status.
        status: u16,
        /// The envelope's `code`, when there was one.
        code: Option<ErrorCode>,
        /// The envelope's `detail` (empty when absent).
        detail: String,
        /// `Retry-After` (seconds or an HTTP date), at most an hour.
        retry_after: Option<Duration>,
    },
    /// The body is not JSON, as when a proxy answers instead of tenancy.
    #[error("tenancy answered {status} from {url} with a body that is not json ({})", content_type.as_deref().unwrap_or("no content type"))]
    NotJson {
        /// The URL called.
        url: Box<Url>,
        /// HTTP status.
        status: u16,
        /// The response's content type.
        content_type: Option<String>,
        /// `Retry-After` (seconds or an HTTP date), at most an hour.
        retry_after: Option<Duration>,
    },
    /// A successful response whose JSON does not have the expected shape.
    #[error("unexpected response shape from {url}")]
    Shape {
        /// The URL called.
        url: Box<Url>,
        /// HTTP status.
        status: u16,
        /// What did not fit, with every quoted value the decoder would show left out: a field
        /// of the wrong type may hold a token.
        detail: String,
    },
    /// A checkin or lease answer the agent must not act on: it does not decode into the call's
    /// shape (a `desired_sha` that is not 64 lowercase hex digits, a field of the wrong type),
    /// or it is for another env than the request's.
    #[error("{}: answer from {url}: {detail}", call.code())]
    Invalid {
        /// The URL called.
        url: Box<Url>,
        /// HTTP status.
        status: u16,
        /// Which call answered.
        call: Call,
        /// What is wrong, with no value the decoder would quote.
        detail: String,
    },
    /// A lease body in the retired AppRole shape (`wrapping_token`/`role_id`); never unwrapped.
    #[error("LEASE_SHAPE: lease from {url} has the retired approle shape; tenancy is stale")]
    LeaseShape {
        /// The URL called.
        url: Box<Url>,
    },
    /// The bundle is larger than the configured limit; the body was not read beyond it.
    #[error("BUNDLE_TOO_LARGE: bundle from {url} exceeds {limit} bytes")]
    BundleTooLarge {
        /// The URL called.
        url: Box<Url>,
        /// The limit in bytes.
        limit: u64,
    },
}

impl Error {
    /// How the caller should treat this failure.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Transport { source, .. } if source.is_builder() => ErrorKind::Refused,
            Error::Transport { .. } | Error::Read { .. } | Error::NotJson { .. } => {
                ErrorKind::Temporary
            }
            Error::Status { status, code, .. } => match (status, code) {
                (429 | 500..=599, _) => ErrorKind::Temporary,
                (401, _) => ErrorKind::Unauthenticated,
                (403, Some(ErrorCode::AgentEnvMismatch)) => ErrorKind::EnvMismatch,
                _ => ErrorKind::Refused,
            },
            Error::BaseUrl { .. }
            | Error::CaBundle { .. }
            | Error::Build { .. }
            | Error::BundleUrl { .. }
            | Error::ConnectionCheck { .. }
            | Error::Shape { .. }
            | Error::Invalid { .. }
            | Error::LeaseShape { .. }
            | Error::BundleTooLarge { .. } => ErrorKind::Refused,
        }
    }

    /// The connection check's own error, when it refused the connection
    /// ([`ClientBuilder::connection_check`](crate::ClientBuilder::connection_check)); the
    /// caller downcasts it to its own type.
    #[must_use]
    pub fn check_refusal(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Error::ConnectionCheck { source, .. } => monky_http::connect::refusal_in(source),
            _ => None,
        }
    }

    /// The HTTP status, when a response arrived.
    #[must_use]
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Status { status, .. }
            | Error::NotJson { status, .. }
            | Error::Shape { status, .. }
            | Error::Invalid { status, .. } => Some(*status),
            Error::Transport { source, .. } => source.status().map(|s| s.as_u16()),
            _ => None,
        }
    }

    /// The error code: tenancy's envelope code, or `LEASE_SHAPE`/`BUNDLE_TOO_LARGE` for the
    /// client's own refusals.
    #[must_use]
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            Error::Status { code, .. } => code.as_ref(),
            Error::LeaseShape { .. } => Some(LEASE_SHAPE),
            Error::Invalid { call, .. } => Some(call.code()),
            Error::BundleTooLarge { .. } => Some(BUNDLE_TOO_LARGE),
            _ => None,
        }
    }

    /// Tenancy's `detail` text, when it sent an envelope.
    #[must_use]
    pub fn detail(&self) -> Option<&str> {
        match self {
            Error::Status { detail, .. } => Some(detail),
            _ => None,
        }
    }

    /// How long tenancy asked to wait (`Retry-After`), at most an hour.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Status { retry_after, .. } | Error::NotJson { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Which way tenancy's certificate missed this machine's clock, when the TLS handshake
    /// failed for that: the caller's next step is the clock, which waiting does not fix. The
    /// kind stays [`ErrorKind::Temporary`].
    #[must_use]
    pub fn certificate_time(&self) -> Option<CertificateTime> {
        let Error::Transport { source, .. } = self else {
            return None;
        };
        match monky_http::certificate::refused_in(source)?.0 {
            monky_http::certificate::Refused::Time(t) => Some(t),
            monky_http::certificate::Refused::Refusal(_) => None,
        }
    }

    /// True when the request timed out.
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::Transport { source, .. } => source.is_timeout(),
            Error::Read { source, .. } => source.kind() == std::io::ErrorKind::TimedOut,
            _ => false,
        }
    }
}

/// The calls whose answers are decoded into a shape the agent acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Call {
    /// `POST /v1/agent/checkin`.
    Checkin,
    /// `POST /v1/agent/lease`.
    Lease,
}

impl Call {
    /// The code an invalid answer to this call is refused with.
    #[must_use]
    pub fn code(self) -> &'static ErrorCode {
        match self {
            Call::Checkin => CHECKIN_INVALID,
            Call::Lease => LEASE_INVALID,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, code: Option<&str>) -> Error {
        Error::Status {
            url: Box::new(Url::parse("http://tenancy.test/v1/agent/checkin").unwrap()),
            status,
            code: code.map(ErrorCode::from),
            detail: "d".into(),
            retry_after: None,
        }
    }

    #[test]
    fn status_classification() {
        let check = |code: u16, name: Option<&str>, expected: ErrorKind| {
            assert_eq!(status(code, name).kind(), expected, "{code} {name:?}");
        };
        check(429, Some("LEASE_RATE_LIMITED"), ErrorKind::Temporary);
        check(500, None, ErrorKind::Temporary);
        check(503, Some("AGENT_ENV_MISMATCH"), ErrorKind::Temporary);
        check(
            401,
            Some("AGENT_UNAUTHENTICATED"),
            ErrorKind::Unauthenticated,
        );
        check(401, None, ErrorKind::Unauthenticated);
        check(403, Some("AGENT_ENV_MISMATCH"), ErrorKind::EnvMismatch);
        check(403, Some("FORBIDDEN"), ErrorKind::Refused);
        check(404, Some("BUNDLE_NOT_FOUND"), ErrorKind::Refused);
        check(422, None, ErrorKind::Refused);
        check(302, None, ErrorKind::Refused);
    }

    #[test]
    fn display_is_lower_case_and_names_the_code() {
        let text = status(404, Some("BUNDLE_NOT_FOUND")).to_string();
        assert_eq!(
            text,
            "tenancy answered 404 from http://tenancy.test/v1/agent/checkin: BUNDLE_NOT_FOUND d"
        );
        let url = Url::parse("http://t.test/v1/agent/lease").unwrap();
        let shape = Error::LeaseShape { url: Box::new(url) };
        assert_eq!(shape.code(), Some(&ErrorCode::LeaseShape));
        assert_eq!(shape.kind(), ErrorKind::Refused);
    }
}
