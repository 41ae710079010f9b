//! Apply: the desired release's steps from fetch to report, as docs/architecture.md's "What a
//! tick does" numbers them, each a stage of `stages.rs`; and a failed sha's wait.

use monky_agent_proto::Sha;
use tracing::{info, warn};

use super::Outcome;
use super::Run;
use super::backoff::ReleaseBackoff;
use super::stages::{self, Fetched, Promoted, Secrets, Stop};
use super::{fallback, look};
use crate::code::Code;
use crate::exit::{Exit, Failure, OrCode as _};
use crate::release;
use crate::state::Fact;

/// Applies the desired release, step by step, as docs/architecture.md's "What a tick
/// does" numbers the steps. A stage that stops returns early and the stages after it never
/// run; a release that failed is recovered from (backoff, fallback) before the failure goes
/// up.
pub(super) fn apply(run: &mut Run, sha: &Sha, url: &str) -> Result<Exit, Failure> {
    // 1-2. Fetch the bundle and verify it hashes to the desired sha.
    let (fetched, raw) = stages::fetch(&run.agent, &run.bearer()?, sha, url)?;
    // Before the checks, so `doctor` measures the desired bundle's need even when a check
    // refuses it.
    run.record(Fact::DiskNeeded(fetched.disk_need()));
    match steps(run, sha, fetched) {
        // 14. Report.
        Ok(promoted) => applied(run, sha, &promoted),
        Err(stop) => {
            let e = run.recover(sha, stop);
            stages::keep_bad_bundle(&run.agent, sha, &raw, &e);
            Err(e)
        }
    }
}

/// Steps 3-13 of `sha`, each a stage of `stages.rs` taking the one before it.
fn steps(run: &mut Run, sha: &Sha, fetched: Fetched) -> Result<Promoted, Stop> {
    // 3. Refuse what the bundle alone shows is wrong, before any lease or secret read.
    let checked = stages::check(&run.agent, &run.tick.state, sha, fetched)?;
    // 4-6. Lease a grant, log in with it, read the secrets.
    if checked.reads_secrets() {
        run.token_for_apply()?;
    }
    let secrets = stages::read_secrets(
        &run.agent,
        &run.tick.judged,
        run.tick.token.as_ref(),
        &checked,
    )?;
    if run.tick.state.original_release().is_some() {
        note_quoting_changes(run, &secrets);
    }
    // 7-9. Render `.env`, stage the release, judge compose's model of it.
    let staged = stages::stage(&run.agent, &run.tick.judged, sha, checked, secrets)?;
    // 10. Pull from the staging dir.
    let pulled = stages::pull(&run.agent, &run.tick.judged, staged)?;
    // A start that could not finish, and fall back, before the tick's deadline is not made.
    fallback::start_fits(&run.agent, &run.tick.state, sha)?;
    // 11. Promote: `current` names the new release, checked again on disk.
    mark_under_way(run, sha)?;
    let promoted = stages::promote(&run.agent, &run.tick.judged, sha, pulled)?;
    // 12-13. Up, and wait for health.
    let (seen, up) = fallback::up_healthy(&run.agent, &run.tick.state, &promoted);
    run.saw(seen);
    up?;
    // 13a. Judge what runs: the uids and arguments of the release's processes.
    let (looked, judged) =
        look::judge_what_runs(&run.agent, &run.tick.judged, &run.tick.facts, &promoted);
    if let Some(looked) = looked {
        run.record(Fact::Looked(looked));
    }
    if judged.is_err() {
        run.refresh_containers();
    }
    judged?;
    Ok(promoted)
}

/// Step 11's first part: marks the apply of `sha` under way. From here to the saved
/// outcome the box changes: the mark says so to a tick that finds this one cut short, and
/// this tick's `finish` removes it once the outcome is saved.
fn mark_under_way(run: &mut Run, sha: &Sha) -> Result<(), Failure> {
    crate::interrupted::write(
        &run.agent.layout,
        &crate::interrupted::Marker {
            sha: Some(sha.clone()),
            previous: run.tick.state.applied_sha().cloned(),
            started_at: crate::clock::wall(),
        },
    )
    .or_code(Code::Failed)?;
    run.tick.marker_settled = true;
    Ok(())
}

/// Step 14: the release is up and healthy: state and tenancy hear so, and older releases
/// go.
fn applied(run: &mut Run, sha: &Sha, promoted: &Promoted) -> Result<Exit, Failure> {
    run.record(Fact::Applied {
        sha: sha.clone(),
        prod: promoted.bundle_prod(),
    });
    run.record_converged(sha);
    // From now on the release is this agent's own.
    run.record(Fact::ReleaseOwned);
    run.record(Fact::FailureForgotten);
    info!(
        "applied {} ({} container(s) healthy)",
        sha.short(),
        run.tick.state.containers().len()
    );
    // What the box gave the services that left it open, in the journal and so in the
    // report's log tail: the bundle's author sees the limits the app runs under.
    if let Some(supplied) = promoted
        .release()
        .compose_yaml()
        .ok()
        .and_then(|yaml| run.agent.cfg.budget.budget_override_for(&yaml))
        .and_then(|text| supplied_defaults(&text))
    {
        info!("supplied the box's defaults: {supplied}");
    }
    run.conclude(Outcome::applied(Some(sha)))?;
    // After every successful apply, not only with `--prune`: a tenancy that sends a new sha
    // every tick must not fill the disk. `current` (this sha, the last good one) stays.
    release::prune(
        &run.agent.layout,
        run.agent.cfg.keep_releases,
        &[sha.as_str()],
    );
    if run.agent.opts.prune
        && let Err(e) = run.agent.docker.image_prune()
    {
        warn!("image prune failed: {e}");
    }
    Ok(Exit::Ok)
}

/// The first apply over a release the original agent wrote: names every variable whose
/// value the app received differently through the original's `.env`, in the journal (and so
/// the report's `log_tail`) and in state for `explain`. The apply goes on: the value now
/// written is the secret itrun.
fn note_quoting_changes(run: &mut Run, secrets: &Secrets) {
    let names = secrets.handed_differently();
    if !names.is_empty() {
        let note = Failure::coded(
            Code::EnvQuotingChanged,
            format!(
                "{}: the original agent's .env handed these to the app differently ($ \
                 expansion, quotes, ' #' or blanks); they now reach it exactly, so an app \
                 initialised with the old form needs its stored value updated",
                names.join(", ")
            ),
        );
        warn!("{note}");
    }
    run.record(Fact::QuotingChanged(names));
}

impl Run<'_> {
    /// When the desired sha failed before under the config the box has now and its backoff
    /// has not run out, the deadline. A failure judged under another config is forgotten: the
    /// box admin's change is tried at once.
    pub(super) fn backoff_deadline(&mut self, sha: &Sha) -> Option<u64> {
        if ReleaseBackoff::config_changed(
            &self.tick.state,
            &super::backoff::verdict_key(self.agent.cfg),
        ) {
            info!(
                "the config changed since {} failed (waivers, budget, allowed_*, health wait): \
                 trying it again now",
                sha.short()
            );
            self.record(Fact::FailureForgotten);
            return None;
        }
        let (now, boot) = (crate::clock::wall(), crate::clock::boot());
        if let Some(rebased) = ReleaseBackoff::rebase(&self.tick.state, now, boot.as_ref()) {
            self.record(rebased);
        }
        let deadline = ReleaseBackoff::deadline(&self.tick.state, sha, now, boot.as_ref())?;
        if self.agent.opts.force {
            info!(
                "--force: trying {} again before its backoff ran out",
                sha.short()
            );
            return None;
        }
        Some(deadline)
    }

    /// A failed release waiting out its backoff: no bundle, lease, pull or up of it. The
    /// running release is judged first, as a heartbeat judges it: its drift is healed (subject
    /// to the heal backoff), and the report says what runs, never "running" when nothing does.
    pub(super) fn report_waiting(&mut self, sha: &Sha, deadline: u64) -> Result<Exit, Failure> {
        if let (None, Some(running)) = (
            &self.tick.docker_error,
            self.tick.state.applied_sha().cloned(),
        ) {
            let drift =
                crate::drift::detect(&running, self.tick.state.converged(), &self.tick.facts);
            if !drift.is_empty() {
                info!(
                    "{} waits out its backoff; the running {} drifted",
                    sha.short(),
                    running.short()
                );
                return self.on_drift(&running, drift);
            }
            // What runs is judged as a heartbeat judges it.
            if let Some(withdrawn) = self.heartbeat_look(&running) {
                return withdrawn;
            }
        }
        // A state written before the failure's own detail was kept has only its code's name.
        let failed = self.tick.state.failed();
        let code = failed.and_then(|f| f.code).unwrap_or(Code::Failed);
        // The kept detail is the failure as it was shown (`CODE: names`); its code is the kept
        // code, so only the names are carried over.
        let shown = failed.and_then(|f| f.detail.as_ref().map(ToString::to_string));
        let base = match shown {
            Some(text) => match text.strip_prefix(&format!("{code}: ")) {
                Some(names) => names.to_string(),
                None => text,
            },
            None => "an earlier attempt failed".to_string(),
        };
        let running = match self.tick.state.applied_sha() {
            None => "running nothing".to_string(),
            Some(_) if self.tick.docker_error.is_some() => "what runs is unknown (docker does not \
                                                       answer)"
                .to_string(),
            Some(_) if self.tick.state.containers().is_empty() => "nothing runs".to_string(),
            Some(a) => match super::not_ready(self.tick.state.containers()) {
                bad if bad.is_empty() => format!("running {}", a.short()),
                bad => format!("running {}, not up: {}", a.short(), bad.join(", ")),
            },
        };
        let detail = format!(
            "{base}; next attempt {} (`monky-deployd run --once --force` tries now); {running}",
            crate::clock::rfc3339(deadline)
        );
        info!(
            "{} failed before; waiting until {} (`run --once --force` retries now)",
            sha.short(),
            crate::clock::rfc3339(deadline)
        );
        self.conclude(Outcome::failed(Some(sha), Failure::coded(code, detail)))
    }
}

/// The budget override in words: `web: pids_limit 1024, mem_limit 2147483648; db: ...`.
fn supplied_defaults(override_json: &str) -> Option<String> {
    fn flatten(v: &serde_json::Value, at: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let here = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    flatten(v, &here, out);
                }
            }
            serde_json::Value::String(s) => out.push(format!("{at} {s}")),
            other => out.push(format!("{at} {other}")),
        }
    }
    let v: serde_json::Value = serde_json::from_str(override_json).ok()?;
    let parts: Vec<String> = v
        .get("services")?
        .as_object()?
        .iter()
        .map(|(service, o)| {
            let mut kv = Vec::new();
            flatten(o, "", &mut kv);
            format!("{service}: {}", kv.join(", "))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}
