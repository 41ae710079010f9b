//! The project's totals: what each service claims (containers, pids and memory limits, tmpfs
//! and shm, host ports) and the project's sum against the box's `max_project_*` keys, where a
//! container without a limit of its own counts what the agent supplies.

use serde_json::{Map, Value};

use super::ports::ports_taken;
use super::tmpfs::service_tmpfs_options;
use super::units::{as_i64, as_u64, human};
use super::{Budget, at};
use crate::mount::{Mount, MountKind};

/// What one service takes of the project's totals, per container where it says so.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Claim {
    containers: u64,
    /// Its own pids limit (positive), per container.
    pids: Option<u64>,
    /// Its own memory limit (non-zero), per container.
    pub(super) memory: Option<u64>,
    /// tmpfs and shm bytes, per container.
    scratch: u64,
    /// Host ports it publishes, all containers together.
    ports: u64,
}

/// The containers of a service: `deploy.replicas`, else `scale`, else one (compose refuses the
/// two when they differ). A count the budget cannot read counts one; the service's own check
/// refuses it.
pub(super) fn containers_of(svc: &Map<String, Value>) -> u64 {
    let n = svc
        .get("deploy")
        .and_then(|d| d.get("replicas"))
        .filter(|v| !v.is_null())
        .or_else(|| svc.get("scale").filter(|v| !v.is_null()));
    match n {
        None => 1,
        Some(v) => as_i64(v).map_or(1, |n| n.max(0) as u64),
    }
}

impl Budget {
    /// The project's memory total, when one is known.
    pub(super) fn project_memory(&self) -> Option<u64> {
        self.max_project_memory.or(self.max_memory)
    }

    /// The project's tmpfs and shm total, when one is known.
    fn project_tmpfs(&self) -> Option<u64> {
        self.max_project_tmpfs.or(self.max_memory.map(|m| m / 2))
    }

    /// The memory limit a `service` runs under: its own (`deploy.resources.limits.memory`,
    /// else `mem_limit`), else the default the agent supplies; `None` for one the budget
    /// cannot read.
    #[must_use]
    pub fn service_memory(&self, service: &Map<String, Value>) -> Option<u64> {
        let own = service
            .get("deploy")
            .and_then(|d| d.pointer("/resources/limits/memory"))
            .or_else(|| service.get("mem_limit"))
            .filter(|v| !v.is_null());
        match own {
            Some(v) => as_u64(v).filter(|m| *m > 0),
            None => Some(self.memory_default()),
        }
    }

    /// The memory limit supplied to one container: the default, never above `max_memory`.
    pub(super) fn memory_default(&self) -> u64 {
        self.max_memory
            .map_or(self.default_memory, |m| self.default_memory.min(m))
    }

    /// What the agent supplies to each of `unlimited` containers when the others take
    /// `explicit` of a total `max`: the default, or the share left when it is smaller. `None`
    /// when the share falls under an eighth of the default (a limit so small would starve an
    /// ordinary service: the bundle must set its own) or `explicit` alone is over.
    pub(super) fn share(
        max: Option<u64>,
        explicit: u64,
        unlimited: u64,
        default: u64,
    ) -> Option<u64> {
        let Some(max) = max else {
            return Some(default);
        };
        let left = max.checked_sub(explicit)?;
        if unlimited == 0 {
            return Some(default);
        }
        let each = (left / unlimited).min(default);
        (each >= default / 8).then_some(each)
    }

    /// What one service takes of the project's totals.
    pub(super) fn claim(&self, svc: &Map<String, Value>) -> Claim {
        let containers = containers_of(svc);
        let pids = ["pids_limit", "deploy.resources.limits.pids"]
            .iter()
            .filter_map(|p| at(svc, p).and_then(as_i64))
            .find(|n| *n > 0)
            .map(|n| n as u64);
        let memory = ["deploy.resources.limits.memory", "mem_limit"]
            .iter()
            .filter_map(|p| at(svc, p).and_then(as_u64))
            .find(|n| *n > 0);
        let ports = match at(svc, "ports") {
            Some(Value::Array(ps)) => ps
                .iter()
                .map(|p| ports_taken(p, containers))
                .fold(0u64, u64::saturating_add),
            _ => 0,
        };
        Claim {
            containers,
            pids,
            memory,
            scratch: self.scratch_of(svc),
            ports,
        }
    }

    /// The tmpfs and shm bytes of one container of a service; a size the budget cannot read
    /// counts nothing here (the service's own check refuses it).
    fn scratch_of(&self, svc: &Map<String, Value>) -> u64 {
        let mut scratch = at(svc, "shm_size").and_then(as_u64).unwrap_or(0);
        for opts in service_tmpfs_options(at(svc, "tmpfs")) {
            if let Ok(Some(n)) = self.tmpfs_bytes(&opts) {
                scratch = scratch.saturating_add(n);
            }
        }
        if let Some(Value::Array(vols)) = at(svc, "volumes") {
            for m in vols.iter().filter_map(Mount::parse) {
                if m.kind == MountKind::Tmpfs
                    && let Some(n) = m.tmpfs_size.and_then(as_u64)
                {
                    scratch = scratch.saturating_add(n);
                }
            }
        }
        scratch
    }

    /// The project's totals: containers, published ports, tmpfs and shm, and the pids and
    /// memory limits (a container without a limit of its own counts what the agent supplies).
    pub(super) fn totals(&self, top: &Map<String, Value>, out: &mut Vec<String>) {
        let Some(services) = top.get("services").and_then(Value::as_object) else {
            return;
        };
        let claims: Vec<Claim> = services
            .values()
            .filter_map(Value::as_object)
            .map(|s| self.claim(s))
            .collect();
        let containers = sum(&claims, |c| c.containers);
        if containers > self.max_project_containers {
            out.push(format!(
                "project: containers {containers} over budget.max_project_containers {}",
                self.max_project_containers
            ));
        }
        let ports = sum(&claims, |c| c.ports);
        if ports > self.max_project_ports {
            out.push(format!(
                "project: published ports {ports} over budget.max_project_ports {}",
                self.max_project_ports
            ));
        }
        self.scratch_total(top, &claims, out);
        self.limit_totals(&claims, out);
    }

    /// tmpfs and shm of every container and tmpfs volume of the project together.
    fn scratch_total(&self, top: &Map<String, Value>, claims: &[Claim], out: &mut Vec<String>) {
        let volumes = top
            .get("volumes")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|v| v.values())
            .filter_map(|v| self.tmpfs_volume(v).ok().flatten())
            .fold(0u64, u64::saturating_add);
        let scratch =
            sum(claims, |c| c.scratch.saturating_mul(c.containers)).saturating_add(volumes);
        if let Some(max) = self.project_tmpfs()
            && scratch > max
        {
            out.push(format!(
                "project: tmpfs and shm {} over budget.max_project_tmpfs {}",
                human(scratch),
                human(max)
            ));
        }
    }

    /// The pids and memory limits of the project together, each container without its own
    /// counting at least the eighth of the default the agent would supply it.
    fn limit_totals(&self, claims: &[Claim], out: &mut Vec<String>) {
        let (explicit, unlimited) = limited(claims, |c| c.pids);
        if Self::share(
            Some(self.max_project_pids),
            explicit,
            unlimited,
            self.default_pids,
        )
        .is_none()
        {
            out.push(total_finding(
                "pids limits",
                &explicit.to_string(),
                unlimited,
                "max_project_pids",
                &self.max_project_pids.to_string(),
                &(self.default_pids / 8).to_string(),
            ));
        }
        let (explicit, unlimited) = limited(claims, |c| c.memory);
        if let Some(max) = self.project_memory()
            && Self::share(Some(max), explicit, unlimited, self.memory_default()).is_none()
        {
            out.push(total_finding(
                "memory limits",
                &human(explicit),
                unlimited,
                "max_project_memory",
                &human(max),
                &human(self.memory_default() / 8),
            ));
        }
    }
}

/// `f` of every claim, added up (saturating).
fn sum(claims: &[Claim], f: impl Fn(&Claim) -> u64) -> u64 {
    claims.iter().map(f).fold(0u64, u64::saturating_add)
}

/// The limits `f` reads of every container that has one, and the count of those without.
fn limited(claims: &[Claim], f: impl Fn(&Claim) -> Option<u64>) -> (u64, u64) {
    let explicit = sum(claims, |c| f(c).unwrap_or(0).saturating_mul(c.containers));
    let unlimited = sum(claims, |c| if f(c).is_none() { c.containers } else { 0 });
    (explicit, unlimited)
}

/// `project: pids limits 20000 over budget.max_project_pids 16384`, or, when containers without
/// a limit of their own are left too little: `... and 8 containers without one, each under 128`.
fn total_finding(
    what: &str,
    value: &str,
    unlimited: u64,
    key: &str,
    limit: &str,
    floor: &str,
) -> String {
    if unlimited == 0 {
        format!("project: {what} {value} over budget.{key} {limit}")
    } else {
        format!(
            "project: {what} {value} and {unlimited} container(s) without one, each at least {floor}, over budget.{key} {limit}"
        )
    }
}
