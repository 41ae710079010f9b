//! The one error type of this crate and the coarse kinds callers branch on.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::Container;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while driving docker.
///
/// Messages never contain secret values: arguments are paths and names only, and process
/// output is only quoted from stderr (never from `config` stdout, which holds interpolated
/// values).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The builder was not given the agent's own `DOCKER_CONFIG` directory.
    #[error(
        "no docker config directory given: the agent needs its own DOCKER_CONFIG, never the invoking user's"
    )]
    MissingDockerConfig,

    /// The `DOCKER_CONFIG` directory is not absolute (children run in other directories).
    #[error("docker config directory {path} must be an absolute path")]
    RelativeDockerConfig {
        /// The path that was given.
        path: PathBuf,
    },

    /// A process could not be started at all.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program that was run.
        program: PathBuf,
        /// Why the operating system refused.
        #[source]
        source: io::Error,
    },

    /// A process ran past its timeout; it and its process group were killed.
    #[error(
        "{what} timed out after {after:?} and was killed{}",
        tail_suffix(stderr)
    )]
    Timeout {
        /// The command line, for example `docker compose ... pull`.
        what: String,
        /// The timeout that expired.
        after: Duration,
        /// The tail of what it wrote to stderr before it was killed.
        stderr: String,
    },

    /// A process exited unsuccessfully.
    #[error("{what} failed ({}){}", describe_code(*code), tail_suffix(stderr))]
    Failed {
        /// The command line.
        what: String,
        /// The exit code, `None` when a signal ended it.
        code: Option<i32>,
        /// The tail of its stderr.
        stderr: String,
    },

    /// `compose pull` failed; `message` is the registry's own text ("no basic auth
    /// credentials", "manifest unknown", a DNS failure), never just an exit code.
    #[error("compose pull failed: {message}")]
    PullFailed {
        /// The relevant lines of compose's output, joined with ` | `.
        message: String,
    },

    /// After `up`, containers did not all become running and healthy.
    #[error("containers not healthy after {after:?}: {}", summarize(containers))]
    Unhealthy {
        /// The containers as last seen.
        containers: Vec<Container>,
        /// How long the wait lasted.
        after: Duration,
    },

    /// No usable compose v2 exists; `detail` says where it was looked for.
    #[error("no docker compose v2 found: {detail}")]
    ComposeNotFound {
        /// What was tried, in order.
        detail: String,
    },

    /// Only compose v1 (the python `docker-compose` 1.x) exists; it is refused.
    #[error(
        "compose v1 ({version} at {path}) is not supported: install the docker compose v2 plugin (docker-compose-plugin)"
    )]
    ComposeV1 {
        /// The v1 binary that was found.
        path: PathBuf,
        /// The version it printed.
        version: String,
    },

    /// A command's output could not be understood.
    #[error("cannot parse the output of {what}: {detail}")]
    Parse {
        /// The command or API path.
        what: String,
        /// What was wrong (never the output itself).
        detail: String,
    },

    /// A command printed more than the configured output cap where all of it is needed.
    #[error("{what} printed more than {limit} bytes")]
    OutputTooLarge {
        /// The command line.
        what: String,
        /// The cap in bytes.
        limit: usize,
    },

    /// The Engine API cannot be reached (socket missing, refused, permission denied, or
    /// `DOCKER_HOST` is not a unix socket).
    #[error("docker engine at {target} is not reachable: {reason}")]
    EngineUnavailable {
        /// The socket path or `DOCKER_HOST` value.
        target: String,
        /// Why, in words.
        reason: String,
    },

    /// An Engine API request failed after connecting (timeout, broken body).
    #[error("docker engine request {path} failed: {source}")]
    EngineRequest {
        /// The API path.
        path: String,
        /// The transport error.
        #[source]
        source: std::io::Error,
    },

    /// The Engine API answered with an error status.
    #[error("docker engine answered {status} for {path}: {message}")]
    EngineStatus {
        /// The API path.
        path: String,
        /// The HTTP status.
        status: u16,
        /// The daemon's `message`.
        message: String,
    },

    /// The free space of the docker data root could not be read.
    #[error("cannot read the free space of {path}: {source}")]
    Statvfs {
        /// The directory.
        path: PathBuf,
        /// The system error.
        #[source]
        source: io::Error,
    },
}

/// What a caller can do about an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The box is set up wrongly (no compose v2, compose v1 only, bad configuration,
    /// docker missing): retrying will not help, an operator must act.
    Setup,
    /// A command ran too long and was killed.
    Timeout,
    /// A command failed (up, down, config, ...).
    CommandFailed,
    /// `compose pull` failed; the message says why.
    PullFailed,
    /// The containers did not become healthy.
    Unhealthy,
    /// The docker engine could not be reached; usually temporary.
    EngineUnavailable,
    /// Docker answered something unexpected (bad JSON, error status, oversized output).
    Protocol,
    /// A local filesystem call failed.
    Io,
}

impl Error {
    /// The coarse class of this error.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::MissingDockerConfig
            | Error::RelativeDockerConfig { .. }
            | Error::Spawn { .. }
            | Error::ComposeNotFound { .. }
            | Error::ComposeV1 { .. } => ErrorKind::Setup,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Failed { .. } => ErrorKind::CommandFailed,
            Error::PullFailed { .. } => ErrorKind::PullFailed,
            Error::Unhealthy { .. } => ErrorKind::Unhealthy,
            Error::EngineUnavailable { .. } | Error::EngineRequest { .. } => {
                ErrorKind::EngineUnavailable
            }
            Error::Parse { .. } | Error::OutputTooLarge { .. } | Error::EngineStatus { .. } => {
                ErrorKind::Protocol
            }
            Error::Statvfs { .. } => ErrorKind::Io,
        }
    }

    /// The cause in the process's own words, without the command line: for a failed or
    /// killed command, its error lines (`Error response from daemon: ...`), else its last
    /// line, at most [`Error::CAUSE_MAX`] characters; any other error's whole message. An
    /// operator reads this first; the command line names temporary paths that are gone.
    #[must_use]
    pub fn cause(&self) -> String {
        match self {
            Error::Failed { stderr, code, .. } => {
                first_words(stderr).unwrap_or_else(|| format!("failed ({})", describe_code(*code)))
            }
            Error::Timeout { stderr, after, .. } => match first_words(stderr) {
                Some(w) => format!("timed out after {after:?}: {w}"),
                None => format!("timed out after {after:?}"),
            },
            other => other.to_string(),
        }
    }

    /// The most characters [`Error::cause`] keeps.
    pub const CAUSE_MAX: usize = 400;

    /// A pull refused because the registry has no such image or tag (`manifest unknown`,
    /// `manifest for ... not found`): the bundle names an image that was never pushed, which
    /// no retry and no credential fixes.
    #[must_use]
    pub fn is_missing_image(&self) -> bool {
        match self {
            Error::PullFailed { message } => {
                let m = message.to_ascii_lowercase();
                m.contains("manifest unknown")
                    || (m.contains("manifest for ") && m.contains(" not found"))
            }
            _ => false,
        }
    }

    /// The exit code of a failed command, when there was one.
    #[must_use]
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            Error::Failed { code, .. } => *code,
            _ => None,
        }
    }
}

/// A command's error in its own words: the lines that say `error` (docker's `Error response
/// from daemon: ...`, compose's `error while interpolating ...`), else the last line; progress
/// lines (` Container x  Starting`) carry nothing. Joined with ` | `, cut to the last
/// [`Error::CAUSE_MAX`] characters.
fn first_words(stderr: &str) -> Option<String> {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.to_ascii_lowercase().contains("error"))
        .collect();
    let chosen = if errors.is_empty() {
        lines.last().map(|l| vec![*l])?
    } else {
        errors
    };
    let mut unique: Vec<&str> = Vec::new();
    for l in chosen {
        if !unique.contains(&l) {
            unique.push(l);
        }
    }
    Some(tail_chars(&unique.join(" | "), Error::CAUSE_MAX))
}

/// The last `max` bytes of `text`, cut at a character boundary, trimmed.
pub(crate) fn tail_chars(text: &str, max: usize) -> String {
    let text = text.trim();
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &text[start..])
}

fn describe_code(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exit code {c}"),
        None => "killed by a signal".to_owned(),
    }
}

fn tail_suffix(stderr: &str) -> String {
    let trimmed = stderr.trim();
    if trimmed.is_empty() {
        String::new()
    } else {
        format!(": {trimmed}")
    }
}

fn summarize(containers: &[Container]) -> String {
    let bad: Vec<String> = containers
        .iter()
        .filter(|c| !c.is_ready())
        .map(|c| match &c.health {
            Some(h) => format!("{} {} ({h})", c.name, c.state),
            None => format!("{} {}", c.name, c.state),
        })
        .collect();
    if bad.is_empty() {
        "no containers".to_owned()
    } else {
        bad.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_chars_cuts_at_char_boundary() {
        assert_eq!(tail_chars("  short \n", 10), "short");
        assert_eq!(tail_chars("abcdef", 3), "...def");
        assert_eq!(tail_chars("aé", 1), "...");
    }

    #[test]
    fn messages_are_lower_case_without_trailing_period() {
        let errors = [
            Error::MissingDockerConfig,
            Error::Failed {
                what: "docker compose up".into(),
                code: Some(1),
                stderr: "boom\n".into(),
            },
            Error::Failed {
                what: "docker compose up".into(),
                code: None,
                stderr: String::new(),
            },
            Error::PullFailed {
                message: "manifest unknown".into(),
            },
            Error::ComposeV1 {
                path: "/usr/bin/docker-compose".into(),
                version: "1.29.2".into(),
            },
        ];
        for e in errors {
            let text = e.to_string();
            assert!(text.chars().next().unwrap().is_lowercase(), "{text}");
            assert!(!text.ends_with('.'), "{text}");
        }
    }

    #[test]
    fn failed_names_code_and_stderr() {
        let e = Error::Failed {
            what: "docker compose up".into(),
            code: Some(18),
            stderr: "no such image\n".into(),
        };
        assert_eq!(
            e.to_string(),
            "docker compose up failed (exit code 18): no such image"
        );
        assert_eq!(e.exit_code(), Some(18));
        assert_eq!(e.kind(), ErrorKind::CommandFailed);
    }

    #[test]
    fn the_cause_comes_in_dockers_words_without_the_command_line() {
        let failed = |stderr: &str| Error::Failed {
            what: "docker compose --ansi never -p p -f /var/lib/x/staging/abc/compose.yaml up"
                .into(),
            code: Some(1),
            stderr: stderr.into(),
        };
        let port = failed(
            " Network p_default  Creating\n Container p-web-1  Starting\n\
             Error response from daemon: failed to set up container networking: driver failed \
             programming external connectivity on endpoint p-web-1: Bind for 0.0.0.0:8080 failed: \
             port is already allocated\n",
        );
        let cause = port.cause();
        assert!(cause.starts_with("Error response from daemon:"), "{cause}");
        assert!(cause.ends_with("port is already allocated"), "{cause}");
        assert!(!cause.contains("staging"), "{cause}");
        assert_eq!(
            failed("services.web.ports must be a list\n").cause(),
            "services.web.ports must be a list"
        );
        assert_eq!(failed("").cause(), "failed (exit code 1)");
        let twice = failed("Error: x\nError: x\n");
        assert_eq!(twice.cause(), "Error: x");
        let long = failed(&format!("error {}\n", "y".repeat(2000)));
        assert!(long.cause().len() <= Error::CAUSE_MAX + 3);
        assert_eq!(
            Error::PullFailed {
                message: "m".into()
            }
            .cause(),
            "compose pull failed: m"
        );
    }

    #[test]
    fn a_missing_tag_is_told_apart_from_other_pull_failures() {
        let pull = |m: &str| Error::PullFailed { message: m.into() };
        assert!(
            pull("manifest for reg:5000/app:nope not found: manifest unknown: manifest unknown")
                .is_missing_image()
        );
        assert!(pull("reg:5000/app:nope: manifest unknown").is_missing_image());
        assert!(!pull("no basic auth credentials").is_missing_image());
        assert!(!pull("dial tcp: lookup reg: no such host").is_missing_image());
    }

    #[test]
    fn unhealthy_lists_only_the_bad_containers() {
        let c = |name: &str, state: &str, health: Option<&str>| {
            crate::container::container(name, name, state, health)
        };
        let e = Error::Unhealthy {
            containers: vec![
                c("p-web-1", "running", Some("unhealthy")),
                c("p-db-1", "running", None),
                c("p-job-1", "exited", None),
            ],
            after: Duration::from_secs(3),
        };
        assert_eq!(
            e.to_string(),
            "containers not healthy after 3s: p-web-1 running (unhealthy), p-job-1 exited"
        );
    }
}
