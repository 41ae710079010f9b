//! Driving `docker compose` for one project: pull, up, ps, logs, down, config; and the parsing
//! of compose's output.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::Container;
use crate::container::{Row, oneoff_word, project_containers};
use crate::docker::{ComposeInfo, Docker};
use crate::error::{Error, Result};
use crate::process::{Invocation, Output};

/// One compose project: a name, its working directory, its compose file and its `.env` file.
///
/// Every command runs as `<compose> --ansi never -p <project> -f <file> [-f <override>]
/// --env-file <env_file> <subcommand>` in `workdir`. Secrets reach compose only through the env file.
#[derive(Debug, Clone)]
pub struct Compose {
    docker: Docker,
    project: String,
    workdir: PathBuf,
    file: PathBuf,
    env_file: PathBuf,
    overrides: Vec<PathBuf>,
}

impl Docker {
    /// The compose project `project`, run in `workdir` with `file` and `env_file`.
    #[must_use]
    pub fn compose(&self, project: &str, workdir: &Path, file: &Path, env_file: &Path) -> Compose {
        Compose::new(self.clone(), project, workdir, file, env_file)
    }
}

impl Compose {
    fn new(docker: Docker, project: &str, workdir: &Path, file: &Path, env_file: &Path) -> Self {
        Compose {
            docker,
            project: project.to_owned(),
            workdir: workdir.to_owned(),
            file: file.to_owned(),
            env_file: env_file.to_owned(),
            overrides: Vec::new(),
        }
    }

    /// One more compose file, merged over the project's own (`-f file -f override`): the agent's
    /// own values, e.g. the box's default pids limit, which compose's model then carries.
    #[must_use]
    pub fn with_override(mut self, file: &Path) -> Self {
        self.overrides.push(file.to_owned());
        self
    }

    /// The project name.
    #[must_use]
    pub fn project(&self) -> &str {
        &self.project
    }

    /// `pull`. A failure becomes [`Error::PullFailed`] carrying the registry's own words,
    /// whatever the exit code (18 up to compose 2.32, 1 from 2.33).
    pub fn pull(&self) -> Result<()> {
        let info = self.docker.compose_info()?;
        let out = self.run(&info, ["pull"], self.docker.limits().timeout)?;
        if out.success() {
            return Ok(());
        }
        Err(Error::PullFailed {
            message: pull_failure_message(&out.stderr, &out.stdout, out.code),
        })
    }

    /// `up -d --remove-orphans`; with `start` set, the whole start is bounded by it: compose's
    /// own run (which waits for a dependency's condition, a one-shot's completion included) and
    /// then the agent's readiness wait ([`Compose::wait_healthy`]), one rule on every compose
    /// version. compose's `up --wait` is never asked: 2.26 refuses a running service whose
    /// healthcheck is disabled, and before 2.17.3 it has no timeout of its own. A compose still
    /// running when the bound passes is ended (its process group killed) and the start is
    /// [`Error::Unhealthy`] with the containers as they are then.
    pub fn up(&self, start: Option<Duration>) -> Result<()> {
        let info = self.docker.compose_info()?;
        let args = ["up", "-d", "--remove-orphans"];
        let Some(bound) = start else {
            return self
                .run(&info, args, self.docker.limits().timeout)?
                .check()
                .map(drop);
        };
        let started = Instant::now();
        match self.run(&info, args, bound) {
            Err(Error::Timeout { .. }) => Err(Error::Unhealthy {
                containers: self.docker.containers(&self.project).unwrap_or_default(),
                after: started.elapsed(),
            }),
            out => {
                out?.check()?;
                self.wait_healthy(bound.saturating_sub(started.elapsed()))
                    .map(drop)
            }
        }
    }

    /// Polls the project's containers (Engine API, CLI fallback) until all are ready, one has
    /// failed (exited, dead, unhealthy), or `timeout` passes.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<Vec<Container>> {
        let started = Instant::now();
        let interval = self.docker.limits().poll_interval;
        loop {
            let containers = self.docker.containers(&self.project)?;
            let all_ready = containers.iter().all(Container::is_ready);
            if all_ready {
                return Ok(containers);
            }
            if containers.iter().any(Container::has_failed) || started.elapsed() >= timeout {
                return Err(Error::Unhealthy {
                    containers,
                    after: started.elapsed(),
                });
            }
            std::thread::sleep(interval.min(timeout.saturating_sub(started.elapsed())));
        }
    }

    /// `ps -a --format json`, parsed from either output shape (an array before 2.21, one
    /// object per line since).
    pub fn ps(&self) -> Result<Vec<Container>> {
        let out = self.query(["ps", "-a", "--format", "json"])?;
        parse_ps_json(&out.stdout).map_err(|detail| Error::Parse {
            what: out.what,
            detail,
        })
    }

    /// `logs --no-color --tail <lines>`: stdout, then stderr if compose wrote any, without
    /// terminal control sequences.
    pub fn logs_tail(&self, lines: usize) -> Result<String> {
        self.logs(lines, None)
    }

    /// As [`Compose::logs_tail`], of one service only: its own words, the other services'
    /// lines left out.
    pub fn service_logs_tail(&self, service: &str, lines: usize) -> Result<String> {
        self.logs(lines, Some(service))
    }

    fn logs(&self, lines: usize, service: Option<&str>) -> Result<String> {
        let info = self.docker.compose_info()?;
        let mut args = vec![
            OsString::from("logs"),
            "--no-color".into(),
            "--tail".into(),
            lines.to_string().into(),
        ];
        if let Some(s) = service {
            // After `--`, a service name is never read as an option.
            args.extend([OsString::from("--"), s.into()]);
        }
        let out = self
            .run(&info, args, self.docker.limits().query_timeout)?
            .check()?;
        let mut text = out.stdout;
        if !out.stderr.trim().is_empty() {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&out.stderr);
        }
        // Compose 2.26 starts every log line with ESC[2K even under --ansi never and
        // --no-color; the tail ends up in reports and audit logs, and an escape inside a value
        // would hide it from a redactor.
        let mut clean = String::with_capacity(text.len());
        for line in text.lines() {
            clean.push_str(&strip_terminal(line));
            clean.push('\n');
        }
        Ok(clean)
    }

    /// `down --remove-orphans`, with `-v` when `volumes` (only for a purge).
    pub fn down(&self, volumes: bool) -> Result<()> {
        let info = self.docker.compose_info()?;
        let mut args = vec!["down", "--remove-orphans"];
        if volumes {
            args.push("-v");
        }
        self.run(&info, args, self.docker.limits().timeout)?
            .check()?;
        Ok(())
    }

    /// `--profile * config --format json`: the interpolated model with every profile active,
    /// which the compose policy judges.
    ///
    /// The output holds interpolated values, secrets included: it is parsed and never quoted
    /// in errors or logs.
    pub fn config_json(&self) -> Result<serde_json::Value> {
        // Every profile: the model judged must hold every service any `up` could start.
        let out = self.query(["--profile", "*", "config", "--format", "json"])?;
        serde_json::from_str(&out.stdout).map_err(|e| Error::Parse {
            what: out.what,
            // serde_json's message names a line and column, not the content
            detail: e.to_string(),
        })
    }

    /// The invocation for `sub` (without running it): program and full argument list.
    pub fn invocation<I, S>(&self, info: &ComposeInfo, sub: I, timeout: Duration) -> Invocation
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let mut inv = Invocation::new(&info.program, timeout);
        if info.plugin {
            inv = inv.arg("compose");
        }
        inv.args([
            OsString::from("--ansi"),
            "never".into(),
            "-p".into(),
            self.project.clone().into(),
            "-f".into(),
            self.file.clone().into(),
        ])
        .args(
            self.overrides
                .iter()
                .flat_map(|o| [OsString::from("-f"), o.clone().into()]),
        )
        .args([OsString::from("--env-file"), self.env_file.clone().into()])
        .args(sub)
        .current_dir(&self.workdir)
    }

    /// A read-only subcommand whose whole stdout is parsed: it must succeed and fit the cap,
    /// since a truncated JSON document would only fail later with a less useful error.
    fn query<const N: usize>(&self, sub: [&str; N]) -> Result<Output> {
        let info = self.docker.compose_info()?;
        let out = self
            .run(&info, sub, self.docker.limits().query_timeout)?
            .check()?;
        if out.stdout_truncated {
            return Err(Error::OutputTooLarge {
                what: out.what,
                limit: self.docker.runner().max_output(),
            });
        }
        Ok(out)
    }

    fn run<I, S>(&self, info: &ComposeInfo, sub: I, timeout: Duration) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.docker
            .runner()
            .run(&self.invocation(info, sub, timeout))
    }
}

/// Parses `compose ps --format json` output in both shapes: one JSON array (compose < 2.21)
/// or one object per line (2.21+). Empty output is an empty project.
pub fn parse_ps_json(text: &str) -> Result<Vec<Container>, String> {
    let trimmed = text.trim();
    let rows: Vec<PsRow> = if trimmed.is_empty() {
        Vec::new()
    } else if trimmed.starts_with('[') {
        serde_json::from_str(trimmed).map_err(|e| format!("ps json array: {e}"))?
    } else {
        trimmed
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l).map_err(|e| format!("ps json line {}: {e}", i + 1))
            })
            .collect::<Result<_, _>>()?
    };
    Ok(project_containers::<PsRow>(rows))
}

#[derive(Debug, Deserialize)]
struct PsRow {
    #[serde(rename = "Name", default)]
    name: String,
    #[serde(rename = "Service", default)]
    service: String,
    #[serde(rename = "State", default)]
    state: String,
    #[serde(rename = "Health", default)]
    health: String,
    #[serde(rename = "Status", default)]
    status: String,
    #[serde(rename = "Project", default)]
    project: String,
    /// A `k=v,k=v` string in newer versions; absent from the early array shape.
    #[serde(rename = "Labels", default)]
    labels: Option<serde_json::Value>,
}

impl Row for PsRow {
    /// `ps -a` of compose v2 also lists `compose run` one-off containers, which are not the
    /// project's state. Their label says so where compose prints labels; otherwise their name
    /// does: `<project>-<service>-run-<hex id>`.
    fn is_oneoff(&self) -> bool {
        let key = crate::engine::ONEOFF_LABEL;
        match &self.labels {
            Some(serde_json::Value::String(text)) => {
                return text.split(',').any(|kv| {
                    kv.split_once('=')
                        .is_some_and(|(k, v)| k == key && oneoff_word(v))
                });
            }
            Some(serde_json::Value::Object(map)) => {
                return map
                    .get(key)
                    .and_then(serde_json::Value::as_str)
                    .is_some_and(oneoff_word);
            }
            _ => {}
        }
        if self.project.is_empty() || self.service.is_empty() {
            return false;
        }
        let name = self.name.trim_start_matches('/');
        ['-', '_'].iter().any(|sep| {
            let prefix = format!("{}{sep}{}{sep}run{sep}", self.project, self.service);
            name.strip_prefix(&prefix)
                .is_some_and(|id| id.len() >= 4 && id.chars().all(|c| c.is_ascii_hexdigit()))
        })
    }

    fn into_container(self) -> Container {
        Container::from_row(
            self.name.trim_start_matches('/').to_owned(),
            self.service,
            &self.state,
            &self.status,
            &self.health,
        )
    }
}

/// Text that identifies the registry's or the resolver's own diagnosis in pull output.
const PULL_PATTERNS: &[&str] = &[
    "no basic auth credentials",
    "manifest unknown",
    "unauthorized",
    "authentication required",
    "denied",
    "not found",
    "no such host",
    "server misbehaving",
    "temporary failure in name resolution",
    "connection refused",
    "i/o timeout",
    "timeout",
    "tls:",
    "x509",
    "certificate",
    "toomanyrequests",
    "rate limit",
    "error response from daemon",
    "failed to resolve reference",
    "failed to do request",
    "error pulling",
    "no matching manifest",
    "invalid reference format",
];

/// The most this crate quotes of a pull failure.
const PULL_MESSAGE_MAX: usize = 600;

/// Extracts the registry's message from a failed pull's output: the lines that carry a known
/// diagnosis, else the last lines compose printed, else the exit code.
#[must_use]
pub fn pull_failure_message(stderr: &str, stdout: &str, code: Option<i32>) -> String {
    let lines: Vec<String> = stderr
        .lines()
        .chain(stdout.lines())
        .map(clean_line)
        .filter(|l| !l.is_empty())
        .collect();
    let mut picked: Vec<&str> = Vec::new();
    for line in &lines {
        let lower = line.to_ascii_lowercase();
        if PULL_PATTERNS.iter().any(|p| lower.contains(p)) && !picked.contains(&line.as_str()) {
            picked.push(line);
        }
    }
    if picked.is_empty() {
        let start = lines.len().saturating_sub(3);
        picked = lines[start..].iter().map(String::as_str).collect();
    }
    if picked.is_empty() {
        return match code {
            Some(c) => format!("exit code {c} and no output"),
            None => "killed by a signal and no output".to_owned(),
        };
    }
    let joined = picked.join(" | ");
    crate::error::tail_chars(&joined, PULL_MESSAGE_MAX)
}

/// Strips ANSI escapes and carriage-return progress redraws from one output line, trimmed.
fn clean_line(line: &str) -> String {
    strip_terminal(line).trim().to_owned()
}

/// One output line without terminal control: ANSI escape sequences, the frames a `\r` redraw
/// overwrote, and control characters other than tabs.
fn strip_terminal(line: &str) -> String {
    // a progress line redrawn with \r: only the last frame counts
    let line = line
        .rsplit('\r')
        .find(|s| !s.trim().is_empty())
        .unwrap_or("");
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // CSI: parameters then one final byte in @..~
                for n in chars.by_ref() {
                    if ('@'..='~').contains(&n) {
                        break;
                    }
                }
            }
            continue;
        }
        if !c.is_control() || c == '\t' {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::container::container as c;

    #[test]
    fn ps_both_shapes_parse_alike() {
        let array = r#"[{"ID":"a1","Name":"p-web-1","Service":"web","State":"running","Health":"healthy","ExitCode":0},
                        {"ID":"b2","Name":"p-db-1","Service":"db","State":"running","Health":"","ExitCode":0},
                        {"ID":"c3","Name":"p-job-1","Service":"job","State":"exited","Health":"","ExitCode":1}]"#;
        let lines = concat!(
            r#"{"ID":"b2","Name":"p-db-1","Service":"db","State":"running","Health":"","Status":"Up 1 minute"}"#,
            "\n",
            r#"{"ID":"c3","Name":"p-job-1","Service":"job","State":"exited","Health":"","Status":"Exited (1) 2 minutes ago"}"#,
            "\n\n",
            r#"{"ID":"a1","Name":"p-web-1","Service":"web","State":"running","Health":"healthy","Status":"Up 1 minute (healthy)"}"#,
            "\n"
        );
        let expected = vec![
            c("p-db-1", "db", "running", None),
            c("p-job-1", "job", "exited", None),
            c("p-web-1", "web", "running", Some("healthy")),
        ];
        assert_eq!(parse_ps_json(array).unwrap(), expected);
        assert_eq!(parse_ps_json(lines).unwrap(), expected);
        assert_eq!(parse_ps_json("").unwrap(), vec![]);
        assert_eq!(parse_ps_json("[]\n").unwrap(), vec![]);
    }

    #[test]
    fn ps_leaves_out_one_off_containers() {
        let check = |row: &str, kept: bool| {
            assert_eq!(
                parse_ps_json(row).unwrap().len(),
                usize::from(kept),
                "{row}"
            );
        };
        // by label, in both label shapes
        check(
            r#"{"Name":"p-web-x","Project":"p","Service":"web","State":"exited","Labels":"com.docker.compose.project=p,com.docker.compose.oneoff=True"}"#,
            false,
        );
        check(
            r#"{"Name":"p-web-1","Project":"p","Service":"web","State":"running","Labels":"com.docker.compose.oneoff=False,com.docker.compose.project=p"}"#,
            true,
        );
        check(
            r#"{"Name":"p-web-x","Project":"p","Service":"web","State":"exited","Labels":{"com.docker.compose.oneoff":"True"}}"#,
            false,
        );
        // by name where no labels are printed (the early array shape)
        check(
            r#"[{"Name":"p-web-run-8c1d2e3f4a5b","Project":"p","Service":"web","State":"exited"}]"#,
            false,
        );
        check(
            r#"[{"Name":"p_web_run_8c1d2e3f4a5b","Project":"p","Service":"web","State":"exited"}]"#,
            false,
        );
        check(
            r#"[{"Name":"p-web-run-now","Project":"p","Service":"web","State":"running"}]"#,
            true,
        );
        check(
            r#"[{"Name":"p-web-run-8c1d","Project":"","Service":"web","State":"running"}]"#,
            true,
        );
        // a label string wins over the name
        check(
            r#"{"Name":"p-web-run-8c1d2e","Project":"p","Service":"web","State":"running","Labels":"com.docker.compose.oneoff=False"}"#,
            true,
        );
    }

    #[test]
    fn ps_health_falls_back_to_status_text() {
        let line = r#"{"Name":"p-web-1","Service":"web","State":"running","Status":"Up 3 seconds (health: starting)"}"#;
        assert_eq!(
            parse_ps_json(line).unwrap(),
            vec![c("p-web-1", "web", "running", Some("starting"))]
        );
    }

    #[test]
    fn ps_garbage_is_an_error_naming_the_line() {
        let err = parse_ps_json("{\"Name\":\"a\"}\nnot json\n").unwrap_err();
        assert!(err.starts_with("ps json line 2"), "{err}");
    }

    #[test]
    fn pull_messages_keep_the_registry_text() {
        let check = |stderr: &str, code: Option<i32>, expected: &str| {
            assert_eq!(
                pull_failure_message(stderr, "", code),
                expected,
                "{stderr:?}"
            );
        };
        check(
            " web Pulling \n web Error \nError response from daemon: Head \"https://harbor.example/v2/app/web/manifests/1.2\": no basic auth credentials\n",
            Some(18),
            "Error response from daemon: Head \"https://harbor.example/v2/app/web/manifests/1.2\": no basic auth credentials",
        );
        check(
            "\u{1b}[31mweb Error\u{1b}[0m manifest unknown\r\n",
            Some(1),
            "web Error manifest unknown",
        );
        check("a\nb\nc\nd\n", Some(1), "b | c | d");
        check("", Some(18), "exit code 18 and no output");
        check("", None, "killed by a signal and no output");
        check(
            "Error response from daemon: Get \"https://harbor.example/v2/\": dial tcp: lookup harbor.example on 127.0.0.53:53: no such host\nError response from daemon: Get \"https://harbor.example/v2/\": dial tcp: lookup harbor.example on 127.0.0.53:53: no such host\n",
            Some(1),
            "Error response from daemon: Get \"https://harbor.example/v2/\": dial tcp: lookup harbor.example on 127.0.0.53:53: no such host",
        );
    }

    #[test]
    fn terminal_control_is_stripped_from_lines() {
        let check = |line: &str, expected: &str| {
            assert_eq!(strip_terminal(line), expected, "{line:?}");
        };
        // compose 2.26 `logs --no-color` under --ansi never
        check("\u{1b}[2Kweb-1  | leak=value", "web-1  | leak=value");
        check("se\u{1b}[0mcret\tx", "secret\tx");
        check("old frame\rnew frame", "new frame");
        check("  indented stays  ", "  indented stays  ");
    }

    #[test]
    fn pull_message_is_capped() {
        let long = format!("unauthorized: {}\n", "x".repeat(5000));
        let msg = pull_failure_message(&long, "", Some(1));
        assert!(msg.len() <= PULL_MESSAGE_MAX + 3, "{}", msg.len());
        assert!(msg.starts_with("..."));
    }
}
