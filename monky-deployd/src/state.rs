//! `state.json`: what the agent remembers between ticks. Never holds a secret.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::clock::BootDeadline;
use crate::fsx;

/// Serializes the saves of state.json within the process: the tick's own and the tick
/// deadline's, which runs on another thread and ends the process while holding it, so the tick
/// cannot save over its record afterwards.
pub(crate) fn save_lock() -> std::sync::MutexGuard<'static, ()> {
    static SAVE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SAVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The state file's format version; another version is moved aside, not guessed at.
pub const STATE_VERSION: u32 = 1;

/// Where the OpenBao token came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenSource {
    /// Minted from the kit's bootstrap grant.
    Bootstrap,
    /// Minted from a lease.
    Lease,
}

/// What is known about the token in `bao.token` (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenState {
    /// Bootstrap or lease.
    pub source: TokenSource,
    /// When it was minted (unix seconds).
    pub obtained_at: u64,
    /// When it expires unless renewed (unix seconds); shown, and a fallback only: a wall
    /// clock step moves it.
    pub expires_at: u64,
    /// When it was minted, on the boot clock: its age for the re-lease within a boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub obtained_boot: Option<BootDeadline>,
    /// When it expires unless renewed, on the boot clock, from OpenBao's TTL: what renewal is
    /// scheduled by within a boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_boot: Option<BootDeadline>,
    /// The TTL it was minted with (OpenBao's answer); a renewal granting less has reached the
    /// token's max TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_ttl_s: Option<u64>,
    /// A renewal came back short of `creation_ttl_s`: the max TTL is near, lease again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub max_ttl_near: bool,
}

impl TokenState {
    /// Facts known by the wall clock alone (a state taken over from the original agent): the
    /// first upkeep asks OpenBao for the rest.
    #[must_use]
    pub fn from_wall(source: TokenSource, obtained_at: u64, expires_at: u64) -> Self {
        Self {
            source,
            obtained_at,
            expires_at,
            obtained_boot: None,
            expires_boot: None,
            creation_ttl_s: None,
            max_ttl_near: false,
        }
    }
}

/// A container as last seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenContainer {
    /// Container name.
    pub name: String,
    /// `running`, `exited`, ...
    pub state: String,
    /// `healthy`, `unhealthy`, `starting`, or none without a healthcheck.
    pub health: Option<String>,
}

/// The persisted state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {
    /// Format version.
    pub version: u32,
    /// The env this state belongs to.
    pub env_id: String,
    /// The sha that is running and was last healthy.
    pub applied_sha: Option<String>,
    /// What tenancy last asked for.
    pub desired_sha: Option<String>,
    /// Every sha applied, oldest first (rollback checks).
    pub applied_history: Vec<String>,
    /// Last successful checkin (unix seconds).
    pub last_checkin: Option<u64>,
    /// Last report sent (unix seconds).
    pub last_report: Option<u64>,
    /// `applied`, `failed` or `down`: what the last report said.
    pub last_result: Option<String>,
    /// `CODE: names` of the last failure, redacted.
    pub last_error: Option<String>,
    /// The code of `last_error`, kept as a code so that nothing reads it back out of the text.
    #[serde(deserialize_with = "crate::code::lenient")]
    pub last_code: Option<crate::code::Code>,
    /// Token facts.
    pub token: Option<TokenState>,
    /// Containers as last seen.
    pub containers: Vec<SeenContainer>,
    /// Tenancy's checkin interval.
    pub checkin_interval_s: Option<u64>,
    /// The KV mount tenancy named, when it differs from config.
    pub kv_mount: Option<String>,
    /// Whether the running release is prod (its bundle's tier), for retire without a bundle.
    pub applied_prod: Option<bool>,
    /// The sha whose apply failed after it was staged (pull, up or health), if it still waits.
    pub failed_sha: Option<String>,
    /// How many applies of `failed_sha` failed in a row.
    pub failed_attempts: u32,
    /// When `failed_sha` may be tried again (unix seconds); shown, and a fallback clamped to
    /// the longest wait after another boot.
    pub next_attempt_at: Option<u64>,
    /// The same deadline on the boot clock, which no wall-clock step moves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_boot: Option<BootDeadline>,
    /// The code of `failed_sha`'s failure.
    #[serde(deserialize_with = "crate::code::lenient")]
    pub failed_code: Option<crate::code::Code>,
    /// `CODE: names` of `failed_sha`'s failure without the backoff note, repeated by the
    /// reports sent while it waits.
    pub failed_detail: Option<String>,
    /// Refusals and failures seen, by code (for the metrics file).
    pub refusals: std::collections::BTreeMap<String, u64>,
    /// The last bundle's disk need in bytes (for `doctor`).
    pub last_disk_need_bytes: Option<u64>,
    /// The last tick that ended with exit 0 (unix seconds).
    pub last_success: Option<u64>,
    /// The compose found last time (a heartbeat spawns no process to find it again).
    pub compose: Option<monky_compose::ComposeInfo>,
    /// The running release when it was written by the original agent (state taken over from
    /// it); cleared by the first apply of this agent.
    pub original_release: Option<String>,
    /// The action tenancy answered in the last tick's checkin (`none`, `apply`, `down`); none
    /// when the tick ended before a checkin answered.
    pub last_action: Option<String>,
    /// How many ticks in a row before the last one ended with the same code and detail: the
    /// journal says "same as the last N ticks" instead of repeating the whole error.
    pub repeats: u32,
    /// Variables whose value the original agent's `.env` handed to the app differently from
    /// the value now written (names only), found by the first apply after the takeover.
    pub quoting_changed: Vec<String>,
    /// What the last healthy `up` of the applied release left, by container; drift is measured
    /// against it.
    pub converged: Option<crate::drift::Converged>,
    /// Heals within an hour of each other, the last included (the heal backoff's step).
    pub heal_attempts: u32,
    /// When the last heal ran (unix seconds).
    pub last_heal_at: Option<u64>,
    /// When drift may be healed again (unix seconds); shown, and a fallback after another boot.
    pub next_heal_at: Option<u64>,
    /// The same deadline on the boot clock, which no wall-clock step moves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_heal_boot: Option<BootDeadline>,
    /// What the last `applied` report noted beside the result (`HEALED: ...`,
    /// `APPLY_INTERRUPTED: ...`, `HELD: ...`), redacted.
    pub last_note: Option<String>,
    /// The operator's hold as the last tick found it (for the metrics file).
    pub hold: Option<crate::hold::Hold>,
    /// How far the box's wall clock was from OpenBao's at the last OpenBao answer a tick read
    /// (its `Date`); the tick, `status` and `explain` judge the clock by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock: Option<crate::clock::ClockReading>,
}

/// Seconds since the epoch by the wall clock (see [`crate::clock`]).
pub fn now() -> u64 {
    crate::clock::wall()
}

const FILE: &str = "state.json";

/// The state file inside a state dir.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

impl State {
    /// Nothing healthy of this agent's runs any more: `applied_prod` goes with `applied_sha`,
    /// so that it never describes another release than the one `applied_sha` names.
    pub fn forget_applied(&mut self) -> Option<String> {
        self.applied_prod = None;
        self.applied_sha.take()
    }

    /// Forgets a failed release and its backoff: it applied, or tenancy wants another sha.
    pub fn clear_failed(&mut self) {
        self.failed_sha = None;
        self.failed_attempts = 0;
        self.next_attempt_at = None;
        self.next_attempt_boot = None;
        self.failed_code = None;
        self.failed_detail = None;
    }

    /// The state as the last tick saved it, for the read-only commands (status, explain,
    /// doctor, the metrics file): bounded, regular file only, and a default when it is missing
    /// or unreadable. Only [`State::load`] (under the tick's lock) moves a bad file aside.
    pub fn peek(state_dir: &Path) -> Self {
        fsx::read_bounded(&path(state_dir), fsx::MAX_STATE_FILE_BYTES)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// As [`State::peek`], for `env_id`'s box: the original agent's file is taken over as the
    /// tick would take it over, in memory only, so an upgraded box shows what it runs before
    /// its first tick.
    pub fn peek_env(state_dir: &Path, env_id: &str) -> Self {
        let Ok(bytes) = fsx::read_bounded(&path(state_dir), fsx::MAX_STATE_FILE_BYTES) else {
            return Self::default();
        };
        if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&bytes)
            && crate::takeover::is_original(&doc)
        {
            return crate::takeover::from_original(&doc, &state_dir.join(env_id), env_id)
                .unwrap_or_default();
        }
        serde_json::from_slice(&bytes).unwrap_or_default()
    }

    /// Loads the state; a corrupt or foreign file is moved aside and a clean state returned,
    /// with a note saying where the old file went.
    pub fn load(state_dir: &Path, env_id: &str) -> anyhow::Result<(Self, Option<String>)> {
        let p = path(state_dir);
        let fresh = Self {
            version: STATE_VERSION,
            env_id: env_id.to_string(),
            ..Self::default()
        };
        let root = fsx::Dir::state_root(state_dir)?;
        let Some(bytes) = root.read_file(FILE, fsx::MAX_STATE_FILE_BYTES)? else {
            return Ok((fresh, None));
        };
        // The original agent's file has no `version`: taken over, not set aside.
        if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&bytes)
            && crate::takeover::is_original(&doc)
        {
            let env_dir = state_dir.join(env_id);
            match crate::takeover::from_original(&doc, &env_dir, env_id) {
                Ok(s) => {
                    let note = format!(
                        "state.json was written by the original agent; taken over (applied {})",
                        s.applied_sha
                            .as_deref()
                            .map_or("none", |a| a.get(..12).unwrap_or(a))
                    );
                    return Ok((s, Some(note)));
                }
                Err(problem) => return set_aside(state_dir, &p, fresh, &problem),
            }
        }
        let problem = match serde_json::from_slice::<Self>(&bytes) {
            Ok(s) if s.version == STATE_VERSION && s.env_id == env_id => return Ok((s, None)),
            Ok(s) if s.version != STATE_VERSION => format!("unknown version {}", s.version),
            Ok(s) => format!("it belongs to env {:?}", s.env_id),
            Err(e) => format!("it does not parse ({e})"),
        };
        set_aside(state_dir, &p, fresh, &problem)
    }

    /// Saves atomically (0600), one save of the process at a time: the tick deadline may record
    /// a timeout from another thread.
    pub fn save(&self, state_dir: &Path) -> anyhow::Result<()> {
        let _one_at_a_time = save_lock();
        self.save_holding_lock(state_dir)
    }

    /// As [`State::save`], for a caller that holds [`save_lock`] already.
    pub(crate) fn save_holding_lock(&self, state_dir: &Path) -> anyhow::Result<()> {
        let mut bytes = serde_json::to_vec_pretty(self).context("cannot encode state")?;
        bytes.push(b'\n');
        fsx::Dir::state_root(state_dir)?.write_atomic(FILE, &bytes, 0o600)
    }

    /// Records a sha as applied (and healthy).
    pub fn mark_applied(&mut self, sha: &str, prod: bool) {
        self.applied_sha = Some(sha.to_string());
        self.applied_prod = Some(prod);
        self.applied_history.retain(|s| s != sha);
        self.applied_history.push(sha.to_string());
        let excess = self.applied_history.len().saturating_sub(50);
        self.applied_history.drain(..excess);
    }
}

/// Moves a state file that cannot be used aside and returns the clean state with a note.
fn set_aside(
    state_dir: &Path,
    p: &Path,
    fresh: State,
    problem: &str,
) -> anyhow::Result<(State, Option<String>)> {
    let aside_name = format!("{FILE}.bad.{}", now());
    let aside = state_dir.join(&aside_name);
    let root = fsx::Dir::state_root(state_dir)?;
    root.rename_to(FILE, &root, &aside_name)
        .with_context(|| format!("cannot move {} aside", p.display()))?;
    Ok((
        fresh,
        Some(format!(
            "state.json set aside as {} because {problem}; starting clean",
            aside.display()
        )),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corrupt_files_are_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, note) = State::load(dir.path(), "e1").unwrap();
        assert!(note.is_none());
        s.mark_applied("aaa", false);
        s.mark_applied("bbb", false);
        s.mark_applied("aaa", false);
        assert_eq!(s.applied_history, ["bbb", "aaa"]);
        s.save(dir.path()).unwrap();
        assert_eq!(State::load(dir.path(), "e1").unwrap().0, s);

        for bad in [
            &b"{not json"[..],
            br#"{"version": 9, "env_id": "e1"}"#,
            br#"{"version": 1, "env_id": "e2"}"#,
            br#"{"env_id": "e2", "applied_sha": null}"#,
        ] {
            std::fs::write(path(dir.path()), bad).unwrap();
            let (s, note) = State::load(dir.path(), "e1").unwrap();
            assert_eq!(s.applied_sha, None);
            assert!(note.unwrap().contains("set aside"));
            assert!(!path(dir.path()).exists());
        }
    }
}
