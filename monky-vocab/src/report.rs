//! The report vocabulary: the codes an agent puts in a report's `detail` (`CODE: names`), the
//! journal and its state, as tenancy receives them, and the report's [`ReportResult`].
//!
//! [`ReportCode`] is the closed list this version knows, exhaustive on purpose: a new code is a
//! breaking change, so every consumer that attaches policy to the codes (the agent's exit class,
//! next step and whose move it is) must name it. [`AnyReportCode`] is what a receiver keeps: a
//! known code, or an unknown one verbatim (from a newer agent), as monky-agent-proto's `ErrorCode`
//! does for tenancy's codes.
//!
//! ```
//! use monky_vocab::{AnyReportCode, ReportCode, ReportResult};
//!
//! assert_eq!(ReportCode::parse("UNHEALTHY"), Some(ReportCode::Unhealthy));
//! assert_eq!(ReportCode::Unhealthy.to_string(), "UNHEALTHY");
//! assert_eq!(ReportCode::parse("FROM_THE_FUTURE"), None);
//!
//! let kept: AnyReportCode = serde_json::from_str(r#""FROM_THE_FUTURE""#)?;
//! assert_eq!(kept, AnyReportCode::Other("FROM_THE_FUTURE".into()));
//! assert_eq!(serde_json::to_string(&kept)?, r#""FROM_THE_FUTURE""#);
//! assert_eq!(AnyReportCode::from("HELD").known(), Some(ReportCode::Held));
//! assert_eq!(serde_json::to_string(&ReportResult::Applied)?, r#""applied""#);
//! # Ok::<(), serde_json::Error>(())
//! ```

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! report_codes {
    ($( $(#[$doc:meta])* $variant:ident = $text:literal; )+) => {
        /// A code of the report vocabulary; its text is what tenancy, the journal and
        /// state.json see.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ReportCode {
            $( $(#[$doc])* $variant, )+
        }

        impl ReportCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ReportCode] = &[$(ReportCode::$variant),+];

            /// The SCREAMING_CASE text.
            #[must_use]
            pub fn as_str(self) -> &'static str {
                match self {
                    $( ReportCode::$variant => $text, )+
                }
            }

            /// The code whose text is exactly `text`; `None` for a code this version does not
            /// know.
            #[must_use]
            pub fn parse(text: &str) -> Option<ReportCode> {
                match text {
                    $( $text => Some(ReportCode::$variant), )+
                    _ => None,
                }
            }
        }
    };
}

report_codes! {
    /// No stored token and no bootstrap grant.
    NoCredentials = "NO_CREDENTIALS";
    /// The bootstrap grant is a link, FIFO, device, readable by others or too large.
    GrantUnsafe = "GRANT_UNSAFE";
    /// Tenancy refused the token.
    AgentUnauthenticated = "AGENT_UNAUTHENTICATED";
    /// The token belongs to another env.
    AgentEnvMismatch = "AGENT_ENV_MISMATCH";
    /// The configuration (config.yaml, or a file or user it names) cannot be used.
    ConfigInvalid = "CONFIG_INVALID";
    /// Tenancy's lease budget is spent.
    LeaseRateLimited = "LEASE_RATE_LIMITED";
    /// Another of tenancy's per-env budgets is spent.
    RateLimited = "RATE_LIMITED";
    /// A lease answer in the retired AppRole shape.
    LeaseShape = "LEASE_SHAPE";
    /// A lease answer of the wrong shape or for another env.
    LeaseInvalid = "LEASE_INVALID";
    /// A checkin answer that cannot be acted on.
    CheckinInvalid = "CHECKIN_INVALID";
    /// Tenancy does not publish the desired sha.
    BundleNotFound = "BUNDLE_NOT_FOUND";
    /// Tenancy unreachable, or a 429 or 5xx without a code.
    TenancyUnavailable = "TENANCY_UNAVAILABLE";
    /// Tenancy refused a call without a code of its own, or with one the agent does not know.
    TenancyRefused = "TENANCY_REFUSED";
    /// Another user's process answered on tenancy's loopback address.
    TenancyListenerUntrusted = "TENANCY_LISTENER_UNTRUSTED";
    /// Another user's process answered on OpenBao's loopback address.
    BaoListenerUntrusted = "BAO_LISTENER_UNTRUSTED";
    /// An untrusted process (another user's, a container's) answered on a registry address of
    /// this box, and the registry credential was kept from it.
    RegistryListenerUntrusted = "REGISTRY_LISTENER_UNTRUSTED";
    /// An image's registry resolves to an address of this box (loopback, link-local, its own)
    /// that the box's config does not name as its registry.
    RegistryNotAllowed = "REGISTRY_NOT_ALLOWED";
    /// A registry on this box could not be proven the box's own (nothing answers there, or the
    /// resolver did not answer for its name): nothing was pulled; the next tick retries.
    RegistryUnavailable = "REGISTRY_UNAVAILABLE";
    /// A service that gets a secret in its environment runs as a uid a host account has too,
    /// and the engine does not remap user namespaces: that account could read the secret.
    SecretReadableOnHost = "SECRET_READABLE_ON_HOST";
    /// Tenancy answered 401 to a token OpenBao still accepts.
    TenancyRefusedToken = "TENANCY_REFUSED_TOKEN";
    /// OpenBao unreachable or sealed.
    BaoUnavailable = "BAO_UNAVAILABLE";
    /// A peer's certificate (OpenBao's, or tenancy's over https) is expired or not yet valid
    /// by the box's clock.
    TlsClock = "TLS_CLOCK";
    /// OpenBao refused a read.
    BaoPermissionDenied = "BAO_PERMISSION_DENIED";
    /// A pinned secret version does not exist.
    SecretNotFound = "SECRET_NOT_FOUND";
    /// OpenBao refused a grant.
    BaoLoginRejected = "BAO_LOGIN_REJECTED";
    /// Any other OpenBao refusal.
    BaoRefused = "BAO_REFUSED";
    /// OpenBao answers, sealed.
    BaoSealed = "BAO_SEALED";
    /// OpenBao's certificate is not signed by the configured CA.
    BaoTlsUnknownCa = "BAO_TLS_UNKNOWN_CA";
    /// OpenBao's certificate is for another host name.
    BaoTlsWrongName = "BAO_TLS_WRONG_NAME";
    /// `.env.template` uses variables no manifest entry provides.
    EnvIncomplete = "ENV_INCOMPLETE";
    /// A secret's value cannot be written where the template puts it unquoted.
    EnvValueUnsafe = "ENV_VALUE_UNSAFE";
    /// The compose file asks for host privileges.
    PrivilegedRefused = "PRIVILEGED_REFUSED";
    /// The compose file names a container, volume or network outside the project's names.
    BundleNonconforming = "BUNDLE_NONCONFORMING";
    /// The compose file asks for more of the box than its budget gives one project.
    BudgetExceeded = "BUDGET_EXCEEDED";
    /// Compose would interpolate a secret into a process's arguments.
    SecretOnCommandLine = "SECRET_ON_COMMAND_LINE";
    /// Tenancy asks for an older release.
    RollbackRefused = "ROLLBACK_REFUSED";
    /// Too little free space on the docker data root.
    DiskInsufficient = "DISK_INSUFFICIENT";
    /// The env's releases and staging would be over `releases_max_bytes` even after pruning.
    ReleasesOverCap = "RELEASES_OVER_CAP";
    /// The bundle names another renderer.
    RendererRefused = "RENDERER_REFUSED";
    /// The manifest carries a secret value.
    ManifestValueRefused = "MANIFEST_VALUE_REFUSED";
    /// A manifest path outside this env's prefix.
    ManifestPathRefused = "MANIFEST_PATH_REFUSED";
    /// The bundle does not hash to the desired sha.
    BundleShaMismatch = "BUNDLE_SHA_MISMATCH";
    /// The bundle is malformed.
    BundleInvalid = "BUNDLE_INVALID";
    /// The bundle is over a size limit.
    BundleTooLarge = "BUNDLE_TOO_LARGE";
    /// `docker compose config` rejected the project.
    ComposeConfigFailed = "COMPOSE_CONFIG_FAILED";
    /// The pull failed.
    ComposePullFailed = "COMPOSE_PULL_FAILED";
    /// The registry has no such image or tag (`manifest unknown`).
    ImageNotFound = "IMAGE_NOT_FOUND";
    /// `docker compose up` failed.
    ComposeUpFailed = "COMPOSE_UP_FAILED";
    /// Containers did not become healthy, or stopped being healthy.
    Unhealthy = "UNHEALTHY";
    /// Nothing of the project runs although a release was applied.
    NotRunning = "NOT_RUNNING";
    /// A retire's `compose down` failed.
    ComposeDownFailed = "COMPOSE_DOWN_FAILED";
    /// The containers could not be listed.
    DockerUnavailable = "DOCKER_UNAVAILABLE";
    /// The state dir, or something below it, is not the agent's alone.
    StateDirUnsafe = "STATE_DIR_UNSAFE";
    /// The agent could not write below its state dir (full, read-only, or an IO error).
    StateWriteFailed = "STATE_WRITE_FAILED";
    /// The docker engine answered something the agent cannot read (bad JSON, an error status).
    EngineAnswerInvalid = "ENGINE_ANSWER_INVALID";
    /// A release's files or `.env` changed on disk since the agent wrote them.
    ReleaseModified = "RELEASE_MODIFIED";
    /// The tick ran past `tick_timeout_s`.
    TickTimeout = "TICK_TIMEOUT";
    /// A warning: the original agent's `.env` handed some values to the app differently.
    EnvQuotingChanged = "ENV_QUOTING_CHANGED";
    /// The project's containers drifted from the current release and were not healed.
    Drift = "DRIFT";
    /// A heal of drift did not bring the current release back.
    HealFailed = "HEAL_FAILED";
    /// A note on an applied report: the agent healed drift.
    Healed = "HEALED";
    /// A service keeps dying: healed again within the hour after an earlier heal.
    CrashLoop = "CRASH_LOOP";
    /// A note on an applied report: an apply that was interrupted was finished or rolled back.
    ApplyInterrupted = "APPLY_INTERRUPTED";
    /// The box is held by an operator.
    Held = "HELD";
    /// A failure without a code of its own.
    Failed = "FAILED";
}

impl fmt::Display for ReportCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ReportCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ReportCode {
    /// Strict: a code this version does not know is an error (keep it with [`AnyReportCode`]).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        ReportCode::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown code {text:?}")))
    }
}

/// A report code as received: one of [`ReportCode`], or an unknown one kept verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AnyReportCode {
    /// A code this version knows.
    Known(ReportCode),
    /// A code this version does not know (a newer agent's), as it was sent.
    Other(String),
}

impl AnyReportCode {
    /// The SCREAMING_CASE text, as it was sent.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            AnyReportCode::Known(code) => code.as_str(),
            AnyReportCode::Other(text) => text,
        }
    }

    /// The known code, if it is one.
    #[must_use]
    pub fn known(&self) -> Option<ReportCode> {
        match self {
            AnyReportCode::Known(code) => Some(*code),
            AnyReportCode::Other(_) => None,
        }
    }
}

impl From<&str> for AnyReportCode {
    fn from(text: &str) -> Self {
        ReportCode::parse(text).map_or_else(
            || AnyReportCode::Other(text.to_owned()),
            AnyReportCode::Known,
        )
    }
}

impl From<ReportCode> for AnyReportCode {
    fn from(code: ReportCode) -> Self {
        AnyReportCode::Known(code)
    }
}

impl fmt::Display for AnyReportCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for AnyReportCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for AnyReportCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(AnyReportCode::from(text.as_str()))
    }
}

/// Outcome of an apply, as reported.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportResult {
    /// The bundle runs (also the heartbeat after `none`).
    Applied,
    /// The apply failed; `detail` says why.
    Failed,
    /// The project was taken down.
    Down,
}

impl ReportResult {
    /// The wire spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ReportResult::Applied => "applied",
            ReportResult::Failed => "failed",
            ReportResult::Down => "down",
        }
    }
}

impl fmt::Display for ReportResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_code_has_one_screaming_text_that_parses_back() {
        let texts: BTreeSet<&str> = ReportCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(texts.len(), ReportCode::ALL.len(), "two codes share a text");
        for code in ReportCode::ALL {
            let text = code.as_str();
            assert!(
                !text.is_empty() && text.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
                "{text}"
            );
            assert_eq!(ReportCode::parse(text), Some(*code));
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<ReportCode>(&json).unwrap(), *code);
            assert_eq!(AnyReportCode::from(text), AnyReportCode::Known(*code));
        }
    }

    #[test]
    fn an_unknown_code_is_refused_strictly_and_kept_verbatim_otherwise() {
        assert_eq!(ReportCode::parse("SOMETHING_NEW"), None);
        assert_eq!(ReportCode::parse("unhealthy"), None);
        assert!(serde_json::from_str::<ReportCode>("\"SOMETHING_NEW\"").is_err());
        let kept: AnyReportCode = serde_json::from_str("\"SOMETHING_NEW\"").unwrap();
        assert_eq!(kept, AnyReportCode::Other("SOMETHING_NEW".into()));
        assert_eq!(kept.known(), None);
        assert_eq!(kept.to_string(), "SOMETHING_NEW");
        assert_eq!(serde_json::to_string(&kept).unwrap(), "\"SOMETHING_NEW\"");
    }
}
