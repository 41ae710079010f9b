//! Test support (feature `testkit`): the recording stub `docker` and the fake Engine API socket,
//! one of each for this crate's tests, the agent's tests, the demo and the benchmark.
//!
//! - [`StubDocker`] writes the stub script ([`DOCKER_STUB`]) into a directory with its scenario
//!   file `stub.env` and reads back what it recorded ([`Call`]). The script keeps a model of the
//!   project's containers (`containers.json`, Engine API shape) that `up` and `down` change.
//! - [`FakeEngine`] answers Engine API requests on a unix socket, each path with a canned answer
//!   or a file read at request time (the stub's model), and records the request lines.
//!
//! ```
//! use monky_compose::testkit::{FakeEngine, StubDocker};
//! use monky_compose::{Docker, Engine};
//!
//! let dir = tempfile::tempdir()?;
//! let stub = StubDocker::install(dir.path())?;
//! let engine = stub.engine();
//! let docker = Docker::builder(stub.program())
//!     .docker_config(dir.path().join("cfg"))
//!     .engine(Engine::unix(engine.socket()))
//!     .build()?;
//! let project = dir.path().join("p");
//! std::fs::create_dir(&project)?;
//! std::fs::write(project.join("compose.yaml"), "services: {}\n")?;
//! std::fs::write(project.join(".env"), "")?;
//! docker.compose("p", &project, &project.join("compose.yaml"), &project.join(".env")).up(None)?;
//! // the stub's model, served by the fake engine
//! assert!(docker.containers("p")?.iter().all(|c| c.is_ready()));
//! assert_eq!(stub.calls().last().unwrap().args.last().unwrap(), "--remove-orphans");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The stub script. Its scenario variables, set in `stub.env` beside it ([`StubDocker::set`]):
///
/// | variable | effect |
/// | --- | --- |
/// | `COMPOSE_VERSION` | the compose plugin's version (2.32.0 when unset); empty: no plugin |
/// | `NO_COMPOSE` | no compose plugin |
/// | `STANDALONE_VERSION` | the version the script reports when installed as `docker-compose` |
/// | `STUB_LOG` | where calls are recorded (default `calls.log` beside the script) |
/// | `DAEMON_DOWN` | every call that needs the engine fails as docker's do |
/// | `SERVER_VERSION`, `DATA_ROOT`, `INFO_EXIT` | what `docker info` says (28.3.0, the stub's dir) or its failure |
/// | `DOCKER_PS_SEQ` | canned `docker ps` outputs, one file per call, the last repeating |
/// | `FAULT_IF` | `PULL_FAIL`, `UP_FAIL` and `HEALTH` apply only to a compose file containing this text |
/// | `HANG` | this compose subcommand never returns (nor its grandchild, pid in `grandchild.pid`) |
/// | `PULL_HANG` | `pull` sleeps this many seconds, its pid in `pull.pid` |
/// | `PULL_FAIL` | `pull` prints this and exits 18 |
/// | `PULL_OUTPUT`, `PULL_EXIT` | `pull`'s canned stderr (a file) and exit status |
/// | `UP_FAIL` | `up` prints this and exits 1 |
/// | `UP_SLEEP` | `up` takes this many seconds; starts and ends (a SIGTERM's too) go to `up.log`, as every `up`'s once it exists |
/// | `UP_OUTPUT`, `UP_EXIT` | `up`'s canned stderr (a file) and exit status |
/// | `HEALTH` | the health of the containers `up` starts (`healthy`; empty: no healthcheck) |
/// | `UNHEALTHY_IF` | a compose file containing this text starts unhealthy containers |
/// | `SERVICES` | the services `up` starts (`web`) |
/// | `STUB_DATA` | a dir with canned `compose ps` outputs (`ps-2.20-array.json`, `ps-2.30-lines.jsonl`) |
/// | `LOGS_FILE`, `LOGS_LINES`, `LOGS_STDERR` | `logs`' output: a file, or N numbered lines; its stderr |
/// | `DOWN_FAIL_QUOTING_ENV` | `down` fails quoting the `.env` lines, as compose does on a bad one |
/// | `CONFIG_OUTPUT`, `CONFIG_EXIT` | `config`'s model (a file) and exit status |
/// | `REAL_COMPOSE` | `config` runs this real docker CLI instead |
pub const DOCKER_STUB: &str = include_str!("testkit/docker-stub.sh");

/// Writes the stub script to `path`, executable.
///
/// A `cat` child writes the file, not this process: a file this process held open for writing
/// would be inherited by a child that another test thread forks meanwhile, and running the stub
/// while that child still holds it fails with "text file busy" (ETXTBSY).
pub fn write_stub(path: &Path) -> std::io::Result<()> {
    let mut cat = std::process::Command::new("/bin/sh")
        .args(["-c", "cat >\"$1\"", "sh"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()?;
    cat.stdin
        .take()
        .expect("piped stdin")
        .write_all(DOCKER_STUB.as_bytes())?;
    let status = cat.wait()?;
    if !status.success() {
        return Err(std::io::Error::other(format!(
            "cannot write {}: {status}",
            path.display()
        )));
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

/// `value` quoted for a POSIX shell.
#[must_use]
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// Writes `dir/stub.env`, the scenario of the stub installed in `dir`.
pub fn write_scenario<'a>(
    dir: &Path,
    settings: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> std::io::Result<()> {
    let text: String = settings
        .into_iter()
        .map(|(k, v)| format!("{k}={}\n", shell_quote(v)))
        .collect();
    std::fs::write(dir.join("stub.env"), text)
}

/// The stub `docker` installed in a directory: its scenario, its records and its model.
#[derive(Debug, Clone)]
pub struct StubDocker {
    dir: PathBuf,
}

impl StubDocker {
    /// Writes the stub as `dir/docker` with an empty scenario.
    pub fn install(dir: &Path) -> std::io::Result<StubDocker> {
        std::fs::create_dir_all(dir)?;
        write_stub(&dir.join("docker"))?;
        write_scenario(dir, [])?;
        Ok(StubDocker {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory holding the stub, its scenario, its records and its model.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The stub `docker` (a `docker_bin`).
    #[must_use]
    pub fn program(&self) -> PathBuf {
        self.dir.join("docker")
    }

    /// Sets a scenario variable (appended to `stub.env`; a later setting wins).
    pub fn set(&self, key: &str, value: &str) {
        let path = self.dir.join("stub.env");
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push_str(&format!("{key}={}\n", shell_quote(value)));
        std::fs::write(path, text).expect("write stub.env");
    }

    /// Forgets every scenario variable.
    pub fn clear(&self) {
        write_scenario(&self.dir, []).expect("write stub.env");
    }

    /// The call log.
    #[must_use]
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("calls.log")
    }

    /// Everything recorded so far, as written.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The calls recorded so far.
    #[must_use]
    pub fn calls(&self) -> Vec<Call> {
        parse_calls(&self.log())
    }

    /// The model of the engine's containers (`containers.json`, Engine API shape).
    #[must_use]
    pub fn model_path(&self) -> PathBuf {
        self.dir.join("containers.json")
    }

    /// The local images the fake engine knows besides its default (`images.json`: reference
    /// to ID, `null` for an image the engine does not have).
    #[must_use]
    pub fn images_path(&self) -> PathBuf {
        self.dir.join("images.json")
    }

    /// Sets the ID of the local image `reference` names (`None`: the engine has none). Every
    /// other reference has the image of [`default_image_id`].
    pub fn set_image(&self, reference: &str, id: Option<&str>) {
        let path = self.images_path();
        let mut map: serde_json::Map<String, serde_json::Value> = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        map.insert(reference.to_owned(), id.into());
        std::fs::write(path, serde_json::Value::Object(map).to_string()).expect("write images");
    }

    /// A fake engine on `docker.sock` in the stub's directory serving the stub's model: its
    /// containers (none before the first `up`), its images ([`StubDocker::set_image`]), and
    /// `/info` naming the stub's directory as the data root (or `info.json` beside the stub,
    /// once a test writes one).
    #[must_use]
    pub fn engine(&self) -> FakeEngine {
        let info = serde_json::json!({"ServerVersion": "28.3.0", "DockerRootDir": self.dir});
        FakeEngine::builder()
            .file("/containers/json", self.model_path(), "[]")
            .images(self.images_path())
            .file(
                "/volumes",
                self.dir.join("volumes.json"),
                r#"{"Volumes":[]}"#,
            )
            .file("/networks", self.dir.join("networks.json"), "[]")
            .file("/info", self.dir.join("info.json"), &info.to_string())
            .start(self.dir.join("docker.sock"))
            .expect("start the fake engine")
    }
}

/// One recorded invocation of the stub.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Call {
    /// The name it was run as (`docker`, `docker-compose`).
    pub program: String,
    /// Its working directory.
    pub cwd: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its whole environment.
    pub env: BTreeMap<String, String>,
}

impl Call {
    /// The arguments as one line, each quoted where a shell would need it.
    #[must_use]
    pub fn command_line(&self) -> String {
        let plain = |a: &str| {
            !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@,+%".contains(&b))
        };
        self.args
            .iter()
            .map(|a| if plain(a) { a.clone() } else { shell_quote(a) })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Reads the stub's call log. A line without a tag continues the argument or variable before
/// it: a value with line breaks is recorded as it is.
#[must_use]
pub fn parse_calls(log: &str) -> Vec<Call> {
    enum Last {
        Arg,
        Env(String),
        Other,
    }
    let mut calls = Vec::new();
    let mut cur: Option<Call> = None;
    let mut last = Last::Other;
    for line in log.lines() {
        let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
        if tag == "@@CALL" {
            cur = Some(Call {
                program: rest.to_owned(),
                ..Call::default()
            });
            last = Last::Other;
            continue;
        }
        let Some(call) = cur.as_mut() else { continue };
        match tag {
            "@@CWD" => {
                call.cwd = PathBuf::from(rest);
                last = Last::Other;
            }
            "@@ARG" => {
                call.args.push(rest.to_owned());
                last = Last::Arg;
            }
            "@@ENV" => {
                let (k, v) = rest.split_once('=').unwrap_or((rest, ""));
                call.env.insert(k.to_owned(), v.to_owned());
                last = Last::Env(k.to_owned());
            }
            "@@END" => {
                calls.extend(cur.take());
                last = Last::Other;
            }
            _ => {
                let value = match &last {
                    Last::Arg => call.args.last_mut(),
                    Last::Env(k) => call.env.get_mut(k),
                    Last::Other => None,
                };
                if let Some(v) = value {
                    v.push('\n');
                    v.push_str(line);
                }
            }
        }
    }
    calls
}

/// How a fake engine answers one path.
#[derive(Debug, Clone)]
enum Answer {
    Fixed { status: u16, body: String },
    File { path: PathBuf, missing: String },
    Images { path: PathBuf },
}

/// Builds a [`FakeEngine`].
#[derive(Debug, Default)]
#[must_use]
pub struct FakeEngineBuilder {
    routes: Vec<(String, Answer)>,
}

impl FakeEngineBuilder {
    /// Answers `path` (the request target without its query) with `status` and `body`.
    pub fn route(mut self, path: &str, status: u16, body: impl Into<String>) -> Self {
        let body = body.into();
        self.routes
            .push((path.to_owned(), Answer::Fixed { status, body }));
        self
    }

    /// Answers `path` with 200 and the content of `file` at request time (`missing` while it
    /// does not exist).
    pub fn file(mut self, path: &str, file: PathBuf, missing: &str) -> Self {
        let missing = missing.to_owned();
        self.routes.push((
            path.to_owned(),
            Answer::File {
                path: file,
                missing,
            },
        ));
        self
    }

    /// Answers `GET /images/{reference}/json` from `file` (reference to ID, `null` for
    /// none); a reference not in it has the image of [`default_image_id`].
    pub fn images(mut self, file: PathBuf) -> Self {
        self.routes
            .push((IMAGES.to_owned(), Answer::Images { path: file }));
        self
    }

    /// Listens on `socket`.
    pub fn start(self, socket: PathBuf) -> std::io::Result<FakeEngine> {
        let listener = UnixListener::bind(&socket)?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen, flag) = (Arc::clone(&requests), Arc::clone(&stop));
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepted = Arc::clone(&connections);
        let routes = Arc::new(self.routes);
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(stream) = stream {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    // A connection of its own each, as dockerd serves them: one a client keeps
                    // open does not hold up another client's.
                    let (routes, seen) = (Arc::clone(&routes), Arc::clone(&seen));
                    std::thread::spawn(move || serve(stream, &routes, &seen));
                }
            }
        });
        Ok(FakeEngine {
            socket,
            requests,
            connections,
            stop,
            thread: Some(thread),
            _dir: None,
        })
    }

    /// Listens on `docker.sock` in a temporary directory of its own.
    pub fn start_in_temp_dir(self) -> std::io::Result<FakeEngine> {
        let dir = tempfile::tempdir()?;
        let mut engine = self.start(dir.path().join("docker.sock"))?;
        engine._dir = Some(dir);
        Ok(engine)
    }
}

/// A fake docker daemon: answers each request with its path's answer (404 for others) and
/// records the request lines. As dockerd does, it keeps a connection open for the next request
/// unless the request asks it to close. It stops when dropped.
#[derive(Debug)]
pub struct FakeEngine {
    socket: PathBuf,
    requests: Arc<Mutex<Vec<String>>>,
    connections: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: Option<tempfile::TempDir>,
}

impl FakeEngine {
    /// A fake engine with no route yet.
    pub fn builder() -> FakeEngineBuilder {
        FakeEngineBuilder::default()
    }

    /// Its socket.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// An Engine API reader on its socket.
    #[must_use]
    pub fn engine(&self) -> crate::Engine {
        crate::Engine::unix(&self.socket)
    }

    /// The connections clients opened so far.
    #[must_use]
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// The requests so far, as `METHOD target`.
    #[must_use]
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("requests lock").clone()
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop; a socket file removed by a test leaves it blocked, detached.
        if UnixStream::connect(&self.socket).is_ok()
            && let Some(t) = self.thread.take()
        {
            let _ = t.join();
        }
    }
}

/// Serves the requests of one connection until the client closes it or asks to.
fn serve(mut stream: UnixStream, routes: &[(String, Answer)], seen: &Mutex<Vec<String>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(clone);
    loop {
        let mut request_line = String::new();
        if matches!(reader.read_line(&mut request_line), Ok(0) | Err(_)) {
            return;
        }
        let (mut length, mut close) = (0usize, false);
        loop {
            let mut header = String::new();
            match reader.read_line(&mut header) {
                Ok(0) | Err(_) => return,
                Ok(_) if header == "\r\n" => break,
                Ok(_) => {}
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("connection") {
                    close = value.trim().eq_ignore_ascii_case("close");
                }
            }
        }
        let mut body = vec![0u8; length];
        if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
            return;
        }
        answer(&mut stream, &request_line, close, routes, seen);
        if close {
            return;
        }
    }
}

/// Answers one request on `stream`, saying `Connection: close` when the request asked to.
fn answer(
    stream: &mut UnixStream,
    request_line: &str,
    close: bool,
    routes: &[(String, Answer)],
    seen: &Mutex<Vec<String>>,
) {
    let mut words = request_line.split_whitespace();
    let method = words.next().unwrap_or("");
    let target = words.next().unwrap_or("");
    seen.lock()
        .expect("requests lock")
        .push(format!("{method} {target}"));
    let path = target.split('?').next().unwrap_or("");
    let image = path
        .strip_prefix("/images/")
        .and_then(|p| p.strip_suffix("/json"));
    let route = if image.is_some() { IMAGES } else { path };
    let probe = path
        .strip_prefix("/containers/")
        .is_some_and(|rest| rest.starts_with(PROBE_ID));
    let container_json = path
        .strip_prefix("/containers/")
        .and_then(|rest| rest.strip_suffix("/json"))
        .is_some_and(|id| !id.is_empty() && !id.contains('/'));
    let (status, body) = match routes.iter().find(|(p, _)| p == route).map(|(_, a)| a) {
        // The image-user probe (`Engine::image_passwd`): a container created and never
        // started, its `/etc/passwd` read, then removed, as on an engine whose images carry a
        // distribution's usual accounts.
        _ if method == "POST" && path == "/containers/create" => {
            (201, serde_json::json!({ "Id": PROBE_ID }).to_string())
        }
        _ if probe && method == "GET" && path.ends_with("/archive") => (200, passwd_tar()),
        _ if probe && method == "DELETE" => (204, String::new()),
        // A container of the model, inspected (`Engine::running`, `Engine::inspect`): the
        // fake runs no process, so none is there to look at, and its restart policy is the
        // engine's usual for a compose service.
        None if method == "GET" && container_json => (
            200,
            serde_json::json!({
                "State": {"Running": false, "Pid": 0},
                "Config": {"Env": []},
                "HostConfig": {"RestartPolicy": {"Name": "always"}},
            })
            .to_string(),
        ),
        Some(Answer::Fixed { status, body }) => (*status, body.clone()),
        Some(Answer::File { path, missing }) => (200, read_whole_json(path, missing)),
        Some(Answer::Images { path }) => {
            let reference = image.unwrap_or_default();
            let known: serde_json::Value =
                serde_json::from_str(&read_whole_json(path, "{}")).unwrap_or_default();
            match known.get(reference) {
                Some(serde_json::Value::Null) => (404, r#"{"message":"No such image"}"#.to_owned()),
                Some(id) => (200, serde_json::json!({ "Id": id }).to_string()),
                None => (
                    200,
                    serde_json::json!({ "Id": default_image_id(reference) }).to_string(),
                ),
            }
        }
        None => (404, r#"{"message":"page not found"}"#.to_owned()),
    };
    // As dockerd does on every answer: its version, the one its `/info` gives.
    let server = routes
        .iter()
        .find(|(p, _)| p == "/info")
        .and_then(|(_, answer)| {
            let info = match answer {
                Answer::Fixed { body, .. } => body.clone(),
                Answer::File { path, missing } => read_whole_json(path, missing),
                Answer::Images { .. } => return None,
            };
            let info: serde_json::Value = serde_json::from_str(&info).ok()?;
            Some(format!(
                "Server: Docker/{} (linux)\r\n",
                info.get("ServerVersion")?.as_str()?
            ))
        })
        .unwrap_or_default();
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nApi-Version: 1.41\r\n{server}Content-Length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "Connection: close\r\n" } else { "" }
    );
}

/// The ID of the fake engine's image for `reference` unless [`StubDocker::set_image`] says
/// otherwise: 64 hex digits that follow from the reference alone.
#[must_use]
pub fn default_image_id(reference: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut id = String::from("sha256:");
    for part in 0u8..4 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (part, reference).hash(&mut h);
        id.push_str(&format!("{:016x}", h.finish()));
    }
    id
}

/// The ID of the fake engine's probe container.
const PROBE_ID: &str = "0000000000000000000000000000000000000000000000000000000000000001";

/// A tar of one `passwd` with a distribution's usual accounts, as the archive endpoint answers
/// for `/etc/passwd`.
fn passwd_tar() -> String {
    let text = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
    let mut header = tar::Header::new_ustar();
    header.set_path("passwd").expect("a short name");
    header.set_size(text.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&header, &text[..]).expect("in memory");
    String::from_utf8(b.into_inner().expect("in memory")).expect("an ASCII archive")
}

/// The route of every `GET /images/{reference}/json`.
const IMAGES: &str = "/images/*/json";

/// The file's JSON; the stub writes its model in place, so a file read half written is read
/// again.
fn read_whole_json(path: &Path, missing: &str) -> String {
    let mut text = String::new();
    for _ in 0..100 {
        match std::fs::read_to_string(path) {
            Ok(t) if serde_json::from_str::<serde_json::Value>(&t).is_ok() => return t,
            Ok(t) => text = t,
            Err(_) => return missing.to_owned(),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand an apply runs works with nothing on `PATH` (so recording forks no
    /// helper), and the records read back exactly, line breaks and empty arguments included.
    #[test]
    fn the_stub_records_calls_exactly_with_builtins_only() {
        let dir = tempfile::tempdir().unwrap();
        let stub = StubDocker::install(&dir.path().join("bin")).unwrap();
        let compose_file = dir.path().join("compose.yaml");
        std::fs::write(&compose_file, "services: {}\n").unwrap();
        let compose_file = compose_file.display().to_string();
        let run = |args: &[&str]| {
            let out = std::process::Command::new(stub.program())
                .args(args)
                .env_clear()
                .env("PATH", "/nonexistent")
                .env("MULTI", "first\nsecond")
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let globals = ["compose", "-p", "p", "-f", compose_file.as_str()];
        assert_eq!(
            run(&["compose", "version"]),
            "Docker Compose version v2.32.0\n"
        );
        for sub in ["config", "pull", "up", "ps", "logs", "down"] {
            run(&[&globals[..], &[sub, "", "two\nlines"]].concat());
        }
        assert_eq!(
            run(&["image", "prune", "-f"]),
            "Total reclaimed space: 0B\n"
        );
        assert!(run(&["info"]).contains("28.3.0"));
        let calls = stub.calls();
        assert_eq!(calls.len(), 9);
        let up = &calls[3];
        assert_eq!(up.program, "docker");
        assert_eq!(up.cwd, dir.path());
        assert_eq!(up.args, [&globals[..], &["up", "", "two\nlines"]].concat());
        assert_eq!(up.env["MULTI"], "first\nsecond");
        assert_eq!(up.env["PATH"], "/nonexistent");
        assert!(
            !up.env.contains_key("COMPOSE_VERSION"),
            "scenario is not env"
        );
        assert_eq!(
            up.command_line(),
            format!("compose -p p -f {compose_file} up '' 'two\nlines'")
        );
    }

    #[test]
    fn the_fake_engine_serves_the_stubs_model() {
        let dir = tempfile::tempdir().unwrap();
        let stub = StubDocker::install(dir.path()).unwrap();
        let engine = stub.engine();
        assert_eq!(engine.engine().containers("p").unwrap(), vec![]);
        stub.set("SERVICES", "web worker");
        stub.set("HEALTH", "starting");
        let out = std::process::Command::new(stub.program())
            .args(["compose", "-p", "p", "up"])
            .env_clear()
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let seen = engine.engine().containers("p").unwrap();
        let names: Vec<(&str, Option<&str>)> = seen
            .iter()
            .map(|c| (c.name.as_str(), c.health.as_deref()))
            .collect();
        assert_eq!(
            names,
            [
                ("p-web-1", Some("starting")),
                ("p-worker-1", Some("starting"))
            ]
        );
        assert_eq!(engine.engine().info().unwrap().docker_root_dir, dir.path());
        assert!(
            engine.requests()[0].starts_with("GET /containers/json?"),
            "{:?}",
            engine.requests()
        );
    }
}
