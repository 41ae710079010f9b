//! The fair share of a shared box: what one project may take of the host's processes, ports,
//! memory, CPUs, disk (logs) and docker's address pools, per container and as totals for the
//! whole project, judged on compose's model (and on the file before the lease where the values
//! are literal). A size, count or duration the budget cannot read is refused, never skipped. A finding gives no host access, so it
//! has its own code (`BUDGET_EXCEEDED`) and the box's admin waives it by raising the named key.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::mount::{Mount, MountKind};

/// The name of the override the agent writes next to a release's compose file to supply what a
/// service leaves to the box ([`Budget::budget_override`]): not a bundle member, so no bundle
/// can carry or replace it.
pub const OVERRIDE_FILE: &str = ".monky-budget.yml";

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

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

/// A size as docker reads one (`RAMInBytes`): digits with an optional fraction, an optional
/// space, and an optional binary unit `k`, `m`, `g`, `t`, `p` (any case) with an optional `i`
/// and `b`: `1g`, `1.5GiB`, `512m`, `100 kb`, `1024`.
///
/// ```
/// use monky_bundle::budget::parse_size;
/// assert_eq!(parse_size("1.5g"), Some(1_610_612_736));
/// assert_eq!(parse_size("64M"), Some(64 << 20));
/// assert_eq!(parse_size("1x"), None);
/// ```
#[must_use]
pub fn parse_size(text: &str) -> Option<u64> {
    let s = text.trim();
    let digits = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, rest) = s.split_at(digits);
    if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
        return None;
    }
    let rest = rest.strip_prefix(' ').unwrap_or(rest).to_ascii_lowercase();
    let mut unit = rest.as_str();
    let mult = match unit.chars().next() {
        Some('k') => KIB,
        Some('m') => MIB,
        Some('g') => GIB,
        Some('t') => GIB * KIB,
        Some('p') => GIB * MIB,
        _ => 1,
    };
    if mult > 1 {
        unit = &unit[1..];
    }
    unit = unit.strip_prefix('i').unwrap_or(unit);
    unit = unit.strip_prefix('b').unwrap_or(unit);
    if !unit.is_empty() {
        return None;
    }
    // docker reads `1.5.3` as 1.5 (its pattern allows more fractions); so does this.
    let mut parts = number.split('.');
    let whole: f64 = parts.next()?.parse().ok()?;
    let frac: f64 = parts
        .next()
        .map_or(Some(0.0), |f| format!("0.{f}").parse().ok())?;
    let bytes = (whole + frac) * mult as f64;
    // `as` saturates: a size past u64::MAX is over every limit anyway.
    Some(bytes as u64)
}

/// A duration as compose reads one (Go's `ParseDuration`): a sequence of numbers with units
/// `ns`, `us`, `µs`, `ms`, `s`, `m`, `h`, e.g. `1m30s`, `1.5h`, `500ms`; `0` alone is zero.
///
/// ```
/// use std::time::Duration;
/// use monky_bundle::budget::parse_duration;
/// assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
/// assert_eq!(parse_duration("1ms"), Some(Duration::from_millis(1)));
/// assert_eq!(parse_duration("10"), None);
/// ```
#[must_use]
pub fn parse_duration(text: &str) -> Option<Duration> {
    let s = text.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return None;
    }
    let mut rest = s;
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[u..];
        total += number * seconds;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// A published host port or range, as the short syntax (`[ip:]host:container[/proto]`) or
/// compose's model (`published: "8080"` or `"10000-20000"`) gives it: `(first, last)`.
fn port_range(text: &str) -> Option<(u32, u32)> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    let (a, b) = t.split_once('-').unwrap_or((t, t));
    let a: u32 = a.trim().parse().ok()?;
    let b: u32 = b.trim().parse().ok()?;
    Some((a.min(b), a.max(b)))
}

/// The host part of a short-syntax port: `8080:80/udp` -> `8080`, `127.0.0.1:9000-9002:9000`
/// -> `9000-9002`, `[::1]:8081:81` -> `8081`, `80` -> none (an ephemeral port).
fn short_published(spec: &str) -> Option<String> {
    let spec = spec.split('/').next().unwrap_or(spec);
    // An IPv6 host ip is bracketed; drop it so its colons do not count.
    let spec = match spec.strip_prefix('[') {
        Some(r) => r.split_once("]:").map_or(r, |(_, rest)| rest),
        None => spec,
    };
    let parts: Vec<&str> = spec.split(':').collect();
    match parts.len() {
        0 | 1 => None,
        n => Some(parts[n - 2].to_string()),
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| n.as_f64().map(|f| f.max(0.0) as u64)),
        Value::String(s) => parse_size(s),
        _ => None,
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn as_duration(v: &Value) -> Option<Duration> {
    v.as_str().and_then(parse_duration)
}

/// Bytes as a finding shows them: `1 GiB`, `64 MiB`, `1.5 GiB`, plain bytes below a KiB.
fn human(bytes: u64) -> String {
    for (unit, size) in [
        ("EiB", GIB * GIB),
        ("PiB", GIB * MIB),
        ("TiB", GIB * KIB),
        ("GiB", GIB),
        ("MiB", MIB),
        ("KiB", KIB),
    ] {
        if bytes >= size {
            let n = bytes as f64 / size as f64;
            return if n.fract() == 0.0 {
                format!("{n:.0} {unit}")
            } else {
                format!("{n:.1} {unit}")
            };
        }
    }
    format!("{bytes} bytes")
}

fn secs(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) || ms == 0 {
        format!("{ms}ms")
    } else {
        format!("{}s", ms / 1000)
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
        let services = top.get("services").and_then(Value::as_object);
        if let Some(s) = services
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
        for (name, service) in services.into_iter().flatten() {
            let Some(svc) = service.as_object() else {
                continue;
            };
            let shown = Shown {
                model,
                raw: raw.get("services").and_then(|s| s.get(name)),
            };
            let mut found = Vec::new();
            self.service(svc, &shown, model && pids_supplied, &mut found);
            self.supplied_limits(svc, model && pids_supplied, &mut found);
            self.logging_bounds(svc, &shown, model && pids_supplied, &mut found);
            self.per_uid_ulimits(svc, &shown, &mut found);
            out.extend(found.into_iter().map(|f| format!("{name}: {f}")));
        }
        if let Some(vols) = top.get("volumes").and_then(Value::as_object) {
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
        self.totals(top, &mut out);
        out
    }

    fn service(
        &self,
        svc: &Map<String, Value>,
        shown: &Shown<'_>,
        need_pids: bool,
        out: &mut Vec<String>,
    ) {
        let get = |path: &str| -> Option<&Value> {
            let mut v: Option<&Value> = None;
            for (i, k) in path.split('.').enumerate() {
                v = if i == 0 { svc.get(k) } else { v?.get(k) };
            }
            v.filter(|v| !v.is_null())
        };
        let over = |out: &mut Vec<String>, key: &str, value: &str, field: &str, limit: &str| {
            out.push(format!(
                "{} over budget.{field} {limit}",
                shown.show(key, value)
            ));
        };

        // Processes.
        let mut has_pids = false;
        for key in ["pids_limit", "deploy.resources.limits.pids"] {
            let Some(v) = get(key) else { continue };
            let Some(n) = as_i64(v) else {
                let hint = format!("write it as 512, up to budget.max_pids {}", self.max_pids);
                shown.unread(out, key, v, "a count", &hint);
                continue;
            };
            has_pids = true;
            if n <= 0 {
                over(
                    out,
                    key,
                    &format!("{n} (unlimited)"),
                    "max_pids",
                    &self.max_pids.to_string(),
                );
            } else if n as u64 > self.max_pids {
                over(
                    out,
                    key,
                    &n.to_string(),
                    "max_pids",
                    &self.max_pids.to_string(),
                );
            }
        }
        if need_pids && !has_pids {
            out.push(format!(
                "no pids limit (set pids_limit up to budget.max_pids {})",
                self.max_pids
            ));
        }

        // Containers.
        for key in ["scale", "deploy.replicas"] {
            if let Some(v) = get(key)
                && as_i64(v).is_none()
            {
                let hint = format!("up to budget.max_replicas {}", self.max_replicas);
                shown.unread(out, key, v, "a count", &hint);
            }
            if let Some(n) = get(key).and_then(as_i64)
                && n > 0
                && n as u64 > self.max_replicas
            {
                over(
                    out,
                    key,
                    &n.to_string(),
                    "max_replicas",
                    &self.max_replicas.to_string(),
                );
            }
        }

        // Published ports.
        if let Some(Value::Array(ports)) = get("ports") {
            for p in ports {
                let published = match p {
                    Value::String(s) => short_published(s),
                    Value::Object(m) => m.get("published").and_then(|v| match v {
                        Value::String(s) => Some(s.clone()),
                        Value::Number(n) => Some(n.to_string()),
                        _ => None,
                    }),
                    _ => None,
                };
                let Some((first, last)) = published.as_deref().and_then(port_range) else {
                    continue;
                };
                let text = if first == last {
                    first.to_string()
                } else {
                    format!("{first}-{last}")
                };
                let count = last - first + 1;
                if count > self.max_port_range {
                    out.push(format!(
                        "{} is {count} ports, over budget.max_port_range {}",
                        shown.show("ports", &text),
                        self.max_port_range
                    ));
                } else if first < u32::from(self.min_published_port) {
                    out.push(format!(
                        "{} below budget.min_published_port {}",
                        shown.show("ports", &text),
                        self.min_published_port
                    ));
                } else if let Some(r) = self
                    .reserved_ports
                    .iter()
                    .find(|r| (first..=last).contains(&u32::from(**r)))
                {
                    out.push(format!(
                        "{} takes {r}, in budget.reserved_ports",
                        shown.show("ports", &text)
                    ));
                }
            }
        }

        // Memory-backed scratch space.
        if let Some(v) = get("shm_size")
            && as_u64(v).is_none()
        {
            let hint = format!(
                "write it as 64m, up to budget.max_shm_size {}",
                human(self.max_shm_size)
            );
            shown.unread(out, "shm_size", v, "a size", &hint);
        }
        if let Some(size) = get("shm_size").and_then(as_u64)
            && size > self.max_shm_size
        {
            over(
                out,
                "shm_size",
                &human(size),
                "max_shm_size",
                &human(self.max_shm_size),
            );
        }
        for t in tmpfs_entries(get("tmpfs")) {
            let opts = t.split_once(':').map_or("", |(_, o)| o);
            match self.tmpfs_bytes(opts) {
                Ok(Some(size)) if size > self.max_tmpfs_size => over(
                    out,
                    "tmpfs",
                    &human(size),
                    "max_tmpfs_size",
                    &human(self.max_tmpfs_size),
                ),
                Err(why) if !shown.takes_variable("tmpfs") => {
                    out.push(format!("tmpfs {why}"));
                }
                _ => {}
            }
        }
        if let Some(Value::Array(vols)) = get("volumes") {
            for m in vols.iter().filter_map(Mount::parse) {
                let size = m.tmpfs_size;
                if m.kind == MountKind::Tmpfs
                    && let Some(s) = size
                    && as_u64(s).is_none()
                {
                    let hint = format!(
                        "write it as 64m, up to budget.max_tmpfs_size {}",
                        human(self.max_tmpfs_size)
                    );
                    shown.unread(out, "volumes tmpfs.size", s, "a size", &hint);
                }
                if m.kind == MountKind::Tmpfs
                    && let Some(size) = size.and_then(as_u64)
                    && size > self.max_tmpfs_size
                {
                    over(
                        out,
                        "volumes tmpfs",
                        &human(size),
                        "max_tmpfs_size",
                        &human(self.max_tmpfs_size),
                    );
                }
            }
        }

        // Memory and CPUs above the host's.
        for key in [
            "mem_limit",
            "mem_reservation",
            "deploy.resources.limits.memory",
            "deploy.resources.reservations.memory",
        ] {
            if let Some(v) = get(key)
                && as_u64(v).is_none()
            {
                shown.unread(out, key, v, "a size", "write it as 512m");
            }
        }
        if let Some(max) = self.max_memory {
            for key in [
                "mem_limit",
                "mem_reservation",
                "deploy.resources.limits.memory",
                "deploy.resources.reservations.memory",
            ] {
                if let Some(size) = get(key).and_then(as_u64)
                    && size > max
                {
                    over(out, key, &human(size), "max_memory", &human(max));
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
                if let Some(n) = get(key).and_then(as_f64)
                    && n > max
                {
                    over(out, key, &n.to_string(), "max_cpus", &max.to_string());
                }
            }
        }
        // A weight, not a limit: under contention a container with 262144 (dockerd's maximum)
        // gets 256 times the CPU of one left at docker's 1024, whatever its `cpus`.
        if let Some(n) = get("cpu_shares").and_then(as_i64)
            && n > 0
            && n as u64 > self.max_cpu_shares
        {
            over(
                out,
                "cpu_shares",
                &n.to_string(),
                "max_cpu_shares",
                &self.max_cpu_shares.to_string(),
            );
        }

        // Time the daemon spends on the project.
        for key in [
            "stop_grace_period",
            "healthcheck.interval",
            "healthcheck.start_interval",
        ] {
            if let Some(v) = get(key)
                && as_duration(v).is_none()
            {
                shown.unread(out, key, v, "a duration", "write it as 30s or 1m30s");
            }
        }
        if let Some(d) = get("stop_grace_period").and_then(as_duration)
            && d > self.max_stop_grace_period
        {
            over(
                out,
                "stop_grace_period",
                &secs(d),
                "max_stop_grace_period",
                &secs(self.max_stop_grace_period),
            );
        }
        // The daemon runs the check every interval for as long as the container runs, whatever
        // its restart policy: a service that never restarts but runs for days is checked as often.
        let disabled = get("healthcheck.disable").is_some_and(|d| d == &Value::Bool(true));
        if !disabled {
            for key in ["healthcheck.interval", "healthcheck.start_interval"] {
                if let Some(d) = get(key).and_then(as_duration)
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

        // Logs on the box's disk.
        if let Some(logging) = get("logging").and_then(Value::as_object) {
            let driver = logging.get("driver").and_then(Value::as_str).map(str::trim);
            let opts = logging.get("options").and_then(Value::as_object);
            let opt = |k: &str| opts.and_then(|o| o.get(k)).filter(|v| !v.is_null());
            // The agent supplies the box's max-size to json-file without one; on compose's
            // model with the override in force, a json-file still without one means it did
            // not land.
            if driver == Some("json-file") && opt("max-size").is_none() && need_pids {
                out.push(format!(
                    "logging json-file without max-size (the box's {} was not supplied)",
                    human(self.default_log_size)
                ));
            }
            if matches!(driver, Some("json-file" | "local")) {
                // The daemon reads max-size with Go's float syntax (`1e3g` is 1000 GB on a
                // current dockerd): a size this check cannot read is refused, never skipped.
                if let Some(v) = opt("max-size")
                    && as_u64(v).is_none()
                {
                    let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    out.push(format!(
                        "{} is not a size the budget reads (write it as 10m, up to budget.max_log_size {})",
                        shown.show("logging max-size", &text),
                        human(self.max_log_size)
                    ));
                }
                if let Some(size) = opt("max-size").and_then(as_u64)
                    && size > self.max_log_size
                {
                    over(
                        out,
                        "logging max-size",
                        &human(size),
                        "max_log_size",
                        &human(self.max_log_size),
                    );
                }
                if let Some(n) = opt("max-file").and_then(as_i64)
                    && n > 0
                    && n as u64 > self.max_log_files
                {
                    over(
                        out,
                        "logging max-file",
                        &n.to_string(),
                        "max_log_files",
                        &self.max_log_files.to_string(),
                    );
                }
            }
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
                let n = name.trim().to_ascii_lowercase();
                if matches!(n.as_str(), "nproc" | "sigpending" | "msgqueue") {
                    let value = match v {
                        Value::Object(m) => {
                            let part =
                                |k: &str| m.get(k).map_or_else(|| "-".into(), |x| x.to_string());
                            format!("{}/{}", part("soft"), part("hard"))
                        }
                        other => other
                            .as_str()
                            .map_or_else(|| other.to_string(), str::to_string),
                    };
                    out.push(format!("{service}: ulimits {} {value}", name.trim()));
                }
            }
        }
        out
    }

    /// [`budget_override`](Self::budget_override) of a compose file as the bundle carries it
    /// (anchors and merge keys expanded); `None` when it cannot be parsed (the policy refuses
    /// it) or nothing needs supplying.
    #[must_use]
    pub fn budget_override_for(&self, compose_yaml: &str) -> Option<String> {
        let doc = crate::checks::parse_compose(compose_yaml).ok()?;
        self.budget_override(doc.get("services")?.as_object()?)
    }

    /// The compose override that supplies what a service leaves to the box: a pids limit
    /// ([`default_pids`](Self::default_pids)) and a memory limit
    /// ([`default_memory`](Self::default_memory)), each no more than the project's share, to a
    /// service without one of its own (directly or through the service it `extends`), and the
    /// `json-file` driver with [`default_log_size`](Self::default_log_size) and
    /// [`default_log_files`](Self::default_log_files) to one that names no logging driver.
    /// `None` when nothing needs supplying. JSON, which compose reads as YAML; service names
    /// are the file's own keys.
    #[must_use]
    pub fn budget_override(&self, services: &Map<String, Value>) -> Option<String> {
        let mut out = Map::new();
        for part in [
            self.supplied_pids(services),
            self.supplied_memory(services),
            self.supplied_logging(services),
        ] {
            for (name, fragment) in part {
                merge_into(
                    out.entry(name).or_insert_with(|| Value::Object(Map::new())),
                    fragment,
                );
            }
        }
        if out.is_empty() {
            return None;
        }
        let mut text = String::new();
        let _ = write!(text, "{}", serde_json::json!({ "services": out }));
        Some(text)
    }

    /// The pids limit of each service that sets none: `default_pids`, or the project's share
    /// of `max_project_pids` left by the services that set one, when that is smaller.
    fn supplied_pids(&self, services: &Map<String, Value>) -> Map<String, Value> {
        let own = |name: &str| {
            inherited(services, name, &["pids_limit"])
                .or_else(|| inherited(services, name, &["deploy", "resources", "limits", "pids"]))
        };
        let each = self.supplied_share(
            services,
            &own,
            &|v| as_i64(v).map(|n| n.max(0) as u64),
            Some(self.max_project_pids),
            self.default_pids,
        );
        self.supply(services, &own, "pids_limit", "pids", &Value::from(each))
    }

    /// The memory limit of each service that sets none (or sets 0, no limit): `default_memory`,
    /// or the project's share of `max_project_memory`, when that is smaller.
    fn supplied_memory(&self, services: &Map<String, Value>) -> Map<String, Value> {
        let own = |name: &str| {
            inherited(services, name, &["deploy", "resources", "limits", "memory"])
                .or_else(|| inherited(services, name, &["mem_limit"]))
                .filter(|v| as_u64(v) != Some(0))
        };
        let each = self.supplied_share(
            services,
            &own,
            &as_u64,
            self.project_memory(),
            self.memory_default(),
        );
        // compose's schema takes `deploy.resources.limits.memory` only as a string.
        self.supply(
            services,
            &own,
            "mem_limit",
            "memory",
            &Value::String(each.to_string()),
        )
    }

    /// What each container without its own limit gets: the default, or the share of `max`
    /// left by the containers with a readable one. A limit the budget cannot read counts
    /// nothing here; compose's model, where it is known, is judged against the total.
    fn supplied_share<'a>(
        &self,
        services: &'a Map<String, Value>,
        own: &dyn Fn(&str) -> Option<&'a Value>,
        read: &dyn Fn(&Value) -> Option<u64>,
        max: Option<u64>,
        default: u64,
    ) -> u64 {
        let (mut explicit, mut unlimited) = (0u64, 0u64);
        for (name, svc) in services {
            let n = svc.as_object().map_or(1, containers_of);
            match own(name) {
                Some(v) => {
                    explicit = explicit.saturating_add(read(v).unwrap_or(0).saturating_mul(n))
                }
                None => unlimited = unlimited.saturating_add(n),
            }
        }
        Self::share(max, explicit, unlimited, default).unwrap_or(default)
    }

    /// `{name: {top_key: each}}` for each service without `own` limit. compose refuses a
    /// top-level limit that differs from `deploy.resources.limits`, which it reads as 0 when a
    /// service has other deploy limits: the limit goes where the service keeps its limits.
    fn supply<'a>(
        &self,
        services: &'a Map<String, Value>,
        own: &dyn Fn(&str) -> Option<&'a Value>,
        top_key: &str,
        deploy_key: &str,
        each: &Value,
    ) -> Map<String, Value> {
        let mut out = Map::new();
        for name in services.keys() {
            if own(name).is_some() {
                continue;
            }
            let deploy_limits = inherited(services, name, &["deploy", "resources", "limits"])
                .is_some_and(Value::is_object);
            let supplied = if deploy_limits {
                serde_json::json!({ "deploy": { "resources": { "limits": { deploy_key: each } } } })
            } else {
                serde_json::json!({ top_key: each })
            };
            out.insert(name.clone(), supplied);
        }
        out
    }

    /// `json-file` with the box's `max-size` and `max-file` for each service that names no
    /// logging driver, and the box's `max-size` (and `max-file`, unless set) for one that names
    /// `json-file` without a `max-size`; its own options kept (compose replaces a `logging` whose driver differs
    /// from the override's, so they are carried over) and judged as `json-file` reads them.
    fn supplied_logging(&self, services: &Map<String, Value>) -> Map<String, Value> {
        let mut out = Map::new();
        for name in services.keys() {
            let logging = inherited(services, name, &["logging"]);
            let driver = logging
                .and_then(|l| l.get("driver"))
                .filter(|d| !d.is_null());
            let json_file = driver.and_then(Value::as_str).map(str::trim) == Some("json-file");
            let unbounded_json_file = json_file
                && logging
                    .and_then(|l| l.get("options"))
                    .and_then(|o| o.get("max-size"))
                    .is_none_or(Value::is_null);
            if driver.is_some_and(|d| d.as_str() != Some("")) && !unbounded_json_file {
                continue;
            }
            let mut options = logging
                .and_then(|l| l.get("options"))
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            options
                .entry("max-size")
                .or_insert_with(|| Value::String(self.default_log_size.to_string()));
            options
                .entry("max-file")
                .or_insert_with(|| Value::String(self.default_log_files.to_string()));
            out.insert(
                name.clone(),
                serde_json::json!({ "logging": { "driver": "json-file", "options": options } }),
            );
        }
        out
    }
}

/// A size as the kernel's tmpfs reads one (`memparse`): an integer in C's notation (`0x` hex,
/// a leading `0` octal, else decimal; no digits at all is 0), then at most one of the suffixes
/// `k`, `m`, `g`, `t`, `p`, `e` (either case, binary), then, for `size=` alone, an optional
/// `%` of the host's memory. `1e` is an exbibyte, `0x40000000` a gibibyte, `010m` 8 MiB, and
/// `1.5g` fails the mount. `None` for anything else, and for a number past 64 bits (the kernel
/// wraps it silently).
///
/// ```
/// use monky_bundle::budget::{parse_kernel_size, KernelSize};
/// assert_eq!(parse_kernel_size("1e"), Some(KernelSize::Bytes(1 << 60)));
/// assert_eq!(parse_kernel_size("0x400k"), Some(KernelSize::Bytes(1 << 20)));
/// assert_eq!(parse_kernel_size("50%"), Some(KernelSize::Percent(50)));
/// assert_eq!(parse_kernel_size("1.5g"), None);
/// ```
#[must_use]
pub fn parse_kernel_size(text: &str) -> Option<KernelSize> {
    let (n, rest) = memparse(text)?;
    match rest {
        "" => Some(KernelSize::Bytes(n)),
        "%" => Some(KernelSize::Percent(n)),
        _ => None,
    }
}

/// A tmpfs size as [`parse_kernel_size`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSize {
    /// Bytes; 0 is no limit at all.
    Bytes(u64),
    /// A share of the host's memory, in percent (it may be over 100).
    Percent(u64),
}

/// `memparse`'s number and suffix, and the text after them; `None` past 64 bits.
fn memparse(text: &str) -> Option<(u64, &str)> {
    let b = text.as_bytes();
    let (radix, start) =
        if b.len() > 2 && b[0] == b'0' && (b[1] | 0x20) == b'x' && b[2].is_ascii_hexdigit() {
            (16, 2)
        } else if b.first() == Some(&b'0') {
            (8, 0)
        } else {
            (10, 0)
        };
    let end = text[start..]
        .find(|c: char| !c.is_digit(radix))
        .map_or(text.len(), |i| start + i);
    let n = if end == start {
        0
    } else {
        u64::from_str_radix(&text[start..end], radix).ok()?
    };
    let mut rest = &text[end..];
    let shift = match rest.bytes().next().map(|c| c | 0x20) {
        Some(b'e') => 60,
        Some(b'p') => 50,
        Some(b't') => 40,
        Some(b'g') => 30,
        Some(b'm') => 20,
        Some(b'k') => 10,
        _ => 0,
    };
    if shift > 0 {
        rest = &rest[1..];
    }
    let n = n.checked_mul(1u64 << shift)?;
    Some((n, rest))
}

/// A page as tmpfs counts `nr_inodes` against its size: the budget allows one inode per page
/// of [`Budget::max_tmpfs_size`], the kernel's own default ratio.
const PAGE: u64 = 4096;

/// What one service takes of the project's totals, per container where it says so.
#[derive(Debug, Default, Clone, Copy)]
struct Claim {
    containers: u64,
    /// Its own pids limit (positive), per container.
    pids: Option<u64>,
    /// Its own memory limit (non-zero), per container.
    memory: Option<u64>,
    /// tmpfs and shm bytes, per container.
    scratch: u64,
    /// Host ports it publishes, all containers together.
    ports: u64,
}

/// The containers of a service: `deploy.replicas`, else `scale`, else one (compose refuses the
/// two when they differ). A count the budget cannot read counts one; the service's own check
/// refuses it.
fn containers_of(svc: &Map<String, Value>) -> u64 {
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

/// The value at `path` in `services[name]`, or in the service it `extends` within the file
/// (a bounded number of hops), as compose inherits it.
fn inherited<'a>(services: &'a Map<String, Value>, name: &str, path: &[&str]) -> Option<&'a Value> {
    let mut name = name;
    for _ in 0..16 {
        let s = services.get(name)?;
        let mut v = Some(s);
        for k in path {
            v = v.and_then(|x| x.get(*k));
        }
        if let Some(v) = v.filter(|v| !v.is_null()) {
            return Some(v);
        }
        let ext = s.get("extends")?;
        if ext.get("file").is_some() {
            return None;
        }
        name = ext.get("service").and_then(Value::as_str)?;
    }
    None
}

/// The host ports one `ports` entry takes, for `containers` containers: a fixed port or range
/// its size, an ephemeral one (no host port) one per container and container port.
fn ports_taken(p: &Value, containers: u64) -> u64 {
    let (published, target) = match p {
        Value::String(s) => {
            let spec = s.split('/').next().unwrap_or(s);
            (
                short_published(s),
                spec.rsplit(':').next().map(str::to_string),
            )
        }
        Value::Object(m) => (
            m.get("published").and_then(|v| match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            }),
            m.get("target")
                .map(|t| t.as_str().map_or_else(|| t.to_string(), str::to_string)),
        ),
        _ => (None, None),
    };
    let size = |t: &str| port_range(t).map_or(1, |(a, b)| u64::from(b - a + 1));
    match published.filter(|p| !p.trim().is_empty()) {
        Some(p) => size(&p),
        None => target.as_deref().map_or(1, size).saturating_mul(containers),
    }
}

impl Budget {
    /// The project's memory total, when one is known.
    fn project_memory(&self) -> Option<u64> {
        self.max_project_memory.or(self.max_memory)
    }

    /// The project's tmpfs and shm total, when one is known.
    fn project_tmpfs(&self) -> Option<u64> {
        self.max_project_tmpfs.or(self.max_memory.map(|m| m / 2))
    }

    /// The memory limit supplied to one container: the default, never above `max_memory`.
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

    fn memory_default(&self) -> u64 {
        self.max_memory
            .map_or(self.default_memory, |m| self.default_memory.min(m))
    }

    /// What the agent supplies to each of `unlimited` containers when the others take
    /// `explicit` of a total `max`: the default, or the share left when it is smaller. `None`
    /// when the share falls under an eighth of the default (a limit so small would starve an
    /// ordinary service: the bundle must set its own) or `explicit` alone is over.
    fn share(max: Option<u64>, explicit: u64, unlimited: u64, default: u64) -> Option<u64> {
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

    /// Bytes of one tmpfs mount's options (`size=64m,mode=1777`) as the kernel reads them:
    /// `Ok(None)` without a size, `Err` a finding's text for what the budget cannot allow.
    fn tmpfs_bytes(&self, opts: &str) -> Result<Option<u64>, String> {
        let limit = human(self.max_tmpfs_size);
        let mut bytes = None;
        for o in opts.split(',') {
            let (name, value) = o.split_once('=').unwrap_or((o, ""));
            match name.trim() {
                "size" => match parse_kernel_size(value) {
                    Some(KernelSize::Bytes(0)) => {
                        return Err(format!(
                            "{o} (unlimited) over budget.max_tmpfs_size {limit}"
                        ));
                    }
                    Some(KernelSize::Bytes(n)) => bytes = Some(n),
                    Some(KernelSize::Percent(pct)) => match self.max_memory {
                        Some(m) => {
                            bytes = Some(
                                ((u128::from(m) * u128::from(pct)) / 100).min(u128::from(u64::MAX))
                                    as u64,
                            )
                        }
                        None => {
                            return Err(format!(
                                "{o} is a share of the host's memory, which the budget does not know (write it as size=64m, up to budget.max_tmpfs_size {limit})"
                            ));
                        }
                    },
                    None => {
                        return Err(format!(
                            "{o} is not a size the kernel reads as the budget does (write it as size=64m, up to budget.max_tmpfs_size {limit})"
                        ));
                    }
                },
                // The kernel takes the last of `size=` and `nr_blocks=`; a size in pages is
                // refused rather than read against a page size the budget cannot see.
                "nr_blocks" => {
                    return Err(format!(
                        "{o} is a size in pages the budget does not read (write it as size=64m, up to budget.max_tmpfs_size {limit})"
                    ));
                }
                // Inodes cost kernel memory outside the size: 0 is no limit.
                "nr_inodes" => {
                    let most = self.max_tmpfs_size / PAGE;
                    match memparse(value) {
                        Some((0, "")) => {
                            return Err(format!(
                                "{o} (unlimited) over budget.max_tmpfs_size {limit} (one inode per 4 KiB: {most})"
                            ));
                        }
                        Some((n, "")) if n <= most => {}
                        Some((_, "")) => {
                            return Err(format!(
                                "{o} over budget.max_tmpfs_size {limit} (one inode per 4 KiB: {most})"
                            ));
                        }
                        _ => {
                            return Err(format!(
                                "{o} is not a count the kernel reads as the budget does (up to {most}, one inode per 4 KiB of budget.max_tmpfs_size {limit})"
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(bytes)
    }

    /// What one service takes of the project's totals.
    fn claim(&self, svc: &Map<String, Value>) -> Claim {
        let containers = containers_of(svc);
        let get = |path: &[&str]| -> Option<&Value> {
            let mut v = svc.get(path[0]);
            for k in &path[1..] {
                v = v?.get(*k);
            }
            v.filter(|v| !v.is_null())
        };
        let pids = [
            &["pids_limit"][..],
            &["deploy", "resources", "limits", "pids"],
        ]
        .iter()
        .filter_map(|p| get(p).and_then(as_i64))
        .find(|n| *n > 0)
        .map(|n| n as u64);
        let memory = [
            &["deploy", "resources", "limits", "memory"][..],
            &["mem_limit"],
        ]
        .iter()
        .filter_map(|p| get(p).and_then(as_u64))
        .find(|n| *n > 0);
        let mut scratch = get(&["shm_size"]).and_then(as_u64).unwrap_or(0);
        for t in tmpfs_entries(get(&["tmpfs"])) {
            let opts = t.split_once(':').map_or("", |(_, o)| o);
            if let Ok(Some(n)) = self.tmpfs_bytes(opts) {
                scratch = scratch.saturating_add(n);
            }
        }
        if let Some(Value::Array(vols)) = get(&["volumes"]) {
            for m in vols.iter().filter_map(Mount::parse) {
                if m.kind == MountKind::Tmpfs
                    && let Some(n) = m.tmpfs_size.and_then(as_u64)
                {
                    scratch = scratch.saturating_add(n);
                }
            }
        }
        let ports = match get(&["ports"]) {
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
            scratch,
            ports,
        }
    }

    /// The project's totals: containers, published ports, tmpfs and shm, and the pids and
    /// memory limits (a container without a limit of its own counts what the agent supplies).
    fn totals(&self, top: &Map<String, Value>, out: &mut Vec<String>) {
        let Some(services) = top.get("services").and_then(Value::as_object) else {
            return;
        };
        let claims: Vec<Claim> = services
            .values()
            .filter_map(Value::as_object)
            .map(|s| self.claim(s))
            .collect();
        let sum = |f: &dyn Fn(&Claim) -> u64| claims.iter().map(f).fold(0u64, u64::saturating_add);
        let containers = sum(&|c| c.containers);
        if containers > self.max_project_containers {
            out.push(format!(
                "project: containers {containers} over budget.max_project_containers {}",
                self.max_project_containers
            ));
        }
        let ports = sum(&|c| c.ports);
        if ports > self.max_project_ports {
            out.push(format!(
                "project: published ports {ports} over budget.max_project_ports {}",
                self.max_project_ports
            ));
        }
        let volumes = top
            .get("volumes")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|v| v.values())
            .filter_map(|v| self.tmpfs_volume(v).ok().flatten())
            .fold(0u64, u64::saturating_add);
        let scratch = sum(&|c| c.scratch.saturating_mul(c.containers)).saturating_add(volumes);
        if let Some(max) = self.project_tmpfs()
            && scratch > max
        {
            out.push(format!(
                "project: tmpfs and shm {} over budget.max_project_tmpfs {}",
                human(scratch),
                human(max)
            ));
        }
        let limited = |f: &dyn Fn(&Claim) -> Option<u64>| {
            let explicit = sum(&|c| f(c).unwrap_or(0).saturating_mul(c.containers));
            let unlimited = sum(&|c| if f(c).is_none() { c.containers } else { 0 });
            (explicit, unlimited)
        };
        let (explicit, unlimited) = limited(&|c| c.pids);
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
        let (explicit, unlimited) = limited(&|c| c.memory);
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

    /// The size of a top-level volume of the local driver's tmpfs shape
    /// (`driver_opts: {type: tmpfs, o: size=...}`), as the kernel reads its `o`.
    fn tmpfs_volume(&self, vol: &Value) -> Result<Option<u64>, String> {
        let Some(opts) = vol.get("driver_opts") else {
            return Ok(None);
        };
        if opts.get("type").and_then(Value::as_str) != Some("tmpfs") {
            return Ok(None);
        }
        match opts.get("o").and_then(Value::as_str) {
            Some(o) => self.tmpfs_bytes(o),
            None => Ok(None),
        }
    }
}

impl Budget {
    /// On compose's model with the agent's override in force: a service without a memory
    /// limit of its own shows that the supplied one did not land, so it is refused.
    fn supplied_limits(&self, svc: &Map<String, Value>, supplied: bool, out: &mut Vec<String>) {
        if supplied && self.claim(svc).memory.is_none() {
            let most = self.max_memory.map_or_else(String::new, |m| {
                format!(" up to budget.max_memory {}", human(m))
            });
            out.push(format!("no memory limit (set mem_limit{most})"));
        }
    }

    /// Logging that the box's disk or journal pays for, whatever shape it takes. A service that
    /// names no driver (no `logging`, `driver: ""`, `options` alone) would get the daemon's
    /// default driver with the bundle's options over `daemon.json`'s, so the agent supplies
    /// `json-file` with the box's defaults and the bundle's options are judged as `json-file`
    /// reads them; on compose's model (`supplied`) every service must then show a driver.
    fn logging_bounds(
        &self,
        svc: &Map<String, Value>,
        shown: &Shown<'_>,
        supplied: bool,
        out: &mut Vec<String>,
    ) {
        let logging = svc.get("logging").filter(|v| !v.is_null());
        let opts = logging
            .and_then(|l| l.get("options"))
            .and_then(Value::as_object);
        match logging
            .and_then(|l| l.get("driver"))
            .filter(|d| !d.is_null())
        {
            None => {}
            Some(Value::String(d)) if d.is_empty() => {}
            Some(Value::String(d)) if d == "journald" => {
                if !self.allow_journald {
                    out.push(format!(
                        "{} writes to the host's journal, shared with the host and every env, which no budget bounds (allowed by budget.allow_journald)",
                        shown.show("logging driver", d)
                    ));
                }
                return;
            }
            Some(Value::String(d)) if d == "json-file" || d == "local" => {
                self.log_files(opts, shown, out);
                return;
            }
            Some(_) => return,
        }
        if supplied {
            out.push(format!(
                "logging names no driver (the box's json-file with max-size {} was not supplied)",
                human(self.default_log_size)
            ));
            return;
        }
        if let Some(size) = opts
            .and_then(|o| o.get("max-size"))
            .filter(|v| !v.is_null())
        {
            let hint = format!(
                "write it as 10m, up to budget.max_log_size {}",
                human(self.max_log_size)
            );
            match as_u64(size) {
                None => shown.unread(out, "logging max-size", size, "a size", &hint),
                Some(n) if n > self.max_log_size => out.push(format!(
                    "{} over budget.max_log_size {}",
                    shown.show("logging max-size", &human(n)),
                    human(self.max_log_size)
                )),
                Some(_) => {}
            }
        }
        self.log_files(opts, shown, out);
        if let Some(n) = opts
            .and_then(|o| o.get("max-file"))
            .and_then(as_i64)
            .filter(|n| *n > 0 && *n as u64 > self.max_log_files)
        {
            out.push(format!(
                "{} over budget.max_log_files {}",
                shown.show("logging max-file", &n.to_string()),
                self.max_log_files
            ));
        }
    }

    /// A `max-file` the daemon reads as a whole number (`strconv.Atoi`); anything else is
    /// refused rather than skipped.
    fn log_files(
        &self,
        opts: Option<&Map<String, Value>>,
        shown: &Shown<'_>,
        out: &mut Vec<String>,
    ) {
        if let Some(v) = opts
            .and_then(|o| o.get("max-file"))
            .filter(|v| !v.is_null())
            && as_i64(v).is_none()
        {
            let hint = format!(
                "write it as \"3\", up to budget.max_log_files {}",
                self.max_log_files
            );
            shown.unread(out, "logging max-file", v, "a count", &hint);
        }
    }

    /// `ulimits` the kernel counts per user id across the whole host (`nproc`, `sigpending`,
    /// `msgqueue`). Such a limit binds only the container that asks for it (another env's
    /// containers at the same uid use up its count, never the other way round), and the
    /// container's own processes and memory are bounded by `pids_limit` and its memory limit:
    /// each applies up to its budget key. A value this check cannot read, or unlimited, is
    /// refused rather than passed.
    fn per_uid_ulimits(&self, svc: &Map<String, Value>, shown: &Shown<'_>, out: &mut Vec<String>) {
        let Some(ulimits) = svc.get("ulimits").and_then(Value::as_object) else {
            return;
        };
        for (name, v) in ulimits {
            let n = name.trim().to_ascii_lowercase();
            let (key, cap) = match n.as_str() {
                "nproc" => ("max_ulimit_nproc", self.max_ulimit_nproc),
                "sigpending" => ("max_ulimit_sigpending", self.max_ulimit_sigpending),
                "msgqueue" => ("max_ulimit_msgqueue", self.max_ulimit_msgqueue),
                _ => continue,
            };
            let value = match v {
                Value::Object(m) => {
                    let part = |k: &str| m.get(k).map_or_else(|| "-".into(), |x| x.to_string());
                    format!("{}/{}", part("soft"), part("hard"))
                }
                other => other
                    .as_str()
                    .map_or_else(|| other.to_string(), str::to_string),
            };
            let label = format!("ulimits {}", name.trim());
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

/// Merges `src` into `dst`, objects key by key (the override's fragments of one service).
fn merge_into(dst: &mut Value, src: Value) {
    match (dst, src) {
        (Value::Object(d), Value::Object(s)) => {
            for (k, v) in s {
                merge_into(d.entry(k).or_insert(Value::Null), v);
            }
        }
        (d, s) => *d = s,
    }
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

/// The entries of a service's `tmpfs` (one string or a list).
fn tmpfs_entries(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_matches_the_documented_numbers() {
        let b = Budget::default();
        assert_eq!(
            (b.max_pids, b.default_pids, b.max_replicas),
            (4096, 1024, 10)
        );
        assert_eq!((b.max_services, b.max_networks), (40, 6));
        assert_eq!(b.min_published_port, 1024);
        assert_eq!(b.reserved_ports, [22, 8200, 8201, 18200, 18443]);
        assert_eq!(b.max_port_range, 100);
        assert_eq!((b.max_shm_size, b.max_tmpfs_size), (GIB, GIB));
        assert_eq!((b.max_memory, b.max_cpus), (None, None));
        assert_eq!(b.max_stop_grace_period, Duration::from_secs(300));
        assert_eq!(b.min_healthcheck_interval, Duration::from_secs(1));
        assert_eq!((b.max_log_size, b.max_log_files), (100 * MIB, 10));
    }

    #[test]
    fn sizes_read_as_docker_reads_them() {
        for (text, want) in [
            ("1024", Some(1024)),
            ("1g", Some(GIB)),
            ("1G", Some(GIB)),
            ("1gb", Some(GIB)),
            ("1GiB", Some(GIB)),
            ("1.5g", Some(GIB + GIB / 2)),
            ("64m", Some(64 * MIB)),
            ("100 kb", Some(100 * KIB)),
            ("512b", Some(512)),
            ("1073741824", Some(GIB)),
            ("", None),
            ("g", None),
            ("-1g", None),
            ("1x", None),
            ("1gbb", None),
            (".5g", None),
        ] {
            assert_eq!(parse_size(text), want, "{text:?}");
        }
    }

    #[test]
    fn durations_read_as_compose_reads_them() {
        for (text, want) in [
            ("1m30s", Some(90_000)),
            ("1h", Some(3_600_000)),
            ("1000h", Some(3_600_000_000)),
            ("1.5s", Some(1500)),
            ("500ms", Some(500)),
            ("1ms", Some(1)),
            ("0", Some(0)),
            ("10", None),
            ("1d", None),
            ("-1s", None),
            ("", None),
        ] {
            assert_eq!(
                parse_duration(text).map(|d| d.as_millis() as u64),
                want,
                "{text:?}"
            );
        }
    }

    #[test]
    fn published_ports_of_the_short_syntax() {
        for (spec, want) in [
            ("8080:80", Some("8080")),
            ("8080:80/udp", Some("8080")),
            ("127.0.0.1:9000-9002:9000-9002", Some("9000-9002")),
            ("[::1]:8081:81", Some("8081")),
            ("127.0.0.1::80", Some("")),
            ("80", None),
            ("3000-3005", None),
        ] {
            assert_eq!(short_published(spec).as_deref(), want, "{spec}");
        }
        assert_eq!(port_range("10000-20000"), Some((10000, 20000)));
        assert_eq!(port_range(""), None);
    }

    fn judge(yaml: &str, budget: &Budget) -> Vec<String> {
        let doc = crate::checks::parse_compose(yaml).unwrap();
        budget.findings(&doc, &doc, false, false)
    }

    #[test]
    fn each_limit_names_its_key_value_and_limit() {
        let b = Budget {
            max_memory: Some(4 * GIB),
            max_cpus: Some(2.0),
            ..Budget::default()
        };
        for (body, want) in [
            (
                "pids_limit: -1",
                "web: pids_limit -1 (unlimited) over budget.max_pids 4096",
            ),
            (
                "pids_limit: 100000",
                "web: pids_limit 100000 over budget.max_pids 4096",
            ),
            ("scale: 1000", "web: scale 1000 over budget.max_replicas 10"),
            (
                "deploy: {replicas: 5000}",
                "web: deploy.replicas 5000 over budget.max_replicas 10",
            ),
            (
                "ports: [\"22:22\"]",
                "web: ports 22 below budget.min_published_port 1024",
            ),
            (
                "ports: [\"8200:8200\"]",
                "web: ports 8200 takes 8200, in budget.reserved_ports",
            ),
            (
                "ports: [\"10000-20000:80\"]",
                "web: ports 10000-20000 is 10001 ports, over budget.max_port_range 100",
            ),
            (
                "shm_size: 64g",
                "web: shm_size 64 GiB over budget.max_shm_size 1 GiB",
            ),
            (
                "tmpfs: [\"/run:size=8g\"]",
                "web: tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB",
            ),
            (
                "tmpfs: [\"/run:size=1m,size=8g\"]",
                "web: tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB",
            ),
            (
                "mem_limit: 64g",
                "web: mem_limit 64 GiB over budget.max_memory 4 GiB",
            ),
            ("cpus: 16", "web: cpus 16 over budget.max_cpus 2"),
            (
                "cpu_shares: 262144",
                "web: cpu_shares 262144 over budget.max_cpu_shares 1024",
            ),
            (
                "stop_grace_period: 1000h",
                "web: stop_grace_period 3600000s over budget.max_stop_grace_period 300s",
            ),
            (
                "restart: always\n    healthcheck: {test: [CMD, \"true\"], interval: 1ms}",
                "web: healthcheck.interval 1ms under budget.min_healthcheck_interval 1s",
            ),
            (
                "logging: {driver: local, options: {max-size: 10g}}",
                "web: logging max-size 10 GiB over budget.max_log_size 100 MiB",
            ),
        ] {
            let yaml = format!("services:\n  web:\n    image: x\n    {body}\n");
            let own: Vec<String> = judge(&yaml, &b)
                .into_iter()
                .filter(|f| !f.starts_with("project: "))
                .collect();
            assert_eq!(own, [want], "{body}");
        }
    }

    #[test]
    fn json_file_without_max_size_gets_the_boxs_and_keeps_its_own_options() {
        let b = Budget::default();
        let yaml = "services:\n  web:\n    image: x\n    logging: {driver: json-file, options: {max-file: \"2\", tag: web}}\n  api:\n    image: x\n    logging: {driver: json-file, options: {max-size: 5m}}\n";
        assert!(
            judge(yaml, &b).iter().all(|f| !f.contains("logging")),
            "{:?}",
            judge(yaml, &b)
        );
        let over: Value = serde_json::from_str(&b.budget_override_for(yaml).unwrap()).unwrap();
        assert_eq!(
            over["services"]["web"]["logging"],
            serde_json::json!({"driver": "json-file", "options": {"max-size": "10485760", "max-file": "2", "tag": "web"}})
        );
        assert!(over["services"]["api"].get("logging").is_none(), "{over}");
    }

    #[test]
    fn sizes_read_as_the_kernel_reads_tmpfs_options() {
        use KernelSize::{Bytes, Percent};
        for (text, want) in [
            ("64m", Some(Bytes(64 * MIB))),
            ("64M", Some(Bytes(64 * MIB))),
            ("1e", Some(Bytes(1 << 60))),
            ("1E", Some(Bytes(1 << 60))),
            ("1p", Some(Bytes(1 << 50))),
            ("1t", Some(Bytes(1 << 40))),
            ("0x40000000", Some(Bytes(GIB))),
            ("0X1e", Some(Bytes(30))),
            ("0x1g", Some(Bytes(GIB))),
            ("010m", Some(Bytes(8 * MIB))),
            ("0", Some(Bytes(0))),
            ("", Some(Bytes(0))),
            ("k", Some(Bytes(0))),
            ("50%", Some(Percent(50))),
            ("1k%", Some(Percent(1024))),
            ("1.5g", None),
            ("08", None),
            ("0x", None),
            ("1gb", None),
            ("1g ", None),
            ("-1", None),
            ("20000000000000000000", None),
            ("16e", None),
            ("50%%", None),
        ] {
            assert_eq!(parse_kernel_size(text), want, "{text:?}");
        }
    }

    #[test]
    fn a_value_the_budget_cannot_read_is_refused_never_skipped() {
        let b = Budget {
            max_memory: Some(16 * GIB),
            ..Budget::default()
        };
        for (body, want) in [
            (
                "tmpfs: [\"/run:size=1e\"]",
                "web: tmpfs 1 EiB over budget.max_tmpfs_size 1 GiB",
            ),
            (
                "tmpfs: [\"/run:size=0x40000001\"]",
                "web: tmpfs 1.0 GiB over budget.max_tmpfs_size 1 GiB",
            ),
            (
                "tmpfs: [\"/run:size=010g\"]",
                "web: tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB",
            ),
            (
                "tmpfs: [\"/run:size=0\"]",
                "web: tmpfs size=0 (unlimited) over budget.max_tmpfs_size 1 GiB",
            ),
            (
                "tmpfs: [\"/run:size=1.5g\"]",
                "web: tmpfs size=1.5g is not a size the kernel reads as the budget does (write it as size=64m, up to budget.max_tmpfs_size 1 GiB)",
            ),
            (
                "tmpfs: [\"/run:size=64m,nr_blocks=268435456\"]",
                "web: tmpfs nr_blocks=268435456 is a size in pages the budget does not read (write it as size=64m, up to budget.max_tmpfs_size 1 GiB)",
            ),
            (
                "tmpfs: [\"/run:size=64m,nr_inodes=0\"]",
                "web: tmpfs nr_inodes=0 (unlimited) over budget.max_tmpfs_size 1 GiB (one inode per 4 KiB: 262144)",
            ),
            (
                "tmpfs: [\"/run:size=64m,nr_inodes=1e\"]",
                "web: tmpfs nr_inodes=1e over budget.max_tmpfs_size 1 GiB (one inode per 4 KiB: 262144)",
            ),
            (
                "tmpfs: [\"/run:nr_inodes=1x\"]",
                "web: tmpfs nr_inodes=1x is not a count the kernel reads as the budget does (up to 262144, one inode per 4 KiB of budget.max_tmpfs_size 1 GiB)",
            ),
            (
                "tmpfs: [\"/run:size=50%\"]",
                "web: tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB",
            ),
            (
                "tmpfs: /run:size=1k%",
                "web: tmpfs 163.8 GiB over budget.max_tmpfs_size 1 GiB",
            ),
            (
                "volumes:\n  - type: tmpfs\n    target: /s\n    tmpfs: {size: 1e3g}",
                "web: volumes tmpfs.size 1e3g is not a size the budget reads (write it as 64m, up to budget.max_tmpfs_size 1 GiB)",
            ),
            (
                "shm_size: 1e3g",
                "web: shm_size 1e3g is not a size the budget reads (write it as 64m, up to budget.max_shm_size 1 GiB)",
            ),
            (
                "shm_size: 0x1p40",
                "web: shm_size 0x1p40 is not a size the budget reads (write it as 64m, up to budget.max_shm_size 1 GiB)",
            ),
            (
                "mem_limit: 1e3g",
                "web: mem_limit 1e3g is not a size the budget reads (write it as 512m)",
            ),
            (
                "deploy: {resources: {limits: {memory: Inf}}}",
                "web: deploy.resources.limits.memory Inf is not a size the budget reads (write it as 512m)",
            ),
            (
                "pids_limit: lots",
                "web: pids_limit lots is not a count the budget reads (write it as 512, up to budget.max_pids 4096)",
            ),
            (
                "scale: many",
                "web: scale many is not a count the budget reads (up to budget.max_replicas 10)",
            ),
            (
                "stop_grace_period: forever",
                "web: stop_grace_period forever is not a duration the budget reads (write it as 30s or 1m30s)",
            ),
            (
                "healthcheck: {interval: 1d}",
                "web: healthcheck.interval 1d is not a duration the budget reads (write it as 30s or 1m30s)",
            ),
            (
                "logging: {driver: local, options: {max-file: \"1e3\"}}",
                "web: logging max-file 1e3 is not a count the budget reads (write it as \"3\", up to budget.max_log_files 10)",
            ),
        ] {
            let yaml = format!(
                "services:\n  web:\n    image: x\n    {}\n",
                body.replace('\n', "\n    ")
            );
            let own: Vec<String> = judge(&yaml, &b)
                .into_iter()
                .filter(|f| !f.starts_with("project: "))
                .collect();
            assert_eq!(own, [want], "{body}");
        }
        // A tmpfs volume's `o` is read as the kernel reads it too.
        let yaml = "services:\n  web: {image: x, volumes: [\"m:/m\"]}\nvolumes:\n  m: {driver_opts: {type: tmpfs, device: tmpfs, o: \"size=1e\"}}\n";
        assert!(judge(yaml, &b).contains(
            &"volumes.m: driver_opts size 1 EiB over budget.max_tmpfs_size 1 GiB".to_string()
        ));
        // A percent size without the host's memory cannot be judged: refused.
        let yaml = "services:\n  web:\n    image: x\n    tmpfs: [\"/run:size=50%\"]\n";
        assert_eq!(
            judge(yaml, &Budget::default()),
            [
                "web: tmpfs size=50% is a share of the host's memory, which the budget does not know (write it as size=64m, up to budget.max_tmpfs_size 1 GiB)"
            ]
        );
    }

    #[test]
    fn every_logging_shape_is_bounded() {
        let b = Budget::default();
        for (body, want) in [
            // Options without a driver, or with an empty one: the daemon's default driver with
            // the bundle's options over daemon.json's. The agent supplies json-file and judges
            // the options as json-file reads them.
            (
                "logging: {options: {max-size: 1t, max-file: \"1000\"}}",
                &[
                    "web: logging max-size 1 TiB over budget.max_log_size 100 MiB",
                    "web: logging max-file 1000 over budget.max_log_files 10",
                ][..],
            ),
            (
                "logging: {driver: \"\", options: {max-size: 1t}}",
                &["web: logging max-size 1 TiB over budget.max_log_size 100 MiB"],
            ),
            (
                "logging: {options: {max-size: \"1e3g\"}}",
                &[
                    "web: logging max-size 1e3g is not a size the budget reads (write it as 10m, up to budget.max_log_size 100 MiB)",
                ],
            ),
            (
                "logging: {options: {max-file: many}}",
                &[
                    "web: logging max-file many is not a count the budget reads (write it as \"3\", up to budget.max_log_files 10)",
                ],
            ),
            (
                "logging: {driver: json-file, options: {max-size: 10m, max-file: x}}",
                &[
                    "web: logging max-file x is not a count the budget reads (write it as \"3\", up to budget.max_log_files 10)",
                ],
            ),
            // Nothing said: the box's defaults are supplied.
            ("logging: {options: {max-size: 10m}}", &[]),
            ("logging: {driver: \"\"}", &[]),
            ("logging: {driver: none}", &[]),
            ("restart: always", &[]),
        ] {
            let yaml = format!("services:\n  web:\n    image: x\n    {body}\n");
            assert_eq!(judge(&yaml, &b), want, "{body}");
        }
        let journald = "services:\n  web:\n    image: x\n    logging: {driver: journald}\n";
        assert_eq!(judge(journald, &b), Vec::<String>::new());
        let closed = Budget {
            allow_journald: false,
            ..Budget::default()
        };
        assert_eq!(
            judge(journald, &closed),
            [
                "web: logging driver journald writes to the host's journal, shared with the host and every env, which no budget bounds (allowed by budget.allow_journald)"
            ]
        );
    }

    #[test]
    fn on_the_model_every_service_shows_the_supplied_limits_and_driver() {
        let doc = crate::checks::parse_compose(
            "services:\n  bare: {image: x}\n  set: {image: x, pids_limit: 100, mem_limit: 1073741824, logging: {driver: json-file, options: {max-size: 10m}}}\n",
        )
        .unwrap();
        assert_eq!(
            Budget::default().findings(&doc, &doc, true, true),
            [
                "bare: no pids limit (set pids_limit up to budget.max_pids 4096)",
                "bare: no memory limit (set mem_limit)",
                "bare: logging names no driver (the box's json-file with max-size 10 MiB was not supplied)",
            ]
        );
    }

    #[test]
    fn ulimits_counted_per_host_uid_apply_up_to_their_keys() {
        // An elasticsearch-like service: applies as asked.
        for body in [
            "ulimits: {nproc: 4096, nofile: {soft: 65535, hard: 65535}, memlock: {soft: -1, hard: -1}}",
            "ulimits: {\" NPROC\": {soft: 10, hard: 20}}",
            "ulimits: {sigpending: 100}",
            "ulimits: {msgqueue: \"819200\"}",
        ] {
            let yaml = format!("services:\n  es:\n    image: x\n    mem_limit: 1g\n    {body}\n");
            assert_eq!(
                judge(&yaml, &Budget::default()),
                Vec::<String>::new(),
                "{body}"
            );
        }
        for (body, want) in [
            (
                "ulimits: {nproc: 100000}",
                "web: ulimits nproc 100000 over budget.max_ulimit_nproc 65536",
            ),
            (
                "ulimits: {nproc: {soft: 10, hard: 70000}}",
                "web: ulimits nproc 10/70000 over budget.max_ulimit_nproc 65536",
            ),
            (
                "ulimits: {nproc: -1}",
                "web: ulimits nproc -1 is unlimited or not a count this check can read: name a number, up to budget.max_ulimit_nproc 65536",
            ),
            (
                "ulimits: {msgqueue: 1e9}",
                "web: ulimits msgqueue 1000000000.0 is unlimited or not a count this check can read: name a number, up to budget.max_ulimit_msgqueue 8388608",
            ),
        ] {
            let yaml = format!("services:\n  web:\n    image: x\n    {body}\n");
            assert_eq!(judge(&yaml, &Budget::default()), [want], "{body}");
        }
        // The box's waiver: a higher key.
        let raised = Budget {
            max_ulimit_nproc: 200_000,
            ..Budget::default()
        };
        let yaml = "services:\n  web:\n    image: x\n    ulimits: {nproc: 100000}\n";
        assert_eq!(judge(yaml, &raised), Vec::<String>::new());
        let nofile =
            "services:\n  web:\n    image: x\n    ulimits: {nofile: {soft: 4096, hard: 4096}}\n";
        assert_eq!(judge(nofile, &Budget::default()), Vec::<String>::new());
    }

    #[test]
    fn each_project_total_names_its_key_value_and_limit() {
        let b = Budget {
            max_memory: Some(16 * GIB),
            ..Budget::default()
        };
        let many = |n: usize, body: &str| {
            let mut y = String::from("services:\n");
            for i in 0..n {
                y.push_str(&format!("  s{i}:\n    image: x\n    {body}\n"));
            }
            y
        };
        for (yaml, want) in [
            (
                many(7, "scale: 9"),
                "project: containers 63 over budget.max_project_containers 60",
            ),
            (
                many(3, "ports: [\"10000-10099:80\"]"),
                "project: published ports 300 over budget.max_project_ports 200",
            ),
            (
                many(
                    3,
                    "deploy: {replicas: 10}\n    ports: [\"127.0.0.1::80\", {target: 81}, \"3000-3004\"]",
                ),
                "project: published ports 210 over budget.max_project_ports 200",
            ),
            (
                many(30, "tmpfs: [\"/t:size=1g\"]"),
                "project: tmpfs and shm 30 GiB over budget.max_project_tmpfs 8 GiB",
            ),
            (
                many(9, "shm_size: 1g"),
                "project: tmpfs and shm 9 GiB over budget.max_project_tmpfs 8 GiB",
            ),
            (
                many(8, "pids_limit: 4096"),
                "project: pids limits 32768 over budget.max_project_pids 16384",
            ),
            (
                many(4, "pids_limit: 4000\n    scale: 2"),
                "project: pids limits 32000 over budget.max_project_pids 16384",
            ),
            (
                many(30, "mem_limit: 1g"),
                "project: memory limits 30 GiB over budget.max_project_memory 16 GiB",
            ),
        ] {
            let totals: Vec<String> = judge(&yaml, &b)
                .into_iter()
                .filter(|f| f.starts_with("project: "))
                .collect();
            assert_eq!(totals, [want], "{yaml}");
        }
        // A top-level tmpfs volume counts once; the project's own keys widen the totals.
        let wide = Budget {
            max_project_containers: 100,
            max_project_tmpfs: Some(64 * GIB),
            max_project_pids: 40000,
            max_project_memory: Some(64 * GIB),
            ..b.clone()
        };
        assert_eq!(
            judge(&many(8, "pids_limit: 4096\n    mem_limit: 4g"), &wide),
            Vec::<String>::new()
        );
    }

    #[test]
    fn ordinary_values_pass() {
        let yaml = "services:\n  web:\n    image: x\n    pids_limit: 512\n    scale: 2\n    ports: [\"8080:80\", \"127.0.0.1:5432:5432\", \"3000\", \"[::1]:9090:9090/udp\"]\n    shm_size: 256m\n    tmpfs: [/tmp, \"/run:size=64m,mode=1777\"]\n    stop_grace_period: 1m30s\n    restart: always\n    healthcheck: {test: [CMD, \"true\"], interval: 10s, start_interval: 1s}\n    logging: {driver: json-file, options: {max-size: 10m, max-file: \"3\"}}\n  worker:\n    image: x\n    logging: {driver: local}\n    healthcheck: {interval: 2s}\nnetworks: {a: {}, b: {}, c: {external: true}}\n";
        assert_eq!(judge(yaml, &Budget::default()), Vec::<String>::new());
    }

    #[test]
    fn project_counts() {
        let mut yaml = String::from("services:\n");
        for n in 0..41 {
            yaml.push_str(&format!("  s{n}:\n    image: x\n"));
        }
        yaml.push_str("networks:\n");
        for n in 0..7 {
            yaml.push_str(&format!("  n{n}: {{}}\n"));
        }
        assert_eq!(
            judge(&yaml, &Budget::default()),
            [
                "services 41 over budget.max_services 40",
                "networks 7 over budget.max_networks 6"
            ]
        );
    }

    fn override_of(yaml: &str, b: &Budget) -> Option<Value> {
        b.budget_override_for(yaml)
            .map(|t| serde_json::from_str(&t).unwrap())
    }

    #[test]
    fn the_override_supplies_pids_memory_and_logging_where_the_service_says_nothing() {
        let yaml = "services:\n  a: {image: x, pids_limit: 10, mem_limit: 1g, logging: {driver: local}}\n  b: {image: x, extends: {service: a}}\n  c: {image: x, deploy: {resources: {limits: {pids: 5, memory: 0}}}, logging: {driver: \"\", options: {max-file: \"2\"}}}\n  d: {image: x, logging: {options: {max-size: 1m}}}\n  e: {image: x, deploy: {resources: {limits: {cpus: \"1\"}}}, logging: {driver: none}}\n";
        let log = |opts: Value| serde_json::json!({"driver": "json-file", "options": opts});
        assert_eq!(
            override_of(yaml, &Budget::default()).unwrap(),
            serde_json::json!({"services": {
                "c": {"deploy": {"resources": {"limits": {"memory": "2147483648"}}},
                      "logging": log(serde_json::json!({"max-file": "2", "max-size": "10485760"}))},
                "d": {"pids_limit": 1024, "mem_limit": "2147483648",
                      "logging": log(serde_json::json!({"max-file": "3", "max-size": "1m"}))},
                "e": {"deploy": {"resources": {"limits": {"pids": 1024, "memory": "2147483648"}}}},
            }})
        );
        let only =
            "services:\n  a: {image: x, pids_limit: 10, mem_limit: 1g, logging: {driver: local}}\n";
        assert_eq!(override_of(only, &Budget::default()), None);
    }

    #[test]
    fn the_supplied_limits_shrink_to_the_projects_share() {
        // 19 containers without limits and 8 GiB for the project: 431 MiB and 862 pids each.
        let mut yaml = String::from("services:\n");
        for n in 0..19 {
            yaml.push_str(&format!(
                "  s{n}: {{image: x, logging: {{driver: local}}}}\n"
            ));
        }
        let b = Budget {
            max_memory: Some(8 * GIB),
            ..Budget::default()
        };
        let o = override_of(&yaml, &b).unwrap();
        assert_eq!(o["services"]["s0"]["pids_limit"], 16384 / 19);
        assert_eq!(o["services"]["s0"]["mem_limit"], (8 * GIB / 19).to_string());
        assert_eq!(judge(&yaml, &b), Vec::<String>::new());
        // With one container asking for 7.5 GiB, the rest would get too little: refused.
        yaml.push_str(
            "  big: {image: x, mem_limit: 7680m, pids_limit: 100, logging: {driver: local}}\n",
        );
        assert_eq!(
            judge(&yaml, &b),
            [
                "project: memory limits 7.5 GiB and 19 container(s) without one, each at least 256 MiB, over budget.max_project_memory 8 GiB"
            ]
        );
    }
}
