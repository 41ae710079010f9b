//! `state.json`: what the agent remembers between ticks. Never holds a secret.

use anyhow::Context;
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use monky_agent_proto::Sha;

use crate::clock::{BootDeadline, BootInstant};
use crate::code::Code;
use crate::layout::Layout;
use crate::redact::Redacted;

/// Serializes the saves of state.json within the process: the tick's own and the tick
/// deadline's, which runs on another thread and ends the process while holding it, so the tick
/// cannot save over its record afterwards.
pub(crate) fn save_lock() -> std::sync::MutexGuard<'static, ()> {
    static SAVE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SAVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The state file's format version; another version is moved aside, not guessed at.
pub(crate) const STATE_VERSION: u32 = 1;

/// Where the OpenBao token came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TokenSource {
    /// Minted from the kit's bootstrap grant.
    Bootstrap,
    /// Minted from a lease.
    Lease,
}

/// What is known about the token in `bao.token` (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TokenState {
    /// Bootstrap or lease.
    pub(crate) source: TokenSource,
    /// When it was minted (unix seconds).
    pub(crate) obtained_at: u64,
    /// When it expires unless renewed (unix seconds); shown, and a fallback only: a wall
    /// clock step moves it.
    pub(crate) expires_at: u64,
    /// When it was minted, on the boot clock: its age for the re-lease within a boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) obtained_boot: Option<BootDeadline>,
    /// When it expires unless renewed, on the boot clock, from OpenBao's TTL: what renewal is
    /// scheduled by within a boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires_boot: Option<BootDeadline>,
    /// The TTL it was minted with (OpenBao's answer); a renewal granting less has reached the
    /// token's max TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) creation_ttl_s: Option<u64>,
    /// A renewal came back short of `creation_ttl_s`, or the token is older than the agent
    /// keeps one: the max TTL is near, lease again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) max_ttl_near: bool,
    /// When the token ends for good (unix seconds), as OpenBao said by capping a renewal at
    /// it; before that the end is estimated (see [`TokenState::max_ttl_end`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_expires_at: Option<u64>,
}

impl TokenState {
    /// Facts known by the wall clock alone (a state taken over from the original agent): the
    /// first upkeep asks OpenBao for the rest.
    #[must_use]
    pub(crate) fn from_wall(source: TokenSource, obtained_at: u64, expires_at: u64) -> Self {
        Self {
            source,
            obtained_at,
            expires_at,
            obtained_boot: None,
            expires_boot: None,
            creation_ttl_s: None,
            max_ttl_near: false,
            max_expires_at: None,
        }
    }

    /// When the token ends for good, whatever renews it, and whether OpenBao said so: the
    /// end a capped renewal gave, else the minting plus the role's documented max TTL
    /// ([`ASSUMED_MAX_TTL_S`]), which the agent's own re-lease at 28 days also counts on.
    #[must_use]
    pub(crate) fn max_ttl_end(&self) -> (u64, bool) {
        match self.max_expires_at {
            Some(end) => (end, true),
            None => (self.obtained_at.saturating_add(ASSUMED_MAX_TTL_S), false),
        }
    }
}

/// Why the box lost its OpenBao token, judged when OpenBao refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TokenLossCause {
    /// OpenBao refused a token the agent's record says is alive: revoked, or its grant
    /// superseded by tenancy (a kit re-reveal, a retire).
    Revoked,
    /// Its TTL ran out by the agent's record: no tick renewed it in time.
    Expired,
    /// It reached its max TTL: no renewal extends it, only a new grant does.
    MaxTtl,
}

/// The token the box lost, kept until it has a token again, so every view says why it has
/// none (the tick after the loss, `status`, `explain`, `doctor`, the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TokenLoss {
    /// Why.
    pub(crate) cause: TokenLossCause,
    /// When OpenBao refused it (unix seconds).
    pub(crate) seen_at: u64,
    /// When it ended by the agent's record (unix seconds), for an expiry or the max TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ended_at: Option<u64>,
}

impl TokenLoss {
    /// The loss of the token `facts` describes, refused by OpenBao at `now`: its max TTL
    /// passed, else its TTL ran out, by the agent's record; else it was revoked or superseded.
    #[must_use]
    pub(crate) fn judged(facts: Option<&TokenState>, now: u64) -> Self {
        let (cause, ended_at) = match facts {
            Some(t) if t.max_ttl_end().0 <= now => {
                (TokenLossCause::MaxTtl, Some(t.max_ttl_end().0))
            }
            Some(t) if t.expires_at <= now => (TokenLossCause::Expired, Some(t.expires_at)),
            _ => (TokenLossCause::Revoked, None),
        };
        Self {
            cause,
            seen_at: now,
            ended_at,
        }
    }

    /// The metrics label and status's word for the cause.
    #[must_use]
    pub(crate) fn cause_name(&self) -> &'static str {
        match self.cause {
            TokenLossCause::Revoked => "revoked",
            TokenLossCause::Expired => "expired",
            TokenLossCause::MaxTtl => "max_ttl",
        }
    }
}

impl std::fmt::Display for TokenLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = |t: u64| crate::clock::rfc3339(t);
        match (self.cause, self.ended_at) {
            (TokenLossCause::MaxTtl, Some(end)) => {
                write!(f, "the token reached its max TTL at {}", at(end))
            }
            (TokenLossCause::Expired, Some(end)) => write!(
                f,
                "the token expired at {} by the agent's record (its TTL ran out unrenewed)",
                at(end)
            ),
            _ => write!(
                f,
                "the token was revoked or superseded by tenancy (OpenBao refused it at {})",
                at(self.seen_at)
            ),
        }
    }
}

/// The `see-env` role's `token_max_ttl` as docs/OPERATIONS.md gives it (30 days): the end
/// assumed for a token until OpenBao caps a renewal at the real one.
pub(crate) const ASSUMED_MAX_TTL_S: u64 = 30 * 24 * 3600;

/// How long after its last heal a crash loop keeps the box from converged: the service must
/// stay up that long.
pub(crate) const CRASH_LOOP_SECS: u64 = 3600;

/// A crash loop: a heal that found a service dead again within the hour, by its own exit (a
/// stop or kill from outside, the OOM killer, an engine restart are no crash). The one record
/// that the tick's exit and report, `status`, `explain`, doctor and the metrics read for the
/// hour after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CrashLoop {
    /// When (unix seconds).
    pub(crate) at: u64,
    /// The same moment on the boot clock: the hour is counted on it within the boot, so that
    /// no wall-clock step lengthens or ends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) at_boot: Option<BootDeadline>,
    /// The heals of a service that died by its own exit within the hour up to it.
    pub(crate) heals: u32,
    /// The service that died (the first, when more did).
    #[serde(default)]
    pub(crate) service: String,
    /// Its exit code.
    #[serde(default)]
    pub(crate) exit_code: Option<i32>,
    /// Its own last lines before it died, redacted.
    #[serde(default)]
    pub(crate) last_lines: Option<Redacted>,
}

/// Seconds from a moment kept as `at` (wall) and `at_boot` (boot clock) to `now` / `boot`: on
/// the boot clock within the same boot, which no wall-clock step moves, else on the wall.
fn seconds_since(
    at: u64,
    at_boot: Option<&BootDeadline>,
    now: u64,
    boot: Option<&BootInstant>,
) -> u64 {
    at_boot
        .zip(boot)
        .and_then(|(at_boot, boot)| at_boot.elapsed(boot))
        .unwrap_or_else(|| now.saturating_sub(at))
}

/// serde's test for a counter that is left out of state.json while it is zero.
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A container as last seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SeenContainer {
    /// Container name.
    pub(crate) name: String,
    /// `running`, `exited`, ...
    pub(crate) state: String,
    /// `healthy`, `unhealthy`, `starting`, or none without a healthcheck.
    pub(crate) health: Option<String>,
    /// A one-shot that completed ([`monky_compose::Container::completed`]): done, not down.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) completed: bool,
}

impl SeenContainer {
    /// Up as compose means it ([`monky_compose::Container::is_ready`]).
    #[must_use]
    pub(crate) fn is_ready(&self) -> bool {
        monky_compose::Container::ready(&self.state, self.health.as_deref(), self.completed)
    }
}

/// A release whose apply failed after it was staged (render, model, pull, up or health) and
/// that waits out its backoff before it is tried again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailedRelease {
    /// The sha that failed.
    pub(crate) sha: Sha,
    /// How many applies of it failed in a row.
    pub(crate) attempts: u32,
    /// When it may be tried again (unix seconds); shown, and a fallback clamped to the longest
    /// wait after another boot.
    pub(crate) next_attempt_at: Option<u64>,
    /// The same deadline on the boot clock, which no wall-clock step moves.
    pub(crate) next_attempt_boot: Option<BootDeadline>,
    /// The code of its failure; none in a state that kept a code this version does not know.
    pub(crate) code: Option<Code>,
    /// `CODE: names` of its failure without the backoff note, repeated by the reports sent
    /// while it waits.
    pub(crate) detail: Option<Redacted>,
    /// The digest of the config parts that decided the verdict when it failed (see
    /// `backoff::verdict_key`): a config changed since then may decide otherwise, so the wait
    /// does not hold across it. None in a state written before it was kept.
    pub(crate) verdict_key: Option<String>,
}

/// The failed release as state.json has always kept it: flat `failed_*` fields beside the
/// others, written even when no release failed, so an upgrade or a downgrade reads it as before.
mod failed_fields {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{BootDeadline, Code, FailedRelease, Redacted, Sha};

    #[derive(Default, Serialize, Deserialize)]
    #[serde(default)]
    struct Flat {
        failed_sha: Option<Sha>,
        failed_attempts: u32,
        next_attempt_at: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        next_attempt_boot: Option<BootDeadline>,
        #[serde(deserialize_with = "crate::code::lenient")]
        failed_code: Option<Code>,
        failed_detail: Option<Redacted>,
        #[serde(skip_serializing_if = "Option::is_none")]
        failed_verdict_key: Option<String>,
    }

    #[allow(clippy::ref_option)] // serde's `with` hands a reference to the field
    pub(super) fn serialize<S: Serializer>(
        failed: &Option<FailedRelease>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let flat = failed.clone().map_or_else(Flat::default, |f| Flat {
            failed_sha: Some(f.sha),
            failed_attempts: f.attempts,
            next_attempt_at: f.next_attempt_at,
            next_attempt_boot: f.next_attempt_boot,
            failed_code: f.code,
            failed_detail: f.detail,
            failed_verdict_key: f.verdict_key,
        });
        flat.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<FailedRelease>, D::Error> {
        let flat = Flat::deserialize(d)?;
        Ok(flat.failed_sha.map(|sha| FailedRelease {
            sha,
            attempts: flat.failed_attempts,
            next_attempt_at: flat.next_attempt_at,
            next_attempt_boot: flat.next_attempt_boot,
            code: flat.failed_code,
            detail: flat.failed_detail,
            verdict_key: flat.failed_verdict_key,
        }))
    }
}

/// The persisted state. Its fields change only through the methods below, each named for what
/// happened; everything else reads them through the accessors of the same names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct State {
    /// Format version.
    version: u32,
    /// The env this state belongs to.
    env_id: String,
    /// The sha that is running and was last healthy.
    applied_sha: Option<Sha>,
    /// What tenancy last asked for.
    desired_sha: Option<Sha>,
    /// Every sha applied, oldest first (rollback checks).
    applied_history: Vec<Sha>,
    /// Last successful checkin (unix seconds).
    last_checkin: Option<u64>,
    /// Last report sent (unix seconds).
    last_report: Option<u64>,
    /// `applied`, `failed` or `down`: what the last tick that reached an action concluded, and
    /// reported unless `last_error` names the report's own failure.
    last_result: Option<String>,
    /// `CODE: names` of the last failure, redacted.
    last_error: Option<Redacted>,
    /// The code of `last_error`, kept as a code so that nothing reads it back out of the text.
    #[serde(deserialize_with = "crate::code::lenient")]
    last_code: Option<Code>,
    /// Token facts.
    token: Option<TokenState>,
    /// The token the box lost and why, until it has one again.
    #[serde(skip_serializing_if = "Option::is_none")]
    token_lost: Option<TokenLoss>,
    /// Containers as last seen.
    containers: Vec<SeenContainer>,
    /// Tenancy's checkin interval.
    checkin_interval_s: Option<u64>,
    /// The KV mount tenancy named, when it differs from config.
    kv_mount: Option<String>,
    /// Whether the running release is prod (its bundle's tier), for retire without a bundle.
    applied_prod: Option<bool>,
    /// The release whose apply failed after it was staged, if it still waits (state.json's flat
    /// `failed_*` fields).
    #[serde(flatten, with = "failed_fields")]
    failed: Option<FailedRelease>,
    /// Refusals and failures seen, by code (for the metrics file).
    refusals: BTreeMap<String, u64>,
    /// The last bundle's disk need in bytes (for `doctor`).
    last_disk_need_bytes: Option<u64>,
    /// The last tick that ended with exit 0 (unix seconds).
    last_success: Option<u64>,
    /// The compose found last time (a heartbeat spawns no process to find it again).
    compose: Option<monky_compose::ComposeInfo>,
    /// The daemon's facts found last time (a heartbeat asks `/info` only when the daemon names
    /// another version).
    #[serde(skip_serializing_if = "Option::is_none")]
    engine: Option<monky_compose::EngineInfo>,
    /// The running release when it was written by the original agent (state taken over from
    /// it); cleared by the first apply of this agent.
    original_release: Option<Sha>,
    /// The action tenancy answered in the last tick's checkin (`none`, `apply`, `down`); none
    /// when the tick ended before a checkin answered.
    last_action: Option<String>,
    /// How many ticks in a row before the last one ended with the same code: the journal says
    /// "same CODE as the last N ticks" instead of repeating the whole error.
    repeats: u32,
    /// Variables whose value the original agent's `.env` handed to the app differently from
    /// the value now written (names only), found by the first apply after the takeover.
    quoting_changed: Vec<String>,
    /// What the last healthy `up` of the applied release left, by container; drift is measured
    /// against it.
    #[serde(deserialize_with = "crate::drift::lenient")]
    converged: Option<crate::drift::Converged>,
    /// Heals within an hour of each other, the last included (the heal backoff's step).
    heal_attempts: u32,
    /// Of those heals, the ones of a service that died by its own exit: a crash loop from two.
    #[serde(skip_serializing_if = "is_zero")]
    heal_crashes: u32,
    /// Of those heals, the ones of a container stopped from outside (`docker stop`/`kill`, an
    /// engine restart, the OOM killer): the box admin's to explain, no crash.
    #[serde(skip_serializing_if = "is_zero")]
    heal_outside_stops: u32,
    /// When the last heal ran (unix seconds).
    last_heal_at: Option<u64>,
    /// The same moment on the boot clock, which no wall-clock step moves.
    #[serde(skip_serializing_if = "Option::is_none")]
    last_heal_boot: Option<BootDeadline>,
    /// When drift may be healed again (unix seconds); shown, and a fallback after another boot.
    next_heal_at: Option<u64>,
    /// The last heal that found a service dead again within the hour (`CRASH_LOOP`): when,
    /// and the heals within that hour. The box is not converged for an hour after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    crash_loop: Option<CrashLoop>,
    /// The same deadline on the boot clock, which no wall-clock step moves.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_heal_boot: Option<BootDeadline>,
    /// What the last `applied` report noted beside the result (`HEALED: ...`,
    /// `APPLY_INTERRUPTED: ...`, `HELD: ...`), redacted.
    last_note: Option<Redacted>,
    /// The operator's hold as the last tick found it (for the metrics file).
    hold: Option<crate::hold::Hold>,
    /// How far the box's wall clock was from OpenBao's at the last OpenBao answer a tick read
    /// (its `Date`); the tick, `status` and `explain` judge the clock by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    clock: Option<crate::clock::ClockReading>,
    /// What the last look at the running release's processes saw: the services that get a
    /// secret (a heartbeat builds no compose model) and the uids that ran.
    #[serde(
        deserialize_with = "crate::runtime_look::lenient",
        skip_serializing_if = "Option::is_none"
    )]
    looked: Option<crate::runtime_look::Looked>,
}

/// Read access, one accessor per field, named as the field.
impl State {
    /// What the last look at the running release's processes saw.
    #[must_use]
    pub(crate) fn looked(&self) -> Option<&crate::runtime_look::Looked> {
        self.looked.as_ref()
    }

    /// Format version.
    #[must_use]
    pub(crate) fn version(&self) -> u32 {
        self.version
    }
    /// The env this state belongs to.
    #[must_use]
    pub(crate) fn env_id(&self) -> &str {
        &self.env_id
    }
    /// The sha that is running and was last healthy.
    #[must_use]
    pub(crate) fn applied_sha(&self) -> Option<&Sha> {
        self.applied_sha.as_ref()
    }
    /// What tenancy last asked for.
    #[must_use]
    pub(crate) fn desired_sha(&self) -> Option<&Sha> {
        self.desired_sha.as_ref()
    }
    /// Every sha applied, oldest first.
    #[must_use]
    pub(crate) fn applied_history(&self) -> &[Sha] {
        &self.applied_history
    }
    /// Last successful checkin (unix seconds).
    #[must_use]
    pub(crate) fn last_checkin(&self) -> Option<u64> {
        self.last_checkin
    }
    /// Last report sent (unix seconds).
    #[must_use]
    pub(crate) fn last_report(&self) -> Option<u64> {
        self.last_report
    }
    /// `applied`, `failed` or `down`.
    #[must_use]
    pub(crate) fn last_result(&self) -> Option<&str> {
        self.last_result.as_deref()
    }
    /// `CODE: names` of the last failure, redacted.
    #[must_use]
    pub(crate) fn last_error(&self) -> Option<&Redacted> {
        self.last_error.as_ref()
    }
    /// The code of `last_error`.
    #[must_use]
    pub(crate) fn last_code(&self) -> Option<Code> {
        self.last_code
    }
    /// Token facts.
    #[must_use]
    pub(crate) fn token(&self) -> Option<&TokenState> {
        self.token.as_ref()
    }
    /// The token the box lost and why, until it has one again.
    #[must_use]
    pub(crate) fn token_lost(&self) -> Option<&TokenLoss> {
        self.token_lost.as_ref()
    }
    /// Containers as last seen.
    #[must_use]
    pub(crate) fn containers(&self) -> &[SeenContainer] {
        &self.containers
    }
    /// Tenancy's checkin interval.
    #[must_use]
    pub(crate) fn checkin_interval_s(&self) -> Option<u64> {
        self.checkin_interval_s
    }
    /// The KV mount tenancy named, when it differs from config.
    #[must_use]
    pub(crate) fn kv_mount(&self) -> Option<&str> {
        self.kv_mount.as_deref()
    }
    /// Whether the running release is prod.
    #[must_use]
    pub(crate) fn applied_prod(&self) -> Option<bool> {
        self.applied_prod
    }
    /// The release that failed and waits out its backoff.
    #[must_use]
    pub(crate) fn failed(&self) -> Option<&FailedRelease> {
        self.failed.as_ref()
    }
    /// Refusals and failures seen, by code.
    #[must_use]
    pub(crate) fn refusals(&self) -> &BTreeMap<String, u64> {
        &self.refusals
    }
    /// The last bundle's disk need in bytes.
    #[must_use]
    pub(crate) fn last_disk_need_bytes(&self) -> Option<u64> {
        self.last_disk_need_bytes
    }
    /// The last tick that ended with exit 0 (unix seconds).
    #[must_use]
    pub(crate) fn last_success(&self) -> Option<u64> {
        self.last_success
    }
    /// The compose found last time.
    #[must_use]
    pub(crate) fn compose(&self) -> Option<&monky_compose::ComposeInfo> {
        self.compose.as_ref()
    }
    /// The daemon's facts found last time.
    #[must_use]
    pub(crate) fn engine(&self) -> Option<&monky_compose::EngineInfo> {
        self.engine.as_ref()
    }
    /// The running release, when the original agent wrote it.
    #[must_use]
    pub(crate) fn original_release(&self) -> Option<&Sha> {
        self.original_release.as_ref()
    }
    /// The action tenancy answered in the last tick's checkin.
    #[must_use]
    pub(crate) fn last_action(&self) -> Option<&str> {
        self.last_action.as_deref()
    }
    /// How many ticks in a row before the last one ended the same.
    #[must_use]
    pub(crate) fn repeats(&self) -> u32 {
        self.repeats
    }
    /// Variables the original agent's `.env` handed to the app differently.
    #[must_use]
    pub(crate) fn quoting_changed(&self) -> &[String] {
        &self.quoting_changed
    }
    /// What the last healthy `up` of the applied release left.
    #[must_use]
    pub(crate) fn converged(&self) -> Option<&crate::drift::Converged> {
        self.converged.as_ref()
    }
    /// Heals within an hour of each other, the last included.
    #[must_use]
    pub(crate) fn heal_attempts(&self) -> u32 {
        self.heal_attempts
    }
    /// Of those heals, the ones of a service that died by its own exit.
    #[must_use]
    pub(crate) fn heal_crashes(&self) -> u32 {
        self.heal_crashes
    }
    /// Of those heals, the ones of a container stopped from outside.
    #[must_use]
    pub(crate) fn heal_outside_stops(&self) -> u32 {
        self.heal_outside_stops
    }
    /// When the last heal ran (unix seconds).
    #[must_use]
    pub(crate) fn last_heal_at(&self) -> Option<u64> {
        self.last_heal_at
    }
    /// The last crash loop found, when it is within [`CRASH_LOOP_SECS`] of `now` (`boot` on
    /// the boot clock, counted on it within the boot the loop was found in).
    #[must_use]
    pub(crate) fn crash_loop(&self, now: u64, boot: Option<&BootInstant>) -> Option<&CrashLoop> {
        self.crash_loop
            .as_ref()
            .filter(|c| seconds_since(c.at, c.at_boot.as_ref(), now, boot) < CRASH_LOOP_SECS)
    }
    /// Whether the last heal ran less than `memory` seconds before `now` (`boot` on the boot
    /// clock, as [`State::crash_loop`] counts).
    #[must_use]
    pub(crate) fn heal_within(&self, memory: u64, now: u64, boot: Option<&BootInstant>) -> bool {
        self.last_heal_at
            .is_some_and(|at| seconds_since(at, self.last_heal_boot.as_ref(), now, boot) < memory)
    }
    /// When drift may be healed again (unix seconds).
    #[must_use]
    pub(crate) fn next_heal_at(&self) -> Option<u64> {
        self.next_heal_at
    }
    /// The same deadline on the boot clock.
    #[must_use]
    pub(crate) fn next_heal_boot(&self) -> Option<&BootDeadline> {
        self.next_heal_boot.as_ref()
    }
    /// What the last `applied` report noted beside the result.
    #[must_use]
    pub(crate) fn last_note(&self) -> Option<&Redacted> {
        self.last_note.as_ref()
    }
    /// The operator's hold as the last tick found it.
    #[must_use]
    pub(crate) fn hold(&self) -> Option<&crate::hold::Hold> {
        self.hold.as_ref()
    }
    /// How far the box's clock was from OpenBao's at the last reading.
    #[must_use]
    pub(crate) fn clock(&self) -> Option<&crate::clock::ClockReading> {
        self.clock.as_ref()
    }
}

/// What the original agent's `state.json` gives the state taken over from it
/// (`statefile.rs`), every value already of its shape.
#[derive(Debug, Default)]
pub(crate) struct Original {
    /// The running release, which becomes `original_release` too.
    pub(crate) applied_sha: Option<Sha>,
    /// Its tier, from its `bundle.json` on disk.
    pub(crate) applied_prod: Option<bool>,
    /// What tenancy last asked for.
    pub(crate) desired_sha: Option<Sha>,
    /// The shas applied, oldest first, the running one last.
    pub(crate) applied_history: Vec<Sha>,
    /// Last checkin and report (unix seconds).
    pub(crate) last_checkin: Option<u64>,
    /// See `last_checkin`.
    pub(crate) last_report: Option<u64>,
    /// `applied`, `failed` or `down`.
    pub(crate) last_result: Option<String>,
    /// Token facts.
    pub(crate) token: Option<TokenState>,
}

impl State {
    /// A clean state for `env_id`.
    #[must_use]
    pub(crate) fn new(env_id: &str) -> Self {
        Self {
            version: STATE_VERSION,
            env_id: env_id.to_string(),
            ..Self::default()
        }
    }

    /// The state taken over from the original agent's file.
    pub(crate) fn taken_over(env_id: &str, o: Original) -> Self {
        Self {
            applied_history: o.applied_history,
            original_release: o.applied_sha.clone(),
            applied_sha: o.applied_sha,
            applied_prod: o.applied_prod,
            desired_sha: o.desired_sha,
            last_checkin: o.last_checkin,
            last_report: o.last_report,
            last_result: o.last_result,
            token: o.token,
            ..Self::new(env_id)
        }
    }

    /// The state as the last tick saved it, for the read-only commands (status, explain,
    /// doctor, the metrics file): bounded, regular file only, and a default when it is missing
    /// or unreadable. Only the tick's load (`statefile::load`, under the lock) moves a bad file aside.
    pub(crate) fn peek(layout: &Layout) -> Self {
        layout
            .peek_state()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Saves atomically (0600), one save of the process at a time: the tick deadline may record
    /// a timeout from another thread.
    pub(crate) fn save(&self, layout: &Layout) -> anyhow::Result<()> {
        let _one_at_a_time = save_lock();
        self.save_holding_lock(layout)
    }

    /// As [`State::save`], for a caller that holds [`save_lock`] already.
    pub(crate) fn save_holding_lock(&self, layout: &Layout) -> anyhow::Result<()> {
        let mut bytes = serde_json::to_vec_pretty(self).context("cannot encode state")?;
        bytes.push(b'\n');
        layout.write_state(&bytes)
    }
}

impl State {
    /// Folds one fact of a tick into the state: the one way a `State` changes after it is
    /// loaded. A step of the tick says what happened as a [`Fact`]; the tick folds it (see
    /// `tick::Run::record`), and the tick's deadline folds the one fact it adds from its own
    /// thread ([`Fact::TimedOut`]).
    pub(crate) fn fold(&mut self, fact: Fact) {
        match fact {
            Fact::TickBegan => self.begin_tick(),
            Fact::ClockRead(reading) => self.read_clock(reading),
            Fact::CheckedIn {
                action,
                desired,
                interval_s,
                at,
            } => self.checked_in(action, desired, interval_s, at),
            Fact::KvMountAdopted(mount) => self.adopt_kv_mount(mount),
            Fact::ContainersSeen(containers) => self.saw_containers(containers),
            Fact::ComposeFound(compose) => self.found_compose(compose),
            Fact::EngineFound(engine) => self.engine = engine,
            Fact::HoldFound(hold) => self.found_hold(hold),
            Fact::DiskNeeded(bytes) => self.needs_disk(bytes),
            Fact::QuotingChanged(names) => self.found_quoting_changed(names),
            Fact::Applied { sha, prod } => self.mark_applied(&sha, prod),
            Fact::ReleaseOwned => self.own_release(),
            Fact::AppliedForgotten => self.forget_applied(),
            Fact::ReleaseFailed(failed) => self.mark_failed(failed),
            Fact::BackoffRebased {
                next_attempt_at,
                next_attempt_boot,
            } => self.rebase_failed(next_attempt_at, next_attempt_boot),
            Fact::FailureForgotten => self.clear_failed(),
            Fact::TokenFacts(token) => self.set_token_facts(token),
            Fact::TokenLost(loss) => self.lose_token(loss),
            Fact::TokenTtlLearnt {
                expires_at,
                expires_boot,
            } => self.token_ttl_learnt(expires_at, expires_boot),
            Fact::TokenMaxTtlNear => self.token_max_ttl_near(),
            Fact::TokenMaxTtlReached(end) => self.token_max_ttl_reached(end),
            Fact::Converged(converged) => self.record_converged(converged),
            Fact::CrashLooped(c) => self.crash_looped(c),
            Fact::Looked(looked) => self.looked = Some(looked),
            Fact::Withdrawn { sha, to } => self.withdraw(&sha, to),
            Fact::Healing {
                attempts,
                crashes,
                outside_stops,
                at,
                at_boot,
                next_at,
                next_boot,
            } => {
                self.heal_crashes = crashes;
                self.heal_outside_stops = outside_stops;
                self.healing(attempts, (at, at_boot), next_at, next_boot);
            }
            Fact::Concluded {
                result,
                failure,
                note,
                reported_at,
            } => self.record_outcome(result, failure, note, reported_at),
            Fact::TimedOut(detail) => self.record_timeout(detail),
            Fact::TickEnded {
                succeeded_at,
                previous,
            } => self.count_tick(succeeded_at, &previous),
        }
    }

    /// OpenBao's clock was read from one of its answers: how far the box's clock was off.
    fn read_clock(&mut self, reading: crate::clock::ClockReading) {
        self.clock = Some(reading);
    }

    /// A tick starts: its action is none until tenancy answers.
    fn begin_tick(&mut self) {
        self.last_action = None;
    }

    /// Tenancy answered a checkin at `at` with `action`, wanting `desired`, with its interval.
    fn checked_in(
        &mut self,
        action: monky_agent_proto::ActionKind,
        desired: Option<Sha>,
        interval_s: Option<u64>,
        at: u64,
    ) {
        // state.json keeps the wire's spelling.
        self.last_action = Some(action.as_str().to_string());
        self.last_checkin = Some(at);
        self.desired_sha = desired;
        self.checkin_interval_s = interval_s;
    }

    /// The KV mount tenancy names when it differs from the config's (else none).
    fn adopt_kv_mount(&mut self, mount: Option<String>) {
        self.kv_mount = mount;
    }

    /// The project's containers as just listed.
    fn saw_containers(&mut self, containers: Vec<SeenContainer>) {
        self.containers = containers;
    }

    /// The compose found on the box, for the next heartbeat.
    fn found_compose(&mut self, compose: Option<monky_compose::ComposeInfo>) {
        self.compose = compose;
    }

    /// The operator's hold as this tick found it.
    fn found_hold(&mut self, hold: Option<crate::hold::Hold>) {
        self.hold = hold;
    }

    /// The desired bundle's disk need, for `doctor`.
    fn needs_disk(&mut self, bytes: Option<u64>) {
        self.last_disk_need_bytes = bytes;
    }

    /// The first apply over the original agent's release found these variables handed to the
    /// app differently.
    fn found_quoting_changed(&mut self, names: Vec<String>) {
        self.quoting_changed = names;
    }

    /// The release that runs is this agent's own now.
    fn own_release(&mut self) {
        self.original_release = None;
    }

    /// Nothing healthy of this agent's runs any more: `applied_prod` goes with `applied_sha`,
    /// so that it never describes another release than the one `applied_sha` names.
    fn forget_applied(&mut self) {
        self.applied_prod = None;
        self.applied_sha = None;
    }

    /// A release failed after it was staged and waits out its backoff.
    fn mark_failed(&mut self, failed: FailedRelease) {
        self.failed = Some(failed);
    }

    /// The failed release's wait, carried into this boot (`Backoff::rebase`).
    fn rebase_failed(&mut self, next_attempt_at: u64, next_attempt_boot: Option<BootDeadline>) {
        if let Some(f) = self.failed.as_mut() {
            f.next_attempt_at = Some(next_attempt_at);
            f.next_attempt_boot = next_attempt_boot;
        }
    }

    /// Forgets a failed release and its backoff: it applied, or tenancy wants another sha.
    fn clear_failed(&mut self) {
        self.failed = None;
    }

    /// The token's facts: minted, learnt from OpenBao, or gone with the token (`None`).
    fn set_token_facts(&mut self, token: Option<TokenState>) {
        if token.is_some() {
            self.token_lost = None;
        }
        self.token = token;
    }

    /// OpenBao refused the token, which is gone: why, kept until a token is stored again.
    fn lose_token(&mut self, loss: TokenLoss) {
        self.token = None;
        self.token_lost = Some(loss);
    }

    /// OpenBao said how long the token has left: its expiry on the wall and boot clocks.
    fn token_ttl_learnt(&mut self, expires_at: u64, expires_boot: Option<BootDeadline>) {
        if let Some(t) = self.token.as_mut() {
            t.expires_at = expires_at;
            t.expires_boot = expires_boot;
        }
    }

    /// The token is older than the agent keeps one: its max TTL is near.
    fn token_max_ttl_near(&mut self) {
        if let Some(t) = self.token.as_mut() {
            t.max_ttl_near = true;
        }
    }

    /// A renewal came back short of the token's TTL, capped by its max TTL at `end` (unix
    /// seconds): the token ends for good then.
    fn token_max_ttl_reached(&mut self, end: u64) {
        if let Some(t) = self.token.as_mut() {
            t.max_ttl_near = true;
            t.max_expires_at = Some(end);
        }
    }

    /// What a healthy `up` left, for drift detection.
    fn record_converged(&mut self, converged: crate::drift::Converged) {
        self.converged = Some(converged);
    }

    /// A heal found a service dead again by its own exit within the hour: a crash loop.
    fn crash_looped(&mut self, c: CrashLoop) {
        self.crash_loop = Some(c);
    }

    /// A heal ran at `at` (wall, boot clock), the `attempts`-th within the heal memory; the
    /// next may run at `next_at` (and `next_boot` on the boot clock).
    fn healing(
        &mut self,
        attempts: u32,
        at: (u64, Option<BootDeadline>),
        next_at: u64,
        next_boot: Option<BootDeadline>,
    ) {
        self.heal_attempts = attempts;
        self.last_heal_at = Some(at.0);
        self.last_heal_boot = at.1;
        self.next_heal_at = Some(next_at);
        self.next_heal_boot = next_boot;
    }

    /// Records what a tick concluded: `result` what it told tenancy (or would have; `None`
    /// when it reached no action, and the last result stands), `failure` its code and
    /// `CODE: names` detail (redacted), `note` what an `applied` result noted, `reported_at`
    /// when the report went out. The only writer of the outcome fields: `Run::conclude`
    /// calls it once per tick, and the tick's deadline (see [`State::record_timeout`]).
    fn record_outcome(
        &mut self,
        result: Option<monky_agent_proto::ReportResult>,
        failure: Option<(Code, Redacted)>,
        note: Option<Redacted>,
        reported_at: Option<u64>,
    ) {
        if let Some(result) = result {
            self.last_result = Some(result.as_str().to_string());
            self.last_note = note;
        }
        if reported_at.is_some() {
            self.last_report = reported_at;
        }
        let (code, error) = failure.unzip();
        self.last_code = code;
        self.last_error = error;
    }

    /// The tick's deadline passed: `detail` (`TICK_TIMEOUT: ...`) is recorded as a failed
    /// outcome and counted, from the deadline's thread, since the tick can no longer conclude.
    fn record_timeout(&mut self, detail: Redacted) {
        let code = Code::TickTimeout;
        let previous = (self.last_code, self.last_error.clone());
        self.record_outcome(
            Some(monky_agent_proto::ReportResult::Failed),
            Some((code, detail)),
            None,
            None,
        );
        self.count_tick(None, &previous);
    }

    /// The tick ended: `succeeded_at` when it ended with exit 0, else its code (recorded by
    /// the outcome) is counted; a failure equal to `previous` tick's (code and detail) counts
    /// as a repeat.
    fn count_tick(
        &mut self,
        succeeded_at: Option<u64>,
        previous: &(Option<Code>, Option<Redacted>),
    ) {
        match succeeded_at {
            Some(at) => self.last_success = Some(at),
            None => {
                if let Some(code) = self.last_code {
                    self.count_failure(code);
                }
            }
        }
        // The same code counts, whatever its detail says: a wait's next attempt, a heal's
        // time or a container's state move from tick to tick, and "same CODE as the last N
        // ticks" is what the journal says.
        let failed =
            |code: Option<Code>, error: Option<&Redacted>| code.filter(|_| error.is_some());
        let now = failed(self.last_code, self.last_error.as_ref());
        self.repeats = if now.is_some() && now == failed(previous.0, previous.1.as_ref()) {
            self.repeats.saturating_add(1)
        } else {
            0
        };
    }

    fn count_failure(&mut self, code: Code) {
        *self.refusals.entry(code.as_str().to_string()).or_default() += 1;
    }

    /// Records a sha as applied (and healthy).
    /// See [`Fact::Withdrawn`].
    fn withdraw(&mut self, sha: &Sha, to: Option<(Sha, bool)>) {
        self.applied_history.retain(|s| s != sha);
        match to {
            Some((to, prod)) => self.mark_applied(&to, prod),
            None => self.forget_applied(),
        }
    }

    fn mark_applied(&mut self, sha: &Sha, prod: bool) {
        // Another release is a fresh start: the crash loop and the heals were the last one's.
        if self.applied_sha.as_ref() != Some(sha) {
            self.crash_loop = None;
            self.heal_crashes = 0;
            self.heal_outside_stops = 0;
        }
        self.applied_sha = Some(sha.clone());
        self.applied_prod = Some(prod);
        self.applied_history.retain(|s| s != sha);
        self.applied_history.push(sha.clone());
        let excess = self.applied_history.len().saturating_sub(50);
        self.applied_history.drain(..excess);
    }
}

/// What happened in a tick, as the state keeps it: the vocabulary of every change to a loaded
/// [`State`], folded in by [`State::fold`] and nowhere else.
#[derive(Debug)]
pub(crate) enum Fact {
    /// A tick starts: its action is none until tenancy answers.
    TickBegan,
    /// OpenBao's clock was read from one of its answers: how far the box's clock was off.
    ClockRead(crate::clock::ClockReading),
    /// Tenancy answered a checkin at `at` with `action`, wanting `desired`, with its interval.
    CheckedIn {
        /// The action tenancy chose.
        action: monky_agent_proto::ActionKind,
        /// The sha tenancy wants.
        desired: Option<Sha>,
        /// Tenancy's checkin interval.
        interval_s: Option<u64>,
        /// When (unix seconds).
        at: u64,
    },
    /// The KV mount tenancy names when it differs from the config's (else none).
    KvMountAdopted(Option<String>),
    /// The project's containers as just listed.
    ContainersSeen(Vec<SeenContainer>),
    /// The compose found on the box, for the next heartbeat.
    ComposeFound(Option<monky_compose::ComposeInfo>),
    /// The daemon's facts, for the next heartbeat.
    EngineFound(Option<monky_compose::EngineInfo>),
    /// The operator's hold as this tick found it.
    HoldFound(Option<crate::hold::Hold>),
    /// The desired bundle's disk need, for `doctor`.
    DiskNeeded(Option<u64>),
    /// The first apply over the original agent's release found these variables handed to the
    /// app differently.
    QuotingChanged(Vec<String>),
    /// A sha came up healthy: it is the applied release, with its bundle's tier.
    Applied {
        /// The release.
        sha: Sha,
        /// Whether its bundle says prod.
        prod: bool,
    },
    /// The release that runs is this agent's own now.
    ReleaseOwned,
    /// Nothing healthy of this agent's runs any more: `applied_prod` goes with `applied_sha`.
    AppliedForgotten,
    /// A release failed after it was staged and waits out its backoff.
    ReleaseFailed(FailedRelease),
    /// The failed release's wait, carried into this boot (`Backoff::rebase`).
    BackoffRebased {
        /// The wall-clock deadline.
        next_attempt_at: u64,
        /// The same moment on this boot's clock.
        next_attempt_boot: Option<BootDeadline>,
    },
    /// A failed release and its backoff are forgotten: it applied, or tenancy wants another.
    FailureForgotten,
    /// The token's facts: minted, learnt from OpenBao, or gone with the token (`None`).
    TokenFacts(Option<TokenState>),
    /// OpenBao refused the token, which is gone: why (kept until a token is stored again).
    TokenLost(TokenLoss),
    /// OpenBao said how long the token has left: its expiry on the wall and boot clocks.
    TokenTtlLearnt {
        /// Unix seconds.
        expires_at: u64,
        /// On this boot's clock.
        expires_boot: Option<BootDeadline>,
    },
    /// The token is older than the agent keeps one: its max TTL is near.
    TokenMaxTtlNear,
    /// A renewal came back short, capped by the token's max TTL at this time (unix seconds).
    TokenMaxTtlReached(u64),
    /// What a healthy `up` left, for drift detection.
    Converged(crate::drift::Converged),
    /// A heal found a service dead again by its own exit within the hour: a crash loop.
    CrashLooped(CrashLoop),
    /// What the look at a release's processes saw.
    Looked(crate::runtime_look::Looked),
    /// The applied `sha` was seen leaking a secret while it ran and is no longer applied: it
    /// leaves the history (so tenancy may ask for it again) and `to` (a release and its tier)
    /// runs instead, or nothing does.
    Withdrawn {
        /// The release withdrawn.
        sha: Sha,
        /// The release fallen back to, with whether it is prod.
        to: Option<(Sha, bool)>,
    },
    /// A heal ran at `at`, the `attempts`-th within the heal memory; the next may run at
    /// `next_at` (and `next_boot` on the boot clock).
    Healing {
        /// The heals within the heal memory, this one included.
        attempts: u32,
        /// Of those, the heals of a service that died by its own exit.
        crashes: u32,
        /// Of those, the heals of a container stopped from outside.
        outside_stops: u32,
        /// When (unix seconds).
        at: u64,
        /// The same moment on this boot's clock.
        at_boot: Option<BootDeadline>,
        /// When the next may run.
        next_at: u64,
        /// The same on this boot's clock.
        next_boot: Option<BootDeadline>,
    },
    /// What the tick concluded (see `State::record_outcome`): the one outcome a tick records.
    Concluded {
        /// What it told tenancy (or would have); `None`: it reached no action.
        result: Option<monky_agent_proto::ReportResult>,
        /// Its code and `CODE: names` detail, redacted.
        failure: Option<(Code, Redacted)>,
        /// What an `applied` result noted.
        note: Option<Redacted>,
        /// When the report went out.
        reported_at: Option<u64>,
    },
    /// The tick's deadline passed (`TICK_TIMEOUT: ...`), recorded from the deadline's thread.
    TimedOut(Redacted),
    /// The tick ended: `succeeded_at` when it ended with exit 0; `previous` is the last tick's
    /// code and error, to count a repeat.
    TickEnded {
        /// When, if it succeeded.
        succeeded_at: Option<u64>,
        /// The last tick's code and error.
        previous: (Option<Code>, Option<Redacted>),
    },
}

#[cfg(test)]
impl State {
    /// This state with `patch`'s keys written over it as state.json spells them: for tests of
    /// the readers, which cannot set the fields themselves.
    pub(crate) fn patched(&self, patch: serde_json::Value) -> Self {
        let mut doc = serde_json::to_value(self).unwrap();
        for (key, value) in patch.as_object().unwrap() {
            doc[key] = value.clone();
        }
        serde_json::from_value(doc).unwrap()
    }
}

/// Moves a state file that cannot be used aside and returns the clean state with a note.
#[cfg(test)]
mod tests {
    use super::*;

    fn sha(c: char) -> Sha {
        Sha::parse(&c.to_string().repeat(64)).unwrap()
    }

    /// The crash loop's hour and the heal memory are counted on the boot clock within their
    /// boot: a wall-clock step either way neither ends them early nor lengthens them. In
    /// another boot, or without a boot clock, the wall counts.
    #[test]
    fn a_crash_loops_hour_and_the_heal_memory_count_on_the_boot_clock() {
        let boot = |id: &str, secs| BootInstant {
            boot_id: id.into(),
            secs,
        };
        let at = 1_800_000_000;
        let mut st = State::default();
        st.fold(Fact::CrashLooped(CrashLoop {
            at,
            at_boot: Some(BootDeadline::after(&boot("b1", 500), 0)),
            heals: 2,
            service: "web".into(),
            exit_code: Some(1),
            last_lines: None,
        }));
        st.fold(Fact::Healing {
            attempts: 2,
            crashes: 2,
            outside_stops: 0,
            at,
            at_boot: Some(BootDeadline::after(&boot("b1", 500), 0)),
            next_at: at + 120,
            next_boot: Some(BootDeadline::after(&boot("b1", 500), 120)),
        });
        let memory = 3600;
        // Ten minutes on, by the boot clock, whichever way the wall stepped.
        for wall in [at + 7200, at - 7200] {
            assert!(
                st.crash_loop(wall, Some(&boot("b1", 1100))).is_some(),
                "{wall}"
            );
            assert!(
                st.heal_within(memory, wall, Some(&boot("b1", 1100))),
                "{wall}"
            );
        }
        // An hour on, by the boot clock, with the wall stepped back: over.
        assert!(st.crash_loop(at - 7200, Some(&boot("b1", 4100))).is_none());
        assert!(!st.heal_within(memory, at - 7200, Some(&boot("b1", 4100))));
        // Another boot, or no boot clock: the wall.
        for other in [Some(boot("b2", 10)), None] {
            assert!(st.crash_loop(at + 600, other.as_ref()).is_some());
            assert!(st.crash_loop(at + 3600, other.as_ref()).is_none());
            assert!(st.heal_within(memory, at + 600, other.as_ref()));
            assert!(!st.heal_within(memory, at + 3600, other.as_ref()));
        }
    }

    #[test]
    fn a_withdrawn_sha_leaves_the_history_and_the_one_before_runs_again() {
        let mut s = State::default();
        for c in ['a', 'b'] {
            s.fold(Fact::Applied {
                sha: sha(c),
                prod: false,
            });
        }
        s.fold(Fact::Withdrawn {
            sha: sha('b'),
            to: None,
        });
        assert_eq!(s.applied_sha(), None);
        s.fold(Fact::Withdrawn {
            sha: sha('b'),
            to: Some((sha('a'), true)),
        });
        assert_eq!(s.applied_sha(), Some(&sha('a')));
        assert_eq!(s.applied_prod(), Some(true));
        assert_eq!(s.applied_history(), [sha('a')]);
        // Asked for again, it is no rollback.
        assert!(monky_bundle::check_rollback(&sha('b'), s.applied_history(), false).is_ok());
        // What the look saw is kept, and a record that does not parse is dropped.
        s.fold(Fact::Looked(crate::runtime_look::Looked {
            sha: Some(sha('a')),
            holders: ["web".to_string()].into(),
            uids: [999].into(),
        }));
        let text = serde_json::to_string(&s).unwrap();
        let back: State = serde_json::from_str(&text).unwrap();
        assert_eq!(back.looked().map(|l| l.uids.clone()), Some([999].into()));
        let broken = text.replace("\"holders\":[\"web\"]", "\"holders\":7");
        let back: State = serde_json::from_str(&broken).unwrap();
        assert!(back.looked().is_none(), "{broken}");
    }

    #[test]
    fn round_trip_and_corrupt_files_are_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::open_at(dir.path(), "e1").unwrap();
        let (mut s, note) = crate::statefile::load(&layout).unwrap();
        assert!(note.is_none());
        s.mark_applied(&sha('a'), false);
        s.mark_applied(&sha('b'), false);
        s.mark_applied(&sha('a'), false);
        assert_eq!(s.applied_history(), [sha('b'), sha('a')]);
        s.save(&layout).unwrap();
        assert_eq!(crate::statefile::load(&layout).unwrap().0, s);

        for bad in [
            &b"{not json"[..],
            br#"{"version": 9, "env_id": "e1"}"#,
            br#"{"version": 1, "env_id": "e2"}"#,
            br#"{"env_id": "e2", "applied_sha": null}"#,
            // A sha is a shape in state.json too.
            br#"{"version": 1, "env_id": "e1", "applied_sha": "aaa"}"#,
        ] {
            std::fs::write(layout.state_path(), bad).unwrap();
            let (s, note) = crate::statefile::load(&layout).unwrap();
            assert_eq!(s.applied_sha(), None);
            assert!(note.unwrap().contains("set aside"));
            assert!(!layout.state_path().exists());
        }
    }

    #[test]
    fn a_lost_tokens_cause_is_judged_by_the_record_and_kept_until_a_new_token() {
        let mut t = TokenState::from_wall(TokenSource::Lease, 1_000, 5_000);
        assert_eq!(
            TokenLoss::judged(Some(&t), 4_000).cause,
            TokenLossCause::Revoked
        );
        assert_eq!(
            TokenLoss::judged(None, 4_000).cause,
            TokenLossCause::Revoked
        );
        let expired = TokenLoss::judged(Some(&t), 6_000);
        assert_eq!(
            (expired.cause, expired.ended_at),
            (TokenLossCause::Expired, Some(5_000))
        );
        assert!(expired.to_string().contains("expired at"), "{expired}");
        t.max_expires_at = Some(3_000);
        assert_eq!(
            TokenLoss::judged(Some(&t), 4_000).cause,
            TokenLossCause::MaxTtl
        );

        let mut s = State::new("e1");
        s.fold(Fact::TokenFacts(Some(t.clone())));
        s.fold(Fact::TokenLost(expired));
        assert_eq!((s.token(), s.token_lost()), (None, Some(&expired)));
        s.fold(Fact::TickBegan);
        s.fold(Fact::TokenFacts(None));
        assert_eq!(s.token_lost(), Some(&expired), "kept across ticks");
        let back: State = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(back.token_lost(), Some(&expired));
        s.fold(Fact::TokenFacts(Some(t)));
        assert_eq!(s.token_lost(), None, "a token again");
    }

    #[test]
    fn the_repeat_count_grows_with_the_same_code_whatever_its_detail() {
        let mut s = State::new("e1");
        let fail = |s: &mut State, code: Code, detail: &str| {
            let previous = (s.last_code(), s.last_error().cloned());
            s.fold(Fact::Concluded {
                result: Some(monky_agent_proto::ReportResult::Failed),
                failure: Some((code, crate::redact::redact(detail))),
                note: None,
                reported_at: None,
            });
            s.fold(Fact::TickEnded {
                succeeded_at: None,
                previous,
            });
            s.repeats()
        };
        assert_eq!(
            fail(&mut s, Code::Unhealthy, "UNHEALTHY: next attempt 10:01"),
            0
        );
        assert_eq!(
            fail(&mut s, Code::Unhealthy, "UNHEALTHY: next attempt 10:03"),
            1
        );
        assert_eq!(
            fail(&mut s, Code::Unhealthy, "UNHEALTHY: next attempt 10:07"),
            2
        );
        s.fold(Fact::TimedOut(crate::redact::redact("TICK_TIMEOUT: a")));
        assert_eq!(s.repeats(), 0, "another code starts over");
        s.fold(Fact::TimedOut(crate::redact::redact("TICK_TIMEOUT: b")));
        s.fold(Fact::TimedOut(crate::redact::redact("TICK_TIMEOUT: a")));
        assert_eq!(s.repeats(), 2);
    }

    #[test]
    fn a_drift_record_that_does_not_parse_is_dropped_and_the_rest_stands() {
        let doc = serde_json::json!({
            "version": STATE_VERSION, "env_id": "e1", "applied_sha": "a".repeat(64),
            "converged": {"sha": "not-a-sha", "containers": {}},
        });
        let s: State = serde_json::from_value(doc).unwrap();
        assert_eq!(s.converged(), None);
        assert_eq!(s.applied_sha(), Some(&sha('a')));
        let good = serde_json::json!({
            "version": STATE_VERSION, "env_id": "e1",
            "converged": {"sha": "b".repeat(64), "containers": {}},
        });
        let s: State = serde_json::from_value(good).unwrap();
        assert_eq!(s.converged().map(|c| &c.sha), Some(&sha('b')));
    }

    #[test]
    fn the_failed_release_keeps_its_flat_fields_on_disk() {
        let mut s = State::new("e1");
        let fresh = serde_json::to_value(&s).unwrap();
        // No failed release: the fields are there, empty, as every earlier version wrote them.
        for (key, empty) in [
            ("failed_sha", serde_json::Value::Null),
            ("failed_attempts", 0.into()),
            ("next_attempt_at", serde_json::Value::Null),
            ("failed_code", serde_json::Value::Null),
            ("failed_detail", serde_json::Value::Null),
        ] {
            assert_eq!(fresh[key], empty, "{key}");
        }
        assert!(fresh.get("next_attempt_boot").is_none());
        assert!(fresh.get("failed").is_none());

        let failed = FailedRelease {
            sha: sha('c'),
            attempts: 3,
            next_attempt_at: Some(1_700_000_000),
            next_attempt_boot: None,
            code: Some(Code::Unhealthy),
            detail: Some(crate::redact::redact("UNHEALTHY: web-1 (unhealthy)")),
            verdict_key: Some("0123abcd".into()),
        };
        s.mark_failed(failed.clone());
        let doc = serde_json::to_value(&s).unwrap();
        assert_eq!(doc["failed_sha"], "c".repeat(64));
        assert_eq!(doc["failed_attempts"], 3);
        assert_eq!(doc["next_attempt_at"], 1_700_000_000);
        assert_eq!(doc["failed_code"], "UNHEALTHY");
        assert_eq!(doc["failed_detail"], "UNHEALTHY: web-1 (unhealthy)");
        assert_eq!(doc["failed_verdict_key"], "0123abcd");
        let back: State = serde_json::from_value(doc).unwrap();
        assert_eq!(back.failed(), Some(&failed));
        // An older file's flat fields, with a code this version does not know.
        let older: State = serde_json::from_value(serde_json::json!({
            "version": 1, "env_id": "e1", "failed_sha": "d".repeat(64),
            "failed_attempts": 2, "failed_code": "SOMETHING_NEW"
        }))
        .unwrap();
        let f = older.failed().unwrap();
        assert_eq!((&f.sha, f.attempts, f.code), (&sha('d'), 2, None));
        s.clear_failed();
        assert_eq!(serde_json::to_value(&s).unwrap(), fresh);
    }
}
