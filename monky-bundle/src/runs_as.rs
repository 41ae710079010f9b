//! Who each service runs as, and which secrets it gets (in its environment, or as a file under
//! `/run/secrets`): the facts from which the agent judges, on the box, whether a host account
//! shares a container's uid (and so reads `/proc/<pid>/environ`, and through
//! `/proc/<pid>/root` the secret's file). Pure: compose's model and the compose file in, names
//! out.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::checks::parse_compose;
use crate::interp;

/// One service of compose's model: its image, the `user` it sets (none: the image's own
/// `USER`), and the secret `.env` keys its containers get, by name.
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
    /// The secret keys it gets as files: compose's `secrets:` of the service whose top-level
    /// secret is taken from the release's `.env` (`environment: <key>`), copied into the
    /// container under `/run/secrets`.
    pub files: BTreeSet<String>,
}

impl RunsAs {
    /// Whether it gets any secret, in its environment or as a file.
    #[must_use]
    pub fn gets_a_secret(&self) -> bool {
        !self.secrets.is_empty() || !self.files.is_empty()
    }
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
    let from_env = secrets_from_env(model, secret_keys);
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
            let files = svc
                .get("secrets")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|s| match s {
                    Value::String(source) => Some(source.as_str()),
                    other => other.get("source")?.as_str(),
                })
                .filter_map(|source| from_env.get(source).cloned())
                .collect();
            Some(RunsAs {
                service: name.clone(),
                image,
                user,
                secrets,
                files,
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

/// The top-level secrets of the model that compose takes from a secret `.env` key
/// (`environment: <key>`), by the secret's name: the key.
fn secrets_from_env(model: &Value, secret_keys: &BTreeSet<String>) -> BTreeMap<String, String> {
    model
        .get("secrets")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(name, s)| {
            let key = s.get("environment")?.as_str()?;
            secret_keys
                .contains(key)
                .then(|| (name.clone(), key.to_owned()))
        })
        .collect()
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
    fn a_secret_given_as_a_file_from_the_env_is_seen_and_others_are_not() {
        let keys: BTreeSet<String> = ["PW".to_string(), "TOKEN".to_string()].into();
        // As compose's model gives them: long syntax with the target filled in, the
        // top-level secret's `environment` interpolated.
        let model = json!({
            "services": {
                "a": {"image": "a", "user": "65534", "secrets": [
                    {"source": "db_pw", "target": "/run/secrets/db_pw"},
                    {"source": "tls", "target": "/run/secrets/tls"},
                    {"source": "mode", "target": "/run/secrets/mode"},
                ]},
                "b": {"image": "b", "secrets": ["token"]},
                "c": {"image": "c"},
            },
            "secrets": {
                "db_pw": {"name": "p_db_pw", "environment": "PW"},
                "token": {"name": "p_token", "environment": "TOKEN"},
                "tls": {"name": "p_tls", "file": "./tls.pem"},
                "mode": {"name": "p_mode", "environment": "LOG_LEVEL"},
            },
        });
        let runs = runs_as(&model, "services: {}\n", &keys);
        let by: BTreeMap<&str, &RunsAs> = runs.iter().map(|r| (r.service.as_str(), r)).collect();
        assert_eq!(by["a"].files, ["PW".to_string()].into());
        assert!(by["a"].secrets.is_empty() && by["a"].gets_a_secret());
        assert_eq!(by["b"].files, ["TOKEN".to_string()].into());
        assert!(!by["c"].gets_a_secret());
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
