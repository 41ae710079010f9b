//! Who each service runs as, and which secrets it gets: the one count of every route a secret
//! takes into a container, from which the agent judges, on the box, whether a host account
//! shares a container's uid (and so reads `/proc/<pid>/environ`, and through
//! `/proc/<pid>/root` the secret's file). Pure: compose's model and the compose file in, names
//! out.
//!
//! The routes, each on compose's own model (which has `env_file` read in and `extends` merged
//! already), with the compose file only where a value's variable is no longer visible there:
//! - the environment: a secret `.env` key under its own name (`env_file: .env`,
//!   `environment`), or any key whose value in the file references one, the service's own or
//!   one it inherits through `extends`;
//! - compose's `secrets:` and `configs:`, copied into the container as files: a top-level one
//!   taken from a secret key (`environment:`), whose `content:` references one, or whose
//!   `file:` is the release's rendered `.env`.
//!
//! A secret key is a `.env` key whose template value references a manifest secret
//! ([`crate::secret_keys`], which reads the template as compose reads `.env`: a
//! `DATABASE_URL` built around a password, a quoted value over several lines).

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
    /// secret is taken from the release's `.env` (`environment: <key>`, or `file:` the
    /// rendered `.env` itself), copied into the container under `/run/secrets`.
    pub files: BTreeSet<String>,
    /// The secret keys it gets as config files: compose's `configs:` of the service whose
    /// top-level config is taken from a secret key (`environment:`), interpolates one
    /// (`content:`) or is the rendered `.env` (`file:`), copied to the config's target.
    pub configs: BTreeSet<String>,
    /// The names of the variables of its environment that hold a secret: a secret key under
    /// its own name, or a key whose value references one. What a shell in the container
    /// expands into a process's arguments when a command names it.
    pub vars: BTreeSet<String>,
}

impl RunsAs {
    /// Whether it gets any secret, by any route: its environment, a secret's or a config's
    /// file. The one test of "holds a secret" for every judgement of the box (the tick,
    /// `bundle check`, doctor, the look at what runs).
    #[must_use]
    pub fn gets_a_secret(&self) -> bool {
        !self.secrets.is_empty() || !self.files.is_empty() || !self.configs.is_empty()
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
    let raw = parse_compose(raw_yaml).unwrap_or(Value::Null);
    let from_env = top_level(model, &raw, "secrets", secret_keys);
    let configs_from_env = top_level(model, &raw, "configs", secret_keys);
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
            let mut secrets: BTreeSet<String> = BTreeSet::new();
            let mut vars: BTreeSet<String> = BTreeSet::new();
            let referenced = secret_env(&raw, name, secret_keys);
            for key in env_keys(svc.get("environment")) {
                if secret_keys.contains(&key) {
                    secrets.insert(key.clone());
                    vars.insert(key);
                } else if let Some(used) = referenced.get(&key) {
                    secrets.extend(used.iter().cloned());
                    vars.insert(key);
                }
            }
            let files = sources(svc.get("secrets"))
                .filter_map(|source| from_env.get(source))
                .flatten()
                .cloned()
                .collect();
            let configs = sources(svc.get("configs"))
                .filter_map(|source| configs_from_env.get(source))
                .flatten()
                .cloned()
                .collect();
            Some(RunsAs {
                service: name.clone(),
                image,
                user,
                secrets,
                files,
                configs,
                vars,
            })
        })
        .collect()
}

/// The top-level names a service's `secrets:` or `configs:` takes (short or long syntax).
fn sources(list: Option<&Value>) -> impl Iterator<Item = &str> {
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| match s {
            Value::String(source) => Some(source.as_str()),
            other => other.get("source")?.as_str(),
        })
}

/// The raw service `name` of the compose file merged with what it inherits through
/// `extends` (in the same file: compose refuses a loop, the walk stops at 16), nearest first.
pub(crate) fn extends_chain<'a>(raw: &'a Value, name: &str) -> Vec<&'a Value> {
    let services = raw.get("services").and_then(Value::as_object);
    let mut chain = Vec::new();
    let mut next = Some(name.to_owned());
    while let Some(n) = next.take() {
        let Some(svc) = services.and_then(|s| s.get(&n)) else {
            break;
        };
        if chain.len() >= 16 {
            break;
        }
        chain.push(svc);
        next = match svc.get("extends") {
            Some(Value::String(base)) => Some(base.clone()),
            Some(e) => e.get("service").and_then(Value::as_str).map(str::to_owned),
            None => None,
        };
    }
    chain
}

/// Per key of the service's environment in the compose file, its own or inherited through
/// `extends` (the nearest definition wins, as compose merges), the secret keys its value
/// references.
pub(crate) fn secret_env(
    raw: &Value,
    service: &str,
    secret_keys: &BTreeSet<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut values: BTreeMap<String, Option<&str>> = BTreeMap::new();
    for svc in extends_chain(raw, service) {
        for (key, value) in raw_env(svc.get("environment")) {
            values.entry(key).or_insert(value);
        }
    }
    values
        .into_iter()
        .filter_map(|(key, value)| {
            let mut names = BTreeSet::new();
            interp::names(value?, &mut names, 0);
            let used: BTreeSet<String> = names.intersection(secret_keys).cloned().collect();
            (!used.is_empty()).then_some((key, used))
        })
        .collect()
}

/// `(key, value)` of an `environment` as a file writes it: a map, or a list of `KEY=value`.
fn raw_env(env: Option<&Value>) -> Vec<(String, Option<&str>)> {
    match env {
        Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v.as_str())).collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(|s| match s.split_once('=') {
                Some((k, v)) => (k.trim().to_owned(), Some(v)),
                None => (s.trim().to_owned(), None),
            })
            .collect(),
        _ => Vec::new(),
    }
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

/// The top-level `secrets` or `configs` (`kind`) of the model that carry a secret, by name:
/// taken from a secret key (`environment:`), interpolating one (`content:`, judged on the
/// compose file `raw`, where the variable is still named), or the release's rendered `.env`
/// (`file:`, judged on the file's literal path: the policy allows only a literal in the
/// release dir), with the secret keys each carries.
fn top_level(
    model: &Value,
    raw: &Value,
    kind: &str,
    secret_keys: &BTreeSet<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    model
        .get(kind)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(name, def)| {
            let mut keys = BTreeSet::new();
            if let Some(key) = def.get("environment").and_then(Value::as_str)
                && secret_keys.contains(key)
            {
                keys.insert(key.to_owned());
            }
            let written = raw.get(kind).and_then(|k| k.get(name));
            if let Some(content) = written
                .and_then(|d| d.get("content"))
                .and_then(Value::as_str)
            {
                let mut names = BTreeSet::new();
                interp::names(content, &mut names, 0);
                keys.extend(names.intersection(secret_keys).cloned());
            }
            let file = written
                .and_then(|d| d.get("file"))
                .and_then(Value::as_str)
                .or_else(|| def.get("file").and_then(Value::as_str));
            if file.is_some_and(is_rendered_env) {
                keys.extend(secret_keys.iter().cloned());
            }
            (!keys.is_empty()).then(|| (name.clone(), keys))
        })
        .collect()
}

/// Whether a `file:` names the release's rendered `.env`: relative and, once `.` and `..`
/// are resolved lexically, `.env` itself; or an absolute path (compose's model) ending in it.
fn is_rendered_env(file: &str) -> bool {
    let mut parts: Vec<&str> = Vec::new();
    for p in file.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.last() == Some(&".env") && (parts.len() == 1 || file.starts_with('/'))
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

    /// Every route of the issue's red team, as compose's model gives it, and its benign twin.
    #[test]
    fn configs_content_files_templates_and_extends_are_routes_too() {
        let keys: BTreeSet<String> = ["PW".to_string(), "DATABASE_URL".to_string()].into();
        let model = json!({
            "services": {
                "env": {"image": "i", "configs": [{"source": "pw", "target": "/pw"}]},
                "content": {"image": "i", "configs": ["inline"]},
                "url": {"image": "i", "configs": ["url"]},
                "file": {"image": "i", "configs": ["dotenv"], "secrets": ["dotenv_s"]},
                "base": {"image": "i", "environment": {"TOKEN": "v"}},
                "child": {"image": "i", "user": "65534", "environment": {"TOKEN": "v"}},
                "benign": {"image": "i", "configs": ["motd", "plain", "tpl"],
                           "environment": {"TOKEN": "lit"}},
            },
            "configs": {
                "pw": {"environment": "PW"},
                "inline": {"content": "password=v"},
                "url": {"environment": "DATABASE_URL"},
                "dotenv": {"file": "/srv/release/.env"},
                "motd": {"environment": "LOG_LEVEL"},
                "plain": {"content": "mode=prod"},
                "tpl": {"file": "/srv/release/.env.template"},
            },
            "secrets": {"dotenv_s": {"file": "/srv/release/.env"}},
        });
        let raw = "services:\n  base:\n    environment:\n      TOKEN: ${PW}\n  \
                   child:\n    extends: base\n  benign:\n    extends: {service: base}\n    \
                   environment:\n      TOKEN: lit\nconfigs:\n  inline:\n    \
                   content: password=${PW:-x}\n  plain:\n    content: mode=$${PW}\n  \
                   dotenv:\n    file: ./sub/../.env\n  tpl:\n    file: ./.env.template\n\
                   secrets:\n  dotenv_s:\n    file: .env\n";
        let runs = runs_as(&model, raw, &keys);
        let by: BTreeMap<&str, &RunsAs> = runs.iter().map(|r| (r.service.as_str(), r)).collect();
        let one = |s: &str| BTreeSet::from([s.to_string()]);
        assert_eq!(by["env"].configs, one("PW"));
        assert_eq!(by["content"].configs, one("PW"));
        assert_eq!(by["url"].configs, one("DATABASE_URL"));
        assert_eq!(by["file"].configs, keys);
        assert_eq!(by["file"].files, keys);
        assert_eq!(by["base"].secrets, one("PW"));
        // Inherited through extends: the finding names the service that runs.
        assert_eq!(by["child"].secrets, one("PW"));
        assert_eq!(by["child"].vars, one("TOKEN"));
        // Its own value replaces the inherited one; a config of no secret is no route.
        assert!(!by["benign"].gets_a_secret(), "{:?}", by["benign"]);
    }

    #[test]
    fn the_rendered_env_is_told_by_its_path() {
        for (file, is) in [
            (".env", true),
            ("./.env", true),
            ("./a/../.env", true),
            ("/srv/release/.env", true),
            (".env.template", false),
            ("./conf/.env", false),
            ("./.env/x", false),
        ] {
            assert_eq!(is_rendered_env(file), is, "{file}");
        }
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
