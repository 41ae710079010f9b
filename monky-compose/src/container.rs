//! The state of one compose container, as both the Engine API and `compose ps` report it.

use serde::{Deserialize, Serialize};

/// One container of a compose project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// The container name without the leading `/`, for example `monky-env-qa-02-web-1`.
    pub name: String,
    /// The compose service it belongs to.
    pub service: String,
    /// The engine state: `created`, `running`, `restarting`, `paused`, `exited`, `dead`, ...
    pub state: String,
    /// `healthy`, `unhealthy` or `starting` when the service has a healthcheck.
    pub health: Option<String>,
    /// A one-shot that did its work: exited 0, and not to be started again (another service
    /// waits for it with `service_completed_successfully`, or its restart policy is `no` or
    /// `on-failure`). Done, not down.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub completed: bool,
}

impl Container {
    /// From what every source reports: the engine's `state`, its `status` text and compose's
    /// `Health` field (empty where the source has none), read by [`docker_words`].
    pub(crate) fn from_row(
        name: String,
        service: String,
        state: &str,
        status: &str,
        health: &str,
    ) -> Self {
        let (state, health) = docker_words(state, status, health);
        Container {
            name,
            service,
            state,
            health,
            completed: false,
        }
    }

    /// Up as compose means it: running, and healthy if it has a healthcheck; or a one-shot
    /// that completed ([`Container::completed`]).
    #[must_use]
    pub fn is_ready(&self) -> bool {
        Self::ready(&self.state, self.health.as_deref(), self.completed)
    }

    /// The one readiness rule, [`is_ready`](Self::is_ready)'s, on a state, health and
    /// one-shot completion kept apart from their container (the agent's state file keeps only
    /// these of a container): a completed one-shot, or `running` and `healthy` unless there is
    /// no healthcheck.
    ///
    /// ```
    /// use monky_compose::Container;
    /// assert!(Container::ready("running", None, false));
    /// assert!(Container::ready("running", Some("healthy"), false));
    /// assert!(!Container::ready("running", Some("starting"), false));
    /// assert!(!Container::ready("restarting", None, false));
    /// assert!(Container::ready("exited", None, true));
    /// ```
    #[must_use]
    pub fn ready(state: &str, health: Option<&str>, completed: bool) -> bool {
        completed || (state == "running" && health.is_none_or(|h| h == "healthy"))
    }

    /// Has failed for good: exited (but for a completed one-shot), dead, or its healthcheck
    /// says unhealthy.
    #[must_use]
    pub fn has_failed(&self) -> bool {
        (matches!(self.state.as_str(), "exited" | "dead" | "removing") && !self.completed)
            || self.health.as_deref() == Some("unhealthy")
    }
}

/// A container from its four fields, for this crate's unit tests.
#[cfg(test)]
pub(crate) fn container(name: &str, service: &str, state: &str, health: Option<&str>) -> Container {
    Container {
        name: name.into(),
        service: service.into(),
        state: state.into(),
        health: health.map(str::to_owned),
        completed: false,
    }
}

/// What one source (`compose ps`, the Engine API, the `docker ps` fallback) says about one
/// container.
pub(crate) trait Row {
    /// A `compose run` one-off container, which is not part of the project's state.
    fn is_oneoff(&self) -> bool;
    /// The container it describes.
    fn into_container(self) -> Container;
}

/// A project's containers from one source's rows: one-off containers left out, the rest in
/// name order, so that every source gives the same list.
pub(crate) fn project_containers<R: Row>(rows: impl IntoIterator<Item = R>) -> Vec<Container> {
    let mut out: Vec<Container> = rows
        .into_iter()
        .filter(|r| !r.is_oneoff())
        .map(Row::into_container)
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Docker's words for a container, the one reader of them: the state (the engine's `State`
/// lower-cased, or, where an old engine leaves it empty, guessed from the `Status` text such as
/// `Up 3 minutes` or `Exited (1) 2 minutes ago`), and the health (`healthy`, `unhealthy` or
/// `starting`, from compose's `Health` field, else from the `Status` text's last parentheses,
/// `(healthy)` or `(health: starting)`; `None` without a healthcheck). Other parentheses
/// (`Exited (0) ...`, `(Paused)`) are not health, and a word this does not know is no health.
pub(crate) fn docker_words(state: &str, status: &str, health: &str) -> (String, Option<String>) {
    let health_word = |raw: &str| {
        let h = raw.trim();
        let h = h.strip_prefix("health:").map_or(h, str::trim);
        let h = h.to_ascii_lowercase();
        matches!(h.as_str(), "healthy" | "unhealthy" | "starting").then_some(h)
    };
    let health = health_word(health).or_else(|| {
        let open = status.rfind('(')?;
        let close = status[open..].find(')')? + open;
        health_word(&status[open + 1..close])
    });
    if !state.is_empty() {
        return (state.to_ascii_lowercase(), health);
    }
    let s = status.trim_start();
    let state = if s.starts_with("Up") {
        if s.contains("(Paused)") {
            "paused"
        } else {
            "running"
        }
    } else if s.starts_with("Exited") {
        "exited"
    } else if s.starts_with("Restarting") {
        "restarting"
    } else if s.starts_with("Created") {
        "created"
    } else if s.starts_with("Dead") {
        "dead"
    } else if s.starts_with("Removal") {
        "removing"
    } else {
        "unknown"
    };
    (state.to_owned(), health)
}

/// Docker's word in compose's `com.docker.compose.oneoff` label for a `compose run`
/// container, as every source spells it (`True`, any case).
pub(crate) fn oneoff_word(value: &str) -> bool {
    value.eq_ignore_ascii_case("true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_from_status_text() {
        let check = |status: &str, expected: Option<&str>| {
            assert_eq!(
                docker_words("running", status, "").1.as_deref(),
                expected,
                "status {status:?}"
            );
        };
        check("Up 3 minutes (healthy)", Some("healthy"));
        check("Up 5 minutes (unhealthy)", Some("unhealthy"));
        check("Up 2 seconds (health: starting)", Some("starting"));
        check("Up 2 seconds", None);
        check("Exited (0) 3 minutes ago", None);
        check("Exited (137) 3 minutes ago", None);
        check("Up 1 hour (Paused)", None);
        check("Created", None);
        check("", None);
    }

    #[test]
    fn state_from_status_text() {
        let check = |status: &str, expected: &str| {
            assert_eq!(
                docker_words("", status, "").0,
                expected,
                "status {status:?}"
            );
        };
        check("Up 3 minutes (healthy)", "running");
        check("Up 1 hour (Paused)", "paused");
        check("Exited (1) 2 minutes ago", "exited");
        check("Restarting (1) 5 seconds ago", "restarting");
        check("Created", "created");
        check("Dead", "dead");
        check("Removal In Progress", "removing");
        check("something new", "unknown");
    }

    #[test]
    fn compose_s_health_field_comes_first_and_the_state_is_lower_cased() {
        let check = |state: &str, status: &str, health: &str, expected: (&str, Option<&str>)| {
            let (s, h) = docker_words(state, status, health);
            assert_eq!(
                (s.as_str(), h.as_deref()),
                expected,
                "{state:?} {status:?} {health:?}"
            );
        };
        check(
            "Running",
            "Up 1 minute (healthy)",
            "",
            ("running", Some("healthy")),
        );
        check(
            "running",
            "Up 1 minute (healthy)",
            "Starting",
            ("running", Some("starting")),
        );
        check(
            "running",
            "Up 1 minute",
            " health: unhealthy ",
            ("running", Some("unhealthy")),
        );
        check(
            "running",
            "Up 1 minute (healthy)",
            "none",
            ("running", Some("healthy")),
        );
        check("running", "Up 1 minute", "sleepy", ("running", None));
    }

    #[test]
    fn readiness() {
        let c = |state: &str, health: Option<&str>| container("n", "s", state, health);
        // Ready: running, and healthy when there is a healthcheck; nothing else is.
        let table: &[(&str, Option<&str>, bool)] = &[
            ("running", None, true),
            ("running", Some("healthy"), true),
            ("running", Some("starting"), false),
            ("running", Some("unhealthy"), false),
            ("created", None, false),
            ("restarting", None, false),
            ("paused", None, false),
            ("exited", None, false),
            ("exited", Some("healthy"), false),
            ("dead", None, false),
            ("", None, false),
        ];
        for (state, health, ready) in table {
            let container = c(state, *health);
            assert_eq!(container.is_ready(), *ready, "{container:?}");
            assert_eq!(
                Container::ready(state, *health, false),
                *ready,
                "{container:?}"
            );
        }
        assert!(c("exited", None).has_failed());
        assert!(c("running", Some("unhealthy")).has_failed());
        assert!(!c("running", Some("starting")).has_failed());
        assert!(!c("restarting", None).has_failed());
    }
}
