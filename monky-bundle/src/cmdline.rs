//! Secrets kept off command lines: compose interpolates a variable into `command`,
//! `entrypoint`, a healthcheck `test` or a lifecycle hook's `command` before the process starts,
//! so its value ends up in the process's arguments, which every local user of the host reads
//! in `/proc/<pid>/cmdline` (unless `/proc` is mounted `hidepid`).
//!
//! Judged on the compose file as carried, where the reference is visible by name: a `.env` key
//! built from a manifest secret (see [`crate::secret_keys`]) referenced in one of those keys is
//! refused. `$$NAME` is compose's escape for a literal `$NAME`, which the container's shell
//! expands from its own environment at run time: it passes, as compose never sees the value
//! (what the shell then does with it is the image's business).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::checks::parse_compose;
use crate::interp;
use crate::refusal::{Refusal, RefusalCode};

/// Every service key whose strings become a process's arguments, as a path below the service
/// (`[]` walks a list's items).
const ARGV_KEYS: &[&[&str]] = &[
    &["command"],
    &["entrypoint"],
    &["healthcheck", "test"],
    &["post_start", "[]", "command"],
    &["pre_stop", "[]", "command"],
];

/// One refusal per service and key that references a secret `.env` key, as
/// `redis: command uses ${REDIS_PASSWORD}` with the fix; none when the compose file does not
/// parse (the compose policy refuses that on its own).
///
/// ```
/// let keys = ["PASS".to_string()].into_iter().collect();
/// let file = "services:\n  redis:\n    image: r\n    command: redis-server --requirepass ${PASS}\n";
/// let refused = monky_bundle::secrets_on_command_lines(file, &keys);
/// assert!(refused[0].to_string().starts_with("SECRET_ON_COMMAND_LINE: redis: command uses ${PASS}"));
/// let fixed = file.replace("${PASS}", "$${PASS}");
/// assert!(monky_bundle::secrets_on_command_lines(&fixed, &keys).is_empty());
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
    for (service, def) in services {
        for path in ARGV_KEYS {
            let mut strings = Vec::new();
            collect(def, path, &mut strings);
            let mut names = BTreeSet::new();
            for s in strings {
                interp::names(s, &mut names, 0);
            }
            let used: Vec<&String> = names.iter().filter(|n| secret_keys.contains(*n)).collect();
            if used.is_empty() {
                continue;
            }
            let key = path
                .iter()
                .filter(|p| **p != "[]")
                .copied()
                .collect::<Vec<_>>();
            let vars = used
                .iter()
                .map(|n| format!("${{{n}}}"))
                .collect::<Vec<_>>()
                .join(", ");
            refused.push(Refusal::one(
                RefusalCode::SecretOnCommandLine,
                format!(
                    "{service}: {} uses {vars}; compose would put the secret in the process's \
                     arguments, readable by every local user: give it to the service in its \
                     environment and let the program read it from there or from a file (a \
                     _FILE variable, a config file its entrypoint writes); a box whose /proc \
                     hides other users' processes may set allow_secrets_on_command_lines",
                    key.join(".")
                ),
            ));
        }
    }
    refused
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

    fn check(file: &str, expected: &[&str]) {
        let keys = ["PASS", "TOKEN"].map(String::from).into_iter().collect();
        let got: Vec<String> = secrets_on_command_lines(file, &keys)
            .iter()
            .map(|r| r.names[0].split(';').next().unwrap().to_string())
            .collect();
        assert_eq!(got, expected, "{file}");
    }

    #[test]
    fn every_argv_key_is_judged_and_the_escape_passes() {
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
        // The fix: escaped, read by the container's shell from its environment.
        check(
            &svc("    command: [\"sh\", \"-c\", \"x --pass $$PASS\"]\n"),
            &[],
        );
        check(&svc("    command: x $${PASS}\n"), &[]);
        // Not a secret key, or not an argv key.
        check(
            &svc("    command: x ${LOG_LEVEL}\n    environment:\n      P: ${PASS}\n"),
            &[],
        );
        // An anchor carries the reference into the service.
        check(
            "x-cmd: &cmd [\"x\", \"${PASS}\"]\nservices:\n  s:\n    image: i\n    command: *cmd\n",
            &["s: command uses ${PASS}"],
        );
    }
}
