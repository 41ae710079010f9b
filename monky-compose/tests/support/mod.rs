//! Shared scaffolding for the behaviour tests: a temp dir holding the recording stub `docker`,
//! a hermetic `PATH`, the agent's docker config dir and a project dir.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use monky_compose::testkit::{self, Call};
use monky_compose::{Compose, Docker, DockerBuilder, Engine};

/// The compose project every stub test uses.
pub const PROJECT: &str = "monky-env-t";

/// The tools the stub script needs (its hang scenarios sleep; everything else is a bash
/// builtin); linked into a private dir so `PATH` holds nothing else (this machine has a real
/// compose v1 in /usr/bin that must stay invisible).
const TOOLS: &[&str] = &["sleep"];

pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

pub struct Stub {
    pub dir: tempfile::TempDir,
    /// Holds the stub `docker` (not on PATH).
    pub bin: PathBuf,
    /// The only other dir on PATH besides the tool links; empty unless a test adds to it.
    pub path_dir: PathBuf,
    /// Searched for a standalone `docker-compose`.
    pub plugin_dir: PathBuf,
    pub tools: PathBuf,
    /// The agent's DOCKER_CONFIG.
    pub cfg: PathBuf,
    pub proj: PathBuf,
    pub log: PathBuf,
    settings: Vec<(String, String)>,
}

impl Stub {
    /// A stub `docker` whose scenario is `settings` (variables of `stub.env`).
    pub fn new(settings: &[(&str, &str)]) -> Stub {
        Stub::in_dir(tempfile::tempdir().unwrap(), settings)
    }

    pub fn in_dir(dir: tempfile::TempDir, settings: &[(&str, &str)]) -> Stub {
        let root = dir.path().to_owned();
        let stub = Stub {
            bin: root.join("bin"),
            path_dir: root.join("path"),
            plugin_dir: root.join("plugins"),
            tools: root.join("tools"),
            cfg: root.join("agent-docker-config"),
            proj: root.join("releases/current"),
            log: root.join("calls.log"),
            settings: settings
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            dir,
        };
        for d in [
            &stub.bin,
            &stub.path_dir,
            &stub.plugin_dir,
            &stub.tools,
            &stub.cfg,
            &stub.proj,
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        for tool in TOOLS {
            let target = ["/usr/bin", "/bin"]
                .iter()
                .map(|d| Path::new(d).join(tool))
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("the stub needs {tool} in /usr/bin or /bin"));
            std::os::unix::fs::symlink(target, stub.tools.join(tool)).unwrap();
        }
        std::fs::write(stub.proj.join("compose.yaml"), "services: {}\n").unwrap();
        std::fs::write(stub.proj.join(".env"), "DB_PASSWORD=never-in-argv\n").unwrap();
        stub.install(&stub.bin, "docker", &[]);
        stub
    }

    /// Writes the stub script as `dir/name` with its own `stub.env`: one log for every copy,
    /// this crate's canned outputs, no compose plugin unless the settings name its version,
    /// then the stub's settings and `extra`.
    pub fn install(&self, dir: &Path, name: &str, extra: &[(&str, &str)]) -> PathBuf {
        let target = dir.join(name);
        testkit::write_stub(&target).unwrap();
        let (log, data_dir, config) = (
            self.log.display().to_string(),
            data("").display().to_string(),
            data("config.json").display().to_string(),
        );
        let base = [
            ("STUB_LOG", log.as_str()),
            ("STUB_DATA", data_dir.as_str()),
            ("COMPOSE_VERSION", ""),
            ("CONFIG_OUTPUT", config.as_str()),
            ("LOGS_STDERR", "compose warning on stderr"),
        ];
        let settings = self.settings.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        testkit::write_scenario(
            dir,
            base.into_iter()
                .chain(settings)
                .chain(extra.iter().copied()),
        )
        .unwrap();
        target
    }

    pub fn docker_bin(&self) -> PathBuf {
        self.bin.join("docker")
    }

    pub fn path_env(&self) -> String {
        format!("{}:{}", self.path_dir.display(), self.tools.display())
    }

    /// A driver on the stub with no reachable engine (so container reads use the CLI).
    pub fn builder(&self) -> DockerBuilder {
        Docker::builder(self.docker_bin())
            .docker_config(&self.cfg)
            .path_env(self.path_env())
            .plugin_dirs(vec![self.plugin_dir.clone()])
            .engine(Engine::unix(self.dir.path().join("no-engine.sock")))
    }

    pub fn docker(&self) -> Docker {
        self.builder().build().unwrap()
    }

    pub fn compose(&self, docker: &Docker) -> Compose {
        docker.compose(
            PROJECT,
            &self.proj,
            &self.proj.join("compose.yaml"),
            &self.proj.join(".env"),
        )
    }

    /// The compose global arguments every project command starts with.
    pub fn globals(&self) -> Vec<String> {
        vec![
            "--ansi".into(),
            "never".into(),
            "-p".into(),
            PROJECT.into(),
            "-f".into(),
            self.proj.join("compose.yaml").display().to_string(),
            "--env-file".into(),
            self.proj.join(".env").display().to_string(),
        ]
    }

    pub fn calls(&self) -> Vec<Call> {
        testkit::parse_calls(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Calls that asked a compose for its version.
    pub fn version_calls(&self) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.args.last().map(String::as_str) == Some("version"))
            .count()
    }
}

pub fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}
