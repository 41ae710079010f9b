//! Where a tick's outcome goes: the report to tenancy, the last result, error and code in
//! state, and the tick's `finally` (token upkeep, staging cleanup, the state saved).

use anyhow::Context;
use monky_agent_proto as proto;
use proto::ReportResult;
use tracing::warn;

use super::Agent;
use crate::code::Code;
use crate::exit::{Exit, Failure};
use crate::state;
use crate::{failpoint, logging, peers, redact, release};

impl Agent<'_> {
    pub(super) fn report(
        &mut self,
        result: ReportResult,
        sha: Option<&str>,
        detail: Option<&str>,
        extra_log: Option<&str>,
    ) -> anyhow::Result<()> {
        let mut tail = logging::tail(logging::LOG_TAIL_MAX);
        if let Some(extra) = extra_log {
            tail.push_str("--- compose logs ---\n");
            tail.push_str(&redact::redact(extra));
            tail = logging::tail_of(&tail, logging::LOG_TAIL_MAX);
        }
        let req = proto::ReportRequest {
            env_id: self.cfg.env_id.clone(),
            sha: sha.map(str::to_string),
            result,
            log_tail: tail,
            containers: self.wire_containers(),
            detail: detail.map(redact::redact),
        };
        self.tenancy
            .report(&self.bearer()?, &req)
            .map_err(|e| peers::tenancy_failure("report", e))?;
        self.state.last_report = Some(state::now());
        Ok(())
    }

    /// Records what the last report said: the one place the last result, error and code are set.
    pub(super) fn record(&mut self, result: &str, code: Option<Code>, error: Option<String>) {
        self.state.last_result = Some(result.to_string());
        self.state.last_error = error;
        self.state.last_code = code;
    }

    /// Reports a failed apply (once), recording `CODE: names` as the last error.
    pub(super) fn report_failure(
        &mut self,
        sha: Option<&str>,
        e: &anyhow::Error,
        logs: Option<&str>,
    ) {
        if e.downcast_ref::<ReportedMarker>().is_some() {
            return;
        }
        let (code, detail) = failure_detail(e);
        let detail = redact::redact(&detail);
        self.record("failed", code, Some(detail.clone()));
        if self.token.is_none() {
            return;
        }
        if let Err(re) = self.report(ReportResult::Failed, sha, Some(&detail), logs) {
            warn!("could not report the failure: {re:#}");
        }
    }

    /// The tick's `finally`: token upkeep, staging cleanup, state saved.
    /// Returns the state save's error.
    pub(super) fn finish(&mut self, result: &anyhow::Result<Exit>) -> anyhow::Result<()> {
        let error = result.as_ref().err();
        if let Some(e) = error {
            let (code, detail) = failure_detail(e);
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
        })
    }
}

/// Marks an error whose report was already sent.
#[derive(Debug)]
pub(super) struct ReportedMarker;

impl std::error::Error for ReportedMarker {}

impl std::fmt::Display for ReportedMarker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("apply failed")
    }
}

/// The code and `CODE: names` of an error, for a report's detail and state's last error; an
/// error that carries no failure is `FAILED` with its innermost cause.
pub(super) fn failure_detail(e: &anyhow::Error) -> (Option<Code>, String) {
    match e.chain().find_map(|c| c.downcast_ref::<Failure>()) {
        Some(f) => (f.code, f.to_string()),
        None => (
            Some(Code::Failed),
            format!(
                "{}: {}",
                Code::Failed,
                e.chain()
                    .last()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ),
        ),
    }
}
