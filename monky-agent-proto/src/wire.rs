//! Tenancy's agent JSON shapes: the four calls, the `{code, detail}` envelope and its codes.
//!
//! Requests serialize with the keys and key order of the protocol's examples; optional request
//! values are sent as `null` except `ReportRequest::detail`, which is left out when absent.
//! Responses ignore fields they do not know, but an unknown `action` or `result` value is a
//! decode error rather than a silent default.

use std::fmt;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

// The sha and the report's result are the shared vocabulary's; re-exported at their old paths.
pub use monky_vocab::{ReportResult, Sha, ShaError};

/// Tenancy's `checkin_interval_s`, clamped into [`CheckinInterval::MIN`]..=[`CheckinInterval::MAX`]
/// as it is decoded.
///
/// A peer's number never reaches a sleep or a deadline unbounded: zero or a negative number
/// becomes the minimum, and anything past an hour (`u64::MAX`, `1e12`, a float) becomes the
/// maximum. The lower bound is a second rather than tenancy's own rate (6 checkins a minute)
/// because a laptop or a test may be told to tick that often; tenancy's bucket answers a faster
/// agent with 429 and `Retry-After` anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckinInterval(Duration);

impl CheckinInterval {
    /// The shortest interval an answer can set: one second.
    pub const MIN: Duration = Duration::from_secs(1);
    /// The longest interval an answer can set: one hour.
    pub const MAX: Duration = Duration::from_secs(3600);

    /// `secs`, clamped into the bounds.
    #[must_use]
    pub fn from_secs(secs: u64) -> Self {
        CheckinInterval(Duration::from_secs(secs).clamp(Self::MIN, Self::MAX))
    }

    /// The interval.
    #[must_use]
    pub fn get(self) -> Duration {
        self.0
    }

    /// The interval in whole seconds.
    #[must_use]
    pub fn as_secs(self) -> u64 {
        self.0.as_secs()
    }
}

impl Serialize for CheckinInterval {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0.as_secs())
    }
}

impl<'de> Deserialize<'de> for CheckinInterval {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = CheckinInterval;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of seconds")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(CheckinInterval::from_secs(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(CheckinInterval::from_secs(u64::try_from(v).unwrap_or(0)))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
                // `as` saturates a float into u64 (NaN becomes 0), which is the clamp wanted.
                Ok(CheckinInterval::from_secs(v as u64))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// The longest grant or token lifetime taken from a peer: one year. Longer answers are clamped
/// to it, so an expiry computed from them stays far from overflowing.
pub const MAX_TTL: Duration = Duration::from_secs(366 * 24 * 3600);

/// Body of `POST /v1/agent/checkin`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckinRequest {
    /// The environment this agent deploys.
    pub env_id: String,
    /// The agent's version string.
    pub agent_version: String,
    /// The bundle sha the host runs now, `null` before the first apply.
    pub applied_sha: Option<Sha>,
    /// Facts about the host.
    pub host: HostFacts,
    /// The state of the project's containers.
    pub containers: Vec<ContainerStatus>,
    /// An operator's hold on the box, while there is one; left out of the body otherwise, so
    /// a tenancy that does not know the field reads the body as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
}

/// An operator's hold on a box (`monky-deployd hold`): while it lasts the agent checks in and
/// reports, but neither applies, heals nor retires. Carried in the checkin and the report as
/// an optional field; the report's `result` stays one of the values tenancy knows.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// Why the box is held, as the operator wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the hold was put (unix seconds).
    pub since: u64,
    /// When the hold ends by itself (unix seconds); absent: until `monky-deployd unhold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
}

/// Host facts sent with every checkin.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFacts {
    /// Host name.
    pub hostname: String,
    /// Operating system, e.g. `ubuntu-26.04`.
    pub os: String,
    /// Kernel release.
    pub kernel: String,
    /// Docker engine version, when known.
    pub docker: Option<String>,
    /// Compose version, when known.
    pub compose: Option<String>,
    /// Free bytes under the docker data root, when known.
    pub free_bytes: Option<u64>,
    /// The agent's version string.
    pub agent_version: String,
    /// How the agent reaches tenancy (`sdk`, `proxy`, ...).
    pub transport: String,
    /// The site the host belongs to.
    pub site: String,
    /// Whether the host runs in laptop mode.
    pub laptop_mode: bool,
}

/// One container of the deployed project.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerStatus {
    /// Container name.
    pub name: String,
    /// Engine state (`running`, `exited`, ...).
    pub state: String,
    /// Health status when the container has a health check.
    pub health: Option<String>,
}

/// What tenancy wants the agent to do after a checkin, as the wire spells it (`action`).
///
/// [`Action`] is the same choice with the data each needs; this is the bare word, for a peer
/// (or a test's fake tenancy) that picks an action before it has that data.
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(
        rename = "Action",
        description = "What tenancy wants the agent to do after a checkin."
    )
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ActionKind {
    /// Fetch and apply the desired bundle (desired differs from applied).
    Apply,
    /// Converged: nothing to do but report a heartbeat.
    None,
    /// Retire: take the project down.
    Down,
}

impl ActionKind {
    /// The wire spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Apply => "apply",
            ActionKind::None => "none",
            ActionKind::Down => "down",
        }
    }
}

impl fmt::Display for ActionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What tenancy wants the agent to do after a checkin, with what it needs to do it.
///
/// Decoded from the answer's `action`, `desired_sha`, `bundle_url` and `purge_volumes`: an
/// `apply` without a `desired_sha` does not decode, so an apply always has its sha, and its
/// bundle URL is tenancy's `bundle_url` or, without one, the protocol's default path of that
/// sha ([`bundle_path`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// Fetch the bundle at `bundle_url` and apply it as `sha`.
    Apply {
        /// The bundle sha tenancy wants running.
        sha: Sha,
        /// Path of the bundle download, relative to tenancy's base URL.
        bundle_url: String,
    },
    /// Converged: nothing to do but report a heartbeat.
    None {
        /// The sha tenancy names as desired, when it names one.
        desired: Option<Sha>,
    },
    /// Retire: take the project down.
    Down {
        /// Whether `down` also removes volumes.
        purge_volumes: bool,
        /// The sha tenancy still names as desired, when it names one (informational).
        desired: Option<Sha>,
    },
}

impl Action {
    /// The bare choice, as the wire spells it.
    #[must_use]
    pub fn kind(&self) -> ActionKind {
        match self {
            Action::Apply { .. } => ActionKind::Apply,
            Action::None { .. } => ActionKind::None,
            Action::Down { .. } => ActionKind::Down,
        }
    }

    /// The wire spelling.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The sha tenancy names as desired: an apply's sha, or what a heartbeat or a retire
    /// answer carried.
    #[must_use]
    pub fn desired_sha(&self) -> Option<&Sha> {
        match self {
            Action::Apply { sha, .. } => Some(sha),
            Action::None { desired } | Action::Down { desired, .. } => desired.as_ref(),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Answer to a checkin.
///
/// On the wire its action is spread over flat fields (`action`, `desired_sha`, `bundle_url`,
/// `purge_volumes`); it decodes from and encodes to exactly those ([`CheckinAnswer`] is the
/// flat shape and its schema), and refuses an answer no [`Action`] can be made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "CheckinAnswer", into = "CheckinAnswer")]
pub struct CheckinResponse {
    /// The environment the answer is for.
    pub env_id: String,
    /// What to do now, with its data.
    pub action: Action,
    /// How long to wait before the next checkin, clamped into the documented bounds as it is
    /// decoded.
    pub checkin_interval_s: Option<CheckinInterval>,
    /// Where the environment's secrets live.
    pub vault: Option<VaultInfo>,
}

impl CheckinResponse {
    /// The sha tenancy names as desired, if any (see [`Action::desired_sha`]).
    #[must_use]
    pub fn desired_sha(&self) -> Option<&Sha> {
        self.action.desired_sha()
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for CheckinResponse {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        CheckinAnswer::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        CheckinAnswer::json_schema(generator)
    }
}

/// A checkin answer as the wire spells it: the flat fields [`CheckinResponse`] is decoded
/// from. Its JSON Schema is the committed `checkin-response.json`.
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(rename = "CheckinResponse", description = "Answer to a checkin.")
)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckinAnswer {
    /// The environment the answer is for.
    pub env_id: String,
    /// The bundle sha tenancy wants running, if any; anything but 64 lowercase hex digits does
    /// not decode.
    pub desired_sha: Option<Sha>,
    /// What to do now.
    pub action: ActionKind,
    /// Whether `down` also removes volumes (only meaningful with [`Action::Down`]).
    #[serde(default)]
    pub purge_volumes: bool,
    /// Path of the bundle download, relative to tenancy's base URL.
    pub bundle_url: Option<String>,
    /// How long to wait before the next checkin, in seconds, clamped into the documented
    /// bounds as it is decoded.
    #[cfg_attr(feature = "schema", schemars(with = "Option<u64>"))]
    pub checkin_interval_s: Option<CheckinInterval>,
    /// Where the environment's secrets live.
    pub vault: Option<VaultInfo>,
}

/// Why a [`CheckinAnswer`] is no [`CheckinResponse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("action apply without desired_sha")]
pub struct ApplyWithoutSha;

impl TryFrom<CheckinAnswer> for CheckinResponse {
    type Error = ApplyWithoutSha;

    fn try_from(a: CheckinAnswer) -> Result<Self, Self::Error> {
        let action = match a.action {
            ActionKind::Apply => {
                let sha = a.desired_sha.ok_or(ApplyWithoutSha)?;
                let bundle_url = a
                    .bundle_url
                    .unwrap_or_else(|| bundle_path(&a.env_id, sha.as_str()));
                Action::Apply { sha, bundle_url }
            }
            ActionKind::None => Action::None {
                desired: a.desired_sha,
            },
            ActionKind::Down => Action::Down {
                purge_volumes: a.purge_volumes,
                desired: a.desired_sha,
            },
        };
        Ok(CheckinResponse {
            env_id: a.env_id,
            action,
            checkin_interval_s: a.checkin_interval_s,
            vault: a.vault,
        })
    }
}

impl From<CheckinResponse> for CheckinAnswer {
    fn from(r: CheckinResponse) -> Self {
        let kind = r.action.kind();
        let (desired_sha, bundle_url, purge_volumes) = match r.action {
            Action::Apply { sha, bundle_url } => (Some(sha), Some(bundle_url), false),
            Action::None { desired } => (desired, None, false),
            Action::Down {
                purge_volumes,
                desired,
            } => (desired, None, purge_volumes),
        };
        CheckinAnswer {
            env_id: r.env_id,
            desired_sha,
            action: kind,
            purge_volumes,
            bundle_url,
            checkin_interval_s: r.checkin_interval_s,
            vault: r.vault,
        }
    }
}

/// The path tenancy serves a bundle at, relative to its base URL:
/// `/v1/agent/bundle/{env_id}/{sha}`. A checkin answer without `bundle_url` means this one.
#[must_use]
pub fn bundle_path(env_id: &str, sha: &str) -> String {
    format!("/v1/agent/bundle/{env_id}/{sha}")
}

/// The OpenBao coordinates tenancy hands out with a checkin.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct VaultInfo {
    /// OpenBao address (informational; the transport decides how it is reached).
    pub addr: Option<String>,
    /// The KV v2 mount.
    pub mount: Option<String>,
    /// The secret prefix inside the mount, `<env>/see`.
    pub prefix: Option<String>,
    /// The JWT auth mount used with lease grants.
    pub auth_mount: Option<String>,
    /// The JWT auth role used with lease grants.
    pub auth_role: Option<String>,
}

/// Body of `POST /v1/agent/lease`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRequest {
    /// The environment asking for a grant.
    pub env_id: String,
    /// Why the agent leases (`apply`, `renew`); tenancy ignores it, it is for its logs.
    #[serde(default)]
    pub reason: String,
}

/// Answer to a lease: a fresh deploy grant to log in to OpenBao with.
///
/// A body in the retired AppRole shape (`wrapping_token`, `role_id`) is not a `LeaseResponse`;
/// see [`is_retired_lease_shape`].
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseResponse {
    /// The environment the grant is for.
    pub env_id: String,
    /// The signed deploy grant (a JWT).
    #[serde(serialize_with = "expose_secret")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub login_jwt: SecretString,
    /// Lifetime of the grant in seconds.
    pub ttl_s: u64,
    /// OpenBao JWT auth mount to log in at.
    pub mount: String,
    /// OpenBao JWT auth role.
    pub role: String,
    /// OpenBao address for the login, when tenancy names one.
    pub addr: Option<String>,
}

impl LeaseResponse {
    /// The grant's lifetime, at most [`MAX_TTL`].
    #[must_use]
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_s).min(MAX_TTL)
    }
}

fn expose_secret<S: Serializer>(value: &SecretString, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(value.expose_secret())
}

/// True when a lease body carries the retired AppRole fields (`wrapping_token` or `role_id`).
///
/// Such a body is refused as [`ErrorCode::LeaseShape`]; it is never unwrapped.
#[must_use]
pub fn is_retired_lease_shape(body: &serde_json::Value) -> bool {
    body.as_object()
        .is_some_and(|o| o.contains_key("wrapping_token") || o.contains_key("role_id"))
}

/// Body of `POST /v1/agent/report`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportRequest {
    /// The reporting environment.
    pub env_id: String,
    /// The bundle sha the report is about.
    pub sha: Option<Sha>,
    /// The outcome.
    pub result: ReportResult,
    /// The redacted tail of the agent's log.
    pub log_tail: String,
    /// The state of the project's containers.
    pub containers: Vec<ContainerStatus>,
    /// Code and names of a failure; left out of the body when absent. An `applied` report may
    /// carry one too, naming what the agent did on its own (`HEALED: ...`, `RECOVERED: ...`)
    /// or why it did not act (`HELD: ...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The operator's hold on the box, while there is one (see [`Hold`]); left out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
}

/// Tenancy's error body.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    /// Machine-readable code.
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub code: ErrorCode,
    /// Human-readable detail.
    #[serde(default)]
    pub detail: String,
}

/// The error codes tenancy (and this crate's client) use; unknown codes are kept verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request's env_id differs from the bearer token's `meta.env_id`.
    AgentEnvMismatch,
    /// Missing, unknown, revoked or superseded bearer token.
    AgentUnauthenticated,
    /// The per-env lease bucket is empty.
    LeaseRateLimited,
    /// Another per-env bucket (checkin, bundle, report) is empty.
    RateLimited,
    /// The requested bundle sha is not published.
    BundleNotFound,
    /// The bundle body exceeded the client's limit.
    BundleTooLarge,
    /// A lease body in the retired AppRole shape.
    LeaseShape,
    /// The client's own refusal of a checkin answer: the wrong shape or another env's.
    CheckinInvalid,
    /// The client's own refusal of a lease answer: the wrong shape or another env's.
    LeaseInvalid,
    /// Any other code, as sent.
    Other(String),
}

impl ErrorCode {
    /// The SCREAMING_CASE wire spelling.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::AgentEnvMismatch => "AGENT_ENV_MISMATCH",
            ErrorCode::AgentUnauthenticated => "AGENT_UNAUTHENTICATED",
            ErrorCode::LeaseRateLimited => "LEASE_RATE_LIMITED",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::BundleNotFound => "BUNDLE_NOT_FOUND",
            ErrorCode::BundleTooLarge => "BUNDLE_TOO_LARGE",
            ErrorCode::LeaseShape => "LEASE_SHAPE",
            ErrorCode::CheckinInvalid => "CHECKIN_INVALID",
            ErrorCode::LeaseInvalid => "LEASE_INVALID",
            ErrorCode::Other(code) => code,
        }
    }
}

impl From<&str> for ErrorCode {
    fn from(code: &str) -> Self {
        match code {
            "AGENT_ENV_MISMATCH" => ErrorCode::AgentEnvMismatch,
            "AGENT_UNAUTHENTICATED" => ErrorCode::AgentUnauthenticated,
            "LEASE_RATE_LIMITED" => ErrorCode::LeaseRateLimited,
            "RATE_LIMITED" => ErrorCode::RateLimited,
            "BUNDLE_NOT_FOUND" => ErrorCode::BundleNotFound,
            "BUNDLE_TOO_LARGE" => ErrorCode::BundleTooLarge,
            "LEASE_SHAPE" => ErrorCode::LeaseShape,
            "CHECKIN_INVALID" => ErrorCode::CheckinInvalid,
            "LEASE_INVALID" => ErrorCode::LeaseInvalid,
            other => ErrorCode::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = String::deserialize(deserializer)?;
        Ok(ErrorCode::from(code.as_str()))
    }
}

/// A downloaded bundle and the sha tenancy claims for it.
///
/// The header is informational: only the agent's own computation over the members counts.
#[derive(Clone, PartialEq, Eq)]
pub struct BundleDownload {
    /// The raw body (a tar, possibly gzip-compressed).
    pub bytes: Vec<u8>,
    /// `X-Bundle-Sha` or, failing that, `X-Bundle-Sha256`.
    pub header_sha: Option<String>,
}

impl fmt::Debug for BundleDownload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BundleDownload")
            .field("bytes", &format_args!("{} bytes", self.bytes.len()))
            .field("header_sha", &self.header_sha)
            .finish()
    }
}

/// The JSON Schemas of every request and response body, by file name (feature `schema`).
///
/// They are generated from these types and committed under `docs/schema/`, so tenancy's Python
/// side can validate against the same contract.
#[cfg(feature = "schema")]
#[must_use]
pub fn schemas() -> Vec<(&'static str, serde_json::Value)> {
    fn of<T: schemars::JsonSchema>() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default()
    }
    vec![
        ("checkin-request.json", of::<CheckinRequest>()),
        ("checkin-response.json", of::<CheckinResponse>()),
        ("lease-request.json", of::<LeaseRequest>()),
        ("lease-response.json", of::<LeaseResponse>()),
        ("report-request.json", of::<ReportRequest>()),
        ("error-envelope.json", of::<ErrorEnvelope>()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(body: serde_json::Value) -> Result<CheckinResponse, serde_json::Error> {
        serde_json::from_value(body)
    }

    #[test]
    fn a_missing_bundle_url_is_the_default_path_of_the_desired_sha() {
        let sha = "7a10".repeat(16);
        let apply = |bundle_url: Option<&str>| {
            decode(serde_json::json!({
                "env_id": "env-qa-02", "desired_sha": sha, "action": "apply",
                "bundle_url": bundle_url,
            }))
            .unwrap()
            .action
        };
        let expected = |bundle_url: String| Action::Apply {
            sha: Sha::parse(&sha).unwrap(),
            bundle_url,
        };
        assert_eq!(
            apply(None),
            expected(format!("/v1/agent/bundle/env-qa-02/{sha}"))
        );
        assert_eq!(
            apply(Some("/elsewhere/b.tar")),
            expected("/elsewhere/b.tar".into())
        );
        assert_eq!(bundle_path("e", "ab"), "/v1/agent/bundle/e/ab");
    }

    #[test]
    fn apply_without_a_sha_does_not_decode() {
        for body in [
            serde_json::json!({"env_id": "e", "action": "apply", "bundle_url": "/b.tar"}),
            serde_json::json!({"env_id": "e", "desired_sha": null, "action": "apply"}),
        ] {
            let err = decode(body.clone()).unwrap_err();
            assert!(
                err.to_string().contains("action apply without desired_sha"),
                "{body}: {err}"
            );
        }
    }

    #[test]
    fn each_action_carries_its_data_and_encodes_to_the_same_flat_fields() {
        let sha = Sha::parse(&"ab".repeat(32)).unwrap();
        let check = |body: serde_json::Value, action: Action| {
            let resp = decode(body.clone()).unwrap();
            assert_eq!(resp.action, action, "{body}");
            assert_eq!(resp.desired_sha(), action.desired_sha());
            let again = serde_json::to_value(&resp).unwrap();
            assert_eq!(again["action"], body["action"]);
            assert_eq!(again["desired_sha"], body["desired_sha"]);
            assert_eq!(decode(again).unwrap(), resp);
        };
        check(
            serde_json::json!({"env_id": "e", "desired_sha": sha, "action": "apply",
                "bundle_url": "/b"}),
            Action::Apply {
                sha: sha.clone(),
                bundle_url: "/b".into(),
            },
        );
        check(
            serde_json::json!({"env_id": "e", "desired_sha": sha, "action": "none",
                "purge_volumes": true}),
            Action::None {
                desired: Some(sha.clone()),
            },
        );
        check(
            serde_json::json!({"env_id": "e", "desired_sha": null, "action": "down",
                "purge_volumes": true}),
            Action::Down {
                purge_volumes: true,
                desired: None,
            },
        );
        assert_eq!(
            (
                Action::None { desired: None }.to_string(),
                ActionKind::Down.as_str()
            ),
            ("none".to_string(), "down")
        );
    }

    #[test]
    fn error_codes_round_trip_and_keep_unknown_codes() {
        for code in [
            "AGENT_ENV_MISMATCH",
            "AGENT_UNAUTHENTICATED",
            "LEASE_RATE_LIMITED",
            "RATE_LIMITED",
            "BUNDLE_NOT_FOUND",
            "BUNDLE_TOO_LARGE",
            "LEASE_SHAPE",
            "CHECKIN_INVALID",
            "LEASE_INVALID",
            "SOMETHING_NEW",
        ] {
            let parsed = ErrorCode::from(code);
            assert_eq!(parsed.as_str(), code);
            assert_eq!(parsed.to_string(), code);
            let json = serde_json::to_string(&parsed).unwrap();
            assert_eq!(json, format!("\"{code}\""));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), parsed);
        }
        assert_eq!(
            ErrorCode::from("SOMETHING_NEW"),
            ErrorCode::Other("SOMETHING_NEW".into())
        );
        assert_eq!(ErrorCode::from("LEASE_SHAPE"), ErrorCode::LeaseShape);
    }

    #[test]
    fn unknown_action_is_an_error_not_a_default() {
        let body = r#"{"env_id":"e","desired_sha":null,"action":"reboot"}"#;
        let err = serde_json::from_str::<CheckinResponse>(body).unwrap_err();
        assert!(err.to_string().contains("reboot"), "{err}");
    }

    #[test]
    fn missing_optional_response_fields_default() {
        let body = r#"{"env_id":"e","action":"none","extra":{"x":1}}"#;
        let resp: CheckinResponse = serde_json::from_str(body).unwrap();
        assert_eq!(resp.action, Action::None { desired: None });
        assert_eq!(resp.desired_sha(), None);
        assert_eq!(resp.vault, None);
    }

    #[test]
    fn retired_lease_shape_is_detected() {
        let check = |body: &str, expected: bool| {
            let value: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(is_retired_lease_shape(&value), expected, "{body}");
        };
        check(r#"{"wrapping_token":"x"}"#, true);
        check(r#"{"role_id":"x","env_id":"e"}"#, true);
        check(r#"{"env_id":"e","login_jwt":"j"}"#, false);
        check("[]", false);
    }

    #[test]
    fn lease_response_debug_hides_the_grant() {
        let body = r#"{"env_id":"e","login_jwt":"eyJsecret","ttl_s":3600,"mount":"m","role":"r","addr":null}"#;
        let resp: LeaseResponse = serde_json::from_str(body).unwrap();
        assert!(!format!("{resp:?}").contains("eyJsecret"));
        assert_eq!(resp.login_jwt.expose_secret(), "eyJsecret");
    }

    #[test]
    fn bundle_download_debug_does_not_dump_the_body() {
        let download = BundleDownload {
            bytes: vec![7; 3],
            header_sha: Some("ab".into()),
        };
        assert_eq!(
            format!("{download:?}"),
            r#"BundleDownload { bytes: 3 bytes, header_sha: Some("ab") }"#
        );
    }
}
