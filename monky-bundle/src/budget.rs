//! The fair share of a shared box: what one project may take of the host's processes, ports,
//! memory, CPUs, disk (logs) and docker's address pools, judged on compose's model (and on the
//! file before the lease where the values are literal). A finding gives no host access, so it
//! has its own code (`BUDGET_EXCEEDED`) and the box's admin waives it by raising the named key.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Map, Value};

/// The name of the override the agent writes next to a release's compose file to supply
/// [`Budget::default_pids`]: not a bundle member, so no bundle can carry or replace it.
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
    for (unit, size) in [("TiB", GIB * KIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)] {
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
    fn show(&self, key: &str, value: &str) -> String {
        let first = key.split(['.', ' ']).next().unwrap_or(key);
        crate::policy::key_value(
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
    /// `default_pids` to a service without a limit, so only the model, which carries the
    /// supplied value, may lack none.
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
            out.extend(found.into_iter().map(|f| format!("{name}: {f}")));
        }
        if let Some(vols) = top.get("volumes").and_then(Value::as_object) {
            for (name, vol) in vols {
                let shown = Shown {
                    model,
                    raw: raw.get("volumes").and_then(|s| s.get(name)),
                };
                if let Some(size) = tmpfs_driver_size(vol)
                    && size > self.max_tmpfs_size
                {
                    out.push(format!(
                        "volumes.{name}: {} over budget.max_tmpfs_size {}",
                        shown.show("driver_opts size", &human(size)),
                        human(self.max_tmpfs_size)
                    ));
                }
            }
        }
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
            let Some(n) = as_i64(v) else { continue };
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
        let tmpfs_mounts: Vec<String> = match get("tmpfs") {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        for t in tmpfs_mounts {
            let opts = t.split_once(':').map_or("", |(_, o)| o);
            if let Some(size) = self.tmpfs_option_size(opts)
                && size > self.max_tmpfs_size
            {
                over(
                    out,
                    "tmpfs",
                    &human(size),
                    "max_tmpfs_size",
                    &human(self.max_tmpfs_size),
                );
            }
        }
        if let Some(Value::Array(vols)) = get("volumes") {
            for v in vols {
                if v.get("type").and_then(Value::as_str) == Some("tmpfs")
                    && let Some(size) = v.get("tmpfs").and_then(|t| t.get("size")).and_then(as_u64)
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
            if driver == Some("json-file") && opt("max-size").is_none() {
                out.push(format!(
                    "logging json-file without max-size (set it up to budget.max_log_size {})",
                    human(self.max_log_size)
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

    /// The `size=` of tmpfs mount options (`size=64m,mode=1777`); `size=50%` is a share of the
    /// host's memory, known only when `max_memory` is.
    fn tmpfs_option_size(&self, opts: &str) -> Option<u64> {
        // The kernel takes the last `size=` of a mount's options.
        let size = opts
            .split(',')
            .rev()
            .find_map(|o| o.trim().strip_prefix("size="))?;
        match size.strip_suffix('%') {
            Some(pct) => {
                let pct: f64 = pct.trim().parse().ok()?;
                self.max_memory.map(|m| (m as f64 * pct / 100.0) as u64)
            }
            None => parse_size(size),
        }
    }

    /// [`pids_override`](Self::pids_override) of a compose file as the bundle carries it
    /// (anchors and merge keys expanded); `None` when it cannot be parsed (the policy refuses
    /// it) or every service sets a limit.
    #[must_use]
    pub fn pids_override_for(&self, compose_yaml: &str) -> Option<String> {
        let doc = crate::checks::parse_compose(compose_yaml).ok()?;
        self.pids_override(doc.get("services")?.as_object()?)
    }

    /// The compose override that supplies [`default_pids`](Self::default_pids) to every
    /// service of `compose_yaml` that sets no pids limit of its own (directly or through the
    /// service it `extends`), or `None` when every service sets one. JSON, which compose reads
    /// as YAML; service names are the file's own keys.
    #[must_use]
    pub fn pids_override(&self, services: &Map<String, Value>) -> Option<String> {
        fn has_pids<'a>(services: &'a Map<String, Value>, mut name: &'a str) -> bool {
            // Follow `extends.service` within the file, a bounded number of hops.
            for _ in 0..16 {
                let Some(s) = services.get(name) else {
                    return false;
                };
                let limits = s
                    .get("deploy")
                    .and_then(|d| d.get("resources"))
                    .and_then(|r| r.get("limits"));
                if s.get("pids_limit").is_some_and(|v| !v.is_null())
                    || limits
                        .and_then(|l| l.get("pids"))
                        .is_some_and(|v| !v.is_null())
                {
                    return true;
                }
                match s
                    .get("extends")
                    .and_then(|e| e.get("service"))
                    .and_then(Value::as_str)
                {
                    Some(next) if s.get("extends").and_then(|e| e.get("file")).is_none() => {
                        name = next
                    }
                    _ => return false,
                }
            }
            false
        }
        let mut out = Map::new();
        for (name, service) in services {
            if has_pids(services, name) {
                continue;
            }
            // compose refuses a `pids_limit` that differs from `deploy.resources.limits.pids`,
            // which it reads as 0 when a service has other deploy limits: the limit goes where
            // the service keeps its limits.
            let deploy_limits = service
                .get("deploy")
                .and_then(|d| d.get("resources"))
                .and_then(|r| r.get("limits"))
                .is_some_and(Value::is_object);
            let supplied = if deploy_limits {
                serde_json::json!({ "deploy": { "resources": { "limits": { "pids": self.default_pids } } } })
            } else {
                serde_json::json!({ "pids_limit": self.default_pids })
            };
            out.insert(name.clone(), supplied);
        }
        if out.is_empty() {
            return None;
        }
        let mut text = String::new();
        let _ = write!(text, "{}", serde_json::json!({ "services": out }));
        Some(text)
    }
}

/// The size of a top-level volume of the local driver's tmpfs shape
/// (`driver_opts: {type: tmpfs, o: size=...}`).
fn tmpfs_driver_size(vol: &Value) -> Option<u64> {
    let opts = vol.get("driver_opts")?;
    if opts.get("type").and_then(Value::as_str) != Some("tmpfs") {
        return None;
    }
    opts.get("o")
        .and_then(Value::as_str)?
        .split(',')
        .rev()
        .find_map(|o| o.trim().strip_prefix("size="))
        .and_then(parse_size)
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
                "logging: {driver: json-file}",
                "web: logging json-file without max-size (set it up to budget.max_log_size 100 MiB)",
            ),
            (
                "logging: {driver: local, options: {max-size: 10g}}",
                "web: logging max-size 10 GiB over budget.max_log_size 100 MiB",
            ),
        ] {
            let yaml = format!("services:\n  web:\n    image: x\n    {body}\n");
            assert_eq!(judge(&yaml, &b), [want], "{body}");
        }
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

    #[test]
    fn the_pids_override_covers_services_without_a_limit() {
        let doc = crate::checks::parse_compose(
            "services:\n  a: {image: x, pids_limit: 10}\n  b: {image: x, extends: {service: a}}\n  c: {image: x, deploy: {resources: {limits: {pids: 5}}}}\n  d: {image: x}\n  e: {image: x, deploy: {resources: {limits: {memory: 1g}}}}\n",
        )
        .unwrap();
        let services = doc["services"].as_object().unwrap();
        assert_eq!(
            Budget::default().pids_override(services).unwrap(),
            r#"{"services":{"d":{"pids_limit":1024},"e":{"deploy":{"resources":{"limits":{"pids":1024}}}}}}"#
        );
        let only =
            crate::checks::parse_compose("services:\n  a: {image: x, pids_limit: 10}\n").unwrap();
        assert_eq!(
            Budget::default().pids_override(only["services"].as_object().unwrap()),
            None
        );
    }
}
