//! Keeping the box converged between applies: drift of the current release healed locally
//! (no tenancy apply, no lease, no OpenBao read), an apply cut short finished or rolled back,
//! and an operator's hold respected.

use std::time::Duration;

use monky_agent_proto::{Action, Sha};
use tracing::{info, warn};

use super::fallback;
use super::outcome::Outcome;
use super::stages::Promoted;
use super::{Run, not_ready};
use crate::backoff::{Backoff, Jitter};
use crate::clock::{BootDeadline, BootInstant};
use crate::code::Code;
use crate::drift::{self, Converged, Drift};
use crate::exit::{Exit, Failure, OrCode as _};
use crate::hold::Hold;
use crate::interrupted::Marker;
use crate::redact::Redacted;
use crate::state::{CrashLoop, Fact};
use crate::{redact, release};

/// The wait after the `attempts`-th heal in a row, healthy or not: one minute doubling up to
/// an hour, spread by up to 10% either way, as a failed release's.
const HEAL: Backoff = Backoff {
    base: Duration::from_secs(60),
    cap: Duration::from_secs(3600),
    jitter: Jitter::Around(0.1),
};

/// Heals within this long of the last one count as one more attempt; past it drift starts
/// over at the first step. The backoff's longest step, so a service that crash-loops slowly
/// still climbs the steps.
const HEAL_MEMORY_SECS: u64 = HEAL.cap.as_secs();

/// The lines of a dead service's own output that the journal and the crash loop keep.
const CRASH_LINES: usize = 5;

impl Run<'_> {
    /// Records what the last healthy `up` of `sha` left (from the listing just taken).
    pub(super) fn record_converged(&mut self, sha: &Sha) {
        self.record(Fact::Converged(Converged::record(sha, &self.tick.facts)));
    }

    /// A heartbeat found no drift: a box without a record of the applied release (one applied
    /// before this agent version, or brought back by a fallback whose listing was partial)
    /// takes what runs now as the record, once all of it is ready.
    pub(super) fn adopt_converged(&mut self, sha: &Sha) {
        let recorded = self.tick.state.converged().is_some_and(|c| c.sha == *sha);
        if !recorded
            && !self.tick.facts.is_empty()
            && not_ready(self.tick.state.containers()).is_empty()
        {
            info!(
                "recording the running containers of {} for drift detection",
                sha.short()
            );
            self.record_converged(sha);
        }
    }

    /// Drift found by a heartbeat: healed, unless healing is off or waits out its backoff.
    /// A container stopped from outside is healed at once: the heal backoff keeps a service
    /// that dies by itself from being started in a loop, and nothing of the release's own
    /// stopped it.
    pub(super) fn on_drift(&mut self, sha: &Sha, drift: Vec<Drift>) -> Result<Exit, Failure> {
        let drift = &self.who_ended(drift);
        let what = drift::describe(drift);
        warn!("drift from {}: {what}", sha.short());
        // While a service loops, its death is the crash loop's, whoever's move the heal is.
        let drift_code = if !drift::crashed(drift).is_empty()
            && self
                .tick
                .state
                .crash_loop(crate::clock::wall(), crate::clock::boot().as_ref())
                .is_some()
        {
            Code::CrashLoop
        } else {
            Code::Drift
        };
        if !self.agent.cfg.self_heal {
            let failure = Failure::coded(
                drift_code,
                format!("{what}; self_heal is off, nothing was changed"),
            );
            return self.conclude(Outcome::failed(Some(sha), failure));
        }
        let now = crate::clock::wall();
        let waits = super::backoff::wait_until(
            &HEAL,
            self.tick.state.next_heal_at(),
            self.tick.state.next_heal_boot(),
            self.tick.state.heal_attempts(),
            now,
            crate::clock::boot().as_ref(),
        );
        if let Some(at) = waits {
            if self.agent.opts.force {
                info!("--force: healing before the heal backoff ran out");
            } else if drift::only_stopped_from_outside(drift) {
                info!("stopped from outside: healing before the heal backoff ran out");
            } else {
                let failure = Failure::coded(
                    drift_code,
                    format!(
                        "{what}; waiting: heal {} ran at {}, the next may run at {}",
                        self.tick.state.heal_attempts(),
                        self.tick
                            .state
                            .last_heal_at()
                            .map_or("-".into(), crate::clock::rfc3339),
                        crate::clock::rfc3339(at)
                    ),
                );
                info!(
                    "the heal of {} waits until {}",
                    sha.short(),
                    crate::clock::rfc3339(at)
                );
                return self.conclude(Outcome::failed(Some(sha), failure));
            }
        }
        self.heal(sha, drift, &what)
    }

    /// Brings the current release up again as it is on disk: verified (sha and `.env`
    /// digest) and judged by the compose policy as before any `up`, compose's leftovers and
    /// containers made by another hand removed first. Every heal, healthy or not, takes a step
    /// of the heal backoff.
    fn heal(&mut self, sha: &Sha, drift: &[Drift], what: &str) -> Result<Exit, Failure> {
        let (now, boot) = (crate::clock::wall(), crate::clock::boot());
        let recent = self
            .tick
            .state
            .heal_within(HEAL_MEMORY_SECS, now, boot.as_ref());
        let attempts = if recent {
            self.tick.state.heal_attempts().saturating_add(1)
        } else {
            1
        };
        // Counted apart: a service's own deaths (two within the hour are a crash loop) and the
        // stops from outside (the box admin's, never a crash).
        let crashed: Vec<Drift> = drift::crashed(drift).into_iter().cloned().collect();
        let stopped_outside = drift.iter().any(
            |d| matches!(d.kind, drift::Kind::Stopped { ender, .. } if ender.is_from_outside()),
        );
        let (crashes, outside_stops) = if recent {
            (
                self.tick.state.heal_crashes(),
                self.tick.state.heal_outside_stops(),
            )
        } else {
            (0, 0)
        };
        let crashes = crashes.saturating_add(u32::from(!crashed.is_empty()));
        let outside_stops = outside_stops.saturating_add(u32::from(stopped_outside));
        // The dead service's own words, read before the up that starts it again.
        let last_lines = crashed.first().and_then(|d| self.last_lines_of(&d.service));
        let wait = HEAL.wait(attempts, rand::random_range(0.0..1.0)).as_secs();
        let next = now.saturating_add(wait);
        self.record(Fact::Healing {
            attempts,
            crashes,
            outside_stops,
            at: now,
            at_boot: boot.as_ref().map(|b| BootDeadline::after(b, 0)),
            next_at: next,
            next_boot: boot.as_ref().map(|b| BootDeadline::after(b, wait)),
        });
        info!("healing {} (heal {attempts}): {what}", sha.short());
        let remove: Vec<String> = drift
            .iter()
            .filter(|d| d.must_be_removed())
            .map(|d| d.container.clone())
            .collect();
        let up = self.bring_up_current(sha, &remove);
        self.refresh_containers();
        let still = drift::detect(sha, self.tick.state.converged(), &self.tick.facts)
            .into_iter()
            // What compose made now is the release's, even where it hashes a service
            // differently from the record (a compose upgraded since the last up).
            .filter(|d| !matches!(d.kind, drift::Kind::Replaced))
            .collect::<Vec<_>>();
        let bad = not_ready(self.tick.state.containers());
        // What went wrong, and whether compose's logs say more.
        let failed = match (&up, bad.is_empty()) {
            // A failure of the heal's own without a code of its own is the heal's.
            (Err(f), _) if f.code == Code::Failed => Some((
                Failure {
                    code: Code::HealFailed,
                    ..f.clone()
                },
                true,
            )),
            (Err(f), _) => Some((f.clone(), true)),
            (Ok(()), false) => Some((
                Failure::coded(
                    Code::HealFailed,
                    format!("not healthy after up: {}", bad.join(", ")),
                ),
                true,
            )),
            (Ok(()), true) if !still.is_empty() => Some((
                Failure::coded(
                    Code::HealFailed,
                    format!("still drifted after up: {}", drift::describe(&still)),
                ),
                false,
            )),
            (Ok(()), true) => None,
        };
        let Some((failure, logs)) = failed else {
            self.record_converged(sha);
            // A service that died by its own exit again within the hour after an earlier heal:
            // brought back, but the box is in a crash loop, not converged, until it stays up.
            if let Some(dead) = crashed.first().filter(|_| crashes >= 2) {
                let record = crash_loop(dead, (now, boot.as_ref()), crashes, last_lines.clone());
                let failure = crate::verdict::crash_loop(&record);
                let failure = Failure::coded(failure.code, format!("{what}; {}", failure.message));
                warn!("{failure}");
                self.record(Fact::CrashLooped(record));
                return self.conclude(Outcome::failed(Some(sha), failure));
            }
            let what = if outside_stops > 0 && stopped_outside {
                format!("{what} ({outside_stops} stop(s) from outside within the hour)")
            } else {
                what.to_string()
            };
            info!("healed {}: {what}", sha.short());
            return self.conclude(Outcome::noted(
                Some(sha),
                Failure::coded(Code::Healed, what),
            ));
        };
        let logs = if logs {
            release::Release::current(&self.agent.layout)
                .ok()
                .flatten()
                .and_then(|rel| {
                    rel.compose(&self.agent.docker, self.agent.cfg)
                        .logs_tail(200)
                        .ok()
                })
                .map(|logs| redact::redact(&logs))
        } else {
            None
        };
        // A service that died by its own exit and is not up again after the heal (it died
        // again at once) is the crash loop's from its second heal within the hour, as one that
        // came up and died later is: the owner does not flip with how fast it dies.
        let looping = failure.code == Code::HealFailed
            && !bad.is_empty()
            && (crashes >= 2 || self.tick.state.crash_loop(now, boot.as_ref()).is_some());
        let code = match crashed.first().filter(|_| looping) {
            Some(dead) => {
                self.record(Fact::CrashLooped(crash_loop(
                    dead,
                    (now, boot.as_ref()),
                    crashes,
                    last_lines.clone(),
                )));
                Code::CrashLoop
            }
            None => failure.code,
        };
        let failure = Failure::coded(
            code,
            format!(
                "{}; drift: {what}; next heal after {}",
                failure.message,
                crate::clock::rfc3339(next)
            ),
        );
        warn!("heal of {} failed: {failure}", sha.short());
        if let Some(logs) = &logs {
            let kept = format!("{failure}\n--- compose logs ---\n{}", logs.as_str());
            self.agent.keep_app_logs(sha, &kept, logs.as_str());
        }
        let mut outcome = Outcome::failed(Some(sha), failure);
        outcome.compose_logs = logs.as_ref();
        self.conclude(outcome)
    }

    /// `drift` with who ended each stopped container's run, by the engine's record of the
    /// container within the heal memory and `State.OOMKilled` ([`drift::Ender::of_record`]):
    /// a `docker stop` of a service that exits 0 on SIGTERM is no crash.
    fn who_ended(&self, mut drift: Vec<Drift>) -> Vec<Drift> {
        let since = crate::clock::wall().saturating_sub(HEAL_MEMORY_SECS);
        let engine = self.agent.docker.engine();
        for d in &mut drift {
            let drift::Kind::Stopped {
                ender, exit_code, ..
            } = &mut d.kind
            else {
                continue;
            };
            let oom = engine
                .inspect(&d.container)
                .is_ok_and(|detail| detail.oom_killed);
            let id = self
                .tick
                .facts
                .iter()
                .find(|f| f.container.name == d.container)
                .map(|f| f.id.clone())
                .unwrap_or_default();
            let events = engine
                .container_events(&id, since)
                .inspect_err(|e| {
                    tracing::debug!("no engine record of {} ({e})", d.container);
                })
                .ok();
            *ender = drift::Ender::of_record(events.as_deref(), *exit_code, oom);
        }
        drift
    }

    /// The last lines `service` of the current release wrote (redacted), said in the journal:
    /// why a service that died by itself exited is in its own words.
    fn last_lines_of(&self, service: &str) -> Option<Redacted> {
        let rel = release::Release::current(&self.agent.layout)
            .ok()
            .flatten()?;
        let logs = rel
            .compose(&self.agent.docker, self.agent.cfg)
            .service_logs_tail(service, CRASH_LINES)
            .inspect_err(|e| warn!("cannot read the logs of {service}: {e}"))
            .ok()?;
        let lines: Vec<&str> = logs
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let lines = redact::redact(&lines[lines.len().saturating_sub(CRASH_LINES)..].join(" | "));
        if !lines.as_str().is_empty() {
            warn!(
                "{service}'s last lines before it exited: {}",
                lines.as_str()
            );
        }
        Some(lines)
    }

    /// `current` must name `sha`, which must verify and pass the policy; then the named
    /// containers go and compose brings the release up, waiting for health.
    fn bring_up_current(&mut self, sha: &Sha, remove: &[String]) -> Result<(), Failure> {
        let current = release::current_sha(&self.agent.layout).or_code(Code::HealFailed)?;
        if current.as_ref() != Some(sha) {
            return Err(Failure::coded(
                Code::HealFailed,
                format!(
                    "current names {}, not the applied {}: nothing is started from it",
                    current.as_ref().map_or("-", Sha::short),
                    sha.short()
                ),
            ));
        }
        release::verify(&self.agent.layout, sha).or_code(Code::HealFailed)?;
        let rel = release::Release::current(&self.agent.layout)
            .or_code(Code::HealFailed)?
            .ok_or_else(|| {
                Failure::coded(Code::HealFailed, "the current release has no compose file")
            })?;
        self.agent.policy_gate(&self.tick.judged, &rel)?;
        if !remove.is_empty() {
            info!("removing before up: {}", remove.join(", "));
            self.agent
                .docker
                .remove_containers(remove)
                .map_err(|e| Failure::coded(Code::HealFailed, e.cause()))?;
        }
        info!("compose up -d --remove-orphans");
        // Nothing falls back after a heal: the whole of what is left of the tick may go to it.
        match rel
            .compose(&self.agent.docker, self.agent.cfg)
            .up(Some(self.agent.start_budget(false)))
        {
            // The containers that are not ready are the heal's verdict, named from the
            // listing taken after it.
            Err(e) if e.kind() == monky_compose::ErrorKind::Unhealthy => Ok(()),
            other => other.map_err(|e| Failure::coded(Code::HealFailed, e.cause())),
        }
    }

    /// A held box: the heartbeat's health report with the hold beside it, whatever tenancy
    /// asked; nothing is applied, healed or retired.
    pub(super) fn held(&mut self, hold: &Hold, action: &Action) -> Result<Exit, Failure> {
        let mut note = hold.note();
        match action {
            Action::Apply { sha, .. } => {
                note.message
                    .push_str(&format!("; tenancy's apply of {} waits", sha.short()));
            }
            Action::Down { .. } => note.message.push_str("; tenancy's retire waits"),
            Action::None { .. } => {}
        }
        if let Some(m) = crate::interrupted::peek(&self.agent.layout) {
            note.message.push_str(&format!(
                "; the interrupted apply of {} waits",
                m.sha.as_ref().map_or("-", Sha::short)
            ));
        }
        info!("{note}");
        self.health_report(Some(note))
    }

    /// An apply that a crash cut short: compose's leftovers go first, then the release is
    /// finished when tenancy still wants it and it verifies on disk (no bundle, lease or
    /// OpenBao read: its `.env` is there), or `current` is rolled back to the applied release
    /// when tenancy wants that one; for any other action the mark is dropped and the action
    /// goes on. `Some` when this concluded the tick.
    pub(super) fn recover_interrupted(&mut self, action: &Action) -> Result<Option<Exit>, Failure> {
        let Some(m) = crate::interrupted::load(&self.agent.layout).or_code(Code::Failed)? else {
            return Ok(None);
        };
        self.tick.marker_settled = true;
        // A mark that does not parse names no release, yet still says an apply was cut short.
        let marked = m.sha.as_ref();
        warn!(
            "{}",
            Failure::coded(
                Code::ApplyInterrupted,
                format!(
                    "the apply of {} started {} did not finish",
                    marked.map_or("-", Sha::short),
                    crate::clock::rfc3339(m.started_at)
                )
            )
        );
        self.clear_leftovers()?;
        let exit = match action {
            Action::Apply { sha, .. } if marked == Some(sha) => self
                .finish_interrupted(&m, sha)
                .inspect_err(|e| self.conclude_error(Some(sha), e))?,
            Action::None { .. } => self.roll_back_interrupted(marked, &m)?,
            _ => {
                info!("tenancy now asks for something else; the interrupted apply is dropped");
                None
            }
        };
        Ok(exit)
    }

    /// Removes the project's containers that were created and never started: what a killed
    /// `compose up` leaves, and what makes the next `up` fail on a name conflict.
    fn clear_leftovers(&mut self) -> Result<(), Failure> {
        let leftovers: Vec<String> = self
            .tick
            .facts
            .iter()
            .filter(|f| f.container.state == "created")
            .map(|f| f.container.name.clone())
            .collect();
        if leftovers.is_empty() {
            return Ok(());
        }
        info!("removing compose's leftovers: {}", leftovers.join(", "));
        self.agent
            .docker
            .remove_containers(&leftovers)
            .map_err(|e| Failure::coded(Code::ComposeUpFailed, e.cause()))?;
        self.refresh_containers();
        Ok(())
    }

    /// Finishes the interrupted apply of the sha `m` names from its release on disk; `None` when that
    /// release is not there whole (the crash came before it was), so the tick's apply goes on
    /// as any other.
    fn finish_interrupted(&mut self, m: &Marker, sha: &Sha) -> Result<Option<Exit>, Failure> {
        if !release::on_disk(&self.agent.layout, sha.as_str()) {
            info!("{} never reached releases/; applying it anew", sha.short());
            return Ok(None);
        }
        if let Err(e) = release::verify(&self.agent.layout, sha) {
            warn!("the release of the interrupted apply does not verify ({e:#}); applying it anew");
            return Ok(None);
        }
        let promoted = Promoted::resumed(
            release::point_current(&self.agent.layout, sha, &|r| {
                self.agent.policy_gate(&self.tick.judged, r)
            })
            .or_code(Code::Failed)?,
        );
        info!("finishing the interrupted apply of {}", sha.short());
        let (seen, up) = fallback::up_healthy(&self.agent, &self.tick.state, &promoted);
        self.saw(seen);
        if let Err(stop) = up {
            return Err(self.recover(sha, stop));
        }
        self.record(Fact::Applied {
            sha: sha.clone(),
            prod: promoted.bundle_prod(),
        });
        self.record_converged(sha);
        self.record(Fact::FailureForgotten);
        let note = Failure::coded(
            Code::ApplyInterrupted,
            format!(
                "finished the apply of {} cut short at {}",
                sha.short(),
                crate::clock::rfc3339(m.started_at)
            ),
        );
        self.conclude(Outcome::noted(Some(sha), note)).map(Some)
    }

    /// Tenancy wants the applied release, not the interrupted one: `current` goes back to it
    /// and it is brought up again. `None` when `current` still names it (the crash came before
    /// the swap): the heartbeat goes on, and heals what the crash left.
    fn roll_back_interrupted(
        &mut self,
        marked: Option<&Sha>,
        m: &Marker,
    ) -> Result<Option<Exit>, Failure> {
        let Some(applied) = self.tick.state.applied_sha().cloned() else {
            return Ok(None);
        };
        if release::current_sha(&self.agent.layout)
            .or_code(Code::Failed)?
            .as_ref()
            == Some(&applied)
        {
            return Ok(None);
        }
        let note = self.revert_to(&applied);
        let what = format!(
            "rolled back the apply of {} cut short at {}: {note}",
            marked.map_or("-", Sha::short),
            crate::clock::rfc3339(m.started_at)
        );
        let sha = self.tick.state.applied_sha().cloned();
        let outcome = match &sha {
            Some(sha) => Outcome::noted(Some(sha), Failure::coded(Code::ApplyInterrupted, what)),
            // The release rolled back to did not come up healthy: a failure, under its code.
            None => Outcome::failed(Some(&applied), Failure::coded(Code::Unhealthy, what)),
        };
        self.conclude(outcome).map(Some)
    }
}

/// The crash loop's record: `dead`, the service that died by its own exit, healed at `now`
/// (wall, boot) for the `heals`-th time within the hour, with its own last lines.
fn crash_loop(
    dead: &Drift,
    now: (u64, Option<&BootInstant>),
    heals: u32,
    last_lines: Option<Redacted>,
) -> CrashLoop {
    CrashLoop {
        at: now.0,
        at_boot: now.1.map(|b| BootDeadline::after(b, 0)),
        heals,
        service: dead.service.clone(),
        exit_code: match dead.kind {
            drift::Kind::Stopped { exit_code, .. } => exit_code,
            _ => None,
        },
        last_lines,
    }
}
