//! The fair share of a shared box: what one project may take of the host's processes, ports,
//! memory, CPUs, disk (logs) and docker's address pools, per container and as totals for the
//! whole project, judged on compose's model (and on the file before the lease where the values
//! are literal). A size, count or duration the budget cannot read is refused, never skipped. A finding gives no host access, so it
//! has its own code (`BUDGET_EXCEEDED`) and the box's admin waives it by raising the named key.
//!
//! By concern: [`units`] reads sizes and durations as docker, compose and the kernel do;
//! `tmpfs` is the one reader of tmpfs options; `ports`, `limits` (one function per key
//! family) and `logging` judge one service; `totals` the whole project; `supplied` writes the
//! override of what a service leaves to the box.

use std::time::Duration;

use serde_json::{Map, Value};

mod limits;
mod logging;
mod ports;
mod supplied;
#[cfg(test)]
mod tests;
mod tmpfs;
mod totals;
pub mod units;

#[cfg(test)]
use ports::{port_range, short_published};
pub(crate) use tmpfs::tmpfs_options;
#[cfg(test)]
use units::KIB;
use units::{GIB, MIB, human};
pub use units::{KernelSize, parse_duration, parse_kernel_size, parse_size};

/// The name of the override the agent writes next to a release's compose file to supply what a
/// service leaves to the box ([`Budget::budget_override`]): not a bundle member, so no bundle
/// can carry or replace it.
pub const OVERRIDE_FILE: &str = ".monky-budget.yml";

/// What one project may take of a box shared with other envs. The box's admin sets it in the
/// agent's config (`budget:`); tenancy's renderer can use the same struct to render bundles
/// that fit.
///
/// The [`Default`] is sized for a VM that hosts a few backends:
///
/// | field | default | why |
/// | --- | --- | --- |
/// | `max_pids` | 4096 per container | a fork bomb stops there; real servers use hundreds |
/// | `default_pids` | 1024 per container | what the agent supplies to a service that sets no limit |
/// | `max_replicas` | 10 per service (`scale`, `deploy.replicas`) | |
/// | `max_services` | 40 per project | |
/// | `max_networks` | 6 per project (external ones not counted) | docker's default pools hold 31 networks for the whole box |
/// | `min_published_port` | 1024 | ports below are the host's services |
/// | `reserved_ports` | 22, 8200, 8201, 18200, 18443 | ssh, OpenBao, the tunneler's proxy ports for OpenBao and tenancy |
/// | `max_port_range` | 100 ports per published range | |
/// | `max_shm_size` | 1 GiB | |
/// | `max_tmpfs_size` | 1 GiB per mount | |
/// | `max_memory` | none (the agent sets the host's memory) | a limit above the host's is no limit |
/// | `max_cpus` | none (the agent sets the host's CPUs) | |
/// | `max_cpu_shares` | 1024 (docker's own weight) | a higher weight takes CPU from every other env's containers |
/// | `max_stop_grace_period` | 5 min | every `down` and update waits for it |
/// | `min_healthcheck_interval` | 1 s | each check is a process the daemon starts, whatever the restart policy |
/// | `max_log_size` | 100 MiB per file (`json-file` must set `max-size`) | |
/// | `max_log_files` | 10 | |
/// | `default_memory` | 2 GiB per container | what the agent supplies to a service that sets no memory limit (less when the project's share is smaller) |
/// | `default_log_size`, `default_log_files` | 10 MiB x 3 | the `json-file` bounds the agent supplies to a service that names no logging driver |
/// | `allow_journald` | true | the host's `journald.conf` bounds the journal (`SystemMaxUse`), but it is shared with the host and every env: a box that must keep its own records turns it off |
/// | `max_project_pids` | 16384 per project | half the kernel's classic `pid_max` (32768): one project's processes leave the rest to the host and other envs |
/// | `max_project_memory` | none (`max_memory`, the host's) | the memory limits of every container of the project together |
/// | `max_project_tmpfs` | none (half of `max_memory`) | tmpfs and shm sizes together, memory the kernel cannot reclaim; half is the kernel's own default for one tmpfs |
/// | `max_project_ports` | 200 host ports per project | each published port is a port no other env can take (and a proxy process) |
/// | `max_project_containers` | 60 per project (`scale` and replicas counted) | each container is a shim process, a network endpoint and daemon state |
/// | `max_ulimit_nproc`, `max_ulimit_sigpending` | 65536 | the highest `ulimits` `nproc` and `sigpending`: limits that bind only the container asking for them (the kernel counts them per host uid, so another env at the same uid uses up the count; `pids_limit` and the memory limit bound what the container itself takes) |
/// | `max_ulimit_msgqueue` | 8 MiB | the highest `ulimits` `msgqueue` (bytes of POSIX message queues per uid), charged to the container's memory limit |
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Most processes per container (`pids_limit`, `deploy.resources.limits.pids`); `-1` and
    /// `0` (unlimited) are refused.
    pub max_pids: u64,
    /// The limit the agent supplies to a service that sets none.
    pub default_pids: u64,
    /// Most containers per service.
    pub max_replicas: u64,
    /// Most services per project.
    pub max_services: usize,
    /// Most networks per project, external ones not counted.
    pub max_networks: usize,
    /// The lowest host port a service may publish.
    pub min_published_port: u16,
    /// Host ports no service may publish.
    pub reserved_ports: Vec<u16>,
    /// Most host ports in one published range.
    pub max_port_range: u32,
    /// Largest `shm_size`, in bytes.
    pub max_shm_size: u64,
    /// Largest tmpfs mount, in bytes.
    pub max_tmpfs_size: u64,
    /// Largest memory limit or reservation, in bytes; `None` is not checked.
    pub max_memory: Option<u64>,
    /// Most CPUs a limit or reservation may name; `None` is not checked.
    pub max_cpus: Option<f64>,
    /// Highest `cpu_shares`, the CPU weight against every other container on the box.
    pub max_cpu_shares: u64,
    /// Longest `stop_grace_period`.
    pub max_stop_grace_period: Duration,
    /// Shortest healthcheck `interval` / `start_interval`.
    pub min_healthcheck_interval: Duration,
    /// Largest log file (`max-size`) of the `json-file` and `local` drivers, in bytes.
    pub max_log_size: u64,
    /// Most log files kept (`max-file`).
    pub max_log_files: u64,
    /// The memory limit the agent supplies to a container that sets none, in bytes; less
    /// when the project's share ([`max_project_memory`](Self::max_project_memory)) is smaller.
    pub default_memory: u64,
    /// The `max-size` the agent supplies, with the `json-file` driver, to a service that names
    /// no logging driver (no `logging`, `driver: ""`, or `options` alone).
    pub default_log_size: u64,
    /// The `max-file` supplied with [`default_log_size`](Self::default_log_size).
    pub default_log_files: u64,
    /// Whether a service may log to the host's journal (`driver: journald`).
    pub allow_journald: bool,
    /// Most processes of every container of the project together (pids limits, supplied
    /// ones included, times each service's containers).
    pub max_project_pids: u64,
    /// Most memory of every container of the project together, in bytes; `None` is
    /// [`max_memory`](Self::max_memory) (unchecked when that is `None` too).
    pub max_project_memory: Option<u64>,
    /// Most tmpfs and shm of the project together, in bytes; `None` is half of
    /// [`max_memory`](Self::max_memory) (unchecked when that is `None` too).
    pub max_project_tmpfs: Option<u64>,
    /// Most host ports the project publishes, ranges and ephemeral ports counted.
    pub max_project_ports: u64,
    /// Most containers of the project (`scale` and `deploy.replicas` counted).
    pub max_project_containers: u64,
    /// The highest `ulimits` `nproc` a service may ask for.
    pub max_ulimit_nproc: u64,
    /// The highest `ulimits` `sigpending` a service may ask for.
    pub max_ulimit_sigpending: u64,
    /// The highest `ulimits` `msgqueue` a service may ask for, in bytes.
    pub max_ulimit_msgqueue: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_pids: 4096,
            default_pids: 1024,
            max_replicas: 10,
            max_services: 40,
            max_networks: 6,
            min_published_port: 1024,
            reserved_ports: vec![22, 8200, 8201, 18200, 18443],
            max_port_range: 100,
            max_shm_size: GIB,
            max_tmpfs_size: GIB,
            max_memory: None,
            max_cpus: None,
            max_cpu_shares: 1024,
            max_stop_grace_period: Duration::from_secs(300),
            min_healthcheck_interval: Duration::from_secs(1),
            max_log_size: 100 * MIB,
            max_log_files: 10,
            default_memory: 2 * GIB,
            default_log_size: 10 * MIB,
            default_log_files: 3,
            allow_journald: true,
            max_project_pids: 16384,
            max_project_memory: None,
            max_project_tmpfs: None,
            max_project_ports: 200,
            max_project_containers: 60,
            max_ulimit_nproc: 65536,
            max_ulimit_sigpending: 65536,
            max_ulimit_msgqueue: 8 * MIB,
        }
    }
}

/// Where one judged value sits, to show it the way the policy does: a value that came from a
/// variable is named by it, never printed (compose's model may hold a secret's value).
struct Shown<'a> {
    model: bool,
    /// The compose file's own service (or top-level entry), uninterpolated.
    raw: Option<&'a Value>,
}

impl Shown<'_> {
    /// Before the lease, whether the key's value takes anything from a variable: one it cannot
    /// read then is judged on compose's model, where the value is known.
    fn takes_variable(&self, key: &str) -> bool {
        let first = key.split(['.', ' ']).next().unwrap_or(key);
        let mut vars = std::collections::BTreeSet::new();
        if let Some(v) = self.raw.and_then(|r| r.get(first)) {
            crate::interp::raw_vars(v, &mut vars);
        }
        !self.model && !vars.is_empty()
    }

    /// `key value is not <what> the budget reads (<hint>)`, unless the value is a variable's
    /// that only compose's model knows.
    fn unread(&self, out: &mut Vec<String>, key: &str, v: &Value, what: &str, hint: &str) {
        if self.takes_variable(key) {
            return;
        }
        let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
        out.push(format!(
            "{} is not {what} the budget reads ({hint})",
            self.show(key, &text)
        ));
    }

    fn show(&self, key: &str, value: &str) -> String {
        let first = key.split(['.', ' ']).next().unwrap_or(key);
        crate::interp::key_value(
            self.model,
            self.raw.and_then(|r| r.get(first)),
            key,
            value,
            60,
        )
    }

    /// `key value over budget.<field> <limit>`.
    fn over(&self, out: &mut Vec<String>, key: &str, value: &str, field: &str, limit: &str) {
        out.push(format!(
            "{} over budget.{field} {limit}",
            self.show(key, value)
        ));
    }
}

/// The value at a dotted `path` of a service (`deploy.resources.limits.pids`); `null` is none.
fn at<'a>(svc: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut keys = path.split('.');
    let mut v = svc.get(keys.next()?);
    for k in keys {
        v = v?.get(k);
    }
    v.filter(|v| !v.is_null())
}

impl Budget {
    /// Every budget finding of a compose tree (the file as the bundle carries it, interpolated
    /// with the values known before the lease, or compose's model), in file order, each
    /// `subject: key value over budget.<field> <limit>`.
    ///
    /// `raw` is the compose file as written: in the model (`model`), a value whose key took
    /// anything from a variable is named by the variable. `pids_supplied`: the agent supplies
    /// pids and memory limits and bounded logging to a service without them, so only the
    /// model, which carries the supplied values, may lack none. The project's totals follow
    /// the services' findings.
    #[must_use]
    pub(crate) fn findings(
        &self,
        doc: &Value,
        raw: &Value,
        model: bool,
        pids_supplied: bool,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let Some(top) = doc.as_object() else {
            return out;
        };
        self.counts(top, &mut out);
        let services = top.get("services").and_then(Value::as_object);
        for (name, service) in services.into_iter().flatten() {
            let Some(svc) = service.as_object() else {
                continue;
            };
            let shown = Shown {
                model,
                raw: raw.get("services").and_then(|s| s.get(name)),
            };
            let found = self.service(svc, &shown, model && pids_supplied);
            out.extend(found.into_iter().map(|f| format!("{name}: {f}")));
        }
        self.tmpfs_volumes(top, raw, model, &mut out);
        self.totals(top, &mut out);
        out
    }

    /// The project's services and its own networks (external ones not counted).
    fn counts(&self, top: &Map<String, Value>, out: &mut Vec<String>) {
        if let Some(s) = top.get("services").and_then(Value::as_object)
            && s.len() > self.max_services
        {
            out.push(format!(
                "services {} over budget.max_services {}",
                s.len(),
                self.max_services
            ));
        }
        if let Some(nets) = top.get("networks").and_then(Value::as_object) {
            let own = nets
                .values()
                .filter(|n| !n.get("external").is_some_and(|e| e != &Value::Bool(false)))
                .count();
            if own > self.max_networks {
                out.push(format!(
                    "networks {own} over budget.max_networks {}",
                    self.max_networks
                ));
            }
        }
    }

    /// One service's findings, key family by key family, in the order a finding list shows
    /// them. `supplied`: compose's model with the agent's override in force.
    fn service(&self, svc: &Map<String, Value>, shown: &Shown<'_>, supplied: bool) -> Vec<String> {
        let mut out = Vec::new();
        self.pids_bounds(svc, shown, supplied, &mut out);
        self.replica_bounds(svc, shown, &mut out);
        if let Some(Value::Array(ports)) = at(svc, "ports") {
            self.published_ports(ports, shown, &mut out);
        }
        self.scratch_bounds(svc, shown, &mut out);
        self.memory_cpu_bounds(svc, shown, &mut out);
        self.time_bounds(svc, shown, &mut out);
        self.log_sizes(svc, shown, supplied, &mut out);
        self.supplied_limits(svc, supplied, &mut out);
        self.logging_bounds(svc, shown, supplied, &mut out);
        self.per_uid_ulimits(svc, shown, &mut out);
        out
    }

    /// Each top-level tmpfs volume up to `max_tmpfs_size`, its options as the kernel reads them.
    fn tmpfs_volumes(
        &self,
        top: &Map<String, Value>,
        raw: &Value,
        model: bool,
        out: &mut Vec<String>,
    ) {
        let Some(vols) = top.get("volumes").and_then(Value::as_object) else {
            return;
        };
        for (name, vol) in vols {
            let shown = Shown {
                model,
                raw: raw.get("volumes").and_then(|s| s.get(name)),
            };
            match self.tmpfs_volume(vol) {
                Ok(Some(size)) if size > self.max_tmpfs_size => out.push(format!(
                    "volumes.{name}: {} over budget.max_tmpfs_size {}",
                    shown.show("driver_opts size", &human(size)),
                    human(self.max_tmpfs_size)
                )),
                Err(why) if !shown.takes_variable("driver_opts") => {
                    out.push(format!("volumes.{name}: driver_opts o {why}"));
                }
                _ => {}
            }
        }
    }
}
