//! One answer to "is this box fine?", shared by `status`, `explain` and the metrics file, so
//! none of them says "converged" while the last tick failed, the token is gone or expired,
//! docker does not answer, or the box's clock is off OpenBao's: equal shas alone are not
//! convergence.

use crate::code::{Code, CodePolicy as _};
use crate::state::State;

/// What the read-only commands know beyond state.json.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen<'a> {
    /// Now (unix seconds).
    pub(crate) now: u64,
    /// Whether `bao.token` exists.
    pub(crate) token_present: bool,
    /// The project's containers as the engine lists them now, or why it could not; `None`
    /// when not looked at (the metrics file, written from the tick's own record).
    pub(crate) containers: Option<&'a Result<Vec<monky_compose::Container>, String>>,
    /// Now on the boot clock: it carries the last reading of OpenBao's clock to this moment,
    /// and counts a crash loop's hour; `None` leaves the clock unjudged and counts on the wall.
    pub(crate) boot: Option<&'a crate::clock::BootInstant>,
    /// The free bytes of the state dir's file system now; `None` when not looked at (the
    /// metrics file: a tick that could not save fails on its own).
    pub(crate) state_free: Option<u64>,
}

/// Below this much free space in the state dir's file system a tick cannot save its record
/// (state.json, a staged release of up to the 4 MiB bundle limit), so state.json may be an
/// older tick's.
pub(crate) const STATE_FREE_MIN: u64 = 16 * 1024 * 1024;

/// Bytes in KiB or MiB with one decimal, as a free-space line reads them.
#[must_use]
pub(crate) fn human_bytes(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20))
    } else {
        format!("{:.1} KiB", b as f64 / 1024.0)
    }
}

/// What is wrong with the state dir's free space, in words, when it is below
/// [`STATE_FREE_MIN`].
#[must_use]
pub(crate) fn state_disk_problem(free: u64) -> Option<String> {
    (free < STATE_FREE_MIN).then(|| {
        format!(
            "the state dir's file system has {} free, less than the {} MiB a tick needs to save \
             its record: what state.json says may be an older tick's",
            human_bytes(free),
            STATE_FREE_MIN >> 20
        )
    })
}

/// What is wrong with the box's clock now, by the last reading of OpenBao's (`TLS_CLOCK`).
#[must_use]
pub(crate) fn clock_problem(st: &State, seen: Seen<'_>) -> Option<String> {
    st.clock().and_then(|r| r.problem(seen.now, seen.boot))
}

/// What the box's missing token means, for `explain` and `doctor`: a staged grant is the
/// next tick's login (the first tick's on a fresh install), not a failure; a token lost
/// before keeps its cause. `grant_staged`: a file is at `bootstrap_file`.
#[must_use]
pub(crate) fn token_absence(st: &State, grant_staged: bool) -> (bool, String) {
    match (st.token_lost(), grant_staged) {
        (None, true) if st.last_checkin().is_none() => (
            true,
            "none yet: the first tick will log in with the staged bootstrap grant".into(),
        ),
        (None, true) => (
            true,
            "none: the next tick will log in with the staged bootstrap grant".into(),
        ),
        (Some(loss), true) => (
            true,
            format!("none ({loss}): the next tick will log in with the staged bootstrap grant"),
        ),
        (Some(loss), false) => (false, format!("none: {loss}")),
        (None, false) => (false, "no token stored".into()),
    }
}

/// Whether a file (the kit's grant) is at `path`; its safety is `doctor`'s `grant` check.
#[must_use]
pub(crate) fn grant_staged(path: &std::path::Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// A token near its max TTL that no lease replaced: when it ends for good, whatever renews it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MaxTtlEnd {
    /// When the token ends (unix seconds).
    pub(crate) end: u64,
    /// OpenBao said so by capping a renewal; else the role's documented max TTL is assumed.
    pub(crate) exact: bool,
    /// Now, when this was judged.
    pub(crate) now: u64,
}

/// Less than this left before the max TTL, the tick says it at error priority.
pub(crate) const MAX_TTL_URGENT_S: u64 = 12 * 3600;

impl MaxTtlEnd {
    /// Seconds left before the token ends (0 once it has).
    #[must_use]
    pub(crate) fn left(&self) -> u64 {
        self.end.saturating_sub(self.now)
    }

    /// Within its last [`MAX_TTL_URGENT_S`]: the box needs a person today.
    #[must_use]
    pub(crate) fn urgent(&self) -> bool {
        self.left() < MAX_TTL_URGENT_S
    }
}

impl std::fmt::Display for MaxTtlEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = crate::clock::rfc3339(self.end);
        let how = if self.exact {
            "OpenBao capped its renewal there"
        } else {
            "the role's documented 30 d max TTL from its minting"
        };
        if self.left() == 0 {
            write!(
                f,
                "the OpenBao token reached its max TTL at {at} ({how}) and no new token was \
                 leased: re-run the install kit"
            )
        } else {
            write!(
                f,
                "the OpenBao token reaches its max TTL at {at}, in {} ({how}), and no new \
                 token was leased: bring tenancy back (the next tick leases one) or re-run the \
                 install kit before then, or the box needs the kit afterwards",
                crate::clock::human(self.left())
            )
        }
    }
}

/// The token's end for good when it is near and no lease replaced the token yet; the same
/// answer for the tick's journal, `explain`, `doctor` and the metrics file.
#[must_use]
pub(crate) fn token_max_ttl(st: &State, now: u64) -> Option<MaxTtlEnd> {
    let t = st.token().filter(|t| t.max_ttl_near)?;
    let (end, exact) = t.max_ttl_end();
    Some(MaxTtlEnd { end, exact, now })
}

/// The crash loop `c` records, as every view says it for the hour after it: the tick's exit
/// and report, `status`, `explain`, doctor (through the last tick's code) and the metrics.
#[must_use]
pub(crate) fn crash_loop(c: &crate::state::CrashLoop) -> crate::exit::Failure {
    let service = if c.service.is_empty() {
        "a service"
    } else {
        c.service.as_str()
    };
    let exit = c
        .exit_code
        .map_or_else(String::new, |code| format!(" with exit code {code}"));
    let lines = c
        .last_lines
        .as_ref()
        .filter(|l| !l.as_str().is_empty())
        .map_or_else(String::new, |l| format!("; its last lines: {}", l.as_str()));
    crate::exit::Failure::coded(
        Code::CrashLoop,
        format!(
            "{service} died by its own exit{exit} again within the hour and was healed ({} \
             heals, the last at {}){lines}; converged once no heal is needed until {}",
            c.heals,
            crate::clock::rfc3339(c.at),
            crate::clock::rfc3339(c.at.saturating_add(crate::state::CRASH_LOOP_SECS)),
        ),
    )
}

/// Why the box is not converged, most important first; empty when it is.
#[must_use]
pub(crate) fn not_converged(st: &State, seen: Seen<'_>) -> Vec<String> {
    let mut why = Vec::new();
    if let Some(code) = st.last_code().filter(|_| st.last_error().is_some()) {
        why.push(format!(
            "the last tick failed with {code} ({} moves next)",
            code.owner()
        ));
    } else if st.last_error().is_some() {
        why.push(format!("the last tick failed ({})", Code::Failed));
    }
    match (st.applied_sha(), st.desired_sha()) {
        (None, None) if st.last_checkin().is_none() => {
            why.push("no checkin has succeeded yet".into());
        }
        (Some(a), Some(d)) if a == d => {}
        (None, None) => {}
        (a, d) => why.push(format!(
            "running {}, tenancy wants {}",
            a.map_or("-", monky_agent_proto::Sha::short),
            d.map_or("-", monky_agent_proto::Sha::short)
        )),
    }
    if !seen.token_present {
        why.push(match st.token_lost() {
            Some(loss) => format!("no OpenBao token on the box: {loss}"),
            None => "no OpenBao token on the box".into(),
        });
    } else if let Some(t) = st.token().filter(|t| t.expires_at <= seen.now) {
        why.push(format!(
            "the token expired at {} by the agent's record",
            crate::clock::rfc3339(t.expires_at)
        ));
    }
    if let Some(c) = st.crash_loop(seen.now, seen.boot) {
        let failure = crash_loop(c);
        why.push(format!("{failure} ({} moves next)", failure.code.owner()));
    }
    if let Some(problem) = seen.state_free.and_then(state_disk_problem) {
        why.insert(0, problem);
    }
    if let Some(problem) = clock_problem(st, seen) {
        let failure = crate::exit::Failure::coded(Code::TlsClock, problem);
        why.push(format!("{failure} ({} moves next)", failure.code.owner()));
    }
    match seen.containers {
        Some(Err(e)) => why.push(format!("docker does not answer: {e}")),
        Some(Ok(cs)) => {
            let bad: Vec<&str> = cs
                .iter()
                .filter(|c| !c.is_ready())
                .map(|c| c.name.as_str())
                .collect();
            if !bad.is_empty() {
                why.push(format!("not running and healthy: {}", bad.join(", ")));
            } else if cs.is_empty() && st.applied_sha().is_some() {
                why.push("no container of the project runs".into());
            }
        }
        None => {}
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{TokenSource, TokenState};

    fn fine() -> State {
        State::default().patched(serde_json::json!({
            "applied_sha": "a".repeat(64),
            "desired_sha": "a".repeat(64),
            "last_checkin": 100,
            "token": TokenState::from_wall(TokenSource::Lease, 0, 10_000),
        }))
    }

    fn seen(containers: Option<&Result<Vec<monky_compose::Container>, String>>) -> Seen<'_> {
        Seen {
            now: 1000,
            token_present: true,
            containers,
            boot: None,
            state_free: None,
        }
    }

    #[test]
    fn equal_shas_are_not_enough() {
        assert!(not_converged(&fine(), seen(None)).is_empty());
        let check = |st: State, s: Seen<'_>, expected: &str| {
            let why = not_converged(&st, s);
            assert!(
                why.iter().any(|w| w.contains(expected)),
                "{expected:?} not in {why:?}"
            );
        };
        check(
            fine().patched(serde_json::json!({
                "last_error": "AGENT_UNAUTHENTICATED: revoked",
                "last_code": Code::AgentUnauthenticated,
            })),
            seen(None),
            "failed with AGENT_UNAUTHENTICATED (box admin moves next)",
        );
        check(
            fine().patched(serde_json::json!({
                "last_error": "TENANCY_UNAVAILABLE: down",
                "last_code": Code::TenancyUnavailable,
            })),
            seen(None),
            "TENANCY_UNAVAILABLE",
        );
        let expired = fine().patched(serde_json::json!({
            "token": TokenState::from_wall(TokenSource::Lease, 0, 999),
        }));
        check(expired, seen(None), "the token expired");
        check(
            fine(),
            Seen {
                token_present: false,
                ..seen(None)
            },
            "no OpenBao token",
        );
        let down = Err("docker engine at unix:///nope is not reachable".to_string());
        check(fine(), seen(Some(&down)), "docker does not answer");
        check(fine(), seen(Some(&Ok(vec![]))), "no container");
        check(
            fine().patched(serde_json::json!({"desired_sha": "b".repeat(64)})),
            seen(None),
            "tenancy wants bbbbbbbbbbbb",
        );
        check(State::default(), seen(None), "no checkin");
        check(
            fine(),
            Seen {
                state_free: Some(4096),
                ..seen(None)
            },
            "the state dir's file system has 4.0 KiB free",
        );
        assert!(
            not_converged(
                &fine(),
                Seen {
                    state_free: Some(STATE_FREE_MIN),
                    ..seen(None)
                }
            )
            .is_empty()
        );
        // The clock, read 3 days ahead of OpenBao's at second 900 of boot "b", now at 1000.
        let boot = crate::clock::BootInstant {
            boot_id: "b".into(),
            secs: 1000,
        };
        let reading = |box_ahead_s: i64| {
            fine().patched(serde_json::json!({"clock": crate::clock::ClockReading {
                box_ahead_s,
                at: 900,
                at_boot: Some(crate::clock::BootDeadline {
                    boot_id: "b".into(),
                    at_s: 900,
                }),
            }}))
        };
        let skewed = reading(259_200);
        let at_boot = Seen {
            boot: Some(&boot),
            ..seen(None)
        };
        check(
            skewed.clone(),
            at_boot,
            "TLS_CLOCK: this box's clock is 3d ahead of OpenBao's",
        );
        assert!(clock_problem(&skewed, seen(None)).is_none(), "unjudged");
        let right = reading(-30);
        assert!(not_converged(&right, at_boot).is_empty());
    }
}
