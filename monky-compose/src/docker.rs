//! The docker driver: configuration, finding compose v2, daemon facts, and the CLI fallbacks
//! used only when the engine socket cannot be reached.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::Container;
use crate::container::{Row, oneoff_word, project_containers};
use crate::engine::{self, ContainerFacts, Engine, EngineInfo, PROJECT_LABEL};
use crate::error::{Error, Result};
use crate::process::{Invocation, Runner, is_executable};
use crate::version::ComposeVersion;

/// Where docker installs CLI plugins system-wide; the docker CLI searches these even when
/// `DOCKER_CONFIG` is set.
pub const SYSTEM_PLUGIN_DIRS: [&str; 4] = [
    "/usr/local/lib/docker/cli-plugins",
    "/usr/local/libexec/docker/cli-plugins",
    "/usr/lib/docker/cli-plugins",
    "/usr/libexec/docker/cli-plugins",
];

/// Timeouts and output caps of the docker commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandLimits {
    /// Commands that change things: pull, up, down, image prune. Default 600 s.
    pub timeout: Duration,
    /// Commands that only read: version, ps, logs, config, info. Default 60 s.
    pub query_timeout: Duration,
    /// Bytes kept of each output stream (the tail). Default 4 MiB.
    pub max_output_bytes: usize,
    /// Pause between two looks at the containers while waiting for health. Default 2 s.
    pub poll_interval: Duration,
}

impl Default for CommandLimits {
    fn default() -> Self {
        CommandLimits {
            timeout: Duration::from_secs(600),
            query_timeout: Duration::from_secs(60),
            max_output_bytes: 4 * 1024 * 1024,
            poll_interval: Duration::from_secs(2),
        }
    }
}

/// The docker facts a checkin carries. Every field is best effort.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerFacts {
    /// The daemon's version.
    pub docker_version: Option<String>,
    /// The compose v2 version, `2.32.0`.
    pub compose_version: Option<String>,
    /// The daemon's data root.
    pub data_root: Option<PathBuf>,
    /// Free bytes of the data root's filesystem (only when the daemon is on this machine).
    pub free_bytes: Option<u64>,
}

/// The compose that was found and how to run it.
///
/// It can be saved between runs of the agent and handed back through
/// [`DockerBuilder::compose_hint`]: while the files in `stamps` are unchanged the hint is used
/// without running `compose version` again, so a heartbeat spawns no process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComposeInfo {
    /// Its version.
    pub version: ComposeVersion,
    /// The program to run: the docker CLI (plugin) or a standalone compose v2 binary.
    pub program: PathBuf,
    /// `true`: run as `<program> compose ...`; `false`: `<program> ...`.
    pub plugin: bool,
    /// Size and modification time of the binaries behind it.
    pub stamps: Vec<FileStamp>,
}

/// A file's identity for cache validation: path, size and modification time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    /// The file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub len: u64,
    /// Its modification time, nanoseconds since the epoch.
    pub modified_ns: u128,
}

impl FileStamp {
    /// The stamp of `path` as it is now.
    #[must_use]
    pub fn of(path: &Path) -> Option<FileStamp> {
        let meta = std::fs::metadata(path).ok()?;
        let modified_ns = meta
            .modified()
            .ok()?
            .duration_since(UNIX_EPOCH)
            .ok()?
            .as_nanos();
        Some(FileStamp {
            path: path.to_owned(),
            len: meta.len(),
            modified_ns,
        })
    }

    fn still_valid(&self) -> bool {
        FileStamp::of(&self.path).as_ref() == Some(self)
    }
}

/// The docker driver. Cheap to clone; clones share their caches.
///
/// Facts that do not change while the agent runs (daemon version, data root, the compose
/// found) are cached, so after the first call [`Docker::facts`] and [`Docker::containers`]
/// spawn no process as long as the engine socket answers.
#[derive(Debug, Clone)]
pub struct Docker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    bin: PathBuf,
    docker_config: PathBuf,
    runner: Runner,
    limits: CommandLimits,
    engine: Engine,
    plugin_dirs: Vec<PathBuf>,
    compose: Mutex<ComposeState>,
    cli_info: Mutex<Option<EngineInfo>>,
    /// The daemon's facts an earlier run saved ([`DockerBuilder::engine_hint`]).
    engine_hint: Option<EngineInfo>,
}

#[derive(Debug, Clone)]
enum ComposeState {
    Unknown,
    Hint(ComposeInfo),
    Found(ComposeInfo),
    /// The last search found nothing usable; only operations look again.
    Failed,
}

#[derive(Debug)]
enum Failure {
    NotFound(String),
    V1 { path: PathBuf, version: String },
}

impl Failure {
    fn to_error(&self) -> Error {
        match self {
            Failure::NotFound(detail) => Error::ComposeNotFound {
                detail: detail.clone(),
            },
            Failure::V1 { path, version } => Error::ComposeV1 {
                path: path.clone(),
                version: version.clone(),
            },
        }
    }
}

/// Builds a [`Docker`].
#[derive(Debug)]
#[must_use]
pub struct DockerBuilder {
    bin: PathBuf,
    docker_config: Option<PathBuf>,
    limits: CommandLimits,
    engine: Option<Engine>,
    path_env: Option<OsString>,
    plugin_dirs: Option<Vec<PathBuf>>,
    hint: Option<ComposeInfo>,
    engine_hint: Option<EngineInfo>,
    ledger: Option<PathBuf>,
}

impl Docker {
    /// Starts a builder for the docker CLI at `bin` (a bare name is looked up on `PATH`).
    pub fn builder(bin: impl Into<PathBuf>) -> DockerBuilder {
        DockerBuilder {
            bin: bin.into(),
            docker_config: None,
            limits: CommandLimits::default(),
            engine: None,
            path_env: None,
            plugin_dirs: None,
            hint: None,
            engine_hint: None,
            ledger: None,
        }
    }

    /// The docker CLI this driver runs.
    #[must_use]
    pub fn bin(&self) -> &Path {
        &self.inner.bin
    }

    /// The agent's `DOCKER_CONFIG` directory every child gets.
    #[must_use]
    pub fn docker_config(&self) -> &Path {
        &self.inner.docker_config
    }

    /// The limits in force.
    #[must_use]
    pub fn limits(&self) -> &CommandLimits {
        &self.inner.limits
    }

    /// The process wrapper every command goes through.
    #[must_use]
    pub fn runner(&self) -> &Runner {
        &self.inner.runner
    }

    /// The Engine API reader.
    #[must_use]
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Finds compose v2 (once; cached): `docker compose version` with the agent's
    /// `DOCKER_CONFIG`, then a `docker-compose` binary in the plugin directories, then
    /// `docker-compose` on `PATH`, run standalone. Compose v1 is refused. A failure is
    /// looked up again on the next call (the operator may have installed compose since).
    ///
    /// A plugin the docker CLI cannot see is run directly rather than made visible through
    /// `cliPluginsExtraDirs`: the agent's `config.json` holds the registry credential and is
    /// written elsewhere, so this crate never edits it.
    pub fn compose_info(&self) -> Result<ComposeInfo> {
        let mut state = self.lock_compose();
        if let Some(info) = self.usable(&state) {
            return Ok(info);
        }
        let found = self.discover();
        *state = match &found {
            Ok(info) => ComposeState::Found(info.clone()),
            Err(_) => ComposeState::Failed,
        };
        found.map_err(|f| f.to_error())
    }

    /// The compose already found (or a still-valid hint), without ever spawning: what to save
    /// for the next run after [`Docker::facts`].
    #[must_use]
    pub fn known_compose(&self) -> Option<ComposeInfo> {
        let state = self.lock_compose();
        self.usable(&state)
    }

    /// For facts: never retries a remembered failure, so a heartbeat spawns nothing.
    fn compose_for_facts(&self) -> Option<ComposeInfo> {
        let mut state = self.lock_compose();
        if let Some(info) = self.usable(&state) {
            return Some(info);
        }
        if matches!(*state, ComposeState::Failed) {
            return None;
        }
        match self.discover() {
            Ok(info) => {
                *state = ComposeState::Found(info.clone());
                Some(info)
            }
            Err(f) => {
                tracing::warn!(error = %f.to_error(), "compose not usable");
                *state = ComposeState::Failed;
                None
            }
        }
    }

    fn lock_compose(&self) -> std::sync::MutexGuard<'_, ComposeState> {
        self.inner.compose.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A found compose, or a hint whose files are unchanged (promoted to found).
    fn usable(&self, state: &ComposeState) -> Option<ComposeInfo> {
        match state {
            ComposeState::Found(info) => Some(info.clone()),
            ComposeState::Hint(info) => {
                let program_ok = !info.plugin || info.program == self.inner.bin;
                let valid = program_ok
                    && !info.stamps.is_empty()
                    && info.stamps.iter().any(|s| s.path == info.program)
                    && info.stamps.iter().all(FileStamp::still_valid);
                if valid {
                    Some(info.clone())
                } else {
                    tracing::debug!("compose hint is stale; looking again");
                    None
                }
            }
            ComposeState::Unknown | ComposeState::Failed => None,
        }
    }

    fn discover(&self) -> Result<ComposeInfo, Failure> {
        let inner = &self.inner;
        let timeout = inner.limits.query_timeout;
        let mut notes: Vec<String> = Vec::new();
        let mut v1: Option<(PathBuf, String)> = None;

        let plugin = Invocation::new(&inner.bin, timeout).args(["compose", "version"]);
        match self.version_of(&plugin, &plugin.describe()) {
            Ok(v) if v.major >= 2 => {
                let mut stamps: Vec<FileStamp> = FileStamp::of(&inner.bin).into_iter().collect();
                stamps.extend(self.plugin_file().and_then(|p| FileStamp::of(&p)));
                return Ok(ComposeInfo {
                    version: v,
                    program: inner.bin.clone(),
                    plugin: true,
                    stamps,
                });
            }
            Ok(v) => v1 = Some((inner.bin.clone(), v.to_string())),
            Err(note) => notes.push(note),
        }

        let mut candidates: Vec<PathBuf> = inner
            .plugin_dirs
            .iter()
            .map(|d| d.join("docker-compose"))
            .filter(|p| is_executable(p))
            .collect();
        candidates.extend(inner.runner.which("docker-compose"));
        candidates.dedup();
        for candidate in candidates {
            let inv = Invocation::new(&candidate, timeout).arg("version");
            match self.version_of(&inv, &format!("{} version", candidate.display())) {
                Ok(v) if v.major >= 2 => {
                    return Ok(ComposeInfo {
                        version: v,
                        stamps: FileStamp::of(&candidate).into_iter().collect(),
                        program: candidate,
                        plugin: false,
                    });
                }
                Ok(v) => {
                    if v1.is_none() {
                        v1 = Some((candidate, v.to_string()));
                    }
                }
                Err(note) => notes.push(note),
            }
        }
        if let Some((path, version)) = v1 {
            return Err(Failure::V1 { path, version });
        }
        let dirs: Vec<String> = inner
            .plugin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        notes.push(format!(
            "no docker-compose v2 binary in {} or on PATH ({})",
            dirs.join(", "),
            inner.runner.path_env().to_string_lossy()
        ));
        Err(Failure::NotFound(notes.join("; ")))
    }

    /// The compose version `inv` (a `version` command) reports, or why there is none, naming
    /// the command as `shown`.
    fn version_of(&self, inv: &Invocation, shown: &str) -> Result<ComposeVersion, String> {
        match self.inner.runner.run(inv) {
            Ok(out) if out.success() => ComposeVersion::from_version_output(&out.stdout)
                .ok_or_else(|| format!("`{shown}` printed no version")),
            Ok(out) => Err(format!(
                "`{shown}` failed: {}",
                first_line(&out.stderr, &out.stdout)
            )),
            Err(e) => Err(format!("`{shown}`: {e}")),
        }
    }

    /// The compose plugin file the docker CLI would run, for cache stamps.
    fn plugin_file(&self) -> Option<PathBuf> {
        std::iter::once(self.inner.docker_config.join("cli-plugins"))
            .chain(SYSTEM_PLUGIN_DIRS.iter().map(PathBuf::from))
            .chain(self.inner.plugin_dirs.iter().cloned())
            .map(|d| d.join("docker-compose"))
            .find(|p| is_executable(p))
    }

    /// The daemon's version and data root: from the Engine API, or from `docker info` when
    /// the socket cannot be reached. Cached either way.
    pub fn info(&self) -> Result<EngineInfo> {
        match self.inner.engine.info() {
            Ok(info) => Ok(info),
            // Only an unreachable socket: a daemon that accepted and then hung would hang
            // the CLI as well.
            Err(e @ Error::EngineUnavailable { .. }) => {
                let mut cached = self
                    .inner
                    .cli_info
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if let Some(info) = cached.as_ref() {
                    return Ok(info.clone());
                }
                tracing::debug!(error = %e, "engine socket unreachable; asking the docker CLI");
                let info = self.cli_info()?;
                *cached = Some(info.clone());
                Ok(info)
            }
            Err(e) => Err(e),
        }
    }

    fn cli_info(&self) -> Result<EngineInfo> {
        let inv = Invocation::new(&self.inner.bin, self.inner.limits.query_timeout).args([
            "info",
            "--format",
            r#"{"ServerVersion":{{json .ServerVersion}},"DockerRootDir":{{json .DockerRootDir}}}"#,
        ]);
        let out = self.inner.runner.run(&inv)?.check()?;
        serde_json::from_str(out.stdout.trim()).map_err(|e| Error::Parse {
            what: out.what,
            detail: e.to_string(),
        })
    }

    /// The daemon's facts this driver knows without a request: those it fetched, else the
    /// saved hint while the daemon names the hint's version. For the caller to save.
    #[must_use]
    pub fn known_engine(&self) -> Option<EngineInfo> {
        self.inner
            .engine
            .info_fetched()
            .or_else(|| self.engine_hint_holds())
    }

    /// The saved hint, when an answer of the engine named its version: the daemon was not
    /// replaced since. (A daemon that names no version never confirms a hint.)
    fn engine_hint_holds(&self) -> Option<EngineInfo> {
        let hint = self.inner.engine_hint.as_ref()?;
        (self.inner.engine.version_seen().as_deref() == Some(hint.server_version.as_str()))
            .then(|| hint.clone())
    }

    /// Free bytes on the daemon's data root (for the disk check).
    pub fn free_bytes(&self) -> Result<u64> {
        let info = self.info()?;
        engine::free_bytes(&info.docker_root_dir)
    }

    /// The facts for a checkin. Never fails: what cannot be learned is `None` (and logged).
    pub fn facts(&self) -> DockerFacts {
        let info = match self.engine_hint_holds() {
            Some(hint) => Some(hint),
            None => self
                .info()
                .map_err(|e| tracing::warn!(error = %e, "docker daemon facts unavailable"))
                .ok(),
        };
        let compose_version = self.compose_for_facts().map(|c| c.version.to_string());
        // The data root only means something here when the daemon runs on this machine.
        let local = self.inner.engine.socket().is_some();
        let free_bytes = info.as_ref().filter(|_| local).and_then(|i| {
            engine::free_bytes(&i.docker_root_dir)
                .map_err(|e| tracing::warn!(error = %e, "free space unknown"))
                .ok()
        });
        DockerFacts {
            docker_version: info.as_ref().map(|i| i.server_version.clone()),
            compose_version,
            data_root: info.map(|i| i.docker_root_dir),
            free_bytes,
        }
    }

    /// The containers of `project` (one-off containers excluded): from the Engine API, or
    /// from `docker ps` only when the socket cannot be reached.
    pub fn containers(&self, project: &str) -> Result<Vec<Container>> {
        match self.inner.engine.containers(project) {
            Err(e @ Error::EngineUnavailable { .. }) => {
                tracing::debug!(error = %e, "engine socket unreachable; asking the docker CLI");
                self.cli_containers(project)
            }
            other => other,
        }
    }

    /// As [`Docker::containers`], with each container's [`ContainerFacts`]: from the Engine API
    /// in one request; the `docker ps` fallback knows the containers only.
    pub fn container_facts(&self, project: &str) -> Result<Vec<ContainerFacts>> {
        match self.inner.engine.container_facts(project) {
            Err(e @ Error::EngineUnavailable { .. }) => {
                tracing::debug!(error = %e, "engine socket unreachable; asking the docker CLI");
                Ok(self
                    .cli_containers(project)?
                    .into_iter()
                    .map(ContainerFacts::of)
                    .collect())
            }
            other => other,
        }
    }

    /// Every container, volume and network on the engine, with the project that made it
    /// ([`Engine::named_objects`]).
    pub fn named_objects(&self) -> Result<Vec<crate::NamedObject>> {
        self.inner.engine.named_objects()
    }

    /// The ID of the local image `reference` names, `None` when the engine has none
    /// ([`Engine::image_id`]).
    pub fn image_id(&self, reference: &str) -> Result<Option<String>> {
        self.inner.engine.image_id(reference)
    }

    /// `docker rm -f <containers>`: removes containers by name or id, running or not (compose's
    /// leftovers, a container made by another hand). Nothing to remove is no call.
    pub fn remove_containers(&self, names: &[String]) -> Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        let mut args: Vec<String> = vec!["rm".into(), "-f".into()];
        args.extend(names.iter().cloned());
        // A running container is stopped first, which may take its stop grace period.
        let inv = Invocation::new(&self.inner.bin, self.inner.limits.timeout).args(args);
        self.inner.runner.run(&inv)?.check()?;
        Ok(())
    }

    fn cli_containers(&self, project: &str) -> Result<Vec<Container>> {
        let inv = Invocation::new(&self.inner.bin, self.inner.limits.query_timeout).args([
            "ps".into(),
            "-a".into(),
            "--no-trunc".into(),
            "--filter".into(),
            format!("label={PROJECT_LABEL}={project}"),
            "--format".into(),
            concat!(
                r#"{"name":{{json .Names}},"#,
                r#""service":{{json (.Label "com.docker.compose.service")}},"#,
                r#""state":{{json .State}},"status":{{json .Status}},"#,
                r#""oneoff":{{json (.Label "com.docker.compose.oneoff")}}}"#
            )
            .to_owned(),
        ]);
        let out = self.inner.runner.run(&inv)?.check()?;
        if out.stdout_truncated {
            return Err(Error::OutputTooLarge {
                what: out.what,
                limit: self.inner.runner.max_output(),
            });
        }
        parse_cli_ps(&out.stdout).map_err(|detail| Error::Parse {
            what: out.what,
            detail,
        })
    }

    /// `docker image prune -f`: drops dangling images.
    pub fn image_prune(&self) -> Result<()> {
        let inv = Invocation::new(&self.inner.bin, self.inner.limits.timeout)
            .args(["image", "prune", "-f"]);
        self.inner.runner.run(&inv)?.check()?;
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
struct CliRow {
    name: String,
    #[serde(default)]
    service: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    oneoff: String,
}

impl Row for CliRow {
    fn is_oneoff(&self) -> bool {
        oneoff_word(&self.oneoff)
    }

    fn into_container(self) -> Container {
        let name = self
            .name
            .split(',')
            .find(|n| !n.contains('/'))
            .unwrap_or(&self.name)
            .to_owned();
        Container::from_row(name, self.service, &self.state, &self.status, "")
    }
}

/// Parses the fallback `docker ps` lines (one object per line, written by our template).
fn parse_cli_ps(text: &str) -> Result<Vec<Container>, String> {
    let rows = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str::<CliRow>(line)
                .map_err(|e| format!("docker ps line {}: {e}", i + 1))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(project_containers(rows))
}

fn first_line(stderr: &str, stdout: &str) -> String {
    stderr
        .lines()
        .chain(stdout.lines())
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no output")
        .to_owned()
}

impl DockerBuilder {
    /// The agent's own `DOCKER_CONFIG` directory (required, absolute). The invoking user's
    /// `~/.docker` is never used: a `docker login` by a human must not be what the agent
    /// depends on.
    pub fn docker_config(mut self, dir: impl Into<PathBuf>) -> Self {
        self.docker_config = Some(dir.into());
        self
    }

    /// Where the running children's process groups are written down (see
    /// [`RunnerBuilder::ledger`](crate::process::RunnerBuilder::ledger)).
    pub fn ledger(mut self, dir: impl Into<PathBuf>) -> Self {
        self.ledger = Some(dir.into());
        self
    }

    /// The timeout of commands that change things (pull, up, down, prune).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.limits.timeout = timeout;
        self
    }

    /// All limits at once.
    pub fn limits(mut self, limits: CommandLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The Engine API reader (default: [`Engine::from_env`]).
    pub fn engine(mut self, engine: Engine) -> Self {
        self.engine = Some(engine);
        self
    }

    /// The `PATH` children get and standalone compose is looked up in (default: the agent's).
    pub fn path_env(mut self, path: impl Into<OsString>) -> Self {
        self.path_env = Some(path.into());
        self
    }

    /// Where to look for a `docker-compose` v2 binary when `docker compose` does not work
    /// (default: [`SYSTEM_PLUGIN_DIRS`] and the invoking user's `~/.docker/cli-plugins`, which
    /// the docker CLI stops searching once `DOCKER_CONFIG` is set).
    pub fn plugin_dirs(mut self, dirs: Vec<PathBuf>) -> Self {
        self.plugin_dirs = Some(dirs);
        self
    }

    /// A [`ComposeInfo`] saved by an earlier run; used without spawning while its binaries
    /// are unchanged.
    pub fn compose_hint(mut self, info: ComposeInfo) -> Self {
        self.hint = Some(info);
        self
    }

    /// An [`EngineInfo`] saved by an earlier run; the checkin's facts use it without asking
    /// `/info` while the daemon names the same version on its answers.
    pub fn engine_hint(mut self, info: EngineInfo) -> Self {
        self.engine_hint = Some(info);
        self
    }

    /// Builds the driver. No process is started and nothing is connected here.
    pub fn build(self) -> Result<Docker> {
        let docker_config = self.docker_config.ok_or(Error::MissingDockerConfig)?;
        let mut runner =
            Runner::builder(&docker_config).max_output_bytes(self.limits.max_output_bytes);
        if let Some(path) = self.path_env {
            runner = runner.path_env(path);
        }
        if let Some(dir) = self.ledger {
            runner = runner.ledger(dir);
        }
        let runner = runner.build()?;
        let bin = if self.bin.components().count() == 1 && !self.bin.is_absolute() {
            let name = self.bin.to_string_lossy();
            runner.which(&name).unwrap_or(self.bin)
        } else {
            self.bin
        };
        let plugin_dirs = self.plugin_dirs.unwrap_or_else(|| {
            let mut dirs: Vec<PathBuf> = SYSTEM_PLUGIN_DIRS.iter().map(PathBuf::from).collect();
            if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
                dirs.push(PathBuf::from(home).join(".docker/cli-plugins"));
            }
            dirs
        });
        let compose = match self.hint {
            Some(h) => ComposeState::Hint(h),
            None => ComposeState::Unknown,
        };
        Ok(Docker {
            inner: Arc::new(Inner {
                bin,
                docker_config,
                runner,
                limits: self.limits,
                engine: self.engine.unwrap_or_else(Engine::from_env),
                plugin_dirs,
                compose: Mutex::new(compose),
                cli_info: Mutex::new(None),
                engine_hint: self.engine_hint,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::container;

    #[test]
    fn cli_ps_lines_parse() {
        let text = concat!(
            r#"{"name":"p-web-1","service":"web","state":"running","status":"Up 2 minutes (healthy)","oneoff":"False"}"#,
            "\n",
            r#"{"name":"p-web-run-0a1","service":"web","state":"running","status":"Up 1 second","oneoff":"True"}"#,
            "\n",
            r#"{"name":"p-db-1,other/db","service":"db","state":"","status":"Exited (0) 1 minute ago","oneoff":""}"#,
            "\n"
        );
        let got = parse_cli_ps(text).unwrap();
        assert_eq!(
            got,
            vec![
                container("p-db-1", "db", "exited", None),
                container("p-web-1", "web", "running", Some("healthy")),
            ]
        );
        assert!(
            parse_cli_ps("nope\n")
                .unwrap_err()
                .starts_with("docker ps line 1")
        );
    }

    #[test]
    fn builder_needs_an_absolute_docker_config() {
        let err = Docker::builder("/usr/bin/docker").build().unwrap_err();
        assert!(matches!(err, Error::MissingDockerConfig), "{err}");
        let err = Docker::builder("/usr/bin/docker")
            .docker_config("state/docker")
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::RelativeDockerConfig { .. }), "{err}");
    }

    #[test]
    fn bare_bin_is_resolved_on_path() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("docker");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let d = Docker::builder("docker")
            .docker_config("/var/lib/monky-deployd/docker")
            .path_env(dir.path().as_os_str())
            .build()
            .unwrap();
        assert_eq!(d.bin(), bin);
    }

    #[test]
    fn file_stamps_notice_changes() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("docker-compose");
        std::fs::write(&f, "one").unwrap();
        let stamp = FileStamp::of(&f).unwrap();
        assert!(stamp.still_valid());
        std::fs::write(&f, "three").unwrap();
        assert!(!stamp.still_valid());
        std::fs::remove_file(&f).unwrap();
        assert!(!stamp.still_valid());
    }
}
