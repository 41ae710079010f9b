//! The supplied defaults: the compose override ([`OVERRIDE_FILE`](super::OVERRIDE_FILE)) the
//! agent writes to give a service what it leaves to the box (a pids and a memory limit within
//! the project's share, bounded `json-file` logging), following `extends` as compose does.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::Budget;
use super::totals::containers_of;
use super::units::{as_i64, as_u64};

impl Budget {
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
