//! Tenancy's agent protocol: wire types, a blocking client and a loopback fake of tenancy.
//!
//! - [`wire`] (always on, re-exported here): the serde shapes of the four calls
//!   (checkin, bundle, lease, report), the `{code, detail}` envelope and [`ErrorCode`].
//! - [`report`] (always on): [`ReportCode`], the codes an agent reports (a report's `detail`
//!   starts with one), and [`AnyReportCode`], a received code that keeps unknown ones.
//! - `client` (feature `client`): `Client`, a blocking reqwest client with bearer auth,
//!   per-call deadlines, an address mapping for mesh transports and a classified `Error`.
//! - `testkit` (feature `testkit`): `FakeTenancy`, a loopback tenancy that signs ES256 deploy
//!   grants, serves their JWKS, checks bearers against an OpenBao and enforces the rate buckets;
//!   with feature `testkit-bao`, `Peers`: that tenancy and `monky-bao-client`'s fake or real
//!   OpenBao, started and wired to each other.
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
//! assert_eq!(resp.action, Action::Apply);
//! assert_eq!(resp.desired_sha.as_ref().map(|s| s.short()), Some("7a107a107a10"));
//! // A peer's interval is clamped as it is decoded: an hour at most.
//! assert_eq!(resp.checkin_interval_s.map(|i| i.as_secs()), Some(3600));
//! assert!(!resp.purge_volumes);
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

pub mod report;
pub mod wire;

pub use report::{AnyReportCode, ReportCode};

pub use wire::{
    Action, BundleDownload, CheckinInterval, CheckinRequest, CheckinResponse, ContainerStatus,
    ErrorCode, ErrorEnvelope, Hold, HostFacts, LeaseRequest, LeaseResponse, MAX_TTL, ReportRequest,
    ReportResult, Sha, ShaError, VaultInfo, bundle_path, is_retired_lease_shape,
};

#[cfg(feature = "schema")]
pub use wire::schemas;

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "client")]
#[path = "../../monky-bao-client/src/connect.rs"]
pub mod connect;
#[cfg(feature = "client")]
pub mod error;

#[cfg(feature = "client")]
pub use client::{Client, ClientBuilder};
#[cfg(feature = "client")]
pub use connect::{CheckError, ConnectionCheck};
#[cfg(feature = "client")]
pub use error::{Call, CertificateTime, Error, ErrorKind, Result};

#[cfg(feature = "testkit")]
pub mod testkit;
