//! Actions none and down: the heartbeat (drift, or the containers' health) and the retire.

use tracing::{info, warn};

use super::outcome::Outcome;
use super::{Run, not_ready};
use crate::code::Code;
use crate::config::VolumesOnAbsent;
use crate::exit::{Exit, Failure, OrCode as _};
use crate::release;
use crate::state::Fact;

impl Run<'_> {
    /// Action none: drift of the applied release healed, or the containers' health reported.
    pub(super) fn heartbeat(&mut self) -> Result<Exit, Failure> {
        if let (None, Some(sha)) = (
            &self.tick.docker_error,
            self.tick.state.applied_sha().cloned(),
        ) {
            let drift = crate::drift::detect(&sha, self.tick.state.converged(), &self.tick.facts);
            if !drift.is_empty() {
                return self.on_drift(&sha, drift);
            }
            self.adopt_converged(&sha);
            if let Some(withdrawn) = self.heartbeat_look(&sha) {
                return withdrawn;
            }
            // For the hour after a crash loop every tick says it, as `status`, `explain` and
            // the metrics do: one record, one verdict, however healthy the service looks now.
            if let Some(c) = self
                .tick
                .state
                .crash_loop(crate::clock::wall(), crate::clock::boot().as_ref())
                .cloned()
            {
                let failure = crate::verdict::crash_loop(&c);
                warn!("heartbeat: {failure}");
                return self.conclude(Outcome::failed(Some(&sha), failure));
            }
        }
        self.health_report(None)
    }

    /// The heartbeat's report of the containers' health; `note` (a hold) goes beside an
    /// `applied` result and after a failure's detail.
    pub(super) fn health_report(&mut self, note: Option<Failure>) -> Result<Exit, Failure> {
        let bad = not_ready(self.tick.state.containers());
        let missing =
            self.tick.state.containers().is_empty() && self.tick.state.applied_sha().is_some();
        let sha = self.tick.state.applied_sha().cloned();
        let unknown = self.tick.docker_error.clone();
        if unknown.is_none() && bad.is_empty() && !missing {
            info!(
                "heartbeat: {} container(s) healthy",
                self.tick.state.containers().len()
            );
            return self.conclude(match note {
                Some(note) => Outcome::noted(sha.as_ref(), note),
                None => Outcome::applied(sha.as_ref()),
            });
        }
        // Under a hold, containers down or gone are the operator's doing (a restore, a disk
        // swap): said beside the hold, the tick fine; docker not answering is no one's hold.
        if let (None, Some(held)) = (&unknown, &note)
            && held.code == Code::Held
        {
            let why = if missing {
                "no container of the project runs".to_string()
            } else {
                format!("not running and healthy: {}", bad.join(", "))
            };
            let note = Failure::coded(Code::Held, format!("{}; {why}", held.message));
            info!("heartbeat: {note}");
            return self.conclude(Outcome::noted(sha.as_ref(), note));
        }
        let (code, why) = if let Some(e) = unknown {
            (
                Code::DockerUnavailable,
                format!("cannot list the containers: {e}"),
            )
        } else if missing {
            (
                Code::NotRunning,
                "no container of the project is running".to_string(),
            )
        } else {
            (Code::Unhealthy, bad.join(", "))
        };
        let mut failure = Failure::coded(code, why);
        if let Some(note) = note {
            failure.message = format!("{}; {note}", failure.message);
        }
        warn!("heartbeat: {failure}");
        self.conclude(Outcome::failed(sha.as_ref(), failure))
    }

    /// Action down: the project taken down (volumes too when asked and not prod), `current`
    /// removed, reported as down.
    pub(super) fn retire(&mut self, purge_requested: bool) -> Result<Exit, Failure> {
        if let Some(sha) = release::current_sha(&self.agent.layout).or_code(Code::Failed)?
            && release::on_disk(&self.agent.layout, sha.as_str())
        {
            // A release changed on disk could steer `down -v` at volumes it never owned.
            release::verify(&self.agent.layout, &sha).or_code(Code::Failed)?;
        }
        let rel = release::Release::current(&self.agent.layout).or_code(Code::Failed)?;
        // The release `current` names is judged by its own (verified) tier too: a failed prod
        // release left in place (on_failure: leave) is no applied release, and still prod.
        let prod = self.agent.cfg.is_prod(
            self.tick.state.applied_prod().unwrap_or(false)
                || rel.as_ref().is_some_and(|r| r.is_prod()),
        );
        let wanted = purge_requested || self.agent.cfg.volumes_on_absent == VolumesOnAbsent::Purge;
        let volumes = wanted && !prod;
        if wanted && prod {
            warn!("volume purge requested on a prod env: refused, volumes kept");
        }
        if let Some(rel) = rel {
            info!(
                "compose down --remove-orphans{}",
                if volumes { " -v" } else { "" }
            );
            rel.compose(&self.agent.docker, self.agent.cfg)
                .down(volumes)
                .map_err(|e| Failure::coded(Code::ComposeDownFailed, e.cause()))?;
        } else {
            info!("nothing deployed; reporting down");
        }
        let sha = self.tick.state.applied_sha().cloned();
        self.record(Fact::AppliedForgotten);
        release::clear_current(&self.agent.layout).or_code(Code::StateWriteFailed)?;
        self.refresh_containers();
        self.conclude(Outcome::down(sha.as_ref()))
    }
}
