//! A release that did not come up: why (the engine's and compose's words), the failed
//! release's backoff, and the fallback to the last healthy release.

use monky_agent_proto::Sha;
use tracing::{info, warn};

use super::Agent;
use super::backoff::Backoff;
use super::not_ready;
use super::stages::{Failed, Promoted, Started, Stop};
use crate::code::Code;
use crate::exit::Failure;
use crate::state::Fact;
use crate::{failpoint, redact, release};

impl Agent<'_> {
    /// Steps 12-13: `compose up` and the health wait. A release that does not come up healthy
    /// starts the backoff and falls back; its failure carries the compose logs to the report.
    pub(super) fn up_healthy(&mut self, promoted: &Promoted) -> Result<(), Stop> {
        let (rel, sha) = (promoted.release(), promoted.sha());
        let project = rel.compose(&self.docker, self.cfg);
        info!("compose up -d --remove-orphans");
        failpoint::hit("before-up");
        let up = project.up(Some(self.cfg.healthy_timeout));
        failpoint::hit("after-up");
        self.refresh_containers();
        let up = match up {
            Err(e) if super::up_gave_up_on_one_shots(&e.to_string(), self.state.containers()) => {
                Ok(())
            }
            other => other,
        };
        let bad = not_ready(self.state.containers());
        if up.is_ok() && bad.is_empty() {
            return Ok(());
        }
        let logs = project.logs_tail(200).unwrap_or_else(|e| {
            warn!("cannot read the compose logs: {e}");
            String::new()
        });
        let looked: Vec<Looked> = self
            .state
            .containers()
            .iter()
            .filter(|c| !c.is_ready())
            .map(|c| Looked {
                name: c.name.clone(),
                state: c.state.clone(),
                health: c.health.clone(),
                detail: self.docker.engine().inspect(&c.name).unwrap_or_default(),
            })
            .collect();
        let (code, why) = diagnose(up.as_ref().err(), &looked);
        let failure = Failure::coded(code, why);
        warn!("apply of {} failed: {failure}", sha.short());
        // Kept before the fallback: `compose up` of the previous release replaces these
        // containers, and their logs with them.
        let kept = format!(
            "{failure}\n{}--- compose logs ---\n{logs}",
            looked.iter().map(Looked::evidence).collect::<String>()
        );
        self.keep_app_logs(sha, &kept, &logs);
        Err(Stop::Failed(Box::new(Failed {
            failure,
            started: Some(Started {
                prod: self.cfg.is_prod(promoted.bundle_prod()),
                compose_logs: logs,
            }),
        })))
    }

    /// Recovery after a stage stopped: a release that failed waits out its backoff and, when
    /// it had started, falls back (see [`Agent::release_failed`]); a halt is its own error.
    pub(super) fn recover(&mut self, sha: &Sha, stop: Stop) -> Failure {
        match stop {
            Stop::Halted(e) => e,
            Stop::Failed(failed) => self.release_failed(sha, *failed),
        }
    }

    /// A release that failed at render, model, pull, up or health: schedules the next attempt
    /// (1 min, 2, 4, ... up to 1 h, jittered) and, when it had `started`, falls back to the last
    /// healthy release. Returns the failure, whose message ends with what happened to the
    /// running release and when the next attempt is.
    fn release_failed(&mut self, sha: &Sha, failed: Failed) -> Failure {
        let Failed { failure, started } = failed;
        let code = failure.code;
        // `CODE: names`, repeated by the reports sent while the sha waits.
        let detail = failure.to_string();
        let key = super::backoff::verdict_key(self.cfg);
        let backoff = Backoff::after_failure(
            &self.state,
            sha,
            &key,
            crate::clock::wall(),
            crate::clock::boot().as_ref(),
            rand::random_range(0.0..1.0),
        );
        let next = backoff.next_attempt_at;
        self.record(backoff.fact(sha, &key, code, redact::redact(&detail)));
        let previous = self.state.applied_sha().filter(|p| *p != sha).cloned();
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
                if self.cfg.on_failure(*prod) == crate::config::OnFailure::Leave =>
            {
                self.record(Fact::AppliedForgotten);
                format!("left {} in place (on_failure: leave)", sha.short())
            }
            (Some(prev), Some(_)) => self.revert_to(&prev),
        };
        let failure = Failure::coded(
            code,
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
        if let Err(e) = release::verify(&self.layout, prev) {
            // Nothing is started from a release that changed on disk; what runs stays.
            self.record(Fact::AppliedForgotten);
            warn!("fallback to {} refused: {e:#}", prev.short());
            let code = Failure::code_of(&e).unwrap_or(Code::Failed);
            return format!("fallback to {} refused ({code})", prev.short());
        }
        let result =
            release::point_current(&self.layout, prev, &|r| self.policy_gate(r)).and_then(|rel| {
                info!("falling back to {}", prev.short());
                rel.compose(&self.docker, self.cfg)
                    .up(Some(self.cfg.healthy_timeout))
                    .map_err(anyhow::Error::new)
            });
        self.refresh_containers();
        let result = match result {
            Err(e)
                if super::up_gave_up_on_one_shots(&format!("{e:#}"), self.state.containers()) =>
            {
                Ok(())
            }
            other => other,
        };
        match result {
            Ok(()) if not_ready(self.state.containers()).is_empty() => {
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

/// A container that was not ready after `up`, with what the engine says about it.
#[derive(Debug, Clone)]
pub(super) struct Looked {
    name: String,
    state: String,
    health: Option<String>,
    detail: monky_compose::ContainerDetail,
}

impl Looked {
    /// `web-1 (unhealthy; probe exit 1: <output>)`, `web-1 (exited; exit code 3)`.
    fn summary(&self) -> String {
        let mut parts = vec![self.health.clone().unwrap_or_else(|| self.state.clone())];
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
