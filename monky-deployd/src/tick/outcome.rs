//! Where a tick's outcome goes: the one report to tenancy, what state keeps of it (the last
//! result, error and code), and the tick's `finally` (token upkeep, staging cleanup, the state
//! saved).

use anyhow::Context;
use monky_agent_proto as proto;
use proto::{ReportResult, Sha};
use tracing::warn;

use super::Run;
use crate::code::Code;
use crate::exit::{Exit, Failure, OrCode as _};
use crate::redact::Redacted;
use crate::state::Fact;
use crate::{failpoint, logging, peers, redact, release};

/// Whether an outcome is reported to tenancy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Send {
    /// Always; the report's failure becomes the tick's error.
    Always,
    /// When a token is there to send it with; the report's failure is logged.
    IfToken,
    /// Never: the tick reached no action.
    Never,
}

/// What a tick tells tenancy about the release it acted on.
#[derive(Debug)]
pub(super) struct Outcome<'a> {
    /// `None`: the tick reached no action (its error came before one), so nothing is reported
    /// and the last result stands.
    result: Option<ReportResult>,
    sha: Option<&'a Sha>,
    /// The failure, whose `CODE: names` is the report's detail.
    failure: Option<Failure>,
    /// Beside an `applied` result: what the agent did on its own or why it did not act
    /// (`HEALED: ...`, `APPLY_INTERRUPTED: ...`, `HELD: ...`), a code whose class is success.
    note: Option<Failure>,
    pub(super) compose_logs: Option<&'a Redacted>,
}

impl<'a> Outcome<'a> {
    /// `sha` runs and is healthy (or nothing runs and nothing should).
    pub(super) fn applied(sha: Option<&'a Sha>) -> Self {
        Self::new(ReportResult::Applied, sha, None)
    }

    /// `sha` runs and is healthy, with `note` (its code's class is success) in the report's
    /// detail.
    pub(super) fn noted(sha: Option<&'a Sha>, note: Failure) -> Self {
        debug_assert_eq!(note.exit(), Exit::Ok, "a note is not a failure");
        let mut o = Self::new(ReportResult::Applied, sha, None);
        o.note = Some(note);
        o
    }

    /// The env was retired; `sha` was what ran.
    pub(super) fn down(sha: Option<&'a Sha>) -> Self {
        Self::new(ReportResult::Down, sha, None)
    }

    /// `sha` failed with `failure`.
    pub(super) fn failed(sha: Option<&'a Sha>, failure: Failure) -> Self {
        Self::new(ReportResult::Failed, sha, Some(failure))
    }

    /// The error of a tick that reached no action.
    fn unreported(failure: Failure) -> Self {
        let mut o = Self::new(ReportResult::Failed, None, Some(failure));
        o.result = None;
        o
    }

    fn new(result: ReportResult, sha: Option<&'a Sha>, failure: Option<Failure>) -> Self {
        Self {
            result: Some(result),
            sha,
            failure,
            note: None,
            compose_logs: None,
        }
    }
}

impl Run<'_> {
    /// The one place an outcome goes out: reported to tenancy (with the journal's redacted
    /// tail), then recorded in state. Returns the tick's exit, or the report's error: the
    /// release's outcome is recorded all the same, and the report's failure beside it, so a
    /// release that came up is never taken for a failed one because tenancy did not take the
    /// report (the next tick's heartbeat reports it again).
    pub(super) fn conclude(&mut self, outcome: Outcome<'_>) -> Result<Exit, Failure> {
        self.conclude_with(outcome, Send::Always)
    }

    /// An action (apply or retire, or a checkin answer that cannot be acted on) that ended in
    /// an error is reported as failed, with the compose logs its failure carries; nothing when
    /// the tick's outcome went out already (a success report that tenancy did not take is no
    /// failed release). The error stays the tick's: a report that cannot be sent (no token,
    /// tenancy down) is logged, and state still records the failure.
    pub(super) fn conclude_error(&mut self, sha: Option<&Sha>, e: &Failure) {
        if self.tick.concluded {
            return;
        }
        let mut outcome = Outcome::failed(sha, e.clone());
        outcome.compose_logs = e.compose_logs.as_ref();
        // Without a token no report can be sent; the failure is still the tick's outcome.
        let _ = self.conclude_with(outcome, Send::IfToken);
    }

    /// Reports `outcome` as `send` says and records it in state, once per tick: the only
    /// maker of `Fact::Concluded` besides `finish` (a failure found after the outcome went
    /// out) and the tick's deadline, which folds `TICK_TIMEOUT` in from its own thread when the
    /// tick can no longer conclude. With
    /// [`Send::Always`], the report's own failure is returned and recorded as the tick's error;
    /// with [`Send::IfToken`] it is logged and the outcome's failure stays the one recorded.
    fn conclude_with(&mut self, outcome: Outcome<'_>, send: Send) -> Result<Exit, Failure> {
        debug_assert!(!self.tick.concluded, "a tick concludes once");
        self.tick.concluded = true;
        let Outcome {
            result,
            sha,
            failure,
            note,
            compose_logs,
        } = outcome;
        // `CODE: names` composed and redacted once here: the same text goes to the report and
        // to state.json.
        let failure = failure.map(|f| (f.code, redact::redact(&f.to_string())));
        let note = note.map(|n| redact::redact(&n.to_string()));
        let Some(result) = result else {
            // No action was reached: nothing to report, and the last result stands.
            self.record(Fact::Concluded {
                result: None,
                failure,
                note: None,
                reported_at: None,
            });
            return Ok(Exit::Fail);
        };
        // `None`: not sent, there being no token to send it with.
        let sent = match send {
            Send::Always => {
                Some(self.report(result, sha, failure.as_ref(), note.as_ref(), compose_logs))
            }
            Send::IfToken if self.tick.token.is_some() => {
                Some(self.report(result, sha, failure.as_ref(), note.as_ref(), compose_logs))
            }
            Send::IfToken | Send::Never => None,
        };
        let exit = match result {
            ReportResult::Failed => Exit::Fail,
            ReportResult::Applied | ReportResult::Down => Exit::Ok,
        };
        let (failure, reported_at, ended) = match sent {
            None => (failure, None, Ok(exit)),
            Some(Ok(())) => (failure, Some(crate::clock::wall()), Ok(exit)),
            Some(Err(e)) if send == Send::Always => {
                (Some((e.code, redact::redact(&e.to_string()))), None, Err(e))
            }
            Some(Err(e)) => {
                warn!("could not report the failure: {}", e.full());
                (failure, None, Ok(exit))
            }
        };
        self.record(Fact::Concluded {
            result: Some(result),
            failure,
            note,
            reported_at,
        });
        ended
    }

    /// The report to tenancy: the result, the failure's or the note's detail (redacted by the
    /// caller), the journal's redacted tail with the compose logs after it.
    fn report(
        &self,
        result: ReportResult,
        sha: Option<&Sha>,
        failure: Option<&(Code, Redacted)>,
        note: Option<&Redacted>,
        compose_logs: Option<&Redacted>,
    ) -> Result<(), Failure> {
        let detail = failure.map(|(_, d)| d).or(note);
        let mut tail = logging::tail(logging::LOG_TAIL_MAX);
        if let Some(logs) = compose_logs {
            tail.push_lines(&redact::redact("--- compose logs ---\n"));
            tail.push_lines(logs);
            tail = tail.tail(logging::LOG_TAIL_MAX);
        }
        let req = proto::ReportRequest {
            env_id: self.agent.cfg.env_id.clone(),
            sha: sha.cloned(),
            result,
            log_tail: tail.into_string(),
            containers: self.wire_containers(),
            detail: detail.map(|d| d.as_str().to_string()),
            hold: self.tick.hold.as_ref().map(crate::hold::Hold::wire),
        };
        self.agent
            .tenancy
            .report(&self.bearer()?, &req)
            .map_err(|e| peers::tenancy_failure("report", e))
    }

    /// A checkin that tenancy answered with something the agent cannot act on
    /// (`CHECKIN_INVALID`) is said back to it once, as failed; any other checkin error reached
    /// no answer to report on.
    pub(super) fn conclude_checkin_error(&mut self, e: &Failure) {
        if e.code == Code::CheckinInvalid {
            self.conclude_error(None, e);
        }
    }

    /// Token upkeep after the action, whatever the action or the checkin did (tenancy down,
    /// a 5xx, a 429, a hold, a backoff): the token is the agent's own to keep, and a renewal
    /// needs OpenBao alone. The re-lease near the max TTL is tried only when tenancy was
    /// reached. Before the clock is judged, so a renewal's or `lookup-self`'s `Date` counts in
    /// this very tick. A token near its max TTL that no lease replaced is said at warning
    /// priority, at error priority in its last hours.
    pub(super) fn token_upkeep(&mut self, result: &Result<Exit, Failure>) {
        let reached_tenancy = result
            .as_ref()
            .err()
            .is_none_or(|e| e.exit() != Exit::Temporary);
        if let Err(e) = self.upkeep(reached_tenancy) {
            warn!("token upkeep: {}", e.full());
        }
        if let Some(end) = crate::verdict::token_max_ttl(&self.tick.state, crate::clock::wall()) {
            if end.urgent() {
                tracing::error!("{end}");
            } else {
                warn!("{end}");
            }
        }
    }

    /// The tick's `finally`: an error no step concluded is concluded here, unreported (it
    /// reached no action), and a failure found after the outcome went out (the clock, judged
    /// on OpenBao's last answer) is added to the recorded outcome, the report standing; then
    /// staging cleanup, state saved. Returns the state save's error.
    pub(super) fn finish(&mut self, result: &Result<Exit, Failure>) -> Result<(), Failure> {
        let error = result.as_ref().err();
        if let Some(e) = error {
            let failure = e.clone();
            if !self.tick.concluded {
                let _ = self.conclude_with(Outcome::unreported(failure), Send::Never);
            } else if self.tick.state.last_code() != Some(failure.code) {
                self.record(Fact::Concluded {
                    result: None,
                    failure: Some((failure.code, redact::redact(&failure.to_string()))),
                    note: None,
                    reported_at: None,
                });
            }
        }
        self.record(Fact::TickEnded {
            succeeded_at: matches!(result, Ok(Exit::Ok)).then(crate::clock::wall),
            previous: self.tick.previous.clone(),
        });
        release::clean_staging(&self.agent.layout);
        // A memory that cannot be written costs the next tick a look through /proc, no more.
        if let Err(e) = self.agent.listeners.save(&self.agent.layout) {
            tracing::debug!("cannot remember the peers' listeners: {e:#}");
        }
        failpoint::hit("before-save");
        self.tick
            .state
            .save(&self.agent.layout)
            .with_context(|| {
                format!(
                    "cannot save {}: free space in {} or the next tick repeats this one",
                    self.agent.layout.state_path().display(),
                    self.agent.layout.path().display()
                )
            })
            .or_code(Code::StateWriteFailed)?;
        // Only once the outcome is saved: a crash before this leaves the mark for the next tick.
        if self.tick.marker_settled {
            crate::interrupted::clear(&self.agent.layout).or_code(Code::StateWriteFailed)?;
        }
        Ok(())
    }
}
