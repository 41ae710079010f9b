//! Secrets kept off command lines: compose interpolates a variable into `command`,
//! `entrypoint`, a healthcheck `test` or a lifecycle hook's `command` before the process starts,
//! so its value ends up in the process's arguments, which every local user of the host reads
//! in `/proc/<pid>/cmdline` (unless `/proc` is mounted `hidepid`).
//!
//! A shell in the container is the same route one step later: `$$NAME` is compose's escape for
//! a literal `$NAME`, and a shell that gets that string (`sh -c`, `bash -lc`, `CMD-SHELL`, a
//! string-form healthcheck, an image entrypoint that is a shell, `su -c`, `eval`) expands it
//! from the container's environment into the arguments of the process it starts. Which
//! program reads a literal `$NAME` is the image's to decide and cannot be seen before the
//! start, and such a string has no other use; so a command string that still names a
//! secret-bearing variable after compose's interpolation is judged as the interpolated one is,
//! whether or not a shell is in sight. A string naming no secret (`sh -c 'exec gunicorn ...'`)
//! and an entrypoint script that reads the variable from its own environment pass.
//!
//! Judged twice, as the other rules are: on the compose file as carried, before the lease
//! ([`secrets_on_command_lines`]: a reference to a secret `.env` key, or `$$NAME` of a
//! secret-bearing variable, see [`crate::secret_keys`]), and on compose's interpolated model
//! after the secrets are read and before anything is pulled or started
//! ([`secrets_on_command_lines_model`]: a `$NAME` left in the model, which a `.env` value can
//! bring in). A service is judged with what it inherits through `extends`, and the finding
//! names the service.

use std::borrow::Cow;
use std::collections::BTreeSet;

use serde_json::Value;

use crate::checks::parse_compose;
use crate::interp::{self, Mode};
use crate::refusal::{Refusal, RefusalCode};
use crate::runs_as::{RunsAs, extends_chain, secret_env};

/// Every service key whose strings become a process's arguments, as a path below the service
/// (`[]` walks a list's items).
const ARGV_KEYS: &[&[&str]] = &[
    &["command"],
    &["entrypoint"],
    &["healthcheck", "test"],
    &["post_start", "[]", "command"],
    &["pre_stop", "[]", "command"],
];

/// The routes that keep a secret off every process's arguments, for the refusal's text.
const FIX: &str = "give it to the service in its environment and let the program read it from \
                   there or from a file (a _FILE variable, a config file its entrypoint writes, \
                   the variable a client reads itself: REDISCLI_AUTH for redis-cli, PGPASSWORD \
                   for psql and pg_isready); a box whose /proc hides other users' processes \
                   may set allow_secrets_on_command_lines";

/// One refusal per service and key that references a secret `.env` key (`${PASS}`), or that
/// leaves a secret-bearing variable for the container's shell to expand (`$$PASS`), as
/// `redis: command uses ${REDIS_PASSWORD}` or `redis: command has the container expand
/// $REDIS_PASSWORD` with the fix; none when the compose file does not parse (the compose
/// policy refuses that on its own).
///
/// ```
/// let keys = ["PASS".to_string()].into_iter().collect();
/// let file = "services:\n  redis:\n    image: r\n    command: redis-server --requirepass ${PASS}\n";
/// let refused = monky_bundle::secrets_on_command_lines(file, &keys);
/// assert!(refused[0].to_string().starts_with("SECRET_ON_COMMAND_LINE: redis: command uses ${PASS}"));
/// let shell = file.replace("${PASS}", "$${PASS}");
/// let refused = monky_bundle::secrets_on_command_lines(&shell, &keys);
/// assert!(refused[0].to_string().starts_with("SECRET_ON_COMMAND_LINE: redis: command has the container expand $PASS"));
/// let fixed = "services:\n  redis:\n    image: r\n    environment: {REDISCLI_AUTH: ${PASS}}\n    \
///              healthcheck: {test: [CMD, redis-cli, ping]}\n";
/// assert!(monky_bundle::secrets_on_command_lines(fixed, &keys).is_empty());
/// ```
#[must_use]
pub fn secrets_on_command_lines(
    compose_yaml: &str,
    secret_keys: &BTreeSet<String>,
) -> Vec<Refusal> {
    let Ok(doc) = parse_compose(compose_yaml) else {
        return Vec::new();
    };
    let Some(services) = doc.get("services").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut refused = Vec::new();
    for service in services.keys() {
        let chain = extends_chain(&doc, service);
        let bearing = secret_bearing(&doc, service, secret_keys);
        for path in ARGV_KEYS {
            let strings = inherited(&chain, path);
            let mut names = BTreeSet::new();
            let mut shell = BTreeSet::new();
            for s in strings {
                interp::names(s, &mut names, 0);
                shell_names(&after_compose(s), &mut shell);
            }
            let used: Vec<&String> = names.iter().filter(|n| secret_keys.contains(*n)).collect();
            if !used.is_empty() {
                let vars = used
                    .iter()
                    .map(|n| format!("${{{n}}}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                refused.push(Refusal::one(
                    RefusalCode::SecretOnCommandLine,
                    format!(
                        "{service}: {} uses {vars}; compose would put the secret in the \
                         process's arguments, readable by every local user: {FIX}",
                        key_name(path)
                    ),
                ));
            }
            refused.extend(shell_refusal(service, path, &shell, &bearing));
        }
    }
    refused
}

/// [`secrets_on_command_lines`] on compose's interpolated model: one refusal per service and
/// key whose strings still name a variable of `runs` (the service's secret-bearing
/// variables, [`RunsAs::vars`]) for the container's shell to expand. A value of the `.env`
/// brings such a `$NAME` into the model where the compose file shows only `${KEY}`.
#[must_use]
pub fn secrets_on_command_lines_model(model: &Value, runs: &[RunsAs]) -> Vec<Refusal> {
    let Some(services) = model.get("services").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut refused = Vec::new();
    for r in runs.iter().filter(|r| !r.vars.is_empty()) {
        let Some(def) = services.get(&r.service) else {
            continue;
        };
        for path in ARGV_KEYS {
            let mut strings = Vec::new();
            collect(def, path, &mut strings);
            let mut shell = BTreeSet::new();
            for s in strings {
                // `docker compose config` writes every literal dollar of its model as `$$`,
                // so the model reads back as a compose file.
                shell_names(&s.replace("$$", "$"), &mut shell);
            }
            refused.extend(shell_refusal(&r.service, path, &shell, &r.vars));
        }
    }
    refused
}

/// The refusal for the variables of `shell` that are in `bearing`, if any.
fn shell_refusal(
    service: &str,
    path: &[&str],
    shell: &BTreeSet<String>,
    bearing: &BTreeSet<String>,
) -> Option<Refusal> {
    let used: Vec<String> = shell
        .intersection(bearing)
        .map(|n| format!("${n}"))
        .collect();
    (!used.is_empty()).then(|| {
        Refusal::one(
            RefusalCode::SecretOnCommandLine,
            format!(
                "{service}: {} has the container expand {}; a shell there would put the \
                 secret in a process's arguments, readable by every local user: {FIX}",
                key_name(path),
                used.join(", ")
            ),
        )
    })
}

/// `healthcheck.test` for `["healthcheck", "test"]`.
fn key_name(path: &[&str]) -> String {
    path.iter()
        .filter(|p| **p != "[]")
        .copied()
        .collect::<Vec<_>>()
        .join(".")
}

/// The variables of a service's environment in the compose file (its own and what it inherits
/// through `extends`) that hold a secret: every secret key (an `env_file` of `.env` holds
/// them all, and an `environment` key named so takes its value from the `.env`), and a key of
/// any name whose value references one.
fn secret_bearing(doc: &Value, service: &str, secret_keys: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = secret_keys.clone();
    out.extend(secret_env(doc, service, secret_keys).into_keys());
    out
}

/// The strings at `path` the service runs with: the nearest definition along its `extends`
/// chain, or for a list of hooks every one of them.
fn inherited<'a>(chain: &[&'a Value], path: &[&str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    for svc in chain {
        let mut found = Vec::new();
        collect(svc, path, &mut found);
        if path.contains(&"[]") {
            out.extend(found);
        } else if !found.is_empty() {
            return found;
        }
    }
    out
}

/// `s` as compose hands it on: `$$` a dollar, every reference replaced by its default word or
/// nothing (what the shell then sees of the compose file's own text).
fn after_compose(s: &str) -> String {
    let empty = |_: &str| Some(Cow::Borrowed(""));
    let mut out = String::new();
    if interp::expand_into(s, &empty, &interp::verbatim, Mode::Compose, 0, &mut out).is_err() {
        return s.replace("$$", "$");
    }
    out
}

/// The variables a shell expands in `s`: `$NAME`, `${NAME...}`, `${#NAME}`, `${!NAME}`;
/// `$$` is the shell's own pid. Quotes are not followed: a name in single quotes may still
/// reach an `eval` or a nested shell.
fn shell_names(s: &str, out: &mut BTreeSet<String>) {
    let b = s.as_bytes();
    let name_at = |mut j: usize| {
        let start = j;
        if j < b.len() && (b[j].is_ascii_alphabetic() || b[j] == b'_') {
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
        }
        (start, j)
    };
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'$' {
            i += 1;
            continue;
        }
        let (start, end) = match b.get(i + 1) {
            Some(b'$') => {
                i += 2;
                continue;
            }
            Some(b'{') => {
                let j = i + 2;
                name_at(if matches!(b.get(j), Some(b'#' | b'!')) {
                    j + 1
                } else {
                    j
                })
            }
            _ => name_at(i + 1),
        };
        if end > start {
            out.insert(s[start..end].to_owned());
            i = end;
        } else {
            i += 1;
        }
    }
}

/// The strings at `path` below `v`: a string, or a list's strings.
fn collect<'a>(v: &'a Value, path: &[&str], out: &mut Vec<&'a str>) {
    match path.split_first() {
        None => match v {
            Value::String(s) => out.push(s),
            Value::Array(items) => out.extend(items.iter().filter_map(Value::as_str)),
            _ => {}
        },
        Some((&"[]", rest)) => {
            for item in v.as_array().into_iter().flatten() {
                collect(item, rest, out);
            }
        }
        Some((key, rest)) => {
            if let Some(next) = v.get(*key) {
                collect(next, rest, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_model_is_judged_for_what_its_values_bring() {
        let runs = |vars: &[&str]| RunsAs {
            service: "s".into(),
            image: "i".into(),
            user: None,
            secrets: BTreeSet::new(),
            files: BTreeSet::new(),
            configs: BTreeSet::new(),
            vars: vars.iter().map(|v| (*v).to_owned()).collect(),
        };
        // `command: [sh, -c, "echo ${CMD}"]` with `CMD=$$PW` in the `.env`, as compose's
        // model writes it (a literal dollar doubled); a bare one is read the same.
        let model = json!({"services": {"s": {"command": ["sh", "-c", "echo $$PW"],
            "entrypoint": ["sh", "-c", "$PW"],
            "healthcheck": {"test": ["CMD-SHELL", "x $$$$ $$OTHER"]}}}});
        let found: Vec<String> = secrets_on_command_lines_model(&model, &[runs(&["PW"])])
            .iter()
            .map(|r| r.names[0].split(';').next().unwrap().to_string())
            .collect();
        assert_eq!(
            found,
            [
                "s: command has the container expand $PW",
                "s: entrypoint has the container expand $PW"
            ]
        );
        assert!(secrets_on_command_lines_model(&model, &[runs(&["X"])]).is_empty());
    }

    fn check(file: &str, expected: &[&str]) {
        let keys = ["PASS", "TOKEN"].map(String::from).into_iter().collect();
        let got: Vec<String> = secrets_on_command_lines(file, &keys)
            .iter()
            .map(|r| r.names[0].split(';').next().unwrap().to_string())
            .collect();
        assert_eq!(got, expected, "{file}");
    }

    #[test]
    fn every_argv_key_is_judged_and_so_is_the_shell_behind_the_escape() {
        let svc = |body: &str| format!("services:\n  s:\n    image: i\n{body}");
        check(
            &svc("    command: [\"--pass\", \"$PASS\"]\n"),
            &["s: command uses ${PASS}"],
        );
        check(
            &svc("    entrypoint: run ${TOKEN:-x}\n"),
            &["s: entrypoint uses ${TOKEN}"],
        );
        check(
            &svc("    healthcheck:\n      test: [\"CMD-SHELL\", \"cli -a ${PASS} ping\"]\n"),
            &["s: healthcheck.test uses ${PASS}"],
        );
        check(
            &svc("    post_start:\n      - command: [\"x\", \"${X:-${PASS}}\"]\n"),
            &["s: post_start.command uses ${PASS}"],
        );
        check(
            &svc("    pre_stop:\n      - command: x ${TOKEN} ${PASS}\n"),
            &["s: pre_stop.command uses ${PASS}, ${TOKEN}"],
        );
        // Escaped for the container's shell, which expands it into the arguments: as exposed.
        check(
            &svc("    command: [\"sh\", \"-c\", \"x --pass $$PASS\"]\n"),
            &["s: command has the container expand $PASS"],
        );
        check(
            &svc("    healthcheck:\n      test: redis-cli -a \"$${TOKEN}\" ping\n"),
            &["s: healthcheck.test has the container expand $TOKEN"],
        );
        check(
            &svc("    entrypoint: [\"/bin/sh\", \"-ec\", \"x ${LOG:-$$PASS}\"]\n"),
            &["s: entrypoint has the container expand $PASS"],
        );
        // A variable renamed in the environment is as secret under its new name.
        check(
            &svc(
                "    environment: [\"DBP=x${PASS}\"]\n    command: [bash, -lc, \"x $${#DBP} $${!DBP}\"]\n",
            ),
            &["s: command has the container expand $DBP"],
        );
        // Shells that name no secret: the shell's pid, other variables, a subshell.
        check(
            &svc("    command: [sh, -c, \"exec gunicorn -w $$WORKERS app:app $$$$PASS\"]\n"),
            &[],
        );
        check(
            &svc(
                "    healthcheck:\n      test: [\"CMD-SHELL\", \"pg_isready -U $$POSTGRES_USER -d $${POSTGRES_DB}\"]\n",
            ),
            &[],
        );
        // Not a secret key, or not an argv key.
        check(
            &svc("    command: x ${LOG_LEVEL}\n    environment:\n      P: ${PASS}\n"),
            &[],
        );
        // What a service inherits through extends is judged on it, by its own name.
        check(
            "services:\n  base:\n    image: i\n    profiles: [never]\n    command: [sh, -c, \"x $$PASS\"]\n  \
             s:\n    extends: base\n  t:\n    extends: {service: base}\n    command: [x]\n",
            &[
                "base: command has the container expand $PASS",
                "s: command has the container expand $PASS",
            ],
        );
        // An anchor carries the reference into the service.
        check(
            "x-cmd: &cmd [\"x\", \"${PASS}\"]\nservices:\n  s:\n    image: i\n    command: *cmd\n",
            &["s: command uses ${PASS}"],
        );
    }
}
