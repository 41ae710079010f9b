//! What a tick says in the journal: one summary line per tick, and an error on one short line
//! with its whole chain after it.

use std::time::Duration;

use monky_agent_proto::Sha;
use tracing::{info, warn};

use crate::code::{Code, CodePolicy as _};
use crate::exit::{Exit, Failure};
use crate::state::State;

/// The tick's one summary line, what `journalctl -u monky-deployd` shows for each run as
/// systemd shows one line per unit start: action, sha, outcome, code, duration, exit.
pub(super) fn summary(st: &State, exit: Exit, took: Duration) {
    let line = summary_line(st, exit, took);
    match exit {
        Exit::Ok => info!("{line}"),
        Exit::Temporary => warn!("{line}"),
        Exit::Fail | Exit::Config => tracing::error!("{line}"),
    }
}

/// See [`summary`].
pub(super) fn summary_line(st: &State, exit: Exit, took: Duration) -> String {
    let code = st.last_code().filter(|_| st.last_error().is_some());
    // A held tick acted on nothing: it says so, with the sha that runs.
    let held = exit == Exit::Ok && st.hold().is_some();
    let outcome = match (exit, st.last_result()) {
        (Exit::Temporary, _) => "temporary",
        (Exit::Config, _) => "config",
        _ if held => "held",
        (_, Some(r)) if code.is_none() || r == "failed" => r,
        (Exit::Ok, _) => "ok",
        _ => "failed",
    };
    let sha = match st.last_action() {
        Some("apply") if !held => st.desired_sha().or(st.applied_sha()),
        _ => st.applied_sha(),
    };
    let mut line = format!(
        "tick: action={} sha={} outcome={outcome} code={} duration={:.1}s exit={}",
        st.last_action().unwrap_or("-"),
        sha.map_or("-", Sha::short),
        code.map_or("-", Code::as_str),
        took.as_secs_f64(),
        exit.code()
    );
    if held && code.is_none() {
        line.push_str(&format!(" owner=\"{}\"", Code::Held.owner()));
    }
    if let Some(code) = code {
        line.push_str(&format!(" owner=\"{}\"", code.owner()));
        if st.repeats() > 0 {
            line.push_str(&format!(
                " (same {code} as the last {} tick{})",
                st.repeats(),
                if st.repeats() == 1 { "" } else { "s" }
            ));
        }
    }
    line
}

/// An error for the journal: `CODE: message` on one line of at most [`ERROR_LINE_MAX`]
/// characters; the whole chain follows on a second, info line when it says more.
pub(super) fn log_error(e: &Failure, repeated: bool) {
    // Raw here: the log sink redacts every line once.
    let full = e.full();
    let (code, detail) = (e.code, e.to_string());
    if repeated {
        // The summary line counts the repeats; the chain was logged in full the first time.
        tracing::error!("{}", one_line(&detail, ERROR_LINE_MAX));
        return;
    }
    let head = one_line(&detail, ERROR_LINE_MAX);
    tracing::error!("{head}");
    if full != detail || head.len() < detail.len() {
        info!("  detail of {code}: {full}");
    }
}

/// The most characters of an error's first line in the journal.
const ERROR_LINE_MAX: usize = 240;

/// `text` on one line, cut to `max` characters with an ellipsis.
pub(super) fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    match flat.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &flat[..at]),
        None => flat,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_summary_line_per_tick_says_action_sha_outcome_code_duration_exit() {
        let sha = "ab".repeat(32);
        let st = State::default().patched(serde_json::json!({
            "last_action": "apply",
            "desired_sha": sha,
            "last_result": "failed",
            "last_error": "UNHEALTHY: web-1 (unhealthy)",
            "last_code": "UNHEALTHY",
            "repeats": 14,
        }));
        assert_eq!(
            summary_line(&st, Exit::Fail, Duration::from_millis(14_200)),
            "tick: action=apply sha=abababababab outcome=failed code=UNHEALTHY duration=14.2s \
             exit=1 owner=\"bundle author\" (same UNHEALTHY as the last 14 ticks)"
        );
        let fine = State::default().patched(serde_json::json!({
            "last_action": "none",
            "applied_sha": sha,
            "last_result": "applied",
        }));
        assert_eq!(
            summary_line(&fine, Exit::Ok, Duration::from_millis(80)),
            "tick: action=none sha=abababababab outcome=applied code=- duration=0.1s exit=0"
        );
        // Held: tenancy asked for another sha, nothing was applied.
        let held = fine.patched(serde_json::json!({
            "last_action": "apply",
            "desired_sha": "cd".repeat(32),
            "last_note": "HELD: restore; until `monky-deployd unhold`",
            "hold": {"reason": "restore", "since": 1, "until": null},
        }));
        assert_eq!(
            summary_line(&held, Exit::Ok, Duration::from_millis(80)),
            "tick: action=apply sha=abababababab outcome=held code=- duration=0.1s exit=0 \
             owner=\"operator\""
        );
        let down = State::default().patched(serde_json::json!({
            "last_error": "TENANCY_UNAVAILABLE: refused",
            "last_code": "TENANCY_UNAVAILABLE",
        }));
        assert_eq!(
            summary_line(&down, Exit::Temporary, Duration::from_secs(2)),
            "tick: action=- sha=- outcome=temporary code=TENANCY_UNAVAILABLE duration=2.0s \
             exit=75 owner=\"no one (retries on its own)\""
        );
    }

    #[test]
    fn an_error_line_is_one_short_line() {
        assert_eq!(one_line("a\n\n b \n", 100), "a | b");
        let long = "x".repeat(500);
        assert_eq!(one_line(&long, 240).chars().count(), 243);
        assert_eq!(one_line("é".repeat(3).as_str(), 2), "éé...");
    }
}
