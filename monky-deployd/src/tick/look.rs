//! Step 13a and every heartbeat: the look at what runs ([`crate::runtime_look`]). A release
//! whose processes show a secret to another account of the box (a uid a host account has, an
//! argument) is stopped and fallen back from, as a release that did not come up healthy.

use std::collections::BTreeSet;
use std::time::Duration;

use monky_agent_proto::Sha;
use tracing::{info, warn};

use std::cell::RefCell;

use monky_compose::ContainerFacts;

use super::outcome::Outcome;
use super::stages::{Failed, Promoted, Started, Stop};
use super::{Agent, Judged, Run};
use crate::exit::{Exit, Failure};
use crate::release;
use crate::runtime_look::{self as look, Finding, Looked, Roots, SecretValues, Sharing, Subject};
use crate::shared_uid::HostAccounts;
use crate::state::Fact;

/// How long a container the look stops gets to end on its own.
const STOP_GRACE: Duration = Duration::from_secs(2);

impl Run<'_> {
    /// The heartbeat's look at the applied release `sha`: `Some` with its outcome when its
    /// processes show a secret, after its containers were stopped and the last good release
    /// brought back.
    pub(super) fn heartbeat_look(&mut self, sha: &Sha) -> Option<Result<Exit, Failure>> {
        let rel = release::Release::current(&self.agent.layout)
            .ok()
            .flatten()
            .filter(|r| r.sha() == sha)?;
        let recorded = self
            .tick
            .state
            .looked()
            .filter(|l| l.sha.as_ref() == Some(sha))
            .map(|l| l.holders.clone());
        let (findings, looked) = look(
            &self.agent,
            &self.tick.judged,
            &self.tick.facts,
            &rel,
            recorded,
        );
        if let Some(looked) = looked {
            self.record(Fact::Looked(looked));
        }
        if findings.is_empty() {
            return None;
        }
        let (code, why) = look::failure(&findings);
        warn!("heartbeat: {}: {why}", code);
        stop_what_runs(&self.agent, &self.tick.facts);
        self.refresh_containers();
        Some(self.withdraw(sha, Failure::coded(code, why)))
    }

    /// The applied `sha`, stopped by a heartbeat's finding: it waits out a backoff as a failed
    /// apply does, leaves the history (tenancy may ask for it again once it is fixed or the
    /// uid waived) and the release applied before it comes back.
    fn withdraw(&mut self, sha: &Sha, failure: Failure) -> Result<Exit, Failure> {
        let code = failure.code;
        // The backoff is the wanted sha's: a release that runs while another waits out its
        // own backoff is withdrawn without taking that sha's place.
        let next =
            (self.tick.state.desired_sha() == Some(sha)).then(|| self.back_off(sha, &failure));
        let previous = self
            .tick
            .state
            .applied_history()
            .iter()
            .rev()
            .find(|s| *s != sha && release::on_disk(&self.agent.layout, s.as_str()))
            .cloned();
        self.record(Fact::Withdrawn {
            sha: sha.clone(),
            to: None,
        });
        let note = match previous {
            Some(prev) => {
                let note = self.revert_to(&prev);
                if self.tick.state.converged().is_some_and(|c| c.sha == prev) {
                    let prod = release::Release::current(&self.agent.layout)
                        .ok()
                        .flatten()
                        .is_some_and(|r| r.is_prod());
                    self.record(Fact::Withdrawn {
                        sha: sha.clone(),
                        to: Some((prev, prod)),
                    });
                }
                note
            }
            None => "no earlier healthy release to fall back to".to_string(),
        };
        let next = next.map_or_else(String::new, |at| {
            format!("; next attempt {}", crate::clock::rfc3339(at))
        });
        let failure = Failure::coded(code, format!("{}; {note}{next}", failure.message));
        self.conclude(Outcome::failed(Some(sha), failure))
    }
}

/// Step 13a: the release is up and healthy; its processes are judged before the report.
/// A finding stops its containers and fails it like a release that did not come up, so
/// it waits out its backoff and the last good release comes back. Returns what the look saw,
/// for the tick to keep, and the outcome; after a stop the tick looks at the containers
/// again.
pub(super) fn judge_what_runs(
    agent: &Agent,
    judged: &RefCell<Judged>,
    facts: &[ContainerFacts],
    promoted: &Promoted,
) -> (Option<Looked>, Result<(), Stop>) {
    let rel = promoted.release();
    let (findings, looked) = look(agent, judged, facts, rel, promoted.holders().cloned());
    if findings.is_empty() {
        return (looked, Ok(()));
    }
    let (code, why) = look::failure(&findings);
    let failure = Failure::coded(code, why);
    warn!("apply of {} failed: {failure}", rel.sha().short());
    stop_what_runs(agent, facts);
    let stop = Stop::Failed(Box::new(Failed {
        failure,
        started: Some(Started {
            prod: agent.cfg.is_prod(promoted.bundle_prod()),
            compose_logs: String::new(),
        }),
    }));
    (looked, Err(stop))
}

/// The findings of a look at every container of the project as last listed: the uids of
/// the processes of each that gets a secret (`holders`, by the count; counted here when
/// `None`), and the arguments of every process. A release without a secret value is not
/// looked at, nor counted, and leaves nothing to keep.
fn look(
    agent: &Agent,
    judged: &RefCell<Judged>,
    facts: &[ContainerFacts],
    rel: &release::Release,
    holders: Option<BTreeSet<String>>,
) -> (Vec<Finding>, Option<Looked>) {
    let secrets = SecretValues::new(rel.secrets());
    if secrets.is_empty() {
        return (Vec::new(), None);
    }
    let holders = holders.unwrap_or_else(|| count_holders(agent, judged, facts, rel));
    let roots = Roots::default();
    let accounts = HostAccounts::read();
    let engine = agent.docker.engine();
    let mut remaps: Option<Result<bool, String>> = None;
    let mut findings = Vec::new();
    let mut uids = BTreeSet::new();
    for f in facts {
        let service = f.container.service.as_str();
        if matches!(
            f.container.state.as_str(),
            "exited" | "created" | "dead" | "removing"
        ) {
            continue;
        }
        let unseen = |why: String| Finding::Unseen {
            service: service.to_owned(),
            why,
        };
        let running = match engine.running(&f.id) {
            Ok(r) => r,
            // Removed since the listing: nothing of it runs.
            Err(monky_compose::Error::EngineStatus { status: 404, .. }) => continue,
            Err(e) => {
                findings.push(unseen(format!("the engine: {e}")));
                continue;
            }
        };
        let Some(pid) = running.pid else { continue };
        let procs = match look::processes(&roots, &f.id, pid) {
            Ok(p) => p,
            // The agent's `/proc` is not the engine's (another pid namespace: a box in a
            // container, an engine elsewhere): the engine's own view of the container's
            // processes, which must show at least its main process.
            Err(_) if !look::shows(&roots, pid) => match engine.top(&f.id) {
                Ok(top) if !top.is_empty() => top.into_iter().map(look::Proc::from).collect(),
                Ok(_) => {
                    findings.push(unseen("the engine lists no process of it".to_owned()));
                    continue;
                }
                Err(e) => {
                    findings.push(unseen(format!("the engine's top: {e}")));
                    continue;
                }
            },
            Err(why) => {
                findings.push(unseen(why));
                continue;
            }
        };
        uids.extend(procs.iter().flat_map(|p| p.uids));
        let holds = holders.contains(service) || secrets.in_env(&running.env);
        let shares = procs
            .iter()
            .flat_map(|p| p.uids)
            .any(|u| u != 0 && !accounts.at(u).is_empty());
        // The engine is asked only when it matters, once.
        let remapped = if holds && shares {
            match remaps
                .get_or_insert_with(|| {
                    engine
                        .info()
                        .map(|i| i.userns_remap())
                        .map_err(|e| e.to_string())
                })
                .clone()
            {
                Ok(r) => r,
                Err(e) => {
                    findings.push(unseen(format!(
                        "cannot ask the engine whether it remaps user namespaces: {e}"
                    )));
                    continue;
                }
            }
        } else {
            false
        };
        let sharing = Sharing {
            accounts: (!remapped).then_some(&accounts),
            allowed: &agent.cfg.allowed_shared_uids,
        };
        let subject = Subject {
            service,
            holds_a_secret: holds,
            args_judged: !agent.cfg.allow_secrets_on_command_lines,
        };
        findings.extend(look::judge(subject, &procs, &sharing, &secrets));
    }
    let looked = Looked {
        sha: Some(rel.sha().clone()),
        holders,
        uids,
    };
    (findings, Some(looked))
}

/// The services of `rel` that get a secret, from compose's model of it (a release the
/// stages did not count in this process); every service when the model cannot be built,
/// since a look that cannot count must not pass a service by default.
fn count_holders(
    agent: &Agent,
    judged: &RefCell<Judged>,
    facts: &[ContainerFacts],
    rel: &release::Release,
) -> BTreeSet<String> {
    match agent.judge(judged, rel) {
        Ok((_, runs)) => look::holders(&runs),
        Err(e) => {
            warn!("cannot count which services get a secret ({e}); judging every service");
            facts.iter().map(|f| f.container.service.clone()).collect()
        }
    }
}

/// Stops every running container of the project (the engine's own stop, so no restart
/// policy starts it again); what cannot be stopped is said, and the fallback's `up`
/// replaces it. The caller looks at the containers again.
fn stop_what_runs(agent: &Agent, facts: &[ContainerFacts]) {
    let engine = agent.docker.engine();
    for f in facts.iter().filter(|f| f.container.state != "exited") {
        match engine.stop(&f.id, STOP_GRACE) {
            Ok(()) => info!("stopped {}", f.container.name),
            Err(e) => warn!("cannot stop {}: {e}", f.container.name),
        }
    }
}
