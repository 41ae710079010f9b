//! Apply: the desired release's steps from fetch to report, the failed-release backoff and the
//! fallback to the last healthy release.

use std::collections::BTreeMap;

use anyhow::Context;
use monky_bao_client as bao;
use monky_bundle as bundle;
use secrecy::{ExposeSecret, SecretString};
use tracing::{info, warn};

use super::Outcome;
use super::backoff::Backoff;
use super::{Agent, not_ready, short};
use crate::code::{Code, CodePolicy as _};
use crate::exit::{Exit, Failure};
use crate::state;
use crate::{failpoint, fsx, peers, redact, refusals, release};

impl Agent<'_> {
    /// Applies the desired release, step by step as docs/architecture.md's "What a tick does"
    /// lists them. A refusal or failure returns early; the steps after it never run.
    pub(super) fn apply(&mut self, sha: &str, url: &str) -> anyhow::Result<Exit> {
        // 1-2. Fetch the bundle and verify it hashes to the desired sha.
        let (b, raw) = self.fetch(sha, url)?;
        self.apply_bundle(sha, b)
            .inspect_err(|e| self.keep_bad_bundle(sha, &raw, e))
    }

    /// A bundle the bundle author must fix is kept on the box, so the advice to run
    /// `bundle check` on it can be followed.
    fn keep_bad_bundle(&self, sha: &str, raw: &[u8], e: &anyhow::Error) {
        if Failure::code_of(e).map(Code::owner) != Some(crate::code::Owner::BundleAuthor) {
            return;
        }
        match crate::evidence::keep_bundle(self.cfg, sha, raw) {
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

    fn apply_bundle(&mut self, sha: &str, b: bundle::Bundle) -> anyhow::Result<Exit> {
        // Recorded before the disk check, so `doctor` measures the desired bundle's need even
        // when the check refuses it.
        self.state.last_disk_need_bytes = b.meta().disk_need_bytes;
        // 3. Refuse what the bundle alone shows is wrong, before any lease or secret read.
        let paths = self.refusal_checks(&b, sha)?;
        // 4-6. Lease a grant, log in with it, read the secrets.
        let values = self.read_secrets(&b, &paths)?;
        if self.state.original_release.is_some() {
            self.note_quoting_changes(&values);
        }
        // 7. Render `.env`. A value that cannot be written where the template puts it fails
        // here, before staging, and waits out the backoff: the pinned versions make it fail the
        // same way next time.
        let env_text = bundle::render_env(b.env_template(), &values)
            .map_err(|r| self.release_failed(sha, Code::of_refusal(r.code), &r, None))?;
        drop(values);
        // 8. Stage the release.
        let staged = release::stage(self.cfg, &b, &env_text)?;
        failpoint::hit("after-staging");
        // 9. Check compose's model: the authority, since a value from a secret is only visible
        // there. A refusal here waits out the backoff as a render failure does: with the same
        // pinned versions the next tick would read the secrets only to be refused again.
        if let Err(e) = self.policy_gate(&staged) {
            return Err(match Failure::code_of(&e) {
                Some(code) if Exit::of(&e) == Exit::Fail => {
                    self.release_failed(sha, code, &Failure::detail_of(&e).1, None)
                }
                _ => e,
            });
        }
        // 10. Pull from the staging dir: a registry refusal leaves `current` naming the release
        // that is still running.
        info!("compose pull");
        if let Err(e) = staged.compose(&self.docker, self.cfg).pull() {
            // A tag never pushed is the bundle's, not the registry's: no credential fixes it.
            let code = if e.is_missing_image() {
                Code::ImageNotFound
            } else {
                Code::ComposePullFailed
            };
            return Err(self.release_failed(sha, code, &e, None));
        }
        // 11. Promote: `current` names the new release, checked again on disk. From here to
        // the saved outcome the box changes: a mark says so to a tick that finds this one cut
        // short, and this tick's `finish` removes it once the outcome is saved.
        crate::interrupted::write(
            self.cfg,
            &crate::interrupted::Marker {
                sha: sha.to_string(),
                previous: self.state.applied_sha.clone(),
                started_at: state::now(),
            },
        )?;
        self.marker_settled = true;
        let rel = release::promote(self.cfg, staged, sha, &|r| self.policy_gate(r))?;
        failpoint::hit("after-swap");
        release::verify(self.cfg, sha)?;
        // 12-13. Up, and wait for health; a failure falls back.
        self.up_healthy(&rel, sha, self.cfg.is_prod(b.meta().is_prod()))?;
        // 14. Report.
        self.state.mark_applied(sha, b.meta().is_prod());
        self.record_converged(sha);
        // From now on the release is this agent's own.
        self.state.original_release = None;
        self.state.clear_failed();
        info!(
            "applied {} ({} container(s) healthy)",
            short(Some(sha)),
            self.state.containers.len()
        );
        self.conclude(Outcome::applied(Some(sha)))?;
        // After every successful apply, not only with `--prune`: a tenancy that sends a new sha
        // every tick must not fill the disk. `current` (this sha, the last good one) stays.
        release::prune(self.cfg, self.cfg.keep_releases, &[sha]);
        if self.opts.prune
            && let Err(e) = self.docker.image_prune()
        {
            warn!("image prune failed: {e}");
        }
        Ok(Exit::Ok)
    }

    /// Steps 1-2: the bundle from tenancy, parsed within the limits and proven to be `sha`.
    fn fetch(&self, sha: &str, url: &str) -> anyhow::Result<(bundle::Bundle, Vec<u8>)> {
        let dl = self
            .tenancy
            .bundle(&self.bearer()?, url)
            .map_err(|e| peers::tenancy_failure("bundle", e))?;
        let b = bundle::Bundle::parse(&dl.bytes, &bundle::Limits::default())
            .map_err(bundle_error)
            .inspect_err(|e| self.keep_bad_bundle(sha, &dl.bytes, e))?;
        b.check_sha(sha).map_err(refusal)?;
        if let Some(h) = dl.header_sha.as_deref().filter(|h| *h != b.sha()) {
            warn!(
                "bundle header sha {} disagrees with its content {}",
                short(Some(h)),
                short(Some(b.sha()))
            );
        }
        failpoint::hit("after-fetch");
        Ok((b, dl.bytes))
    }

    /// Steps 4-6: the token for reading (a lease, unless a valid one is held), then every
    /// manifest entry's value; the registry credential goes to the agent's docker config.
    /// Names are logged, values never.
    fn read_secrets(
        &mut self,
        b: &bundle::Bundle,
        paths: &[bao::KvPath],
    ) -> anyhow::Result<BTreeMap<String, SecretString>> {
        let manifest = b.manifest();
        let mut values: BTreeMap<String, SecretString> = BTreeMap::new();
        if manifest.entries.is_empty() {
            return Ok(values);
        }
        self.token_for_apply()?;
        let token = self.token.as_ref().context("no token")?;
        for (entry, path) in manifest.entries.iter().zip(paths) {
            let v = self
                .bao()?
                .read_kv(token, path, entry.version)
                .map_err(|e| peers::bao_failure(&format!("read {}", entry.var), e))?;
            redact::register(v.expose_secret());
            if entry.is_registry_auth() {
                self.write_registry_auth(&v);
            } else {
                values.insert(entry.var.clone(), v);
            }
        }
        info!(
            "read {} secret(s): {}",
            values.len(),
            values.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        Ok(values)
    }

    /// Steps 12-13: `compose up` and the health wait. A release that does not come up healthy
    /// starts the backoff and falls back; its failure carries the compose logs to the report.
    pub(super) fn up_healthy(
        &mut self,
        rel: &release::Release,
        sha: &str,
        prod: bool,
    ) -> anyhow::Result<()> {
        let project = rel.compose(&self.docker, self.cfg);
        info!("compose up -d --remove-orphans");
        failpoint::hit("before-up");
        let up = project.up(Some(self.cfg.healthy_timeout));
        failpoint::hit("after-up");
        self.refresh_containers();
        let bad = not_ready(&self.state.containers);
        if up.is_ok() && bad.is_empty() {
            return Ok(());
        }
        let logs = project.logs_tail(200).unwrap_or_else(|e| {
            warn!("cannot read the compose logs: {e}");
            String::new()
        });
        let looked: Vec<Looked> = self
            .state
            .containers
            .iter()
            .filter(|c| !monky_compose::Container::ready(&c.state, c.health.as_deref()))
            .map(|c| Looked {
                name: c.name.clone(),
                state: c.state.clone(),
                health: c.health.clone(),
                detail: self.docker.engine().inspect(&c.name).unwrap_or_default(),
            })
            .collect();
        let (code, why) = diagnose(up.as_ref().err(), &looked);
        warn!(
            "apply of {} failed: {code}: {}",
            short(Some(sha)),
            redact::redact(&why)
        );
        // Kept before the fallback: `compose up` of the previous release replaces these
        // containers, and their logs with them.
        let kept = format!(
            "{code}: {why}\n{}--- compose logs ---\n{logs}",
            looked.iter().map(Looked::evidence).collect::<String>()
        );
        match crate::evidence::keep_logs(self.cfg, sha, &kept) {
            Ok(path) => info!(
                "kept the failed release's logs in {}: `monky-deployd logs {}`",
                path.display(),
                short(Some(sha))
            ),
            Err(e) => warn!("cannot keep the failed release's logs: {e:#}"),
        }
        let last: Vec<&str> = logs.lines().rev().take(5).collect();
        if !last.is_empty() {
            warn!(
                "last compose log lines: {}",
                redact::redact(&last.into_iter().rev().collect::<Vec<_>>().join(" | "))
            );
        }
        let started = Started {
            prod,
            compose_logs: &logs,
        };
        Err(self.release_failed(sha, code, &why, Some(started)))
    }

    /// The first apply over a release the original agent wrote: names every variable whose
    /// value the app received differently through the original's `.env`, in the journal (and so
    /// the report's `log_tail`) and in state for `explain`. The apply goes on: the value now
    /// written is the secret itself.
    pub(super) fn note_quoting_changes(&mut self, values: &BTreeMap<String, SecretString>) {
        let names = crate::takeover::handed_differently(values);
        if !names.is_empty() {
            warn!(
                "{}: {}: the original agent's .env handed these to the app \
                 differently ($ expansion, quotes, ' #' or blanks); they now reach it exactly, \
                 so an app initialised with the old form needs its stored value updated",
                Code::EnvQuotingChanged,
                names.join(", ")
            );
        }
        self.state.quoting_changed = names;
    }

    /// When the desired sha failed before and its backoff has not run out, the deadline.
    pub(super) fn backoff_deadline(&mut self, sha: &str) -> Option<u64> {
        let (now, boot) = (state::now(), crate::clock::boot());
        Backoff::rebase(&mut self.state, now, boot.as_ref());
        let deadline = Backoff::deadline(&self.state, sha, now, boot.as_ref())?;
        if self.opts.force {
            info!(
                "--force: trying {} again before its backoff ran out",
                short(Some(sha))
            );
            return None;
        }
        Some(deadline)
    }

    /// A failed release waiting out its backoff: report, but no bundle, lease, pull or up.
    pub(super) fn report_waiting(&mut self, sha: &str, deadline: u64) -> anyhow::Result<Exit> {
        // A state written before the failure's own detail was kept has only its code's name.
        let code = self.state.failed_code.unwrap_or(Code::Failed);
        let base = self
            .state
            .failed_detail
            .clone()
            .unwrap_or_else(|| format!("{code}: an earlier attempt failed"));
        let running = self.state.applied_sha.clone();
        let detail = format!(
            "{base}; next attempt {}; running {}",
            crate::status::rfc3339(deadline),
            running.as_deref().map_or("nothing", |s| short(Some(s)))
        );
        info!(
            "{} failed before; waiting until {} (`run --once --force` retries now)",
            short(Some(sha)),
            crate::status::rfc3339(deadline)
        );
        self.conclude(Outcome::failed(Some(sha), code, detail))
    }

    /// A release that failed at render, model, pull, up or health: schedules the next attempt
    /// (1 min, 2, 4, ... up to 1 h, jittered) and, when it had `started`, falls back to the last
    /// healthy release. Returns the failure, whose message ends with what happened to the
    /// running release and when the next attempt is.
    pub(super) fn release_failed(
        &mut self,
        sha: &str,
        code: Code,
        why: &dyn std::fmt::Display,
        started: Option<Started<'_>>,
    ) -> anyhow::Error {
        // `CODE: names`, repeated by the reports sent while the sha waits.
        let detail = Failure::coded(code, why.to_string()).to_string();
        let backoff = Backoff::after_failure(
            &self.state,
            sha,
            state::now(),
            crate::clock::boot().as_ref(),
            rand::random_range(0.0..1.0),
        );
        let next = backoff.next_attempt_at;
        backoff.record(&mut self.state, sha, code, redact::redact(&detail));
        let previous = self.state.applied_sha.clone().filter(|p| p != sha);
        let note = match (previous, started) {
            // Nothing of it started (its `.env` or its pull failed): nothing changed on the
            // engine or on disk, so nothing falls back, prod or not.
            (Some(prev), None) => format!("running {}", short(Some(&prev))),
            (None, None) => "nothing running".to_string(),
            (None, Some(_)) => {
                self.state.forget_applied();
                "no earlier healthy release to fall back to".to_string()
            }
            (Some(_), Some(Started { prod, .. }))
                if self.cfg.on_failure(prod) == crate::config::OnFailure::Leave =>
            {
                self.state.forget_applied();
                format!("left {} in place (on_failure: leave)", short(Some(sha)))
            }
            (Some(prev), Some(_)) => self.revert_to(&prev),
        };
        let failure = Failure::coded(
            code,
            format!(
                "{why}; {note}; next attempt {}",
                crate::status::rfc3339(next)
            ),
        );
        match started {
            Some(Started { compose_logs, .. }) => failure.with_compose_logs(compose_logs).into(),
            None => failure.into(),
        }
    }

    /// Points `current` back at `prev` and brings it up again; volumes are not touched.
    pub(super) fn revert_to(&mut self, prev: &str) -> String {
        if let Err(e) = release::verify(self.cfg, prev) {
            // Nothing is started from a release that changed on disk; what runs stays.
            self.state.forget_applied();
            warn!(
                "fallback to {} refused: {}",
                short(Some(prev)),
                redact::redact(&format!("{e:#}"))
            );
            let code = Failure::code_of(&e).unwrap_or(Code::Failed);
            return format!("fallback to {} refused ({code})", short(Some(prev)));
        }
        let result =
            release::point_current(self.cfg, prev, &|r| self.policy_gate(r)).and_then(|rel| {
                info!("falling back to {}", short(Some(prev)));
                rel.compose(&self.docker, self.cfg)
                    .up(Some(self.cfg.healthy_timeout))
                    .map_err(anyhow::Error::new)
            });
        self.refresh_containers();
        match result {
            Ok(()) if not_ready(&self.state.containers).is_empty() => {
                self.record_converged(prev);
                format!("reverted to {}", short(Some(prev)))
            }
            Ok(()) => {
                self.state.forget_applied();
                format!(
                    "reverted to {}, which is not healthy either",
                    short(Some(prev))
                )
            }
            Err(e) => {
                self.state.forget_applied();
                warn!("fallback to {} failed: {e:#}", short(Some(prev)));
                match Failure::code_of(&e) {
                    Some(code) => format!("fallback to {} refused ({code})", short(Some(prev))),
                    None => format!("fallback to {} failed", short(Some(prev))),
                }
            }
        }
    }

    /// The compose policy on compose's model of `rel`, before compose pulls or starts it: the
    /// staged release, a retried one updated in place before `current` names it, and a release
    /// fallen back to, whose files may have changed on disk since it was checked.
    pub(super) fn policy_gate(&self, rel: &release::Release) -> anyhow::Result<()> {
        // The override is written before the model is built, so the model carries the pids
        // limit the agent supplies, and compose's model must show one for every service.
        rel.write_budget_override(self.cfg)?;
        let policy = self
            .cfg
            .compose_policy(rel.allow_privileged())
            .pids_supplied(true);
        let raw = rel.compose_yaml()?;
        let refused = refusals::model(
            &policy,
            &rel.compose(&self.docker, self.cfg),
            &raw,
            rel.dir(),
        )?;
        match refusals::all(refused) {
            Some(f) => Err(f.into()),
            None => Ok(()),
        }
    }

    /// Every refusal an apply can meet before any lease or secret read; returns the KV paths.
    pub(super) fn refusal_checks(
        &self,
        b: &bundle::Bundle,
        sha: &str,
    ) -> anyhow::Result<Vec<bao::KvPath>> {
        let (paths, refused) = refusals::offline(
            b,
            &self.cfg.env_id,
            &self.kv_mount(),
            &self.cfg.compose_policy(false),
        );
        if let Some(f) = refusals::all(refused) {
            return Err(f.into());
        }
        bundle::check_rollback(sha, &self.state.applied_history, b.meta().allow_rollback)
            .map_err(refusal)?;
        // The byte cap of releases/ and staging/, before anything is leased or staged; the
        // running release, the last good one and a sha waiting out its backoff are never pruned
        // for room.
        let need = b
            .files()
            .values()
            .map(|bytes| bytes.len() as u64)
            .sum::<u64>()
            .saturating_add(ENV_ALLOWANCE);
        let protect: Vec<&str> = [
            Some(sha),
            self.state.applied_sha.as_deref(),
            self.state.failed_sha.as_deref(),
        ]
        .into_iter()
        .flatten()
        .collect();
        release::make_room(self.cfg, need, &protect)?;
        match self.docker.free_bytes() {
            Ok(free) => bundle::check_disk(
                free,
                b.meta().disk_need_bytes.unwrap_or(0),
                self.cfg.disk_factor,
                self.cfg.disk_headroom_bytes,
            )
            .map_err(refusal)?,
            Err(e) => {
                warn!("cannot read the docker data root's free space ({e}); disk check skipped")
            }
        }
        Ok(paths)
    }

    pub(super) fn write_registry_auth(&self, value: &SecretString) {
        let result = bundle::RegistryAuth::parse(value, Some(&self.cfg.registry_host))
            .map_err(anyhow::Error::new)
            .and_then(|auth| {
                redact::register_basic_auth(auth.username(), auth.password().expose_secret());
                let json = auth.docker_config_json();
                redact::register(json.expose_secret());
                fsx::Dir::state_root(&self.cfg.state_dir)?
                    .ensure_sub("docker", 0o700)?
                    .write_atomic("config.json", json.expose_secret().as_bytes(), 0o600)?;
                Ok(auth.registry().to_string())
            });
        match result {
            Ok(registry) => info!("registry credential in place for {registry}"),
            Err(e) => warn!("registry credential unusable ({e:#}); private images will not pull"),
        }
    }
}

/// What a release's `.env` is counted as before its values are read: a few hundred secrets of
/// a few hundred bytes.
const ENV_ALLOWANCE: u64 = 256 * 1024;
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

fn refusal(r: bundle::Refusal) -> anyhow::Error {
    Failure::from(&r).into()
}

fn bundle_error(e: bundle::Error) -> anyhow::Error {
    Failure::from(&e).into()
}

/// A failed release that had started: its tier (for `on_failure`) and the tail of its compose
/// logs (for the report).
#[derive(Debug, Clone, Copy)]
pub(super) struct Started<'a> {
    prod: bool,
    compose_logs: &'a str,
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
