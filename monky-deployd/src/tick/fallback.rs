//! A release that did not come up: why (the engine's and compose's words), the failed
//! release's backoff, and the fallback to the last healthy release.

use std::time::{Duration, Instant};

use monky_agent_proto::Sha;
use tracing::{info, warn};

use super::backoff::ReleaseBackoff;
use super::checkin::{Seen, containers};
use super::not_ready;
use super::stages::{Failed, Promoted, Started, Stop};
use super::{Agent, Run};
use crate::code::Code;
use crate::exit::Failure;
use crate::state::{Fact, State};
use crate::{failpoint, redact, release};
use monky_compose::ContainerFacts;

impl Run<'_> {
    /// Recovery after a stage stopped: a release that failed waits out its backoff and, when
    /// it had started, falls back (see [`Run::release_failed`]); a halt is its own error.
    pub(super) fn recover(&mut self, sha: &Sha, stop: Stop) -> Failure {
        match stop {
            Stop::Halted(e) => e,
            Stop::Failed(failed) => self.release_failed(sha, *failed),
        }
    }

    /// Records `failure` as `sha`'s failed attempt (its `CODE: names`, repeated by the reports
    /// sent while the sha waits, under the config's verdict key) and returns when the next
    /// attempt may run.
    pub(super) fn back_off(&mut self, sha: &Sha, failure: &Failure) -> u64 {
        let key = super::backoff::verdict_key(self.agent.cfg);
        let backoff = ReleaseBackoff::after_failure(
            &self.tick.state,
            sha,
            &key,
            crate::clock::wall(),
            crate::clock::boot().as_ref(),
            rand::random_range(0.0..1.0),
        );
        let next = backoff.next_attempt_at;
        self.record(backoff.fact(
            sha,
            &key,
            failure.code,
            redact::redact(&failure.to_string()),
        ));
        next
    }

    /// A release that failed at render, model, pull, up or health: schedules the next attempt
    /// (1 min, 2, 4, ... up to 1 h, jittered) and, when it had `started`, falls back to the last
    /// healthy release. Returns the failure, whose message ends with what happened to the
    /// running release and when the next attempt is.
    fn release_failed(&mut self, sha: &Sha, failed: Failed) -> Failure {
        let Failed { failure, started } = failed;
        let next = self.back_off(sha, &failure);
        let previous = self.tick.state.applied_sha().filter(|p| *p != sha).cloned();
        let note = match (previous, &started) {
            // Nothing of it started (its `.env` or its pull failed): nothing changed on the
            // engine or on disk, so nothing falls back, prod or not.
            (Some(prev), None) => format!("running {}", prev.short()),
            (None, None) => "nothing running".to_string(),
            (None, Some(_)) => {
                self.record(Fact::AppliedForgotten);
                "no earlier healthy release to fall back to".to_string()
            }
            (Some(_), Some(Started { prod, .. }))
                if self.agent.cfg.on_failure(*prod) == crate::config::OnFailure::Leave =>
            {
                self.record(Fact::AppliedForgotten);
                format!("left {} in place (on_failure: leave)", sha.short())
            }
            (Some(prev), Some(_)) => self.revert_to(&prev),
        };
        let failure = Failure::coded(
            failure.code,
            format!(
                "{}; {note}; next attempt {} (`monky-deployd run --once --force` tries now)",
                failure.message,
                crate::clock::rfc3339(next)
            ),
        );
        match started {
            Some(Started { compose_logs, .. }) => failure.with_compose_logs(&compose_logs),
            None => failure,
        }
    }

    /// Points `current` back at `prev` and brings it up again; volumes are not touched.
    pub(super) fn revert_to(&mut self, prev: &Sha) -> String {
        if let Err(e) = release::verify(&self.agent.layout, prev) {
            // Nothing is started from a release that changed on disk; what runs stays.
            self.record(Fact::AppliedForgotten);
            warn!("fallback to {} refused: {e:#}", prev.short());
            let code = Failure::code_of(&e).unwrap_or(Code::Failed);
            return format!("fallback to {} refused ({code})", prev.short());
        }
        let budget = self.agent.start_budget(false);
        let result = release::point_current(&self.agent.layout, prev, &|r| {
            self.agent.policy_gate(&self.tick.judged, r)
        })
        .and_then(|rel| {
            info!(
                "falling back to {} (the start bounded at {}s)",
                prev.short(),
                budget.as_secs()
            );
            rel.compose(&self.agent.docker, self.agent.cfg)
                .up(Some(budget))
                .map_err(anyhow::Error::new)
        });
        self.refresh_containers();
        match result {
            Ok(()) if not_ready(self.tick.state.containers()).is_empty() => {
                self.record_converged(prev);
                format!("reverted to {}", prev.short())
            }
            Ok(()) => {
                self.record(Fact::AppliedForgotten);
                format!("reverted to {}, which is not healthy either", prev.short())
            }
            Err(e) => {
                self.record(Fact::AppliedForgotten);
                warn!("fallback to {} failed: {e:#}", prev.short());
                match Failure::code_of(&e) {
                    Some(code) => format!("fallback to {} refused ({code})", prev.short()),
                    None => format!("fallback to {} failed", prev.short()),
                }
            }
        }
    }
}

/// Steps 12-13: `compose up` and the readiness wait, the whole start bounded by
/// [`Agent::start_budget`]. A release that does not come up ready starts the backoff and
/// falls back; its failure names first a one-shot that never finished, with its own last
/// output, and carries the compose logs to the report. Returns the containers it saw with
/// the outcome, for the tick to keep.
pub(super) fn up_healthy(
    agent: &Agent,
    state: &State,
    promoted: &Promoted,
) -> (Seen, Result<(), Stop>) {
    let (rel, sha) = (promoted.release(), promoted.sha());
    let project = rel.compose(&agent.docker, agent.cfg);
    let then_fallback = state.applied_sha().is_some_and(|p| p != sha);
    let budget = agent.start_budget(then_fallback);
    info!(
        "compose up -d --remove-orphans (the start bounded at {}s)",
        budget.as_secs()
    );
    failpoint::hit("before-up");
    let started = Instant::now();
    let up = project.up(Some(budget));
    failpoint::hit("after-up");
    let seen = containers(agent, state);
    let bad = not_ready(&seen.containers);
    if up.is_ok() && bad.is_empty() {
        return (seen, Ok(()));
    }
    let logs = project.logs_tail(200).unwrap_or_else(|e| {
        warn!("cannot read the compose logs: {e}");
        String::new()
    });
    let unfinished = unfinished_one_shots(&seen.facts);
    let looked: Vec<Looked> = unfinished
        .iter()
        .map(|(name, service)| (name, Some(service)))
        .chain(
            seen.containers
                .iter()
                .filter(|c| !c.is_ready() && !unfinished.iter().any(|(n, _)| *n == c.name))
                .map(|c| (&c.name, None)),
        )
        .filter_map(|(name, unfinished_service)| {
            let seen = seen.containers.iter().find(|c| c.name == *name)?;
            Some(Looked {
                name: seen.name.clone(),
                state: seen.state.clone(),
                health: seen.health.clone(),
                detail: agent
                    .docker
                    .engine()
                    .inspect(&seen.name)
                    .unwrap_or_default(),
                unfinished: unfinished_service.map(|service| {
                    project
                        .service_logs_tail(service, UNFINISHED_LINES)
                        .map(|l| last_lines(&l, UNFINISHED_LINES))
                        .unwrap_or_default()
                }),
            })
        })
        .collect();
    let (code, why) = diagnose(up.as_ref().err(), &looked);
    let out_of_time =
        matches!(up, Err(monky_compose::Error::Unhealthy { .. })) && started.elapsed() >= budget;
    let why = if out_of_time {
        format!(
            "the start did not finish within {}s (healthy_timeout_s {}s): {why}",
            budget.as_secs(),
            agent.cfg.healthy_timeout.as_secs()
        )
    } else {
        why
    };
    let failure = Failure::coded(code, why);
    warn!("apply of {} failed: {failure}", sha.short());
    // Kept before the fallback: `compose up` of the previous release replaces these
    // containers, and their logs with them.
    let kept = format!(
        "{failure}\n{}--- compose logs ---\n{logs}",
        looked.iter().map(Looked::evidence).collect::<String>()
    );
    agent.keep_app_logs(sha, &kept, &logs);
    let stop = Stop::Failed(Box::new(Failed {
        failure,
        started: Some(Started {
            prod: agent.cfg.is_prod(promoted.bundle_prod()),
            compose_logs: logs,
        }),
    }));
    (seen, Err(stop))
}

/// The one-shots another service waits for (`service_completed_successfully`) that have
/// not completed: what a start that never finished waits on, by container and service.
fn unfinished_one_shots(facts: &[ContainerFacts]) -> Vec<(String, String)> {
    facts
        .iter()
        .filter(|f| f.awaited && !f.container.completed && f.container.state == "running")
        .map(|f| (f.container.name.clone(), f.container.service.clone()))
        .collect()
}

/// Before `current` moves: a start whose budget, with its fallback's room kept, would be
/// cut below what any start needs (the tick's fetch or pull took most of it) is not made.
/// Nothing changed, and the next tick starts the release with its images already here.
///
/// # Errors
/// `TICK_TIMEOUT` (temporary): the release that runs stays.
pub(super) fn start_fits(agent: &Agent, state: &State, sha: &Sha) -> Result<(), Failure> {
    let then_fallback = state.applied_sha().is_some_and(|p| p != sha);
    let share = start_share(agent.tick_left(), then_fallback, agent.cfg.tick_timeout);
    if share.is_none_or(|s| s >= MIN_START) {
        return Ok(());
    }
    Err(Failure::coded(
        Code::TickTimeout,
        format!(
            "too little of tick_timeout_s ({}s) is left to start {} and fall back if it \
             fails: nothing was changed, and the next tick starts it",
            agent.cfg.tick_timeout.as_secs(),
            sha.short(),
        ),
    ))
}

impl Agent<'_> {
    /// What is left of the tick before its deadline; `None` without one.
    fn tick_left(&self) -> Option<Duration> {
        self.tick_deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// What a start of a release may take, one-shots and dependency waits included:
    /// `healthy_timeout_s`, and never more than the tick has left before its deadline
    /// (`tick_timeout_s`) less what its end needs. When a fallback may follow (`then_fallback`),
    /// half of that: the last good release then comes back up before the deadline, so no tick
    /// ends with the site it found serving down because of it.
    pub(super) fn start_budget(&self, then_fallback: bool) -> Duration {
        let share = start_share(self.tick_left(), then_fallback, self.cfg.tick_timeout);
        start_budget(self.cfg.healthy_timeout, share)
    }

    /// What the app said when its release failed to come up or to heal: kept for
    /// `monky-deployd logs <sha>` (redacted, bounded) and its last lines in the journal, so the
    /// operator reads the app's own words (`cannot reach db:5432`) without tenancy's log view.
    pub(super) fn keep_app_logs(&self, sha: &Sha, kept: &str, logs: &str) {
        match crate::evidence::keep_logs(&self.layout, sha.as_str(), kept) {
            Ok(path) => info!(
                "kept the failed release's logs in {}: `monky-deployd logs {}`",
                path.display(),
                sha.short()
            ),
            Err(e) => warn!("cannot keep the failed release's logs: {e:#}"),
        }
        let last: Vec<&str> = logs.lines().rev().take(5).collect();
        if !last.is_empty() {
            warn!(
                "last compose log lines: {}",
                last.into_iter().rev().collect::<Vec<_>>().join(" | ")
            );
        }
    }
}

/// The lines of a one-shot's own output that name it when it never finished.
const UNFINISHED_LINES: usize = 3;

/// What a tick keeps after a start and its fallback (the logs, the report and the save), or a
/// tenth of `tick_timeout_s` when that is less.
const TICK_END_RESERVE: Duration = Duration::from_secs(3);

/// The least a start is given: with less of the tick left for it, it is not made (see
/// [`start_fits`]).
const MIN_START: Duration = Duration::from_secs(1);

/// What of `left` of a tick of `tick_timeout` a start may take (`None`: no deadline): all but
/// the tick's end, and half of that when a fallback may follow.
fn start_share(
    left: Option<Duration>,
    then_fallback: bool,
    tick_timeout: Duration,
) -> Option<Duration> {
    let left = left?.saturating_sub(TICK_END_RESERVE.min(tick_timeout / 10));
    Some(if then_fallback { left / 2 } else { left })
}

/// [`Agent::start_budget`] of `healthy_timeout` with the tick's `share` for the start.
fn start_budget(healthy_timeout: Duration, share: Option<Duration>) -> Duration {
    share.map_or(healthy_timeout, |s| healthy_timeout.min(s).max(MIN_START))
}

/// The last `n` non-empty lines of `text`, joined with ` | `.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// A container that was not ready after `up`, with what the engine says about it.
#[derive(Debug, Clone)]
pub(super) struct Looked {
    name: String,
    state: String,
    health: Option<String>,
    detail: monky_compose::ContainerDetail,
    /// A one-shot another service waits for that never finished: its own last output.
    unfinished: Option<String>,
}

impl Looked {
    /// `web-1 (unhealthy; probe exit 1: <output>)`, `web-1 (exited; exit code 3)`,
    /// `migrate-1 (running; never finished, another service waits for it; last output: ...)`.
    fn summary(&self) -> String {
        let mut parts = vec![self.health.clone().unwrap_or_else(|| self.state.clone())];
        if let Some(out) = &self.unfinished {
            parts.push("never finished, another service waits for it".to_string());
            if !out.is_empty() {
                parts.push(format!("last output: {out}"));
            }
        }
        if let Some(code) = self.detail.exit_code {
            parts.push(format!("exit code {code}"));
        }
        if let Some(p) = self.detail.last_probe.as_ref().filter(|p| p.exit_code != 0) {
            parts.push(format!("probe exit {}: {}", p.exit_code, p.output));
        }
        format!("{} ({})", self.name, parts.join("; "))
    }

    /// The container's lines in the kept evidence.
    fn evidence(&self) -> String {
        let mut out = format!("container {}: state {}", self.name, self.state);
        if let Some(h) = &self.health {
            out.push_str(&format!(", health {h}"));
        }
        if let Some(e) = &self.detail.error {
            out.push_str(&format!(", engine error: {e}"));
        }
        if let Some(c) = self.detail.exit_code {
            out.push_str(&format!(", exit code {c}"));
        }
        if let Some(p) = &self.detail.last_probe {
            out.push_str(&format!(", last probe exit {}: {}", p.exit_code, p.output));
        }
        if self.unfinished.is_some() {
            out.push_str(", a one-shot another service waits for, never finished");
        }
        out.push('\n');
        out
    }
}

/// The code and the cause of a release that did not come up: a container the engine could
/// not start (a host port in use) or an `up` that failed before any container ran is
/// `COMPOSE_UP_FAILED` in docker's words; a container that ran and then failed its probe,
/// exited or never became healthy is `UNHEALTHY`, with its last probe output or exit code.
pub(super) fn diagnose(up: Option<&monky_compose::Error>, bad: &[Looked]) -> (Code, String) {
    let never_started: Vec<String> = bad
        .iter()
        .filter_map(|l| {
            l.detail
                .error
                .as_ref()
                .map(|e| format!("{} did not start: {e}", l.name))
        })
        .collect();
    if !never_started.is_empty() {
        return (Code::ComposeUpFailed, never_started.join("; "));
    }
    // Nothing ran that could have failed on its own: compose itself failed.
    let nothing_ran = bad.iter().all(|l| l.state == "created");
    match up {
        Some(e) if nothing_ran && e.kind() != monky_compose::ErrorKind::Unhealthy => {
            (Code::ComposeUpFailed, e.cause())
        }
        _ if bad.is_empty() => (
            Code::Unhealthy,
            up.map_or_else(|| "no container came up".to_string(), |e| e.cause()),
        ),
        _ => (
            Code::Unhealthy,
            bad.iter()
                .map(Looked::summary)
                .collect::<Vec<_>>()
                .join(", "),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monky_compose::{ContainerDetail, Probe};

    fn looked(state: &str, health: Option<&str>, detail: ContainerDetail) -> Looked {
        Looked {
            name: "p-web-1".into(),
            state: state.into(),
            health: health.map(str::to_owned),
            detail,
            unfinished: None,
        }
    }

    fn up_failed(stderr: &str) -> monky_compose::Error {
        monky_compose::Error::Failed {
            what: "docker compose -f /x/staging/abc/compose.yaml up".into(),
            code: Some(1),
            stderr: stderr.into(),
        }
    }

    #[test]
    fn a_start_leaves_room_for_its_fallback_before_the_ticks_deadline() {
        let s = Duration::from_secs;
        let check = |left: Option<u64>, then_fallback: bool, expected: u64| {
            let share = start_share(left.map(s), then_fallback, s(1500));
            assert_eq!(
                start_budget(s(300), share),
                s(expected),
                "{left:?} left, fallback {then_fallback}"
            );
        };
        check(None, true, 300);
        check(Some(1400), true, 300);
        // The default tick_timeout_s is healthy_timeout_s + 300 at least: a start late in the
        // tick leaves half of what is left (less the tick's end) to the fallback.
        check(Some(503), true, 250);
        check(Some(503), false, 300);
        check(Some(203), false, 200);
        check(Some(2), true, 1);
        // A tick of a few seconds keeps a tenth of it for its end.
        assert_eq!(
            start_share(Some(s(5)), true, s(6)),
            Some(Duration::from_millis(2200))
        );
        assert_eq!(start_share(None, true, s(6)), None);
    }

    #[test]
    fn the_last_lines_of_a_one_shots_output() {
        assert_eq!(last_lines("a\n\nb\n c \nd\n", 3), "b | c | d");
        assert_eq!(last_lines("", 3), "");
    }

    #[test]
    fn a_container_that_never_started_is_compose_up_failed_in_the_engines_words() {
        let port = ContainerDetail {
            error: Some("Bind for 127.0.0.1:8080 failed: port is already allocated".into()),
            ..ContainerDetail::default()
        };
        let (code, why) = diagnose(
            Some(&up_failed("Error response from daemon: x")),
            &[looked("created", None, port)],
        );
        assert_eq!(code, Code::ComposeUpFailed);
        assert_eq!(
            why,
            "p-web-1 did not start: Bind for 127.0.0.1:8080 failed: port is already allocated"
        );
        // Nothing ran and the engine said nothing more: compose's own words.
        let (code, why) = diagnose(
            Some(&up_failed("Error response from daemon: no such network")),
            &[looked("created", None, ContainerDetail::default())],
        );
        assert_eq!(code, Code::ComposeUpFailed);
        assert_eq!(why, "Error response from daemon: no such network");
        let (code, _) = diagnose(Some(&up_failed("Error: boom")), &[]);
        assert_eq!(code, Code::ComposeUpFailed);
    }

    #[test]
    fn a_container_that_ran_and_failed_is_unhealthy_with_its_probe_or_exit_code() {
        let probe = ContainerDetail {
            last_probe: Some(Probe {
                exit_code: 1,
                output: "curl: (7) refused".into(),
            }),
            ..ContainerDetail::default()
        };
        let (code, why) = diagnose(
            Some(&up_failed("container p-web-1 is unhealthy")),
            &[looked("running", Some("unhealthy"), probe)],
        );
        assert_eq!(code, Code::Unhealthy);
        assert_eq!(why, "p-web-1 (unhealthy; probe exit 1: curl: (7) refused)");
        let exited = ContainerDetail {
            exit_code: Some(3),
            ..ContainerDetail::default()
        };
        let (code, why) = diagnose(None, &[looked("exited", None, exited)]);
        assert_eq!(code, Code::Unhealthy);
        assert_eq!(why, "p-web-1 (exited; exit code 3)");
        // A passing last probe is no cause.
        let passing = ContainerDetail {
            last_probe: Some(Probe {
                exit_code: 0,
                output: "ok".into(),
            }),
            ..ContainerDetail::default()
        };
        let (_, why) = diagnose(None, &[looked("running", Some("starting"), passing)]);
        assert_eq!(why, "p-web-1 (starting)");
    }
}
