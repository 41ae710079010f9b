//! Tenancy's agent protocol: wire types and a blocking client.
//!
//! - [`wire`] (always on, re-exported here): the serde shapes of the four calls
//!   (checkin, bundle, lease, report), the `{code, detail}` envelope and [`ErrorCode`].
//! - [`report`] (always on): [`ReportCode`], the codes an agent reports (a report's `detail`
//!   starts with one), and [`AnyReportCode`], a received code that keeps unknown ones. They,
//!   [`Sha`] and [`ReportResult`] are the shared vocabulary crate's (`monky-vocab`), re-exported
//!   here at their old paths.
//! - `client` (feature `client`): `Client`, a blocking client with bearer auth, per-call
//!   deadlines, an address mapping for mesh transports and a classified `Error`, built on the
//!   workspace's hardened-HTTP crate (`monky-http`) as the OpenBao client is.
//! - `grant` (feature `grant`): the deploy grant's claims, an ES256 signer and the JWK Set
//!   OpenBao verifies them with: what tenancy's tooling and the test kit mint for an agent.
//!
//! A loopback fake of tenancy for tests lives in the workspace's `monky-testkit` crate.
//!
//! No agent policy lives here: no configuration, no retries, no exit codes.
//!
//! ```
//! use monky_agent_proto::{Action, CheckinResponse, ErrorCode, ErrorEnvelope};
//!
//! let sha = "7a10".repeat(16);
//! let resp: CheckinResponse = serde_json::from_str(&format!(
//!     r#"{{"env_id": "env-qa-02", "desired_sha": "{sha}", "action": "apply",
//!         "checkin_interval_s": 1e12, "new_field": 1}}"#
//! ))?;
//! let Action::Apply { sha, bundle_url } = &resp.action else { panic!("an apply") };
//! assert_eq!(sha.short(), "7a107a107a10");
//! // Without `bundle_url`, the protocol's default path of the sha.
//! assert_eq!(bundle_url, &format!("/v1/agent/bundle/env-qa-02/{sha}"));
//! // A peer's interval is clamped as it is decoded: an hour at most.
//! assert_eq!(resp.checkin_interval_s.map(|i| i.as_secs()), Some(3600));
//!
//! // An apply without a sha is no action.
//! let bare = r#"{"env_id": "e", "action": "apply"}"#;
//! assert!(serde_json::from_str::<CheckinResponse>(bare).is_err());
//!
//! // A padded sha is not a sha.
//! let padded = format!(r#"{{"env_id": "e", "desired_sha": " {sha}", "action": "apply"}}"#);
//! assert!(serde_json::from_str::<CheckinResponse>(&padded).is_err());
//!
//! let err: ErrorEnvelope = serde_json::from_str(r#"{"code": "QUOTA_GONE", "detail": "x"}"#)?;
//! assert_eq!(err.code, ErrorCode::Other("QUOTA_GONE".into()));
//! assert_eq!(err.code.to_string(), "QUOTA_GONE");
//! # Ok::<(), serde_json::Error>(())
//! ```

#![deny(missing_docs)]

/// The report-code vocabulary (monky-vocab's, re-exported at its old path).
pub mod report {
    pub use monky_vocab::report::{AnyReportCode, ReportCode};
}
pub mod wire;

pub use report::{AnyReportCode, ReportCode};

pub use wire::{
    Action, ActionKind, ApplyWithoutSha, BundleDownload, CheckinAnswer, CheckinInterval,
    CheckinRequest, CheckinResponse, ContainerStatus, ErrorCode, ErrorEnvelope, Hold, HostFacts,
    LeaseRequest, LeaseResponse, MAX_TTL, ReportRequest, ReportResult, Sha, ShaError, VaultInfo,
    bundle_path, is_retired_lease_shape,
};

#[cfg(feature = "schema")]
pub use wire::schemas;

// The certificate reading and the connection check are the shared hardened-HTTP crate's,
// re-exported at their old paths (the OpenBao client has the same ones).
#[cfg(feature = "grant")]
pub mod grant;

#[cfg(feature = "client")]
pub use monky_http::certificate;
#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "client")]
pub use monky_http::connect;
#[cfg(feature = "client")]
pub mod error;

#[cfg(feature = "client")]
pub use certificate::{CertificateRefusal, CertificateTime};
#[cfg(feature = "client")]
pub use client::{Client, ClientBuilder};
#[cfg(feature = "client")]
pub use connect::{CheckError, ConnectionCheck};
#[cfg(feature = "client")]
pub use error::{Call, Error, ErrorKind, Result};
