//! Limits on one service's own containers, one key family each: processes, replicas,
//! memory-backed scratch space (shm and tmpfs), memory and CPUs, the time the daemon spends
//! on it, and the `ulimits` the kernel counts per host uid (`nproc`, `sigpending`,
//! `msgqueue`). A value a check cannot read is refused, never skipped.

use serde_json::{Map, Value};

use super::tmpfs::service_tmpfs_options;
use super::units::{as_duration, as_f64, as_i64, as_u64, human, secs};
use super::{Budget, Shown, at};
use crate::mount::{Mount, MountKind};

/// The memory keys of a service, limits and reservations.
const MEMORY_KEYS: [&str; 4] = [
    "mem_limit",
    "mem_reservation",
    "deploy.resources.limits.memory",
    "deploy.resources.reservations.memory",
];

impl Budget {
    /// Processes: `pids_limit` and `deploy.resources.limits.pids` up to `max_pids`, never
    /// unlimited; on compose's model with the override in force (`need_pids`), one of them set.
    pub(super) fn pids_bounds(
        &self,
        svc: &Map<String, Value>,
        shown: &Shown<'_>,
        need_pids: bool,
        out: &mut Vec<String>,
    ) {
        let mut has_pids = false;
        for key in ["pids_limit", "deploy.resources.limits.pids"] {
            let Some(v) = at(svc, key) else { continue };
            let Some(n) = as_i64(v) else {
                let hint = format!("write it as 512, up to budget.max_pids {}", self.max_pids);
                shown.unread(out, key, v, "a count", &hint);
                continue;
            };
            has_pids = true;
            let max = self.max_pids.to_string();
            if n <= 0 {
                shown.over(out, key, &format!("{n} (unlimited)"), "max_pids", &max);
            } else if n as u64 > self.max_pids {
                shown.over(out, key, &n.to_string(), "max_pids", &max);
            }
        }
        if need_pids && !has_pids {
            out.push(format!(
                "no pids limit (set pids_limit up to budget.max_pids {})",
                self.max_pids
            ));
        }
    }

    /// Containers: `scale` and `deploy.replicas` up to `max_replicas`.
    pub(super) fn replica_bounds(
        &self,
        svc: &Map<String, Value>,
        shown: &Shown<'_>,
        out: &mut Vec<String>,
    ) {
        for key in ["scale", "deploy.replicas"] {
            if let Some(v) = at(svc, key)
                && as_i64(v).is_none()
            {
                let hint = format!("up to budget.max_replicas {}", self.max_replicas);
                shown.unread(out, key, v, "a count", &hint);
            }
            if let Some(n) = at(svc, key).and_then(as_i64)
                && n > 0
                && n as u64 > self.max_replicas
            {
                let max = self.max_replicas.to_string();
                shown.over(out, key, &n.to_string(), "max_replicas", &max);
            }
        }
    }

    /// Memory-backed scratch space: `shm_size` up to `max_shm_size`, and each tmpfs (the
    /// `tmpfs` key and `volumes` of `type: tmpfs`) up to `max_tmpfs_size`.
    pub(super) fn scratch_bounds(
        &self,
        svc: &Map<String, Value>,
        shown: &Shown<'_>,
        out: &mut Vec<String>,
    ) {
        if let Some(v) = at(svc, "shm_size")
            && as_u64(v).is_none()
        {
            let hint = format!(
                "write it as 64m, up to budget.max_shm_size {}",
                human(self.max_shm_size)
            );
            shown.unread(out, "shm_size", v, "a size", &hint);
        }
        if let Some(size) = at(svc, "shm_size").and_then(as_u64)
            && size > self.max_shm_size
        {
            let max = human(self.max_shm_size);
            shown.over(out, "shm_size", &human(size), "max_shm_size", &max);
        }
        let max = human(self.max_tmpfs_size);
        for opts in service_tmpfs_options(at(svc, "tmpfs")) {
            match self.tmpfs_bytes(&opts) {
                Ok(Some(size)) if size > self.max_tmpfs_size => {
                    shown.over(out, "tmpfs", &human(size), "max_tmpfs_size", &max);
                }
                Err(why) if !shown.takes_variable("tmpfs") => {
                    out.push(format!("tmpfs {why}"));
                }
                _ => {}
            }
        }
        let Some(Value::Array(vols)) = at(svc, "volumes") else {
            return;
        };
        for m in vols.iter().filter_map(Mount::parse) {
            let Some(s) = m.tmpfs_size.filter(|_| m.kind == MountKind::Tmpfs) else {
                continue;
            };
            match as_u64(s) {
                None => {
                    let hint = format!("write it as 64m, up to budget.max_tmpfs_size {max}");
                    shown.unread(out, "volumes tmpfs.size", s, "a size", &hint);
                }
                Some(size) if size > self.max_tmpfs_size => {
                    shown.over(out, "volumes tmpfs", &human(size), "max_tmpfs_size", &max);
                }
                Some(_) => {}
            }
        }
    }

    /// Memory and CPUs: sizes the budget reads, none above the host's (`max_memory`,
    /// `max_cpus`), and a CPU weight no higher than `max_cpu_shares`.
    pub(super) fn memory_cpu_bounds(
        &self,
        svc: &Map<String, Value>,
        shown: &Shown<'_>,
        out: &mut Vec<String>,
    ) {
        for key in MEMORY_KEYS {
            if let Some(v) = at(svc, key)
                && as_u64(v).is_none()
            {
                shown.unread(out, key, v, "a size", "write it as 512m");
            }
        }
        if let Some(max) = self.max_memory {
            for key in MEMORY_KEYS {
                if let Some(size) = at(svc, key).and_then(as_u64)
                    && size > max
                {
                    shown.over(out, key, &human(size), "max_memory", &human(max));
                }
            }
        }
        if let Some(max) = self.max_cpus {
            for key in [
                "cpus",
                "cpu_count",
                "deploy.resources.limits.cpus",
                "deploy.resources.reservations.cpus",
            ] {
                if let Some(n) = at(svc, key).and_then(as_f64)
                    && n > max
                {
                    shown.over(out, key, &n.to_string(), "max_cpus", &max.to_string());
                }
            }
        }
        // A weight, not a limit: under contention a container with 262144 (dockerd's maximum)
        // gets 256 times the CPU of one left at docker's 1024, whatever its `cpus`.
        if let Some(n) = at(svc, "cpu_shares").and_then(as_i64)
            && n > 0
            && n as u64 > self.max_cpu_shares
        {
            let max = self.max_cpu_shares.to_string();
            shown.over(out, "cpu_shares", &n.to_string(), "max_cpu_shares", &max);
        }
    }

    /// Time the daemon spends on the project: `stop_grace_period` up to
    /// `max_stop_grace_period`, healthcheck intervals no shorter than `min_healthcheck_interval`.
    pub(super) fn time_bounds(
        &self,
        svc: &Map<String, Value>,
        shown: &Shown<'_>,
        out: &mut Vec<String>,
    ) {
        for key in [
            "stop_grace_period",
            "healthcheck.interval",
            "healthcheck.start_interval",
        ] {
            if let Some(v) = at(svc, key)
                && as_duration(v).is_none()
            {
                shown.unread(out, key, v, "a duration", "write it as 30s or 1m30s");
            }
        }
        if let Some(d) = at(svc, "stop_grace_period").and_then(as_duration)
            && d > self.max_stop_grace_period
        {
            let max = secs(self.max_stop_grace_period);
            shown.over(
                out,
                "stop_grace_period",
                &secs(d),
                "max_stop_grace_period",
                &max,
            );
        }
        // The daemon runs the check every interval for as long as the container runs, whatever
        // its restart policy: a service that never restarts but runs for days is checked as often.
        if at(svc, "healthcheck.disable").is_some_and(|d| d == &Value::Bool(true)) {
            return;
        }
        for key in ["healthcheck.interval", "healthcheck.start_interval"] {
            if let Some(d) = at(svc, key).and_then(as_duration)
                && d < self.min_healthcheck_interval
            {
                out.push(format!(
                    "{} under budget.min_healthcheck_interval {}",
                    shown.show(key, &secs(d)),
                    secs(self.min_healthcheck_interval)
                ));
            }
        }
    }

    /// On compose's model with the agent's override in force: a service without a memory
    /// limit of its own shows that the supplied one did not land, so it is refused.
    pub(super) fn supplied_limits(
        &self,
        svc: &Map<String, Value>,
        supplied: bool,
        out: &mut Vec<String>,
    ) {
        if supplied && self.claim(svc).memory.is_none() {
            let most = self.max_memory.map_or_else(String::new, |m| {
                format!(" up to budget.max_memory {}", human(m))
            });
            out.push(format!("no memory limit (set mem_limit{most})"));
        }
    }

    /// The `ulimits` of a compose file (as the bundle carries it) that the kernel counts per
    /// host uid, as `service: ulimits name value`: information for the box's admin (`bundle
    /// check`, `doctor`), since processes of other envs' containers at the same uid count
    /// toward the limit. Empty when the file cannot be parsed (the policy refuses it).
    #[must_use]
    pub fn per_uid_ulimits_of(compose_yaml: &str) -> Vec<String> {
        let Ok(doc) = crate::checks::parse_compose(compose_yaml) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (service, svc) in doc
            .get("services")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            for (name, v) in svc
                .get("ulimits")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                if per_uid(name) {
                    out.push(format!(
                        "{service}: ulimits {} {}",
                        name.trim(),
                        ulimit_text(v)
                    ));
                }
            }
        }
        out
    }

    /// `ulimits` the kernel counts per user id across the whole host (`nproc`, `sigpending`,
    /// `msgqueue`). Such a limit binds only the container that asks for it (another env's
    /// containers at the same uid use up its count, never the other way round), and the
    /// container's own processes and memory are bounded by `pids_limit` and its memory limit:
    /// each applies up to its budget key. A value this check cannot read, or unlimited, is
    /// refused rather than passed.
    pub(super) fn per_uid_ulimits(
        &self,
        svc: &Map<String, Value>,
        shown: &Shown<'_>,
        out: &mut Vec<String>,
    ) {
        let Some(ulimits) = svc.get("ulimits").and_then(Value::as_object) else {
            return;
        };
        for (name, v) in ulimits {
            let (key, cap) = match name.trim().to_ascii_lowercase().as_str() {
                "nproc" => ("max_ulimit_nproc", self.max_ulimit_nproc),
                "sigpending" => ("max_ulimit_sigpending", self.max_ulimit_sigpending),
                "msgqueue" => ("max_ulimit_msgqueue", self.max_ulimit_msgqueue),
                _ => continue,
            };
            let label = format!("ulimits {}", name.trim());
            let value = ulimit_text(v);
            match ulimit_highest(v) {
                Some(n) if n <= cap => {}
                Some(_) => out.push(format!(
                    "{} over budget.{key} {cap}",
                    shown.show(&label, &value)
                )),
                None => out.push(format!(
                    "{} is unlimited or not a count this check can read: name a number, up to budget.{key} {cap}",
                    shown.show(&label, &value)
                )),
            }
        }
    }
}

/// Whether the kernel counts the `ulimits` entry `name` per host uid.
fn per_uid(name: &str) -> bool {
    matches!(
        name.trim().to_ascii_lowercase().as_str(),
        "nproc" | "sigpending" | "msgqueue"
    )
}

/// A `ulimits` entry as a finding shows it: `soft/hard` (`-` for a part not given), or the
/// value as written.
fn ulimit_text(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let part = |k: &str| m.get(k).map_or_else(|| "-".into(), |x| x.to_string());
            format!("{}/{}", part("soft"), part("hard"))
        }
        other => other
            .as_str()
            .map_or_else(|| other.to_string(), str::to_string),
    }
}

/// The higher of a `ulimits` entry's soft and hard values (a number, a string of one, or
/// `{soft, hard}`), when both read as non-negative counts; `-1` (unlimited) does not.
fn ulimit_highest(v: &Value) -> Option<u64> {
    let one = |v: &Value| match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    match v {
        Value::Object(m) => {
            let soft = m.get("soft").map(one);
            let hard = m.get("hard").map(one);
            match (soft, hard) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(Some(0))?.max(b.unwrap_or(Some(0))?)),
            }
        }
        other => one(other),
    }
}
