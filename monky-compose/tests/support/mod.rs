//! Shared scaffolding for the behaviour tests: a temp dir holding the recording stub `docker`,
//! a hermetic `PATH`, the agent's docker config dir and a project dir.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use monky_compose::{Compose, Docker, DockerBuilder, Engine};

/// The compose project every stub test uses.
pub const PROJECT: &str = "monky-env-t";

/// The tools the stub script needs; linked into a private dir so `PATH` holds nothing else
/// (this machine has a real compose v1 in /usr/bin that must stay invisible).
const TOOLS: &[&str] = &[
    "env", "sort", "sed", "cat", "sleep", "seq", "dirname", "basename",
];

pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// One recorded invocation of the stub.
#[derive(Debug, Clone)]
pub struct Call {
    pub program: String,
    pub cwd: PathBuf,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
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

    /// Copies the stub script to `dir/name` with its own `stub.env`.
    pub fn install(&self, dir: &Path, name: &str, extra: &[(&str, &str)]) -> PathBuf {
        let target = dir.join(name);
        std::fs::copy(data("docker-stub.sh"), &target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut env = format!(
            "STUB_LOG='{}'\nSTUB_DATA='{}'\n",
            self.log.display(),
            data("").display()
        );
        for (k, v) in self
            .settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(extra.iter().copied())
        {
            env.push_str(&format!("{k}='{v}'\n"));
        }
        std::fs::write(dir.join("stub.env"), env).unwrap();
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
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut calls = Vec::new();
        let mut cur: Option<Call> = None;
        for line in text.lines() {
            if let Some(p) = line.strip_prefix("@@CALL ") {
                cur = Some(Call {
                    program: p.to_owned(),
                    cwd: PathBuf::new(),
                    args: Vec::new(),
                    env: BTreeMap::new(),
                });
            } else if let Some(c) = line.strip_prefix("@@CWD ") {
                cur.as_mut().unwrap().cwd = PathBuf::from(c);
            } else if let Some(a) = line.strip_prefix("@@ARG ") {
                cur.as_mut().unwrap().args.push(a.to_owned());
            } else if line == "@@ARG" {
                cur.as_mut().unwrap().args.push(String::new());
            } else if let Some(kv) = line.strip_prefix("@@ENV ") {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                cur.as_mut().unwrap().env.insert(k.to_owned(), v.to_owned());
            } else if line == "@@END" {
                calls.push(cur.take().unwrap());
            }
        }
        calls
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
