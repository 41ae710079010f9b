//! Drift: how the project's containers differ from what the current release's last `up` left,
//! judged from one Engine API listing (the heartbeat's own), so finding it spawns no process.
//!
//! After every `up` that ended healthy (an apply, a heal, a finished interrupted apply) the
//! agent records, by container name, the service, compose's config hash, the image and whether
//! the container had already completed (exited 0: a one-shot such as a migration that its
//! dependents wait for with `service_completed_successfully`). A later listing is drift when:
//!
//! - a recorded container is gone (`docker rm -f`, `compose down` in the wrong directory, a
//!   `docker system prune`);
//! - a container is `exited` or `dead` and was not a completed one-shot that is still exited 0
//!   (`docker stop`, `docker kill`, a reboot or daemon restart of a service without a restart
//!   policy). The engine shows a container it is going to restart as `restarting`, so an exit
//!   under a restart policy is docker's to handle and never drift;
//! - its config hash or image differs from the record (recreated by another hand);
//! - it is `created` and never started (compose's leftover from an interrupted `up`, which
//!   blocks the name of the container the next `up` makes);
//! - the record has no container of that name (a container added to the project by hand, or a
//!   service that is not the release's).
//!
//! Health is not drift: a running container that is unhealthy is reported `UNHEALTHY` as
//! before, since recreating it would not make its dependencies answer.

use std::collections::BTreeMap;
use std::fmt;

use monky_agent_proto::Sha;
use monky_compose::ContainerFacts;
use serde::{Deserialize, Serialize};

/// What the last healthy `up` of a release left running, by container name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Converged {
    /// The release these containers are of.
    pub(crate) sha: Sha,
    /// Each container's record, by name.
    #[serde(default)]
    pub(crate) containers: BTreeMap<String, Expected>,
}

/// One container as the last healthy `up` left it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Expected {
    /// Its compose service.
    pub(crate) service: String,
    /// Compose's config hash label, when there was one.
    pub(crate) config_hash: Option<String>,
    /// The image id it ran.
    pub(crate) image_id: Option<String>,
    /// It had exited 0 already: a one-shot whose exit is its success.
    pub(crate) completed: bool,
}

/// state.json's record, read leniently: a record that does not parse (a hand edit, a sha that
/// is no sha) is dropped, as a missing one is, and the next healthy `up` writes it again; the
/// rest of the state stands.
pub(crate) fn lenient<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Converged>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(d)?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

impl Converged {
    /// The record of `sha` from a listing taken after its healthy `up`.
    pub(crate) fn record(sha: &Sha, facts: &[ContainerFacts]) -> Self {
        let containers = facts
            .iter()
            .filter(|f| f.container.state != "created")
            .map(|f| {
                let expected = Expected {
                    service: f.container.service.clone(),
                    config_hash: f.config_hash.clone(),
                    image_id: f.image_id.clone(),
                    completed: f.container.state == "exited" && f.exit_code == Some(0),
                };
                (f.container.name.clone(), expected)
            })
            .collect();
        Self {
            sha: sha.clone(),
            containers,
        }
    }
}

/// Who ended a stopped container's run, by the engine's record of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ender {
    /// Its own process exited: an error, a panic, a clean exit of a service meant to run.
    Itself,
    /// A signal from outside, SIGKILL (exit 137) or SIGTERM (143): `docker stop` or `kill`, an
    /// engine that stopped or restarted.
    Signal(i32),
    /// The kernel's OOM killer (`State.OOMKilled`).
    OomKiller,
    /// Exit 0 of a service meant to run, and no record of its death left in the engine: its
    /// record lives in memory and is short (every healthcheck probe adds to it), so an engine
    /// restart or a stop a while ago leaves none. A service that exits 0 on the SIGTERM of a
    /// `docker stop` or an engine stop reads so; an error exit never does.
    Unrecorded,
}

impl Ender {
    /// Who ended a run that ended with `exit_code`, by the code alone: 128 + the signal's
    /// number for SIGKILL and SIGTERM, which a process does not exit with by itself. The OOM
    /// killer's SIGKILL looks the same here; [`Ender::OomKiller`] is the engine's word.
    #[must_use]
    pub(crate) fn of_exit(exit_code: Option<i32>) -> Self {
        match exit_code {
            Some(137) => Ender::Signal(9),
            Some(143) => Ender::Signal(15),
            _ => Ender::Itself,
        }
    }

    /// Who ended the last run of a container, by the engine's record of its life (`events`,
    /// oldest first; `None` when the engine did not answer) and `State.OOMKilled`: of what
    /// the record holds after the last `start`, an `oom` or a `kill` with a stopping signal is
    /// from outside, a `die` alone is the container's own exit. A record without the death
    /// leaves the exit code: 137 and 143 are a signal's, another error exit the container's
    /// own, and 0 [`Ender::Unrecorded`].
    #[must_use]
    pub(crate) fn of_record(
        events: Option<&[monky_compose::ContainerEvent]>,
        exit_code: Option<i32>,
        oom_killed: bool,
    ) -> Self {
        if oom_killed {
            return Ender::OomKiller;
        }
        let Some(events) = events else {
            return Ender::of_exit(exit_code);
        };
        let since_start = events
            .iter()
            .rposition(|e| e.action == "start")
            .map_or(events, |i| &events[i + 1..]);
        if since_start.iter().any(|e| e.action == "oom") {
            return Ender::OomKiller;
        }
        // SIGINT, SIGQUIT, SIGKILL, SIGTERM: what `docker stop`, `kill` and an engine that
        // stops send; a SIGHUP asks a service to reload, and it lives on.
        if let Some(signal) = since_start
            .iter()
            .filter(|e| e.action == "kill")
            .filter_map(|e| e.signal)
            .find(|s| matches!(s, 2 | 3 | 9 | 15))
        {
            return Ender::Signal(signal);
        }
        if since_start.iter().any(|e| e.action == "die") {
            return Ender::Itself;
        }
        match exit_code {
            Some(0) => Ender::Unrecorded,
            code => Ender::of_exit(code),
        }
    }

    /// Not the container's own doing: the box admin's to explain, and no crash.
    #[must_use]
    pub(crate) fn is_from_outside(self) -> bool {
        self != Ender::Itself
    }
}

impl fmt::Display for Ender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ender::Itself => write!(f, "exited by itself"),
            Ender::Signal(9) => write!(
                f,
                "stopped from outside by SIGKILL (docker kill, a docker stop past its grace \
                 period, or an engine stop or restart)"
            ),
            Ender::Signal(n) => write!(
                f,
                "stopped from outside by signal {n} (docker stop or kill, or an engine stop or \
                 restart)"
            ),
            Ender::OomKiller => write!(f, "killed by the kernel's OOM killer"),
            Ender::Unrecorded => write!(
                f,
                "stopped from outside as far as the engine shows (a clean exit of a service \
                 meant to run, and no record of its death left: an engine stop or restart, or \
                 a docker stop)"
            ),
        }
    }
}

/// How one container drifted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Recorded, and gone.
    Missing,
    /// Exited or dead, with its exit code when the engine says.
    Stopped {
        /// `exited` or `dead`.
        state: String,
        /// The exit code.
        exit_code: Option<i32>,
        /// Who ended its run.
        ender: Ender,
    },
    /// Its config hash or image differs from the record.
    Replaced,
    /// Created and never started: a leftover of an interrupted `up`.
    Leftover,
    /// Not recorded: made by another hand, or of a service the release does not have.
    Extra,
}

/// One drifted container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Drift {
    /// The container's name (empty when nothing of the project is left and no record says
    /// which containers there were).
    pub(crate) container: String,
    /// Its compose service.
    pub(crate) service: String,
    /// How it drifted.
    pub(crate) kind: Kind,
}

impl Drift {
    /// Whether a heal removes this container before `up`: compose would not replace it, or
    /// could not make its own under that name.
    pub(crate) fn must_be_removed(&self) -> bool {
        matches!(self.kind, Kind::Replaced | Kind::Leftover | Kind::Extra)
    }
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let service = if self.service.is_empty() {
            "?"
        } else {
            &self.service
        };
        match &self.kind {
            Kind::Missing if self.container.is_empty() => {
                write!(f, "every container of the project is missing")
            }
            Kind::Missing => write!(f, "{service} missing ({})", self.container),
            Kind::Stopped {
                state,
                exit_code,
                ender,
            } => {
                match exit_code {
                    Some(code) => write!(f, "{service} {state} ({code}) ({})", self.container)?,
                    None => write!(f, "{service} {state} ({})", self.container)?,
                }
                if ender.is_from_outside() {
                    write!(f, ", {ender}")?;
                }
                Ok(())
            }
            Kind::Replaced => write!(f, "{service} recreated by hand ({})", self.container),
            Kind::Leftover => write!(f, "{service} created, never started ({})", self.container),
            Kind::Extra => write!(f, "{service} not the release's ({})", self.container),
        }
    }
}

/// The drift of `seen` (the project's containers now) from `converged`, the record of the
/// release `applied` names; without a record of that release, only what needs none (a
/// stopped or leftover container, or nothing of the project left) is found.
pub(crate) fn detect(
    applied: &Sha,
    converged: Option<&Converged>,
    seen: &[ContainerFacts],
) -> Vec<Drift> {
    let record = converged.filter(|c| c.sha == *applied);
    let mut out = Vec::new();
    for f in seen {
        let c = &f.container;
        let drift = |kind| Drift {
            container: c.name.clone(),
            service: c.service.clone(),
            kind,
        };
        let expected = record.and_then(|r| r.containers.get(&c.name));
        if c.state == "created" {
            out.push(drift(Kind::Leftover));
            continue;
        }
        if record.is_some() && expected.is_none() {
            out.push(drift(Kind::Extra));
            continue;
        }
        // Only the engine's answer carries the hash and the image; the CLI fallback's rows
        // (no id) are not compared, or every container would look replaced.
        if let Some(e) = expected.filter(|_| !f.id.is_empty()) {
            // A container without compose's hash where compose had put one is not compose's.
            let hash_differs = e.config_hash.is_some() && e.config_hash != f.config_hash;
            let image_differs =
                e.image_id.is_some() && f.image_id.is_some() && e.image_id != f.image_id;
            if hash_differs || image_differs {
                out.push(drift(Kind::Replaced));
                continue;
            }
        }
        if matches!(c.state.as_str(), "exited" | "dead") {
            let one_shot_done = expected.is_some_and(|e| e.completed)
                && c.state == "exited"
                && f.exit_code == Some(0);
            if !one_shot_done {
                out.push(drift(Kind::Stopped {
                    state: c.state.clone(),
                    exit_code: f.exit_code,
                    ender: Ender::of_exit(f.exit_code),
                }));
            }
        }
    }
    match record {
        Some(r) => {
            for (name, e) in &r.containers {
                if !seen.iter().any(|f| &f.container.name == name) {
                    out.push(Drift {
                        container: name.clone(),
                        service: e.service.clone(),
                        kind: Kind::Missing,
                    });
                }
            }
        }
        None if seen.is_empty() => out.push(Drift {
            container: String::new(),
            service: String::new(),
            kind: Kind::Missing,
        }),
        None => {}
    }
    out
}

/// Whether the engine's `completed` for container `name` stands: a container that exits 0 with
/// no restart policy looks the same whether it did its work or someone stopped it, and the
/// record of the last healthy up tells them apart (running then: stopped, not done; exited 0
/// already, or not in the record: a one-shot).
#[must_use]
pub(crate) fn completed_stands(record: Option<&Converged>, name: &str) -> bool {
    record
        .and_then(|r| r.containers.get(name))
        .is_none_or(|c| c.completed)
}

/// `containers` as the engine lists them, each `completed` kept only where
/// [`completed_stands`]: what `status` and `explain` judge.
#[must_use]
pub(crate) fn settled(
    mut containers: Vec<monky_compose::Container>,
    record: Option<&Converged>,
) -> Vec<monky_compose::Container> {
    for c in &mut containers {
        c.completed = c.completed && completed_stands(record, &c.name);
    }
    containers
}

/// Of `drift`, the containers that died by their own exit: a crash, when it repeats.
pub(crate) fn crashed(drift: &[Drift]) -> Vec<&Drift> {
    drift
        .iter()
        .filter(|d| {
            matches!(
                d.kind,
                Kind::Stopped {
                    ender: Ender::Itself,
                    ..
                }
            )
        })
        .collect()
}

/// Whether every drift of `drift` is a container stopped from outside: nothing of the
/// release's own doing, healed at once.
pub(crate) fn only_stopped_from_outside(drift: &[Drift]) -> bool {
    !drift.is_empty()
        && drift
            .iter()
            .all(|d| matches!(d.kind, Kind::Stopped { ender, .. } if ender.is_from_outside()))
}

/// The drift as one line: `web missing (p-web-1), db exited (1) (p-db-1)`.
pub(crate) fn describe(drift: &[Drift]) -> String {
    drift
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use monky_compose::Container;

    /// The shas of the tests: `S` the applied release, `T` another.
    fn sha(name: &str) -> Sha {
        let digit = if name == "S" { "5" } else { "7" };
        Sha::parse(&digit.repeat(64)).unwrap()
    }

    fn facts(
        name: &str,
        service: &str,
        state: &str,
        hash: &str,
        exit: Option<i32>,
    ) -> ContainerFacts {
        ContainerFacts {
            container: Container {
                name: name.into(),
                service: service.into(),
                state: state.into(),
                health: None,
                completed: false,
            },
            id: format!("id-{name}"),
            config_hash: Some(hash.into()),
            image_id: Some("sha256:img".into()),
            exit_code: exit,
            awaited: false,
        }
    }

    fn converged() -> Converged {
        Converged::record(
            &sha("S"),
            &[
                facts("p-web-1", "web", "running", "h-web", None),
                facts("p-migrate-1", "migrate", "exited", "h-migrate", Some(0)),
            ],
        )
    }

    /// `check(seen, expected drift lines)` against the record above.
    fn check(seen: &[ContainerFacts], expected: &[&str]) {
        let got = detect(&sha("S"), Some(&converged()), seen);
        let lines: Vec<String> = got.iter().map(ToString::to_string).collect();
        assert_eq!(lines, expected, "{seen:?}");
    }

    #[test]
    fn the_record_keeps_one_shots_as_completed_and_skips_leftovers() {
        let c = converged();
        assert!(c.containers["p-migrate-1"].completed);
        assert!(!c.containers["p-web-1"].completed);
        let with_leftover =
            Converged::record(&sha("S"), &[facts("p-x-1", "x", "created", "h", None)]);
        assert!(with_leftover.containers.is_empty());
    }

    #[test]
    fn drift_by_kind() {
        let web = |state: &str, hash: &str, exit| facts("p-web-1", "web", state, hash, exit);
        let migrate = |exit| facts("p-migrate-1", "migrate", "exited", "h-migrate", exit);
        // Converged: the web runs, the one-shot stays exited 0.
        check(&[migrate(Some(0)), web("running", "h-web", None)], &[]);
        // Docker's to restart: not drift.
        check(&[migrate(Some(0)), web("restarting", "h-web", None)], &[]);
        // A paused container is a person's pause, reported by its health as before.
        check(&[migrate(Some(0)), web("paused", "h-web", None)], &[]);
        check(&[migrate(Some(0))], &["web missing (p-web-1)"]);
        check(
            &[],
            &["migrate missing (p-migrate-1)", "web missing (p-web-1)"],
        );
        check(
            &[migrate(Some(0)), web("exited", "h-web", Some(0))],
            &["web exited (0) (p-web-1)"],
        );
        check(
            &[migrate(Some(0)), web("exited", "h-web", Some(137))],
            &[
                "web exited (137) (p-web-1), stopped from outside by SIGKILL (docker kill, a \
               docker stop past its grace period, or an engine stop or restart)",
            ],
        );
        check(
            &[migrate(Some(0)), web("exited", "h-web", Some(143))],
            &[
                "web exited (143) (p-web-1), stopped from outside by signal 15 (docker stop or \
               kill, or an engine stop or restart)",
            ],
        );
        check(
            &[migrate(Some(0)), web("dead", "h-web", None)],
            &["web dead (p-web-1)"],
        );
        // A one-shot that failed on its own later is drift.
        check(
            &[migrate(Some(1)), web("running", "h-web", None)],
            &["migrate exited (1) (p-migrate-1)"],
        );
        check(
            &[migrate(Some(0)), web("running", "h-other", None)],
            &["web recreated by hand (p-web-1)"],
        );
        let mut no_hash = web("running", "h-web", None);
        no_hash.config_hash = None;
        check(
            &[migrate(Some(0)), no_hash.clone()],
            &["web recreated by hand (p-web-1)"],
        );
        // The CLI fallback's rows carry no id, hash or image: not compared.
        no_hash.id = String::new();
        check(&[migrate(Some(0)), no_hash], &[]);
        let mut other_image = web("running", "h-web", None);
        other_image.image_id = Some("sha256:other".into());
        check(
            &[migrate(Some(0)), other_image],
            &["web recreated by hand (p-web-1)"],
        );
        check(
            &[migrate(Some(0)), web("created", "h-web", None)],
            &["web created, never started (p-web-1)"],
        );
        check(
            &[
                migrate(Some(0)),
                web("running", "h-web", None),
                facts("p-intruder-1", "intruder", "running", "x", None),
            ],
            &["intruder not the release's (p-intruder-1)"],
        );
    }

    #[test]
    fn without_a_record_of_the_applied_release_only_what_needs_none_is_found() {
        let stale = converged();
        let seen = [facts("p-web-1", "web", "running", "h-other", None)];
        assert_eq!(detect(&sha("T"), Some(&stale), &seen), vec![]);
        assert_eq!(detect(&sha("T"), None, &seen), vec![]);
        let stopped = [facts("p-web-1", "web", "exited", "h", Some(0))];
        assert_eq!(
            describe(&detect(&sha("T"), None, &stopped)),
            "web exited (0) (p-web-1)"
        );
        assert_eq!(
            describe(&detect(&sha("T"), None, &[])),
            "every container of the project is missing"
        );
    }

    #[test]
    fn who_ended_a_run_by_the_engines_record() {
        let ev = |action: &str, signal: Option<i32>, exit_code: Option<i32>| {
            monky_compose::ContainerEvent {
                action: action.into(),
                time: 0,
                signal,
                exit_code,
            }
        };
        let check = |events: Option<&[monky_compose::ContainerEvent]>,
                     exit: Option<i32>,
                     oom: bool,
                     expected: Ender| {
            assert_eq!(
                Ender::of_record(events, exit, oom),
                expected,
                "{events:?} {exit:?} {oom}"
            );
        };
        let stopped = [
            ev("start", None, None),
            ev("kill", Some(15), None),
            ev("die", None, Some(0)),
            ev("stop", None, None),
        ];
        // `docker stop` of a service that exits 0 on SIGTERM.
        check(Some(&stopped), Some(0), false, Ender::Signal(15));
        // A stop before the last start is history: this run died by itself.
        let crashed_since = [
            stopped.as_slice(),
            &[ev("start", None, None), ev("die", None, Some(3))],
        ]
        .concat();
        check(Some(&crashed_since), Some(3), false, Ender::Itself);
        // A reload signal is no stop.
        let reloaded = [
            ev("start", None, None),
            ev("kill", Some(1), None),
            ev("die", None, Some(1)),
        ];
        check(Some(&reloaded), Some(1), false, Ender::Itself);
        check(
            Some(&[ev("oom", None, None), ev("die", None, Some(137))]),
            Some(137),
            false,
            Ender::OomKiller,
        );
        check(Some(&stopped), Some(137), true, Ender::OomKiller);
        // No record of the death (an engine restarted since, or the record moved on): an
        // error exit is still the container's own.
        check(Some(&[]), Some(0), false, Ender::Unrecorded);
        check(Some(&[]), Some(143), false, Ender::Signal(15));
        check(Some(&[]), Some(3), false, Ender::Itself);
        // The engine did not answer: the exit code alone.
        check(None, Some(137), false, Ender::Signal(9));
        check(None, Some(0), false, Ender::Itself);
    }

    #[test]
    fn what_a_heal_removes_first() {
        let d = |kind| Drift {
            container: "c".into(),
            service: "s".into(),
            kind,
        };
        assert!(d(Kind::Replaced).must_be_removed());
        assert!(d(Kind::Leftover).must_be_removed());
        assert!(d(Kind::Extra).must_be_removed());
        assert!(!d(Kind::Missing).must_be_removed());
        assert!(
            !d(Kind::Stopped {
                state: "exited".into(),
                exit_code: None,
                ender: Ender::Itself,
            })
            .must_be_removed()
        );
    }
}
