//! The Prometheus textfile (`metrics_textfile`, node_exporter's textfile-collector convention),
//! rewritten atomically at the end of every tick. It carries no secret: shas, codes and times.

use monky_agent_proto::Sha;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::exit::Exit;
use crate::fsx;
use crate::state::State;

/// What one tick ended with.
#[derive(Debug, Clone)]
pub(crate) struct TickFacts {
    /// The exit status.
    pub(crate) exit: Exit,
    /// Wall time of the tick.
    pub(crate) duration: Duration,
    /// When it ended (unix seconds).
    pub(crate) ended_at: u64,
    /// The same moment on the boot clock, when it can be read.
    pub(crate) ended_boot: Option<crate::clock::BootInstant>,
}

/// Renders the metrics text for a tick and the state it left.
pub(crate) fn render(env_id: &str, state: &State, tick: TickFacts) -> String {
    let env = escape(env_id);
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP monky_deployd_{name} {help}");
        let _ = writeln!(out, "# TYPE monky_deployd_{name} {kind}");
        for (labels, value) in samples {
            let sep = if labels.is_empty() { "" } else { "," };
            let _ = writeln!(
                out,
                "monky_deployd_{name}{{env_id=\"{env}\"{sep}{labels}}} {value}"
            );
        }
    };
    let secs = |t: Option<u64>| t.map_or(0.0, |t| t as f64);
    metric(
        "tick_duration_seconds",
        "gauge",
        "Wall time of the last tick.",
        &[(String::new(), tick.duration.as_secs_f64())],
    );
    metric(
        "last_tick_timestamp_seconds",
        "gauge",
        "When the last tick ended.",
        &[(String::new(), tick.ended_at as f64)],
    );
    metric(
        "last_success_timestamp_seconds",
        "gauge",
        "When a tick last ended with exit 0 (0: never).",
        &[(String::new(), secs(state.last_success()))],
    );
    // An alert fires on this, not on the exit code: a box that keeps exiting 75 or keeps
    // waiting out a failed release's backoff is not converged either.
    let converged = tick.exit == Exit::Ok
        && crate::verdict::not_converged(
            state,
            crate::verdict::Seen {
                now: tick.ended_at,
                token_present: state.token().is_some(),
                containers: None,
                boot: tick.ended_boot.as_ref(),
                state_free: None,
            },
        )
        .is_empty();
    metric(
        "converged",
        "gauge",
        "1 when the last tick ended fine and the box runs what tenancy wants.",
        &[(String::new(), f64::from(u8::from(converged)))],
    );
    metric(
        "exit_code",
        "gauge",
        "Exit status of the last tick (0, 1, 75, 78).",
        &[(String::new(), f64::from(tick.exit.code()))],
    );
    let results = ["applied", "failed", "down"];
    let current = state.last_result().unwrap_or("");
    let samples: Vec<(String, f64)> = results
        .iter()
        .map(|r| {
            (
                format!("result=\"{r}\""),
                f64::from(u8::from(*r == current)),
            )
        })
        .collect();
    metric(
        "last_result",
        "gauge",
        "1 for the result of the last report.",
        &samples,
    );
    if let Some(sha) = state.applied_sha().map(Sha::as_str) {
        metric(
            "applied_info",
            "gauge",
            "The applied bundle sha, as a label.",
            &[(format!("sha=\"{}\"", escape(sha)), 1.0)],
        );
    }
    let ttl = state
        .token()
        .as_ref()
        .map_or(0.0, |t| t.expires_at.saturating_sub(tick.ended_at) as f64);
    metric(
        "token_ttl_seconds",
        "gauge",
        "Seconds left on the OpenBao token by the agent's record (0: none).",
        &[(String::new(), ttl)],
    );
    // The token's end for good: alert on this before a long tenancy outage strands the box.
    let max_end = crate::verdict::token_max_ttl(state, tick.ended_at);
    metric(
        "token_max_ttl_near",
        "gauge",
        "1 when the OpenBao token is near its max TTL and no lease replaced it yet.",
        &[(String::new(), f64::from(u8::from(max_end.is_some())))],
    );
    metric(
        "token_max_ttl_expiry_timestamp_seconds",
        "gauge",
        "When the OpenBao token ends for good, whatever renews it: OpenBao's capped renewal, \
         else its minting plus the role's 30 d (0: no token).",
        &[(
            String::new(),
            secs(state.token().map(|t| t.max_ttl_end().0)),
        )],
    );
    // Why the box has no token, until it has one again: the cause the tick saw, kept.
    let lost = state.token_lost().map(crate::state::TokenLoss::cause_name);
    metric(
        "token_lost",
        "gauge",
        "1 for the cause while the box has lost its OpenBao token (revoked, expired, max_ttl).",
        &["revoked", "expired", "max_ttl"].map(|c| {
            (
                format!("cause=\"{c}\""),
                f64::from(u8::from(lost == Some(c))),
            )
        }),
    );
    // Ticks in a row that ended with the last tick's code: what an alert on a repeated failure
    // counts, whatever the time between ticks (a timed-out tick takes tick_timeout_s).
    let streak = state
        .last_code()
        .filter(|_| tick.exit != Exit::Ok && state.last_error().is_some());
    metric(
        "failure_streak",
        "gauge",
        "Ticks in a row, the last included, that failed with this code (0: the last did not fail).",
        &[(
            format!("code=\"{}\"", streak.map_or("", |c| c.as_str())),
            streak.map_or(0.0, |_| f64::from(state.repeats().saturating_add(1))),
        )],
    );
    let refusals: Vec<(String, f64)> = state
        .refusals()
        .iter()
        .map(|(code, n)| (format!("code=\"{}\"", escape(code)), *n as f64))
        .collect();
    metric(
        "refusals_total",
        "counter",
        "Refusals and failures seen, by code.",
        &refusals,
    );
    metric(
        "backoff_deadline_timestamp_seconds",
        "gauge",
        "When a failed release may be tried again (0: no backoff).",
        &[(
            String::new(),
            secs(state.failed().and_then(|f| f.next_attempt_at)),
        )],
    );
    // The hold as this tick found it: the tick removed one whose end surely came.
    let hold = state.hold();
    metric(
        "crash_loop",
        "gauge",
        "1 for the hour after a heal found a service dead again within the hour (CRASH_LOOP).",
        &[(
            String::new(),
            f64::from(u8::from(
                state
                    .crash_loop(tick.ended_at, tick.ended_boot.as_ref())
                    .is_some(),
            )),
        )],
    );
    metric(
        "held",
        "gauge",
        "1 while an operator holds the box (`monky-deployd hold`).",
        &[(String::new(), f64::from(u8::from(hold.is_some())))],
    );
    metric(
        "hold_until_timestamp_seconds",
        "gauge",
        "When the hold ends by itself (0: no hold, or until unhold).",
        &[(String::new(), secs(hold.and_then(|h| h.until)))],
    );
    metric(
        "heal_deadline_timestamp_seconds",
        "gauge",
        "When drift may be healed again after the last heal (0: never healed).",
        &[(String::new(), secs(state.next_heal_at()))],
    );
    out
}

/// Writes the file atomically, readable by node_exporter (0644). Its directory must be owned by
/// the agent's user or root and not writable by group or others; the file is replaced through
/// an unpredictable temp name, never written through a link.
pub(crate) fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    fsx::write_outside(path, text.as_bytes(), 0o644)
}

fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_with_the_env_label() {
        let sha = "ab12000000000000000000000000000000000000000000000000000000000000";
        let state = State::default().patched(serde_json::json!({
            "applied_sha": sha,
            "last_result": "failed",
            "refusals": {"ENV_INCOMPLETE": 2},
            "failed_sha": sha,
            "next_attempt_at": 1_900_000_000,
            "hold": crate::hold::Hold {
                reason: Some("db work".into()),
                since: 1_700_000_000,
                until: Some(1_800_000_600),
                until_boot: None,
            },
            "next_heal_at": 1_800_000_060,
        }));
        let text = render(
            "env-\"x\"",
            &state,
            TickFacts {
                exit: Exit::Fail,
                duration: Duration::from_millis(250),
                ended_at: 1_800_000_000,
                ended_boot: None,
            },
        );
        for line in [
            "monky_deployd_exit_code{env_id=\"env-\\\"x\\\"\"} 1",
            "monky_deployd_tick_duration_seconds{env_id=\"env-\\\"x\\\"\"} 0.25",
            "monky_deployd_last_result{env_id=\"env-\\\"x\\\"\",result=\"failed\"} 1",
            concat!(
                "monky_deployd_applied_info{env_id=\"env-\\\"x\\\"\",sha=\"",
                "ab12000000000000000000000000000000000000000000000000000000000000",
                "\"} 1"
            ),
            "monky_deployd_refusals_total{env_id=\"env-\\\"x\\\"\",code=\"ENV_INCOMPLETE\"} 2",
            "monky_deployd_backoff_deadline_timestamp_seconds{env_id=\"env-\\\"x\\\"\"} 1900000000",
            "monky_deployd_held{env_id=\"env-\\\"x\\\"\"} 1",
            "monky_deployd_hold_until_timestamp_seconds{env_id=\"env-\\\"x\\\"\"} 1800000600",
            "monky_deployd_heal_deadline_timestamp_seconds{env_id=\"env-\\\"x\\\"\"} 1800000060",
            "monky_deployd_converged{env_id=\"env-\\\"x\\\"\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
    }

    #[test]
    fn the_tokens_end_for_good_is_a_timestamp_and_near_is_a_gauge() {
        let mut token = crate::state::TokenState::from_wall(
            crate::state::TokenSource::Lease,
            1_800_000_000,
            1_800_086_400,
        );
        let facts = TickFacts {
            exit: Exit::Temporary,
            duration: Duration::from_secs(1),
            ended_at: 1_800_000_100,
            ended_boot: None,
        };
        let line = |st: &State, name: &str| {
            render("e", st, facts.clone())
                .lines()
                .find(|l| l.starts_with(&format!("monky_deployd_{name}{{")))
                .unwrap()
                .to_string()
        };
        let st = State::default().patched(serde_json::json!({ "token": token.clone() }));
        // Minted, with no cap seen: the role's documented 30 d from the minting.
        assert!(line(&st, "token_max_ttl_expiry_timestamp_seconds").ends_with(" 1802592000"));
        assert!(line(&st, "token_max_ttl_near").ends_with(" 0"));
        token.max_ttl_near = true;
        token.max_expires_at = Some(1_800_003_600);
        let st = State::default().patched(serde_json::json!({ "token": token }));
        assert!(line(&st, "token_max_ttl_expiry_timestamp_seconds").ends_with(" 1800003600"));
        assert!(line(&st, "token_max_ttl_near").ends_with(" 1"));
        assert!(line(&State::default(), "token_max_ttl_expiry_timestamp_seconds").ends_with(" 0"));
    }

    #[test]
    fn converged_only_when_the_tick_ended_fine_and_the_shas_agree() {
        let sha = "c".repeat(64);
        let fine = State::default().patched(serde_json::json!({
            "applied_sha": sha,
            "desired_sha": sha,
            "last_checkin": 1_800_000_000,
            "last_success": 1_800_000_000,
            "token": crate::state::TokenState::from_wall(
                crate::state::TokenSource::Lease,
                1_799_000_000,
                1_900_000_000,
            ),
        }));
        let facts = |exit| TickFacts {
            exit,
            duration: Duration::from_secs(1),
            ended_at: 1_800_000_000,
            ended_boot: None,
        };
        let gauge = |st: &State, exit| {
            render("e", st, facts(exit))
                .lines()
                .find(|l| l.starts_with("monky_deployd_converged{"))
                .unwrap()
                .to_string()
        };
        assert!(gauge(&fine, Exit::Ok).ends_with(" 1"));
        assert!(gauge(&fine, Exit::Temporary).ends_with(" 0"));
        let failing = fine.patched(serde_json::json!({
            "last_error": "TENANCY_UNAVAILABLE: down",
            "last_code": "TENANCY_UNAVAILABLE",
        }));
        assert!(gauge(&failing, Exit::Ok).ends_with(" 0"));
        let text = render("e", &fine, facts(Exit::Ok));
        assert!(
            text.contains("monky_deployd_last_success_timestamp_seconds{env_id=\"e\"} 1800000000"),
            "{text}"
        );
    }
}
