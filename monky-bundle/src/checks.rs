//! The refusal checks an apply runs before it leases anything. Names only, never values.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeSet;

use secrecy::zeroize::Zeroize;
use serde_json::Value;

use crate::env::unresolved_vars;
use crate::interp::{self, Mode};
use crate::parse::short;
use crate::refusal::{Refusal, RefusalCode};

/// The default free-space factor applied to a bundle's `disk_need_bytes`.
pub const DEFAULT_DISK_FACTOR: f64 = 1.5;

/// The default free-space headroom on top of `need x factor`: 2 GiB.
pub const DEFAULT_DISK_HEADROOM: u64 = 2 * GIB;

const GIB: u64 = 1024 * 1024 * 1024;
const MIB: u64 = 1024 * 1024;

/// Refuses with `ENV_INCOMPLETE` naming every variable `template` needs that `provided`
/// lacks (see [`unresolved_vars`](crate::unresolved_vars) for what counts).
///
/// ```
/// use std::collections::BTreeSet;
/// let provided = BTreeSet::from(["KEY".to_string()]);
/// let err = monky_bundle::check_env_complete("# ${VAR}\nKEY=$KEY\nTOKEN=${TOKEN}\n", &provided)
///     .unwrap_err();
/// assert_eq!(err.to_string(), "ENV_INCOMPLETE: unresolved: TOKEN");
/// ```
pub fn check_env_complete(template: &str, provided: &BTreeSet<String>) -> Result<(), Refusal> {
    let missing = unresolved_vars(template, provided);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Refusal::new(RefusalCode::EnvIncomplete, missing))
    }
}

/// Refuses with `ROLLBACK_REFUSED` when `sha` was applied before but is not the current one.
///
/// `applied_history` is oldest first; its last entry is the currently applied sha, which may
/// be re-applied. With `allow` (the bundle's `allow_rollback`) nothing is refused. The names
/// give the two shas' first 12 characters.
pub fn check_rollback(sha: &str, applied_history: &[String], allow: bool) -> Result<(), Refusal> {
    let current = applied_history.last();
    if allow || current.is_some_and(|c| c.eq_ignore_ascii_case(sha)) {
        return Ok(());
    }
    if !applied_history.iter().any(|h| h.eq_ignore_ascii_case(sha)) {
        return Ok(());
    }
    let current = current.map_or_else(String::new, |c| short(c));
    Err(Refusal::new(
        RefusalCode::RollbackRefused,
        [short(sha), format!("current {current}")],
    ))
}

/// Refuses with `DISK_INSUFFICIENT` when `free < need x factor + headroom`.
///
/// A `factor` that is not a finite non-negative number is replaced by
/// [`DEFAULT_DISK_FACTOR`] rather than letting a NaN wave everything through. The names give
/// the required and the free space, e.g. `need 3.5 GiB, free 1.2 GiB`.
pub fn check_disk(free: u64, need: u64, factor: f64, headroom: u64) -> Result<(), Refusal> {
    let factor = if factor.is_finite() && factor >= 0.0 {
        factor
    } else {
        DEFAULT_DISK_FACTOR
    };
    let scaled = (need as f64 * factor).ceil();
    // `as` saturates for floats beyond u64::MAX.
    let required = (scaled as u64).saturating_add(headroom);
    if free >= required {
        return Ok(());
    }
    Err(Refusal::new(
        RefusalCode::DiskInsufficient,
        [
            format!("need {}", human(required)),
            format!("free {}", human(free)),
        ],
    ))
}

/// Bytes as the journal shows them: GiB or MiB with one decimal, plain bytes below that.
fn human(bytes: u64) -> String {
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{bytes} bytes")
    }
}

/// YAML limits for the compose file: generous for real compose files, small enough that an
/// alias bomb (billion laughs) or a merge-key storm is refused instead of expanded.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_events: 200_000,
            max_aliases: 2_000,
            max_anchors: 2_000,
            max_nodes: 100_000,
            max_depth: 64,
            max_documents: 1,
            max_merge_keys: 2_000,
            max_recorded_anchor_events: 100_000,
            max_recorded_anchor_bytes: 4 * 1024 * 1024,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: 100_000,
            max_replay_stack_depth: 16,
            max_alias_expansions_per_anchor: 1_000,
        },
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
    }
}

/// Parses compose YAML into a JSON value under [`yaml_options`]. The refusal names the kind of
/// problem and its position, never the text around it.
fn parse_compose(yaml: &str) -> Result<Value, Refusal> {
    serde_saphyr::from_str_with_options::<Value>(yaml, yaml_options()).map_err(|e| {
        use serde_saphyr::Error as E;
        // Classified by variant: the rendered message quotes the YAML around the error.
        let mut inner = &e;
        while let E::WithSnippet { error, .. } | E::AliasError { error, .. } = inner {
            inner = error;
        }
        let what = match inner {
            E::Budget {
                breach: serde_saphyr::budget::BudgetBreach::Documents { .. },
                ..
            }
            | E::MultipleDocuments { .. } => "more than one yaml document",
            E::Budget { .. }
            | E::AliasReplayCounterOverflow { .. }
            | E::AliasReplayLimitExceeded { .. }
            | E::AliasExpansionLimitExceeded { .. }
            | E::AliasReplayStackDepthExceeded { .. } => "yaml over the alias/size budget",
            E::DuplicateMappingKey { .. } => "duplicate key",
            _ => "invalid yaml",
        };
        match e.location() {
            Some(l) if l.line() > 0 => Refusal::invalid(format!(
                "compose file: {what} at line {} column {}",
                l.line(),
                l.column()
            )),
            _ => Refusal::invalid(format!("compose file: {what}")),
        }
    })
}

/// The most the values interpolated into a compose file may add up to: far above any real
/// file, far below what a small file referencing a long value thousands of times would need.
const MAX_INTERPOLATED_VALUE_BYTES: usize = 8 * 1024 * 1024;

/// Interpolates every string value (not keys) the way compose does, through `env`. `used`
/// counts the value bytes substituted so far across the document.
fn interpolate(
    v: &mut Value,
    env: &dyn Fn(&str) -> Option<String>,
    used: &Cell<usize>,
) -> Result<(), Refusal> {
    match v {
        Value::String(s) => {
            if s.contains('$') {
                let over = Cell::new(false);
                let lookup = |n: &str| {
                    if over.get() {
                        return None;
                    }
                    let value = env(n)?;
                    if used.get() + value.len() > MAX_INTERPOLATED_VALUE_BYTES {
                        over.set(true);
                        return None;
                    }
                    used.set(used.get() + value.len());
                    Some(Cow::Owned(value))
                };
                let mut out = String::with_capacity(s.len());
                interp::expand_into(s, &lookup, &interp::verbatim, Mode::Compose, 0, &mut out)
                    .map_err(|_| {
                        Refusal::invalid("compose file: interpolation nested too deeply")
                    })?;
                if over.get() {
                    out.zeroize();
                    return Err(Refusal::one(
                        RefusalCode::BundleTooLarge,
                        format!(
                            "compose file interpolates over {MAX_INTERPOLATED_VALUE_BYTES} bytes of values"
                        ),
                    ));
                }
                *s = out;
            }
        }
        Value::Array(a) => {
            for item in a {
                interpolate(item, env, used)?;
            }
        }
        Value::Object(m) => {
            for item in m.values_mut() {
                interpolate(item, env, used)?;
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
    Ok(())
}

/// Refuses with `PRIVILEGED_REFUSED` when a service asks for host-level power.
///
/// The compose YAML is parsed (duplicate keys refused, aliases and merge keys expanded under
/// limits, so an alias bomb is `BUNDLE_INVALID`), then every string value is interpolated
/// through `env` with compose's rules (`${VAR}`, `$VAR`, `${VAR:-default}`, `${VAR-default}`,
/// `$$`), so a value that only turns dangerous after interpolation is caught. Per service it
/// refuses: `privileged` true (also `"true"`, `yes`, `on`, `1`), `network_mode: host`, `pid`,
/// `ipc`, `userns_mode`, `uts` or `cgroup: host`, `cap_add` containing `SYS_ADMIN` or `ALL`
/// (any case, with or without `CAP_`), `devices`, a bind (short or long volume syntax) of `/`,
/// the docker socket (`/var/run/docker.sock`, `/run/docker.sock`) or a directory holding it
/// (`/var`, `/var/run`, `/run`), anything under `/proc` (`/proc/1/root` is the host's root),
/// a relative bind that climbs out of the project directory, and a `build` that is privileged
/// or uses the host network. A top-level volume whose `driver_opts.device` is such a path is
/// refused too.
///
/// Names are `service: reason` with fixed reasons (`web: privileged`, `web: cap_add SYS_ADMIN`,
/// `web: bind /var/run/docker.sock`); no interpolated value is ever named. The caller skips
/// this check when the bundle's `allow_privileged` is set.
///
/// ```
/// let yaml = "services:\n  web:\n    image: nginx\n    network_mode: ${MODE:-host}\n";
/// let err = monky_bundle::check_privileged(yaml, &|_| None).unwrap_err();
/// assert_eq!(err.to_string(), "PRIVILEGED_REFUSED: web: network_mode host");
/// assert!(monky_bundle::check_privileged(yaml, &|_| Some("bridge".into())).is_ok());
/// ```
pub fn check_privileged(
    compose_yaml: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), Refusal> {
    let mut doc = parse_compose(compose_yaml)?;
    let interpolated = interpolate(&mut doc, env, &Cell::new(0));
    let verdict = interpolated.and_then(|()| judge(&doc));
    // Interpolated strings may hold secret values: zero them before the tree is freed.
    scrub(&mut doc);
    verdict
}

/// [`check_privileged`] on a compose model already parsed, e.g. the JSON of
/// `docker compose config`, which holds the interpolated secrets: the model is zeroed before
/// it is freed, whatever the verdict.
pub fn check_privileged_model(mut model: Value) -> Result<(), Refusal> {
    let verdict = interpolate(&mut model, &|_| None, &Cell::new(0)).and_then(|()| judge(&model));
    scrub(&mut model);
    verdict
}

fn scrub(v: &mut Value) {
    match v {
        Value::String(s) => s.zeroize(),
        Value::Array(a) => a.iter_mut().for_each(scrub),
        Value::Object(m) => m.values_mut().for_each(scrub),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn judge(doc: &Value) -> Result<(), Refusal> {
    let mut names: Vec<String> = Vec::new();
    let mut add = |who: &str, why: &str| {
        let n = format!("{who}: {why}");
        if !names.contains(&n) {
            names.push(n);
        }
    };
    if let Some(Value::Object(services)) = doc.get("services") {
        for (service, def) in services {
            for why in service_reasons(def) {
                add(service, &why);
            }
        }
    }
    if let Some(Value::Object(volumes)) = doc.get("volumes") {
        for (volume, def) in volumes {
            if let Some(why) = def
                .get("driver_opts")
                .and_then(|o| o.get("device"))
                .and_then(Value::as_str)
                .and_then(judge_bind_source)
            {
                add(&format!("volume {volume}"), &why);
            }
        }
    }
    if names.is_empty() {
        Ok(())
    } else {
        Err(Refusal::new(RefusalCode::PrivilegedRefused, names))
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => matches!(
            s.trim().to_ascii_lowercase().as_str(),
            "true" | "yes" | "y" | "on" | "1"
        ),
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::Null | Value::Array(_) | Value::Object(_) => false,
    }
}

fn is_host(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str)
        .is_some_and(|s| s.trim().eq_ignore_ascii_case("host"))
}

/// Entries of a field that may be a list or a single string.
fn list(v: Option<&Value>) -> Vec<&Value> {
    match v {
        Some(Value::Array(a)) => a.iter().collect(),
        Some(v @ Value::String(_)) => vec![v],
        _ => Vec::new(),
    }
}

fn service_reasons(def: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let Value::Object(svc) = def else {
        return out;
    };
    if svc.get("privileged").is_some_and(truthy) {
        out.push("privileged".to_owned());
    }
    if is_host(svc.get("network_mode")) {
        out.push("network_mode host".to_owned());
    }
    for key in ["pid", "ipc", "userns_mode", "uts", "cgroup"] {
        if is_host(svc.get(key)) {
            out.push(format!("{key} host"));
        }
    }
    for cap in list(svc.get("cap_add")) {
        let Some(cap) = cap.as_str() else { continue };
        let upper = cap.trim().to_ascii_uppercase();
        let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
        if bare == "SYS_ADMIN" || bare == "ALL" {
            let why = format!("cap_add {bare}");
            if !out.contains(&why) {
                out.push(why);
            }
        }
    }
    for vol in list(svc.get("volumes")) {
        let source = match vol {
            Value::String(s) => s.split_once(':').map(|(src, _)| src),
            Value::Object(m) => m.get("source").and_then(Value::as_str),
            _ => None,
        };
        if let Some(why) = source.and_then(judge_bind_source)
            && !out.contains(&why)
        {
            out.push(why);
        }
    }
    if !list(svc.get("devices")).is_empty() {
        out.push("devices".to_owned());
    }
    if let Some(Value::Object(build)) = svc.get("build") {
        if build.get("privileged").is_some_and(truthy) {
            out.push("build privileged".to_owned());
        }
        if is_host(build.get("network")) {
            out.push("build network host".to_owned());
        }
    }
    out
}

/// Host paths whose bind gives a container the host: the root, the docker socket and the
/// directories holding it.
const DANGEROUS_SOURCES: [&str; 6] = [
    "/",
    "/var",
    "/var/run",
    "/run",
    "/var/run/docker.sock",
    "/run/docker.sock",
];

/// Why a bind source is refused, or `None` for a named volume or a harmless path.
fn judge_bind_source(source: &str) -> Option<String> {
    let source = source.trim();
    if let Some(abs) = source.strip_prefix('/') {
        let mut parts: Vec<&str> = Vec::new();
        for seg in abs.split('/') {
            match seg {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                s => parts.push(s),
            }
        }
        let norm = format!("/{}", parts.join("/"));
        if parts.first() == Some(&"proc") {
            return Some("bind /proc".to_owned());
        }
        return DANGEROUS_SOURCES
            .iter()
            .find(|d| **d == norm)
            .map(|d| format!("bind {d}"));
    }
    if source.starts_with('.') || source.starts_with('~') {
        let mut depth = 0usize;
        for seg in source.split('/').skip(1) {
            match seg {
                "" | "." => {}
                ".." if depth == 0 => return Some("bind outside the project directory".to_owned()),
                ".." => depth -= 1,
                _ => depth += 1,
            }
        }
        // The first segment itself: `..` climbs at once; `.` and `~` are the base.
        if source == ".." || source.starts_with("../") {
            return Some("bind outside the project directory".to_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human(0), "0 bytes");
        assert_eq!(human(MIB), "1.0 MiB");
        assert_eq!(human(3 * GIB + GIB / 2), "3.5 GiB");
    }

    #[test]
    fn bind_sources() {
        for (src, expected) in [
            ("/", Some("bind /")),
            ("//", Some("bind /")),
            ("/.", Some("bind /")),
            ("/etc/..", Some("bind /")),
            ("/var/run/docker.sock", Some("bind /var/run/docker.sock")),
            ("/var/run/./docker.sock", Some("bind /var/run/docker.sock")),
            (
                "/var/lib/../run/docker.sock",
                Some("bind /var/run/docker.sock"),
            ),
            ("/run/docker.sock/", Some("bind /run/docker.sock")),
            ("/run", Some("bind /run")),
            ("/proc/1/root", Some("bind /proc")),
            ("/srv/data", None),
            ("/var/lib/app", None),
            ("./data", None),
            ("./a/../b", None),
            ("./..", Some("bind outside the project directory")),
            ("../x", Some("bind outside the project directory")),
            ("./a/../../x", Some("bind outside the project directory")),
            ("~/../..", Some("bind outside the project directory")),
            ("pgdata", None),
        ] {
            assert_eq!(judge_bind_source(src).as_deref(), expected, "{src}");
        }
    }
}
