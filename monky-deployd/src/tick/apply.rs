//! Apply: the desired release's steps from fetch to report, as docs/architecture.md's "What a
//! tick does" numbers them, each a stage of `stages.rs`; and a failed sha's wait.

use std::collections::BTreeMap;

use monky_agent_proto::Sha;
use secrecy::SecretString;
use tracing::{info, warn};

use super::Agent;
use super::Outcome;
use super::backoff::Backoff;
use super::stages::{Fetched, Promoted};
use crate::code::{Code, CodePolicy as _};
use crate::exit::{Exit, Failure};
use crate::release;

impl Agent<'_> {
    /// Applies the desired release, step by step. A refusal or failure returns early; the
    /// steps after it never run.
    pub(super) fn apply(&mut self, sha: &Sha, url: &str) -> anyhow::Result<Exit> {
        // 1-2. Fetch the bundle and verify it hashes to the desired sha.
        let (fetched, raw) = self.fetch(sha, url)?;
        self.apply_fetched(fetched)
            .inspect_err(|e| self.keep_bad_bundle(sha, &raw, e))
    }

    fn apply_fetched(&mut self, fetched: Fetched) -> anyhow::Result<Exit> {
        // 3. Refuse what the bundle alone shows is wrong, before any lease or secret read.
        let checked = self.check(fetched)?;
        // 4-9. Lease a grant, log in with it, read the secrets; render `.env`; stage the
        // release; check compose's model of it against the policy.
        let staged = self.stage(checked)?;
        // 10. Pull from the staging dir.
        let pulled = self.pull(staged)?;
        // 11. Promote: `current` names the new release, checked again on disk.
        let promoted = self.promote(pulled)?;
        // 12-13. Up, and wait for health; a failure falls back.
        let prod = self.cfg.is_prod(promoted.bundle_prod());
        self.up_healthy(promoted.release(), promoted.sha(), prod)?;
        // 14. Report.
        self.applied(&promoted)
    }

    /// Step 14: the release is up and healthy: state and tenancy hear so, and older releases
    /// go.
    fn applied(&mut self, promoted: &Promoted) -> anyhow::Result<Exit> {
        let sha = promoted.sha();
        self.state.mark_applied(sha, promoted.bundle_prod());
        self.record_converged(sha);
        // From now on the release is this agent's own.
        self.state.own_release();
        self.state.clear_failed();
        info!(
            "applied {} ({} container(s) healthy)",
            sha.short(),
            self.state.containers().len()
        );
        // What the box gave the services that left it open, in the journal and so in the
        // report's log tail: the bundle's author sees the limits the app runs under.
        if let Some(supplied) = promoted
            .release()
            .compose_yaml()
            .ok()
            .and_then(|yaml| self.cfg.budget.budget_override_for(&yaml))
            .and_then(|text| supplied_defaults(&text))
        {
            info!("supplied the box's defaults: {supplied}");
        }
        self.conclude(Outcome::applied(Some(sha.as_str())))?;
        // After every successful apply, not only with `--prune`: a tenancy that sends a new sha
        // every tick must not fill the disk. `current` (this sha, the last good one) stays.
        release::prune(&self.layout, self.cfg.keep_releases, &[sha.as_str()]);
        if self.opts.prune
            && let Err(e) = self.docker.image_prune()
        {
            warn!("image prune failed: {e}");
        }
        Ok(Exit::Ok)
    }

    /// A bundle the bundle author must fix is kept on the box, so the advice to run
    /// `bundle check` on it can be followed.
    pub(super) fn keep_bad_bundle(&self, sha: &Sha, raw: &[u8], e: &anyhow::Error) {
        if Failure::code_of(e).map(Code::owner) != Some(crate::code::Owner::BundleAuthor) {
            return;
        }
        match crate::evidence::keep_bundle(&self.layout, sha.as_str(), raw) {
            Ok(Some(path)) => info!(
                "kept the bundle as {}: `monky-deployd bundle check {} --env {}`",
                path.display(),
                path.display(),
                self.cfg.env_id
            ),
            Ok(None) => {}
            Err(e) => warn!("cannot keep the failed bundle: {e:#}"),
        }
    }

    /// The first apply over a release the original agent wrote: names every variable whose
    /// value the app received differently through the original's `.env`, in the journal (and so
    /// the report's `log_tail`) and in state for `explain`. The apply goes on: the value now
    /// written is the secret itself.
    pub(super) fn note_quoting_changes(&mut self, values: &BTreeMap<String, SecretString>) {
        let names = crate::statefile::handed_differently(values);
        if !names.is_empty() {
            warn!(
                "{}: {}: the original agent's .env handed these to the app \
                 differently ($ expansion, quotes, ' #' or blanks); they now reach it exactly, \
                 so an app initialised with the old form needs its stored value updated",
                Code::EnvQuotingChanged,
                names.join(", ")
            );
        }
        self.state.found_quoting_changed(names);
    }

    /// When the desired sha failed before and its backoff has not run out, the deadline.
    pub(super) fn backoff_deadline(&mut self, sha: &Sha) -> Option<u64> {
        let (now, boot) = (crate::clock::wall(), crate::clock::boot());
        Backoff::rebase(&mut self.state, now, boot.as_ref());
        let deadline = Backoff::deadline(&self.state, sha, now, boot.as_ref())?;
        if self.opts.force {
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
    pub(super) fn report_waiting(&mut self, sha: &Sha, deadline: u64) -> anyhow::Result<Exit> {
        if let (None, Some(running)) = (&self.docker_error, self.state.applied_sha().cloned()) {
            let drift = crate::drift::detect(&running, self.state.converged(), &self.facts);
            if !drift.is_empty() {
                info!(
                    "{} waits out its backoff; the running {} drifted",
                    sha.short(),
                    running.short()
                );
                return self.on_drift(&running, &drift);
            }
        }
        // A state written before the failure's own detail was kept has only its code's name.
        let failed = self.state.failed();
        let code = failed.and_then(|f| f.code).unwrap_or(Code::Failed);
        let base = failed
            .and_then(|f| f.detail.as_ref().map(ToString::to_string))
            .unwrap_or_else(|| format!("{code}: an earlier attempt failed"));
        let running = match self.state.applied_sha() {
            None => "running nothing".to_string(),
            Some(_) if self.docker_error.is_some() => "what runs is unknown (docker does not \
                                                       answer)"
                .to_string(),
            Some(_) if self.state.containers().is_empty() => "nothing runs".to_string(),
            Some(a) => match super::not_ready(self.state.containers()) {
                bad if bad.is_empty() => format!("running {}", a.short()),
                bad => format!("running {}, not up: {}", a.short(), bad.join(", ")),
            },
        };
        let detail = format!(
            "{base}; next attempt {}; {running}",
            crate::clock::rfc3339(deadline)
        );
        info!(
            "{} failed before; waiting until {} (`run --once --force` retries now)",
            sha.short(),
            crate::clock::rfc3339(deadline)
        );
        self.conclude(Outcome::failed(Some(sha.as_str()), code, detail))
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
