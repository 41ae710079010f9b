//! `cargo xtask teardown`: removes the suite's containers, networks, volumes and test images,
//! stops by PID what setup started (registry, dockerd if setup started it), deletes the run
//! state. Apt installs are kept. Safe to run any number of times.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::docker::Docker;
use crate::procs;
use crate::state::{self, EnvFile, IMAGE_LABEL, NAME_PREFIX, RUN_LABEL, remove_if_exists};

const COMPOSE_PROJECT: &str = "com.docker.compose.project";

/// Runs teardown with the command-line `args` (after `teardown`).
pub fn main(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        if arg == "-h" || arg == "--help" {
            println!(
                "cargo xtask teardown\n  stops what setup started and removes monky-e2e-* docker objects"
            );
            return Ok(());
        }
        bail!("teardown: unknown argument {arg:?} (try --help)");
    }
    teardown()
}

/// The whole teardown, as `cargo xtask ci` also calls it.
pub fn teardown() -> Result<()> {
    let run_state = EnvFile::load(&state::state_path())?.unwrap_or_default();
    println!(
        "==> teardown: docker objects named {NAME_PREFIX}* or labelled {RUN_LABEL}/{IMAGE_LABEL}"
    );
    match Docker::find().filter(Docker::engine_up) {
        Some(docker) => remove_docker_objects(&docker)?,
        None => println!("    the docker engine does not answer: no docker objects to remove"),
    }
    println!("==> teardown: a demo left running by `cargo xtask demo --keep`");
    if let Err(e) = crate::demo::stop_kept() {
        // Not fatal: the demo's containers went with the docker objects above.
        println!("    warning: {e:#}");
    }
    println!("==> teardown: processes started by setup");
    stop_registry(&run_state)?;
    if let Some(pid) = pid_of(&run_state, "DOCKERD_PID")
        && procs::stop(pid, "dockerd", Duration::from_secs(30))?
    {
        println!("    stopped dockerd (pid {pid})");
    }
    println!("==> teardown: run state");
    remove_run_dir(&run_state)?;
    remove_stale_run_dirs()?;
    for file in [state::e2e_env_path(), state::state_path()] {
        remove_if_exists(&file)?;
    }
    println!("teardown: ok");
    Ok(())
}

/// Stops the registry recorded in `run_state`, if it is still running.
pub fn stop_registry(run_state: &EnvFile) -> Result<()> {
    if let Some(pid) = pid_of(run_state, "REGISTRY_PID")
        && procs::stop(pid, "docker-registry", Duration::from_secs(10))?
    {
        println!("    stopped docker-registry (pid {pid})");
    }
    Ok(())
}

/// Removes every `monky-e2e-*` run folder under the ci-run dir (left by runs whose state
/// was lost, e.g. a setup that failed half-way).
fn remove_stale_run_dirs() -> Result<()> {
    let root = state::ci_run_dir();
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() && is_run_dir(&path, &root) {
            remove_if_exists(&path)?;
            println!("    removed {}", path.display());
        }
    }
    Ok(())
}

/// Removes the run folder recorded in `run_state` (registry storage, build context, logs).
/// Only a folder directly under the ci-run dir whose name starts with `monky-e2e-` is removed.
pub fn remove_run_dir(run_state: &EnvFile) -> Result<()> {
    let Some(dir) = run_state.get("RUN_DIR").map(PathBuf::from) else {
        return Ok(());
    };
    if !is_run_dir(&dir, &state::ci_run_dir()) {
        bail!(
            "refusing to remove {}: not a {NAME_PREFIX}* folder in {}",
            dir.display(),
            state::ci_run_dir().display()
        );
    }
    if dir.exists() {
        remove_if_exists(&dir)?;
        println!("    removed {}", dir.display());
    }
    Ok(())
}

fn is_run_dir(dir: &Path, root: &Path) -> bool {
    dir.parent() == Some(root)
        && dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(NAME_PREFIX) && n.len() > NAME_PREFIX.len())
}

fn pid_of(run_state: &EnvFile, key: &str) -> Option<u32> {
    run_state.get(key).and_then(|p| p.parse().ok())
}

fn remove_docker_objects(docker: &Docker) -> Result<()> {
    let containers = ours(&docker.capture([
        "ps",
        "--all",
        "--no-trunc",
        "--format",
        &format!(
            "{{{{.ID}}}}\t{{{{.Names}}}}\t{{{{.Label \"{COMPOSE_PROJECT}\"}}}}\t{{{{.Label \"{RUN_LABEL}\"}}}}"
        ),
    ])?);
    remove(
        docker,
        &["rm", "--force", "--volumes"],
        &containers,
        "containers",
    )?;

    let networks = ours(&docker.capture([
        "network",
        "ls",
        "--no-trunc",
        "--format",
        &format!("{{{{.ID}}}}\t{{{{.Name}}}}\t{{{{.Label \"{COMPOSE_PROJECT}\"}}}}"),
    ])?);
    remove(docker, &["network", "rm"], &networks, "networks")?;

    let volumes = ours(&docker.capture([
        "volume",
        "ls",
        "--format",
        &format!("{{{{.Name}}}}\t{{{{.Name}}}}\t{{{{.Label \"{COMPOSE_PROJECT}\"}}}}"),
    ])?);
    remove(docker, &["volume", "rm", "--force"], &volumes, "volumes")?;

    // `image ls` lists newest first, so an image built FROM another of ours comes before
    // its parent; the engine refuses to remove a parent while a child exists, even forced.
    let listed = docker.capture([
        "image",
        "ls",
        "--quiet",
        "--no-trunc",
        "--filter",
        &format!("label={IMAGE_LABEL}"),
    ])?;
    remove_images(docker, &first_of_each(&listed))
}

/// The lines of `listed`, each once, in the order they first appear.
fn first_of_each(listed: &str) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    listed
        .lines()
        .filter(|id| !id.is_empty() && seen.insert(*id))
        .map(str::to_owned)
        .collect()
}

/// Removes `images` one by one, in passes, until a pass removes nothing: an image whose child
/// is removed later in a pass goes in the next one. What still stands is an error naming it.
fn remove_images(docker: &Docker, images: &[String]) -> Result<()> {
    let mut left: Vec<&String> = images.iter().collect();
    let mut last_errors = Vec::new();
    let mut removed = 0;
    while !left.is_empty() {
        last_errors.clear();
        let before = left.len();
        left.retain(|id| match docker.capture(["rmi", "--force", id.as_str()]) {
            Ok(_) => false,
            // Gone with a child removed before it (an untagged parent goes with its child).
            Err(e) if format!("{e:#}").contains("No such image") => false,
            Err(e) => {
                last_errors.push(format!("{id}: {e:#}"));
                true
            }
        });
        removed += before - left.len();
        if left.len() == before {
            bail!(
                "cannot remove {} test image(s) after {removed} removed:\n  {}",
                left.len(),
                last_errors.join("\n  ")
            );
        }
    }
    if removed == 0 {
        println!("    no test images to remove");
    } else {
        println!("    removed {removed} test images");
    }
    Ok(())
}

/// From tab-separated `id, name, compose project[, run label]` rows, the ids of the suite's
/// objects: name or project starting with `monky-e2e-`, or any value for the run label.
fn ours(rows: &str) -> Vec<String> {
    rows.lines()
        .filter_map(|row| {
            let cols: Vec<&str> = row.split('\t').collect();
            let id = cols.first().filter(|id| !id.is_empty())?;
            let name = cols.get(1).copied().unwrap_or("");
            let project = cols.get(2).copied().unwrap_or("");
            let run_label = cols.get(3).copied().unwrap_or("");
            let names_match = name
                .split(',')
                .any(|n| n.trim_start_matches('/').starts_with(NAME_PREFIX));
            (names_match || project.starts_with(NAME_PREFIX) || !run_label.is_empty())
                .then(|| (*id).to_owned())
        })
        .collect()
}

fn remove(docker: &Docker, verb: &[&str], ids: &[String], what: &str) -> Result<()> {
    if ids.is_empty() {
        println!("    no {what} to remove");
        return Ok(());
    }
    let mut args: Vec<&str> = verb.to_vec();
    args.extend(ids.iter().map(String::as_str));
    docker
        .capture(&args)
        .with_context(|| format!("cannot remove {what}"))?;
    println!("    removed {} {what}", ids.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_by_name_project_or_label() {
        let rows = "\
a1\tmonky-e2e-1234-web-1\t\t
b2\tunrelated\tmonky-e2e-1234-scenario\t
c3\tunrelated\t\tmonky-e2e-1234
d4\tother\tother-project\t
e5\tmy-monky-e2e-x\t\t
f6\tmonky-e2e-1234_default\t
\t\t\t
";
        assert_eq!(ours(rows), ["a1", "b2", "c3", "f6"]);
        assert!(ours("").is_empty());
    }

    #[test]
    fn images_keep_the_engine_order_once_each() {
        assert_eq!(first_of_each("c\na\n\nc\nb\na\n"), ["c", "a", "b"]);
        assert!(first_of_each("").is_empty());
    }

    #[test]
    fn only_prefixed_children_of_the_root_are_run_dirs() {
        let root = Path::new("/w/target/ci-run");
        let check = |dir: &str, ok: bool| assert_eq!(is_run_dir(Path::new(dir), root), ok, "{dir}");
        check("/w/target/ci-run/monky-e2e-0a1b2c3d", true);
        check("/w/target/ci-run/monky-e2e-", false);
        check("/w/target/ci-run/other", false);
        check("/w/target/monky-e2e-0a1b2c3d", false);
        check("/", false);
    }
}
