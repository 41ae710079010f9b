//! Where a tick's outcome goes: the one report to tenancy, what state keeps of it (the last
//! result, error and code), and the tick's `finally` (token upkeep, staging cleanup, the state
//! saved).

use anyhow::Context;
use monky_agent_proto as proto;
use proto::ReportResult;
use tracing::warn;

use super::Agent;
use crate::code::{Code, CodePolicy as _};
use crate::exit::{Exit, Failure};
use crate::state;
use crate::{failpoint, logging, peers, redact, release};

/// What a tick tells tenancy about the release it acted on.
#[derive(Debug)]
pub(super) struct Outcome<'a> {
    result: ReportResult,
    sha: Option<&'a str>,
    /// The failure's code and `CODE: names` detail.
    failure: Option<(Code, String)>,
    /// Beside an `applied` result: what the agent did on its own or why it did not act
    /// (`HEALED: ...`, `APPLY_INTERRUPTED: ...`, `HELD: ...`).
    note: Option<String>,
    pub(super) compose_logs: Option<&'a str>,
}

impl<'a> Outcome<'a> {
    /// `sha` runs and is healthy (or nothing runs and nothing should).
    pub(super) fn applied(sha: Option<&'a str>) -> Self {
        Self::new(ReportResult::Applied, sha, None)
    }

    /// `sha` runs and is healthy, with a note of `code` (`CODE: names`) in the report's detail.
    pub(super) fn noted(sha: Option<&'a str>, code: Code, detail: String) -> Self {
        debug_assert_eq!(code.exit(), Exit::Ok, "a note is not a failure");
        let mut o = Self::new(ReportResult::Applied, sha, None);
        o.note = Some(detail);
        o
    }

    /// The env was retired; `sha` was what ran.
    pub(super) fn down(sha: Option<&'a str>) -> Self {
        Self::new(ReportResult::Down, sha, None)
    }

    /// `sha` failed with `code`; `detail` is `CODE: names`.
    pub(super) fn failed(sha: Option<&'a str>, code: Code, detail: String) -> Self {
        Self::new(ReportResult::Failed, sha, Some((code, detail)))
    }

    fn new(result: ReportResult, sha: Option<&'a str>, failure: Option<(Code, String)>) -> Self {
        Self {
            result,
            sha,
            failure,
            note: None,
            compose_logs: None,
        }
    }
}

impl Agent<'_> {
    /// The one place an outcome goes out: reported to tenancy (with the journal's redacted
    /// tail), then recorded in state as what the last report said. Returns the tick's exit.
    pub(super) fn conclude(&mut self, outcome: Outcome<'_>) -> anyhow::Result<Exit> {
        let Outcome {
            result,
            sha,
            failure,
            note,
            compose_logs,
        } = outcome;
        // Redacted once here: the same text goes to the report and to state.json.
        let failure = failure.map(|(code, detail)| (code, redact::redact(&detail)));
        let note = note.map(|n| redact::redact(&n));
        let detail = failure
            .as_ref()
            .map(|(_, d)| d.as_str())
            .or(note.as_deref());
        let mut tail = logging::tail(logging::LOG_TAIL_MAX);
        if let Some(logs) = compose_logs {
            tail.push_str("--- compose logs ---\n");
            tail.push_str(&redact::redact(logs));
            tail = logging::tail_of(&tail, logging::LOG_TAIL_MAX);
        }
        let req = proto::ReportRequest {
            env_id: self.cfg.env_id.clone(),
            sha: sha.map(str::to_string),
            result,
            log_tail: tail,
            containers: self.wire_containers(),
            detail: detail.map(str::to_string),
            hold: self.hold.as_ref().map(crate::hold::Hold::wire),
        };
        self.tenancy
            .report(&self.bearer()?, &req)
            .map_err(|e| peers::tenancy_failure("report", e))?;
        self.state.last_report = Some(state::now());
        self.state.last_result = Some(result.as_str().to_string());
        let (code, error) = failure.unzip();
        self.state.last_code = code;
        self.state.last_error = error;
        self.state.last_note = note;
        Ok(match result {
            ReportResult::Failed => Exit::Fail,
            ReportResult::Applied | ReportResult::Down => Exit::Ok,
        })
    }

    /// An action (apply or retire) that ended in an error is reported as failed, with the
    /// compose logs its failure carries. The error stays the tick's: a report that cannot be
    /// sent (no token, tenancy down) is logged, and state still records the failure.
    pub(super) fn conclude_error(&mut self, sha: Option<&str>, e: &anyhow::Error) {
        let (code, detail) = Failure::detail_of(e);
        let mut outcome = Outcome::failed(sha, code.unwrap_or(Code::Failed), detail);
        outcome.compose_logs = Failure::compose_logs_of(e);
        let reported = self.token.is_some()
            && self
                .conclude(outcome)
                .inspect_err(|re| warn!("could not report the failure: {re:#}"))
                .is_ok();
        if !reported {
            // `finish` records the error's code and detail.
            self.state.last_result = Some(ReportResult::Failed.as_str().to_string());
        }
    }

    /// The tick's `finally`: an error's code and detail recorded, token upkeep, staging
    /// cleanup, state saved. Returns the state save's error.
    pub(super) fn finish(&mut self, result: &anyhow::Result<Exit>) -> anyhow::Result<()> {
        let error = result.as_ref().err();
        if let Some(e) = error {
            let (code, detail) = Failure::detail_of(e);
            self.state.last_error = Some(redact::redact(&detail));
            self.state.last_code = code;
        }
        match result {
            Ok(Exit::Ok) => self.state.last_success = Some(state::now()),
            // A tick that ends failed without an error (a heartbeat, a wait) recorded its code.
            Ok(_) | Err(_) => {
                if let Some(code) = self.state.last_code {
                    *self
                        .state
                        .refusals
                        .entry(code.as_str().to_string())
                        .or_default() += 1;
                }
            }
        }
        // A failure equal to the last tick's (code and detail) is counted, not logged again.
        let now = (self.state.last_code, self.state.last_error.clone());
        self.state.repeats = if now.1.is_some() && now == self.previous {
            self.state.repeats.saturating_add(1)
        } else {
            0
        };
        let reached_tenancy = error.is_none_or(|e| Exit::of(e) != Exit::Temporary);
        if reached_tenancy && let Err(e) = self.upkeep() {
            warn!("token upkeep: {}", redact::redact(&format!("{e:#}")));
        }
        release::clean_staging(self.cfg);
        failpoint::hit("before-save");
        self.state.save(&self.cfg.state_dir).with_context(|| {
            format!(
                "cannot save {}: free space in {} or the next tick repeats this one",
                state::path(&self.cfg.state_dir).display(),
                self.cfg.state_dir.display()
            )
        })?;
        // Only once the outcome is saved: a crash before this leaves the mark for the next tick.
        if self.marker_settled {
            crate::interrupted::clear(self.cfg)?;
        }
        Ok(())
    }
}
