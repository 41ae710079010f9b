//! The failed-release backoff: how long a release that failed waits before it is tried again,
//! kept in state as its [`FailedRelease`] (state.json's flat `failed_*` fields).
//!
//! The wait is counted on the boot clock ([`crate::clock`]), so a wall-clock step neither holds
//! a release back for the step's length nor retries it in a loop. After a reboot (or with a
//! deadline from an older state) only the wall-clock deadline is left, and it is clamped to the
//! longest wait the attempts allow.
//!
//! The wait is kept for a sha and the config that judged it ([`verdict_key`]): the box admin's
//! fix (a waiver, a budget key, an `allowed_*` entry) is tried at the next tick, not after the
//! wait.

use std::time::Duration;

use crate::backoff::{Backoff, Jitter};
use crate::clock::{BootDeadline, BootInstant};
use crate::code::Code;
use crate::config::Config;
use crate::redact::Redacted;
use crate::state::{Fact, FailedRelease, State};
use monky_agent_proto::Sha;

/// The wait of a release that failed once more: which attempt this was and when the next may
/// start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReleaseBackoff {
    /// How many applies of the sha failed in a row, this one included.
    pub(crate) attempts: u32,
    /// When the sha may be tried again (unix seconds).
    pub(crate) next_attempt_at: u64,
    /// The same moment on the boot clock, when the kernel has one.
    pub(crate) next_attempt_boot: Option<BootDeadline>,
}

impl ReleaseBackoff {
    /// The backoff after `sha` failed at `now` (wall) and `boot` under the config whose
    /// [`verdict_key`] is `key`: one attempt more when it is the sha that failed before under
    /// the same config, else the first. `jitter` is in 0..1.
    pub(crate) fn after_failure(
        state: &State,
        sha: &Sha,
        key: &str,
        now: u64,
        boot: Option<&BootInstant>,
        jitter: f64,
    ) -> Self {
        let attempts = match state.failed() {
            Some(f) if f.sha == *sha && !judged_otherwise(f.verdict_key.as_deref(), key) => {
                f.attempts.saturating_add(1)
            }
            _ => 1,
        };
        let wait = RELEASE.wait(attempts, jitter).as_secs();
        Self {
            attempts,
            next_attempt_at: now.saturating_add(wait),
            next_attempt_boot: boot.map(|b| BootDeadline::after(b, wait)),
        }
    }

    /// The backoff for `sha` as the state keeps it, with the failure's code and `CODE: names`
    /// that the reports repeat while it waits.
    pub(crate) fn fact(self, sha: &Sha, key: &str, code: Code, detail: Redacted) -> Fact {
        Fact::ReleaseFailed(FailedRelease {
            sha: sha.clone(),
            attempts: self.attempts,
            next_attempt_at: Some(self.next_attempt_at),
            next_attempt_boot: self.next_attempt_boot,
            code: Some(code),
            detail: Some(detail),
            verdict_key: Some(key.to_owned()),
        })
    }

    /// Whether the failed release's verdict came from another config than the one whose
    /// [`verdict_key`] is `key`: then its wait no longer holds, as the config may decide
    /// otherwise now. A state written before the key was kept holds its wait.
    #[must_use]
    pub(crate) fn config_changed(state: &State, key: &str) -> bool {
        state
            .failed()
            .is_some_and(|f| judged_otherwise(f.verdict_key.as_deref(), key))
    }

    /// Carries a wait set in another boot (or by an older state) into this one: the wall-clock
    /// deadline, held to the longest wait the attempts allow, becomes a deadline on this boot's
    /// clock, so a wall clock that stays wrong neither renews the wait at every tick nor holds
    /// the sha back for the step's length. Without a boot clock the wall deadline is clamped.
    pub(crate) fn rebase(state: &State, now: u64, boot: Option<&BootInstant>) -> Option<Fact> {
        let failed = state.failed()?;
        let at = failed.next_attempt_at?;
        if let (Some(b), Some(d)) = (boot, &failed.next_attempt_boot)
            && d.boot_id == b.boot_id
        {
            return None;
        }
        let longest = RELEASE.longest(failed.attempts).as_secs();
        let left = at.saturating_sub(now).min(longest);
        Some(Fact::BackoffRebased {
            next_attempt_at: now.saturating_add(left),
            next_attempt_boot: boot.map(|b| BootDeadline::after(b, left)),
        })
    }

    /// When `sha` may be tried again (wall clock, for the reports), if it is the failed sha and
    /// its wait has not run out at `now` (wall) and `boot`. A query only: it changes nothing.
    pub(crate) fn deadline(
        state: &State,
        sha: &Sha,
        now: u64,
        boot: Option<&BootInstant>,
    ) -> Option<u64> {
        let failed = state.failed().filter(|f| f.sha == *sha)?;
        wait_until(
            &RELEASE,
            failed.next_attempt_at,
            failed.next_attempt_boot.as_ref(),
            failed.attempts,
            now,
            boot,
        )
    }
}

fn judged_otherwise(kept: Option<&str>, key: &str) -> bool {
    kept.is_some_and(|k| k != key)
}

/// The digest of what in the box's config decides whether a release is refused or fails after
/// it was staged: the waivers and `allowed_*` lists, the budget (the sibling envs' peer ports
/// included, which it reserves), the registry credential's host, the health wait and the
/// docker CLI. A change to any of them may change the verdict, so a failed release's wait is
/// kept for it beside the sha. The text hashed is the parts' debug form, which an upgrade of
/// the agent may change: that costs one early retry, never a retry held back.
#[must_use]
pub(crate) fn verdict_key(cfg: &Config) -> String {
    use sha2::Digest as _;
    let parts = format!(
        "{:?}",
        (
            &cfg.allowed_binds,
            &cfg.allowed_external_volumes,
            &cfg.allowed_external_networks,
            cfg.allow_unprefixed_names,
            &cfg.trusted_registries,
            cfg.allow_secrets_on_command_lines,
            &cfg.allowed_shared_uids,
            &cfg.budget,
            &cfg.registry_host,
            cfg.healthy_timeout,
            &cfg.docker_bin,
        )
    );
    let digest = sha2::Sha256::digest(parts.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// When a wait of `backoff`'s `attempts`-th step, set for the wall-clock moment `at` and the boot-clock
/// deadline `on_boot`, ends (wall clock, for the reports), if it has not run out at `now` and
/// `boot`. Within the boot it was set in, the boot clock decides, which no wall-clock step
/// moves; in another boot (or without a boot clock) the wall-clock deadline, which a backward
/// step may have pushed out, is held to the longest wait this many steps can have.
pub(crate) fn wait_until(
    backoff: &Backoff,
    at: Option<u64>,
    on_boot: Option<&BootDeadline>,
    attempts: u32,
    now: u64,
    boot: Option<&BootInstant>,
) -> Option<u64> {
    let left = match boot.and_then(|b| on_boot?.remaining(b)) {
        Some(left) => left,
        None => at?
            .saturating_sub(now)
            .min(backoff.longest(attempts).as_secs()),
    };
    (left > 0).then(|| now.saturating_add(left))
}

/// The wait after the `attempts`-th failure of the same release: 1 min doubling up to 1 h,
/// spread by up to 10% either way so a fleet does not retry in step.
pub(crate) const RELEASE: Backoff = Backoff {
    base: Duration::from_secs(60),
    cap: Duration::from_secs(3600),
    jitter: Jitter::Around(0.1),
};

#[cfg(test)]
mod tests {
    use super::*;

    fn a() -> Sha {
        Sha::parse(&"a".repeat(64)).unwrap()
    }

    fn b() -> Sha {
        Sha::parse(&"b".repeat(64)).unwrap()
    }

    #[test]
    fn the_release_backoff_doubles_from_a_minute_to_an_hour_with_jitter() {
        let secs = |n, j| RELEASE.wait(n, j).as_secs();
        assert_eq!(
            [1, 2, 3, 4, 5, 6, 7, 20].map(|n| secs(n, 0.5)),
            [60, 120, 240, 480, 960, 1920, 3600, 3600]
        );
        assert_eq!(secs(1, 0.0), 54);
        assert_eq!(secs(1, 1.0), 66);
        assert_eq!(secs(30, 1.0), 3960);
    }

    fn boot(id: &str, secs: u64) -> BootInstant {
        BootInstant {
            boot_id: id.into(),
            secs,
        }
    }

    #[test]
    fn the_same_sha_counts_up_and_another_starts_over() {
        let mut st = State::default();
        let first = ReleaseBackoff::after_failure(&st, &a(), "k", 1000, None, 0.5);
        assert_eq!((first.attempts, first.next_attempt_at), (1, 1060));
        st.fold(first.fact(
            &a(),
            "k",
            Code::Unhealthy,
            crate::redact::redact("UNHEALTHY: web"),
        ));
        let second = ReleaseBackoff::after_failure(&st, &a(), "k", 2000, None, 0.5);
        assert_eq!((second.attempts, second.next_attempt_at), (2, 2120));
        st.fold(second.clone().fact(
            &a(),
            "k",
            Code::Unhealthy,
            crate::redact::redact("UNHEALTHY: web"),
        ));
        let failed = st.failed().unwrap();
        assert_eq!((failed.attempts, failed.code), (2, Some(Code::Unhealthy)));
        assert_eq!(
            ReleaseBackoff::after_failure(&st, &b(), "k", 3000, None, 0.5).attempts,
            1
        );
        st.fold(
            ReleaseBackoff {
                attempts: u32::MAX,
                ..second
            }
            .fact(
                &a(),
                "k",
                Code::Unhealthy,
                crate::redact::redact("UNHEALTHY: web"),
            ),
        );
        let last = ReleaseBackoff::after_failure(
            &st,
            &a(),
            "k",
            u64::MAX,
            Some(&boot("x", u64::MAX)),
            1.0,
        );
        assert_eq!(last.attempts, u32::MAX);
        assert_eq!(last.next_attempt_at, u64::MAX);
        assert_eq!(last.next_attempt_boot.unwrap().at_s, u64::MAX);
    }

    #[test]
    fn another_config_starts_the_count_over_and_a_state_without_a_key_holds() {
        let mut st = State::default();
        let first = ReleaseBackoff::after_failure(&st, &a(), "k1", 1000, None, 0.5);
        st.fold(first.fact(
            &a(),
            "k1",
            Code::SecretReadableOnHost,
            crate::redact::redact("x"),
        ));
        assert!(!ReleaseBackoff::config_changed(&st, "k1"));
        assert!(ReleaseBackoff::config_changed(&st, "k2"));
        assert_eq!(
            ReleaseBackoff::after_failure(&st, &a(), "k1", 2000, None, 0.5).attempts,
            2
        );
        assert_eq!(
            ReleaseBackoff::after_failure(&st, &a(), "k2", 2000, None, 0.5).attempts,
            1
        );
        let older = st.patched(serde_json::json!({"failed_verdict_key": null}));
        assert!(!ReleaseBackoff::config_changed(&older, "k2"));
    }

    #[test]
    fn the_verdict_key_follows_the_waivers_and_not_the_rest() {
        let text = |extra: &str| {
            format!("env_id: e1\ntenancy: {{service: t}}\nbao: {{service: b}}\n{extra}")
        };
        let key = |extra: &str| {
            verdict_key(&Config::parse(&text(extra), std::path::Path::new("c.yaml")).unwrap())
        };
        let base = key("");
        assert_eq!(
            key("interval_s: 30\n"),
            base,
            "the interval decides no verdict"
        );
        for waiver in [
            "allowed_shared_uids: [65534]\n",
            "budget: {max_pids: 8192}\n",
            "allowed_external_networks: [edge]\n",
            "allow_secrets_on_command_lines: true\n",
            "healthy_timeout_s: 600\n",
        ] {
            assert_ne!(key(waiver), base, "{waiver}");
        }
    }

    #[test]
    fn the_deadline_holds_only_for_the_failed_sha_and_changes_nothing() {
        let mut st = State::default();
        let at = boot("x", 500);
        assert_eq!(ReleaseBackoff::deadline(&st, &a(), 0, Some(&at)), None);
        st.fold(
            ReleaseBackoff::after_failure(&st, &a(), "k", 1000, Some(&at), 0.5).fact(
                &a(),
                "k",
                Code::Failed,
                crate::redact::redact("x"),
            ),
        );
        let before = st.clone();
        assert_eq!(
            ReleaseBackoff::deadline(&st, &a(), 1059, Some(&boot("x", 559))),
            Some(1060)
        );
        assert_eq!(
            ReleaseBackoff::deadline(&st, &a(), 1060, Some(&boot("x", 560))),
            None,
            "run out"
        );
        assert_eq!(
            ReleaseBackoff::deadline(&st, &b(), 1000, Some(&at)),
            None,
            "another sha"
        );
        assert_eq!(st, before);
    }

    /// Wall-clock steps of 20 h either way: within the boot the wait is the boot clock's; after
    /// a reboot the wall deadline is held to the longest wait one failure has (66 s).
    #[test]
    fn a_wall_clock_step_neither_stretches_nor_ends_the_wait() {
        let step = 20 * 3600;
        let mut st = State::default();
        st.fold(
            ReleaseBackoff::after_failure(&st, &a(), "k", 100_000, Some(&boot("x", 500)), 0.5)
                .fact(&a(), "k", Code::Failed, crate::redact::redact("x")),
        );
        let now = 100_000 - step;
        assert_eq!(
            ReleaseBackoff::deadline(&st, &a(), now, Some(&boot("x", 510))),
            Some(now + 50),
            "clock 20 h behind: still 50 s, not 20 h"
        );
        let now = 100_000 + step;
        assert_eq!(
            ReleaseBackoff::deadline(&st, &a(), now, Some(&boot("x", 510))),
            Some(now + 50),
            "clock 20 h ahead: the wait is not over"
        );
        assert_eq!(
            ReleaseBackoff::deadline(&st, &a(), now, Some(&boot("x", 561))),
            None
        );
        let now = 100_000 - step;
        assert_eq!(
            ReleaseBackoff::deadline(&st, &a(), now, Some(&boot("y", 3))),
            Some(now + 66),
            "another boot, clock behind: clamped"
        );
        assert_eq!(
            ReleaseBackoff::deadline(&st, &a(), 100_000 + step, None),
            None,
            "no boot clock, clock ahead: run out"
        );

        // Rebased into a later boot: 66 s on that boot's clock, however wrong the wall stays.
        let mut later = st.clone();
        if let Some(f) = ReleaseBackoff::rebase(&later, now, Some(&boot("y", 3))) {
            later.fold(f);
        }
        let failed = later.failed().unwrap();
        assert_eq!(failed.next_attempt_boot.as_ref().unwrap().at_s, 69);
        assert_eq!(failed.next_attempt_at, Some(now + 66));
        let still = later.clone();
        if let Some(f) = ReleaseBackoff::rebase(&later, now + 30, Some(&boot("y", 33))) {
            later.fold(f);
        }
        assert_eq!(later, still, "once per boot");
        assert_eq!(
            ReleaseBackoff::deadline(&later, &a(), now, Some(&boot("y", 69))),
            None
        );
        // No boot clock: the wall deadline itself is clamped, once.
        let mut bare = st.clone();
        if let Some(f) = ReleaseBackoff::rebase(&bare, now, None) {
            bare.fold(f);
        }
        let failed = bare.failed().unwrap();
        assert_eq!(failed.next_attempt_at, Some(now + 66));
        assert_eq!(failed.next_attempt_boot, None);
        // Nothing failed: nothing to rebase.
        let mut clean = State::default();
        if let Some(f) = ReleaseBackoff::rebase(&clean, now, Some(&boot("y", 3))) {
            clean.fold(f);
        }
        assert_eq!(clean, State::default());
    }
}
