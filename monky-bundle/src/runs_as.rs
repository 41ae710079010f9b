//! Who each service runs as, and which secrets its environment holds: the facts from which
//! the agent judges, on the box, whether a host account shares a container's uid (and so
//! reads `/proc/<pid>/environ`). Pure: compose's model and the compose file in, names out.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::checks::parse_compose;
use crate::interp;

/// One service of compose's model: its image, the `user` it sets (none: the image's own
/// `USER`), and the secret `.env` keys its containers' environment holds, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunsAs {
    /// The service's name.
    pub service: String,
    /// Its image reference, as the model names it.
    pub image: String,
    /// The model's `user` (`uid`, `uid:gid`, `name`, `name:group`); `None` when unset or
    /// empty, so the image's `USER` decides.
    pub user: Option<String>,
    /// The secret keys its environment holds: under their own name (an `env_file` of the
    /// release's `.env`, or `environment`), or through a reference in `environment`'s values.
    pub secrets: BTreeSet<String>,
}

/// [`RunsAs`] for every service of compose's `model` that sets an image; `raw_yaml` is the
/// release's compose file (where a renamed secret is still seen by its reference) and
/// `secret_keys` the `.env` keys built from the manifest's secrets.
///
/// ```
/// use serde_json::json;
/// let model = json!({"services": {
///     "web": {"image": "app:1", "user": "65534", "environment": {"DB_PW": "x", "MODE": "prod"}},
///     "cache": {"image": "redis:7", "environment": {"DEBUG": "0"}},
/// }});
/// let raw = "services:\n  web:\n    environment:\n      DB_PW: ${POSTGRES_PASSWORD}\n";
/// let keys = ["POSTGRES_PASSWORD".to_string()].into_iter().collect();
/// let runs = monky_bundle::runs_as(&model, raw, &keys);
/// assert_eq!(runs[1].service, "web");
/// assert_eq!(runs[1].user.as_deref(), Some("65534"));
/// assert!(runs[1].secrets.contains("POSTGRES_PASSWORD"));
/// assert!(runs[0].secrets.is_empty());
/// ```
#[must_use]
pub fn runs_as(model: &Value, raw_yaml: &str, secret_keys: &BTreeSet<String>) -> Vec<RunsAs> {
    let referenced = references(raw_yaml, secret_keys);
    let Some(services) = model.get("services").and_then(Value::as_object) else {
        return Vec::new();
    };
    services
        .iter()
        .filter_map(|(name, svc)| {
            let image = svc.get("image")?.as_str()?.to_owned();
            let user = svc
                .get("user")
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_owned);
            let mut secrets: BTreeSet<String> = env_keys(svc.get("environment"))
                .filter(|k| secret_keys.contains(k))
                .collect();
            if let Some(r) = referenced.get(name) {
                secrets.extend(r.iter().cloned());
            }
            Some(RunsAs {
                service: name.clone(),
                image,
                user,
                secrets,
            })
        })
        .collect()
}

/// The keys of an `environment` as the model gives it (a map), or as a file may (a list of
/// `KEY=value`).
fn env_keys(env: Option<&Value>) -> Box<dyn Iterator<Item = String> + '_> {
    match env {
        Some(Value::Object(m)) => Box::new(m.keys().cloned()),
        Some(Value::Array(items)) => Box::new(items.iter().filter_map(|i| {
            let s = i.as_str()?;
            Some(s.split_once('=').map_or(s, |(k, _)| k).trim().to_owned())
        })),
        _ => Box::new(std::iter::empty()),
    }
}

/// Per service of the compose file, the secret keys its `environment` values reference.
fn references(
    raw_yaml: &str,
    secret_keys: &BTreeSet<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    let Ok(doc) = parse_compose(raw_yaml) else {
        return out;
    };
    let Some(services) = doc.get("services").and_then(Value::as_object) else {
        return out;
    };
    for (name, svc) in services {
        let mut names = BTreeSet::new();
        match svc.get("environment") {
            Some(Value::Object(m)) => {
                for v in m.values().filter_map(Value::as_str) {
                    interp::names(v, &mut names, 0);
                }
            }
            Some(Value::Array(items)) => {
                for v in items.iter().filter_map(Value::as_str) {
                    interp::names(v, &mut names, 0);
                }
            }
            _ => {}
        }
        let used: BTreeSet<String> = names.intersection(secret_keys).cloned().collect();
        if !used.is_empty() {
            out.insert(name.clone(), used);
        }
    }
    out
}

/// The uid a `user` spec names when it is numeric (`1000`, `1000:1000`); `None` for a name,
/// which only the image's own `/etc/passwd` resolves.
#[must_use]
pub fn numeric_uid(user: &str) -> Option<u32> {
    user.split(':').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_by_name_by_reference_and_by_env_file_are_seen_and_others_are_not() {
        let keys: BTreeSet<String> = ["PW".to_string(), "TOKEN".to_string()].into();
        let model = json!({"services": {
            "a": {"image": "a", "environment": {"PW": "v", "TOKEN": "w", "X": "1"}},
            "b": {"image": "b", "environment": {"RENAMED": "v"}, "user": " "},
            "c": {"image": "c", "environment": ["TOKEN=w", "Y"]},
            "d": {"build": "."},
        }});
        let raw = "services:\n  b:\n    environment:\n      - RENAMED=${PW:-x}\n";
        let runs = runs_as(&model, raw, &keys);
        let by: BTreeMap<&str, &RunsAs> = runs.iter().map(|r| (r.service.as_str(), r)).collect();
        assert_eq!(
            by.len(),
            3,
            "a service without an image is compose's to refuse"
        );
        assert_eq!(by["a"].secrets, keys);
        assert_eq!(by["b"].secrets, ["PW".to_string()].into());
        assert_eq!(by["b"].user, None);
        assert_eq!(by["c"].secrets, ["TOKEN".to_string()].into());
    }

    #[test]
    fn numeric_users_are_read_and_names_are_not() {
        assert_eq!(numeric_uid("65534"), Some(65534));
        assert_eq!(numeric_uid("1000:1000"), Some(1000));
        assert_eq!(numeric_uid("node"), None);
        assert_eq!(numeric_uid("node:node"), None);
        assert_eq!(numeric_uid("-1"), None);
    }
}
