//! Host ports: the published port or range of a `ports` entry (short syntax or compose's
//! model), what one service may publish, and how many host ports an entry takes of the
//! project's total.

use serde_json::Value;

use super::{Budget, Shown};

/// A published host port or range, as the short syntax (`[ip:]host:container[/proto]`) or
/// compose's model (`published: "8080"` or `"10000-20000"`) gives it: `(first, last)`.
pub(super) fn port_range(text: &str) -> Option<(u32, u32)> {
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
pub(super) fn short_published(spec: &str) -> Option<String> {
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

/// The published host port or range of one `ports` entry, as written; `None` for an
/// ephemeral port (no host port) or an entry of another shape.
fn published_of(p: &Value) -> Option<String> {
    match p {
        Value::String(s) => short_published(s),
        Value::Object(m) => m.get("published").and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }),
        _ => None,
    }
}

/// The host ports one `ports` entry takes, for `containers` containers: a fixed port or range
/// its size, an ephemeral one (no host port) one per container and container port.
pub(super) fn ports_taken(p: &Value, containers: u64) -> u64 {
    let target = match p {
        Value::String(s) => {
            let spec = s.split('/').next().unwrap_or(s);
            spec.rsplit(':').next().map(str::to_string)
        }
        Value::Object(m) => m
            .get("target")
            .map(|t| t.as_str().map_or_else(|| t.to_string(), str::to_string)),
        _ => None,
    };
    let size = |t: &str| port_range(t).map_or(1, |(a, b)| u64::from(b - a + 1));
    match published_of(p).filter(|p| !p.trim().is_empty()) {
        Some(p) => size(&p),
        None => target.as_deref().map_or(1, size).saturating_mul(containers),
    }
}

impl Budget {
    /// Each published port or range: no wider than `max_port_range`, not below
    /// `min_published_port`, and clear of `reserved_ports`.
    pub(super) fn published_ports(
        &self,
        ports: &[Value],
        shown: &Shown<'_>,
        out: &mut Vec<String>,
    ) {
        for p in ports {
            let Some((first, last)) = published_of(p).as_deref().and_then(port_range) else {
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
}
