//! The checkin: what the box looks like, said to tenancy, and tenancy's answer.

use monky_agent_proto as proto;
use tracing::warn;

use super::{Agent, Run};
use crate::exit::Failure;
use crate::state::{Fact, SeenContainer, State};
use crate::{host, peers};

impl Run<'_> {
    /// Looks at the project's containers again: state keeps what was seen, and why the look
    /// failed is kept for the heartbeat (a failed look is no "nothing running").
    pub(super) fn refresh_containers(&mut self) {
        let seen = containers(&self.agent, &self.tick.state);
        self.saw(seen);
    }

    /// Keeps what a look at the containers found: the listing and why it failed for this
    /// tick's later looks, and what was seen in the state.
    pub(super) fn saw(&mut self, seen: Seen) {
        let Seen {
            facts,
            error,
            containers,
        } = seen;
        self.tick.docker_error = error;
        self.tick.facts = facts;
        self.record(Fact::ContainersSeen(containers));
    }

    pub(super) fn wire_containers(&self) -> Vec<proto::ContainerStatus> {
        self.tick
            .state
            .containers()
            .iter()
            .map(|c| proto::ContainerStatus {
                name: c.name.clone(),
                state: c.state.clone(),
                health: c.health.clone(),
            })
            .collect()
    }

    /// Looks at the box (the containers, the docker facts, the compose found) and says it to
    /// tenancy as a checkin.
    fn checkin_request(&mut self) -> proto::CheckinRequest {
        self.refresh_containers();
        let facts = self.agent.docker.facts();
        self.record(Fact::ComposeFound(self.agent.docker.known_compose()));
        self.record(Fact::EngineFound(self.agent.docker.known_engine()));
        proto::CheckinRequest {
            env_id: self.agent.cfg.env_id.clone(),
            agent_version: crate::host::VERSION.to_string(),
            applied_sha: self.tick.state.applied_sha().cloned(),
            host: proto::HostFacts {
                hostname: host::hostname(),
                os: host::os(),
                kernel: host::kernel(),
                docker: facts.docker_version,
                compose: facts.compose_version,
                free_bytes: facts.free_bytes,
                agent_version: crate::host::VERSION.to_string(),
                transport: self.agent.cfg.transport.as_str().to_string(),
                site: self.agent.cfg.site.clone(),
                laptop_mode: self.agent.cfg.laptop_mode,
            },
            containers: self.wire_containers(),
            hold: self.tick.hold.as_ref().map(crate::hold::Hold::wire),
        }
    }

    /// Checks in. Tenancy's 401 alone destroys nothing: a fresh grant on disk (staged by the
    /// box's admin) replaces the token, and otherwise OpenBao says whether the token is dead.
    pub(super) fn checkin(&mut self) -> Result<proto::CheckinResponse, Failure> {
        let req = self.checkin_request();
        let refused = match self.agent.tenancy.checkin(&self.bearer()?, &req) {
            Ok(r) => return Ok(r),
            Err(e) if e.kind() == proto::ErrorKind::Unauthenticated => e,
            Err(e) => return Err(peers::tenancy_failure("checkin", e)),
        };
        warn!("tenancy refused the token ({refused})");
        if !self.agent.cfg.bootstrap_file.exists() {
            return Err(self.token_refused_by_tenancy(&refused));
        }
        // The new login's token replaces (and revokes) the old one only once it exists.
        self.bootstrap()?;
        self.agent
            .tenancy
            .checkin(&self.bearer()?, &req)
            .map_err(|e| peers::tenancy_failure("checkin after re-bootstrap", e))
    }
}

/// What a look at the project's containers found: the engine's listing, why it failed, and
/// what the state keeps of it.
pub(super) struct Seen {
    /// The project's containers as listed, with what drift detection compares.
    pub(super) facts: Vec<monky_compose::ContainerFacts>,
    /// Why the listing failed; a heartbeat must not call that "not running".
    pub(super) error: Option<String>,
    /// What the state keeps: each container's state and health, and a one-shot's completion
    /// as the converged record lets it stand.
    pub(super) containers: Vec<SeenContainer>,
}

/// Lists the project's containers; `state` gives the converged record a one-shot's completion
/// is judged against.
pub(super) fn containers(agent: &Agent, state: &State) -> Seen {
    let listed = agent.docker.container_facts(&agent.cfg.compose_project);
    let error = listed.as_ref().err().map(ToString::to_string);
    let facts = listed.unwrap_or_else(|e| {
        warn!("cannot list containers: {e}");
        Vec::new()
    });
    let record = state.converged();
    let containers = facts
        .iter()
        .map(|f| SeenContainer {
            name: f.container.name.clone(),
            state: f.container.state.clone(),
            health: f.container.health.clone(),
            completed: f.container.completed
                && crate::drift::completed_stands(record, &f.container.name),
        })
        .collect();
    Seen {
        facts,
        error,
        containers,
    }
}
