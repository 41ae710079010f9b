//! Names no other env can own: the containers, volumes and networks a release would make,
//! judged against every project on the box (the engine's, and the other agents' configs).
//!
//! Compose names a project's objects `<project>-<service>-<n>` and `<project>_<key>`, so one
//! env's project name can be a prefix of another's (`monky-env-qa` and `monky-env-qa-b`): the
//! first may then write a name the second makes by default, and the second's every `up` fails
//! on it, or reuses its volume. A name belongs to the longest project name it starts with
//! (followed by `-` or `_`); a release may make only names that are its own project's and that
//! no object of another project, or of no project, already has.

use std::collections::BTreeSet;
use std::path::Path;

use monky_compose::{NamedObject, ObjectKind};
use serde_json::Value;

/// One name a release would make.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Made {
    /// What it names.
    pub(crate) kind: ObjectKind,
    /// The name.
    pub(crate) name: String,
}

/// The names compose's `model` of `project` makes: a container per replica (its
/// `container_name`, else `<project>-<service>-<n>`), and each volume's and network's `name`
/// but external ones.
#[must_use]
pub(crate) fn made_by(model: &Value, project: &str) -> Vec<Made> {
    let mut out = Vec::new();
    let entries = |key: &str| {
        model
            .get(key)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
    };
    for (service, s) in entries("services") {
        if let Some(name) = s.get("container_name").and_then(Value::as_str) {
            out.push(made(ObjectKind::Container, name));
            continue;
        }
        let replicas = s
            .get("scale")
            .or_else(|| s.pointer("/deploy/replicas"))
            .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))
            .unwrap_or(1)
            .clamp(1, 1000);
        for n in 1..=replicas {
            out.push(made(
                ObjectKind::Container,
                &format!("{project}-{service}-{n}"),
            ));
        }
    }
    for (key, kind) in [
        ("volumes", ObjectKind::Volume),
        ("networks", ObjectKind::Network),
    ] {
        for (_, v) in entries(key) {
            let external = v
                .get("external")
                .is_some_and(|e| e.as_bool() != Some(false));
            if let Some(name) = v.get("name").and_then(Value::as_str).filter(|_| !external) {
                out.push(made(kind, name));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn made(kind: ObjectKind, name: &str) -> Made {
    Made {
        kind,
        name: name.to_owned(),
    }
}

/// The project a `name` belongs to among `projects`: the longest one it equals or starts with
/// followed by `-` or `_`.
#[must_use]
pub(crate) fn owner<'a>(name: &str, projects: &'a BTreeSet<String>) -> Option<&'a str> {
    projects
        .iter()
        .filter(|p| {
            name == p.as_str()
                || name
                    .strip_prefix(p.as_str())
                    .is_some_and(|rest| rest.starts_with(['-', '_']))
        })
        .max_by_key(|p| p.len())
        .map(String::as_str)
}

/// Each name of `made` that is not `ours` to make, in words naming both projects: one that
/// belongs to another project on the box (`others`), or that an object of another project, or
/// of none, already has on the engine (`on_engine`).
#[must_use]
pub(crate) fn conflicts(
    ours: &str,
    made: &[Made],
    others: &BTreeSet<String>,
    on_engine: &[NamedObject],
) -> Vec<String> {
    let mut projects: BTreeSet<String> = others.clone();
    projects.extend(on_engine.iter().filter_map(|o| o.project.clone()));
    projects.insert(ours.to_owned());
    let mut out = Vec::new();
    for m in made {
        let kind = m.kind.as_str();
        if let Some(owner) = owner(&m.name, &projects).filter(|o| *o != ours) {
            out.push(format!(
                "{kind} {} is project {owner}'s name, not {ours}'s",
                m.name
            ));
            continue;
        }
        let taken = on_engine
            .iter()
            .find(|o| o.kind == m.kind && o.name == m.name && o.project.as_deref() != Some(ours));
        if let Some(t) = taken {
            out.push(match &t.project {
                Some(p) => format!("{kind} {} exists, made by project {p}", m.name),
                None => format!("{kind} {} exists, made by hand", m.name),
            });
        }
    }
    out
}

/// The other agents' configs on this box: every `*.yaml` / `*.yml` file beside `config` but
/// itself, with its text. Bounded: a config is a few hundred bytes, and a larger file is none.
pub(crate) fn sibling_configs(config: &Path) -> Vec<(std::path::PathBuf, String)> {
    let Some(dir) = config.parent() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
        if !yaml || path == config || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(text) if text.len() <= 256 * 1024 => out.push((path, text)),
            _ => {}
        }
    }
    out.sort();
    out
}

/// The compose projects of the other agents configured on this box, by their
/// `compose_project` or `monky-<env_id>`. A file that does not read as a config names nothing.
#[must_use]
pub(crate) fn configured_projects(config: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, text) in sibling_configs(config) {
        let Ok(doc) = serde_saphyr::from_str::<Value>(&text) else {
            continue;
        };
        let project = doc
            .get("compose_project")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| {
                doc.get("env_id")
                    .and_then(Value::as_str)
                    .map(|e| format!("monky-{e}"))
            });
        out.extend(project);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(kind: ObjectKind, name: &str, project: Option<&str>) -> NamedObject {
        NamedObject {
            kind,
            name: name.into(),
            project: project.map(Into::into),
        }
    }

    #[test]
    fn a_name_belongs_to_the_longest_project_it_starts_with() {
        let projects: BTreeSet<String> = ["monky-env-qa", "monky-env-qa-b", "monky-qa"]
            .map(String::from)
            .into();
        assert_eq!(
            owner("monky-env-qa-b-web-1", &projects),
            Some("monky-env-qa-b")
        );
        assert_eq!(owner("monky-env-qa-web-1", &projects), Some("monky-env-qa"));
        assert_eq!(
            owner("monky-env-qa_db_data", &projects),
            Some("monky-env-qa")
        );
        assert_eq!(
            owner("monky-env-qa-b_default", &projects),
            Some("monky-env-qa-b")
        );
        assert_eq!(owner("monky-env-qab-web-1", &projects), None);
        assert_eq!(owner("redis", &projects), None);
    }

    #[test]
    fn another_envs_default_names_and_taken_names_are_conflicts() {
        let model = json!({
            "services": {
                "web": {"container_name": "monky-env-qa-b-web-1"},
                "worker": {"scale": 2},
                "db": {}
            },
            "volumes": {"data": {"name": "monky-env-qa_data"}, "ext": {"name": "shared", "external": true}},
            "networks": {"default": {"name": "monky-env-qa_default"}}
        });
        let made = made_by(&model, "monky-env-qa");
        assert_eq!(made.len(), 6, "{made:?}");
        let others: BTreeSet<String> = ["monky-env-qa-b".to_string()].into();
        let engine = [
            obj(ObjectKind::Volume, "monky-env-qa_data", None),
            obj(
                ObjectKind::Container,
                "monky-env-qa-db-1",
                Some("monky-env-qa"),
            ),
        ];
        assert_eq!(
            conflicts("monky-env-qa", &made, &others, &engine),
            [
                "container monky-env-qa-b-web-1 is project monky-env-qa-b's name, not monky-env-qa's",
                "volume monky-env-qa_data exists, made by hand",
            ]
        );
        // The victim's own names are its own.
        let theirs = made_by(&json!({"services": {"web": {}}}), "monky-env-qa-b");
        let ours: BTreeSet<String> = ["monky-env-qa".to_string()].into();
        assert!(conflicts("monky-env-qa-b", &theirs, &ours, &[]).is_empty());
    }

    #[test]
    fn the_other_configs_on_the_box_name_their_projects() {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("config.yaml");
        std::fs::write(&ours, "env_id: env-qa\n").unwrap();
        std::fs::write(dir.path().join("b.yaml"), "env_id: env-qa-b\nsite: x\n").unwrap();
        std::fs::write(
            dir.path().join("c.yml"),
            "env_id: c\ncompose_project: custom\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("notes.txt"), "env_id: nope\n").unwrap();
        std::fs::write(dir.path().join("broken.yaml"), ": : :\n").unwrap();
        let got = configured_projects(&ours);
        assert_eq!(
            got,
            ["custom".to_string(), "monky-env-qa-b".to_string()].into()
        );
    }
}
