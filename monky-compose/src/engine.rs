//! The Docker Engine API over the unix socket, in-process: container states and daemon facts
//! without spawning a process (a heartbeat must not cost a `docker compose ps`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use url::Url;

use crate::Container;
use crate::container::{Row, docker_words, oneoff_word};
use crate::error::{Error, Result};

/// The socket the daemon listens on when `DOCKER_HOST` is not set.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// The label compose puts on every container of a project.
pub const PROJECT_LABEL: &str = "com.docker.compose.project";
/// Compose's label of a container's dependencies: `<service>:<condition>:<restart>`, comma
/// separated.
const DEPENDS_ON_LABEL: &str = "com.docker.compose.depends_on";
/// The label naming the compose service.
pub const SERVICE_LABEL: &str = "com.docker.compose.service";
/// The label marking `compose run` one-off containers (`True`), which are not the project's
/// state.
pub const ONEOFF_LABEL: &str = "com.docker.compose.oneoff";
/// The label holding compose's hash of the service's configuration: `up` recreates a container
/// whose hash differs from the model's, so a container made by another hand shows here.
pub const CONFIG_HASH_LABEL: &str = "com.docker.compose.config-hash";

/// The most this crate reads of one Engine API response.
const MAX_BODY: u64 = 16 * 1024 * 1024;

/// A reader of the Docker Engine API on a unix socket.
///
/// Paths are unversioned, so the daemon answers in its own current API version; only fields
/// present since long before docker 20.10 are read. The daemon facts of [`Engine::info`] are
/// fetched once and cached.
#[derive(Debug)]
pub struct Engine {
    target: Target,
    timeout: Duration,
    info: Mutex<Option<EngineInfo>>,
    /// The daemon version the last answer named in its `Server` header (dockerd names it on
    /// every answer), so a saved [`EngineInfo`] can be known still true without `/info`.
    version_seen: Mutex<Option<String>>,
    /// The `USER` of each image reference [`Engine::image_id`] looked up, from the same answer.
    users: Mutex<std::collections::HashMap<String, Option<String>>>,
    /// The connection the last `GET` left open (dockerd keeps one open between requests), for
    /// the next `GET`: a heartbeat's few reads dial the socket once.
    idle: Mutex<Option<std::os::unix::net::UnixStream>>,
}

#[derive(Debug, Clone)]
enum Target {
    Unix(PathBuf),
    /// A `DOCKER_HOST` this reader does not speak (tcp://, ssh://): only the CLI can reach it.
    Other(String),
}

/// What the daemon says about itself (`GET /info`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineInfo {
    /// The daemon version, for example `28.3.0` or `20.10.24+dfsg1`.
    #[serde(rename = "ServerVersion")]
    pub server_version: String,
    /// The daemon's data root, for example `/var/lib/docker`.
    #[serde(rename = "DockerRootDir")]
    pub docker_root_dir: PathBuf,
    /// The daemon's security options, for example `name=seccomp,profile=builtin` and, with
    /// `userns-remap`, `name=userns`.
    #[serde(rename = "SecurityOptions", default)]
    pub security_options: Vec<String>,
}

/// What an engine object is: the three kinds a compose project names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ObjectKind {
    /// A container.
    Container,
    /// A volume.
    Volume,
    /// A network.
    Network,
}

impl ObjectKind {
    /// The word for it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Container => "container",
            ObjectKind::Volume => "volume",
            ObjectKind::Network => "network",
        }
    }
}

/// A container, volume or network on the engine ([`Engine::named_objects`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedObject {
    /// Its kind.
    pub kind: ObjectKind,
    /// Its name, without the leading `/` the engine gives a container's.
    pub name: String,
    /// The compose project that made it, by its label.
    pub project: Option<String>,
}

impl EngineInfo {
    /// Whether the daemon remaps user namespaces (`userns-remap`): then a container's uid is
    /// no host account's.
    #[must_use]
    pub fn userns_remap(&self) -> bool {
        self.security_options
            .iter()
            .any(|o| o.split(',').any(|kv| kv == "name=userns"))
    }
}

impl Engine {
    /// The engine named by `DOCKER_HOST` (`unix://...`), else [`DEFAULT_SOCKET`].
    #[must_use]
    pub fn from_env() -> Engine {
        Engine::for_docker_host(std::env::var("DOCKER_HOST").ok().as_deref())
    }

    /// The engine for a `DOCKER_HOST` value: `unix:///path` or an empty/absent value use a
    /// socket; any other scheme cannot be read in-process and every call returns
    /// [`Error::EngineUnavailable`] (callers fall back to the CLI).
    #[must_use]
    pub fn for_docker_host(host: Option<&str>) -> Engine {
        let target = match host.map(str::trim) {
            None | Some("") => Target::Unix(PathBuf::from(DEFAULT_SOCKET)),
            Some(h) => match h.strip_prefix("unix://") {
                Some(path) if path.starts_with('/') => Target::Unix(PathBuf::from(path)),
                _ => Target::Other(h.to_owned()),
            },
        };
        Engine::with_target(target)
    }

    /// The engine on the socket at `path`.
    #[must_use]
    pub fn unix(path: impl Into<PathBuf>) -> Engine {
        Engine::with_target(Target::Unix(path.into()))
    }

    fn with_target(target: Target) -> Engine {
        Engine {
            target,
            timeout: Duration::from_secs(10),
            info: Mutex::new(None),
            version_seen: Mutex::new(None),
            idle: Mutex::new(None),
            users: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The timeout of one API call (default 10 s).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Engine {
        self.timeout = timeout;
        self
    }

    /// The socket, when the engine is reached through one on this machine.
    #[must_use]
    pub fn socket(&self) -> Option<&Path> {
        match &self.target {
            Target::Unix(p) => Some(p),
            Target::Other(_) => None,
        }
    }

    /// The daemon's version and data root; fetched on the first call, cached after.
    pub fn info(&self) -> Result<EngineInfo> {
        let mut cached = self.info.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(info) = cached.as_ref() {
            return Ok(info.clone());
        }
        let info: EngineInfo = self.get_json("/info", &[])?;
        *cached = Some(info.clone());
        Ok(info)
    }

    /// The daemon's facts when this engine fetched them already, without a request.
    #[must_use]
    pub fn info_fetched(&self) -> Option<EngineInfo> {
        self.info.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The daemon version the last answer of this engine named (`Server: Docker/<version>
    /// (<os>)`), when it named one.
    #[must_use]
    pub fn version_seen(&self) -> Option<String> {
        self.version_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The containers of compose project `project`, one-off containers excluded, sorted by
    /// name. `GET /containers/json?all=1&filters={"label":["com.docker.compose.project=<p>"]}`.
    pub fn containers(&self, project: &str) -> Result<Vec<Container>> {
        Ok(self
            .container_facts(project)?
            .into_iter()
            .map(|f| f.container)
            .collect())
    }

    /// Every host port a running container of any project publishes, with the host address it
    /// is bound to (`0.0.0.0` / `::` for all): one request, `GET /containers/json`.
    pub fn published_ports(&self) -> Result<Vec<(String, u16)>> {
        #[derive(Deserialize)]
        struct Port {
            #[serde(rename = "IP", default)]
            ip: String,
            #[serde(rename = "PublicPort", default)]
            public: Option<u16>,
        }
        #[derive(Deserialize)]
        struct Row {
            #[serde(rename = "Ports", default)]
            ports: Vec<Port>,
        }
        let rows: Vec<Row> = self.get_json("/containers/json", &[])?;
        Ok(rows
            .into_iter()
            .flat_map(|r| r.ports)
            .filter_map(|p| Some((p.ip, p.public?)))
            .collect())
    }

    /// As [`Engine::containers`], with what the same answer says about where each container
    /// came from ([`ContainerFacts`]): still one request, no process.
    pub fn container_facts(&self, project: &str) -> Result<Vec<ContainerFacts>> {
        let rows: Vec<ApiContainer> = self
            .rows(project)?
            .into_iter()
            .filter(|r| !r.is_oneoff())
            .collect();
        let waited_on = completion_awaited(&rows);
        let mut facts: Vec<ContainerFacts> =
            rows.into_iter().map(ApiContainer::into_facts).collect();
        for f in &mut facts {
            f.awaited = waited_on.contains(&f.container.service);
            if f.container.state != "exited" || f.exit_code != Some(0) {
                continue;
            }
            // A one-shot that did its work is done, not down: compose's own rule for a service
            // another waits for with `service_completed_successfully`, and the engine's for a
            // container it will not restart (asked only for an exited-0 container).
            f.container.completed = f.awaited
                || self
                    .restart_policy(&f.id)
                    .is_ok_and(|p| matches!(p.as_str(), "" | "no" | "on-failure"));
        }
        facts.sort_by(|a, b| a.container.name.cmp(&b.container.name));
        Ok(facts)
    }

    /// The restart policy of a container (`HostConfig.RestartPolicy.Name`: `no`, `always`,
    /// `unless-stopped`, `on-failure`; empty for none), from `GET /containers/{id}/json`.
    fn restart_policy(&self, id: &str) -> Result<String> {
        if id.is_empty() || id.contains(['/', '?']) {
            return Err(Error::Parse {
                what: "container id".to_owned(),
                detail: format!("{id:?} is not a container id"),
            });
        }
        let raw: ApiInspect = self.get_json(&format!("/containers/{id}/json"), &[])?;
        Ok(raw.host_config.restart_policy.name)
    }

    /// What the engine recorded of container `id` since `since` (unix seconds), oldest
    /// first: `start`, `kill` (with its signal), `oom`, `die` (with its exit code), ... from
    /// `GET /events?since=..&until=now`, which answers from the engine's in-memory record and
    /// ends. An engine restarted since remembers nothing of before it.
    pub fn container_events(&self, id: &str, since: u64) -> Result<Vec<ContainerEvent>> {
        if id.is_empty() || id.contains(['/', '?']) {
            return Err(Error::Parse {
                what: "container id".to_owned(),
                detail: format!("{id:?} is not a container id"),
            });
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let filters = serde_json::json!({ "type": ["container"], "container": [id] });
        let body = self.call(
            Method::Get,
            "/events",
            &[
                ("since", &since.to_string()),
                ("until", &now.to_string()),
                ("filters", &filters.to_string()),
            ],
            None,
        )?;
        serde_json::Deserializer::from_slice(&body)
            .into_iter::<ApiEvent>()
            .map(|e| {
                e.map(ApiEvent::into_event).map_err(|e| Error::Parse {
                    what: "engine /events".to_owned(),
                    detail: e.to_string(),
                })
            })
            .collect()
    }

    fn rows(&self, project: &str) -> Result<Vec<ApiContainer>> {
        let filters = serde_json::json!({ "label": [format!("{PROJECT_LABEL}={project}")] });
        self.get_json(
            "/containers/json",
            &[("all", "1"), ("filters", &filters.to_string())],
        )
    }

    /// Why a container is not ready, from `GET /containers/{name}/json`: the engine's own
    /// error for a container that never started (a host port in use, a missing device) and the
    /// last healthcheck probe. Texts are cut to [`ContainerDetail::MAX_TEXT`] characters; they
    /// are the app's or the engine's words and callers redact them like any log line.
    pub fn inspect(&self, name: &str) -> Result<ContainerDetail> {
        // A container name never holds a slash; one that does would address another endpoint.
        if name.is_empty() || name.contains('/') || name.contains('?') {
            return Err(Error::Parse {
                what: "container name".to_owned(),
                detail: format!("{name:?} is not a container name"),
            });
        }
        let raw: ApiInspect = self.get_json(&format!("/containers/{name}/json"), &[])?;
        Ok(raw.into_detail())
    }

    /// The local image `reference` names, by its ID (`sha256:...`), from
    /// `GET /images/{reference}/json`; `None` when the engine has no such image.
    pub fn image_id(&self, reference: &str) -> Result<Option<String>> {
        check_reference(reference)?;
        match self.get_json::<ApiImage>(&format!("/images/{reference}/json"), &[]) {
            Ok(image) => {
                self.users
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(reference.to_owned(), image.user());
                Ok(Some(image.id))
            }
            Err(Error::EngineStatus { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The `USER` an image's config sets (`None`: unset or empty, so root), by the image's ID
    /// or reference as [`image_id`](Self::image_id) takes it; from that call's answer when it
    /// looked this reference up.
    ///
    /// # Errors
    /// The engine's, or an image it does not have.
    pub fn image_user(&self, image: &str) -> Result<Option<String>> {
        if let Some(user) = self
            .users
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(image)
        {
            return Ok(user.clone());
        }
        check_reference(image)?;
        let found: ApiImage = self.get_json(&format!("/images/{image}/json"), &[])?;
        Ok(found.user())
    }

    /// An image's own `/etc/passwd`, as the container's user name will be resolved against it:
    /// read from a container created from the image and never started (no code of the image
    /// runs), then removed. `None` when the image has no such file.
    ///
    /// # Errors
    /// The engine's.
    pub fn image_passwd(&self, image: &str) -> Result<Option<String>> {
        #[derive(Deserialize)]
        struct Created {
            #[serde(rename = "Id")]
            id: String,
        }
        check_reference(image)?;
        let spec = serde_json::json!({
            "Image": image,
            "Entrypoint": ["/nonexistent"],
            "Cmd": [],
            "NetworkDisabled": true,
            "Labels": {"io.monky.deployd.probe": "passwd"},
            "HostConfig": {"NetworkMode": "none"},
        });
        let body = self.call(Method::Post, "/containers/create", &[], Some(&spec))?;
        let created: Created = serde_json::from_slice(&body).map_err(|e| Error::Parse {
            what: "engine /containers/create".to_owned(),
            detail: e.to_string(),
        })?;
        let archive = self.call(
            Method::Get,
            &format!("/containers/{}/archive", created.id),
            &[("path", "/etc/passwd")],
            None,
        );
        let removed = self.call(
            Method::Delete,
            &format!("/containers/{}", created.id),
            &[("force", "1"), ("v", "1")],
            None,
        );
        let text = match archive {
            Ok(tar) => first_file(&tar),
            Err(Error::EngineStatus { status: 404, .. }) => None,
            Err(e) => return Err(e),
        };
        removed?;
        Ok(text)
    }

    /// What runs of container `id` (an ID or name of [`Engine::container_facts`]), from
    /// `GET /containers/{id}/json`: its main process as the host numbers it, and its
    /// environment. The environment's values are the app's, secrets among them: a caller
    /// compares them in memory and never shows them ([`Running`]'s `Debug` gives names only).
    ///
    /// # Errors
    /// The engine's (a container gone meanwhile is a 404 [`Error::EngineStatus`]).
    pub fn running(&self, id: &str) -> Result<Running> {
        #[derive(Deserialize)]
        struct Raw {
            #[serde(rename = "State", default)]
            state: RawState,
            #[serde(rename = "Config", default)]
            config: RawConfig,
        }
        #[derive(Default, Deserialize)]
        struct RawState {
            #[serde(rename = "Running", default)]
            running: bool,
            #[serde(rename = "Pid", default)]
            pid: u32,
        }
        #[derive(Default, Deserialize)]
        struct RawConfig {
            #[serde(rename = "Env", default)]
            env: Option<Vec<String>>,
        }
        check_container_id(id)?;
        let raw: Raw = self.get_json(&format!("/containers/{id}/json"), &[])?;
        Ok(Running {
            pid: (raw.state.running && raw.state.pid > 0).then_some(raw.state.pid),
            env: raw.config.env.unwrap_or_default(),
        })
    }

    /// The processes of container `id` as the engine sees them (`GET /containers/{id}/top`,
    /// which runs `ps -ww -o pid,ruid,euid,suid,fsuid,args` beside dockerd and keeps the
    /// container's own): the look at what runs when the caller's `/proc` is not the engine's
    /// (the agent in another pid namespace). The arguments are the app's, secrets maybe among
    /// them: a caller compares them in memory ([`TopProcess`]'s `Debug` never shows them).
    ///
    /// # Errors
    /// The engine's; [`Error::Parse`] for columns other than those asked, or a number that is
    /// not one (the message names the column, never an argument).
    pub fn top(&self, id: &str) -> Result<Vec<TopProcess>> {
        #[derive(Deserialize)]
        struct Raw {
            #[serde(rename = "Titles", default)]
            titles: Vec<String>,
            #[serde(rename = "Processes", default)]
            processes: Option<Vec<Vec<String>>>,
        }
        const TITLES: [&str; 6] = ["PID", "RUID", "EUID", "SUID", "FSUID", "COMMAND"];
        check_container_id(id)?;
        let raw: Raw = self.get_json(
            &format!("/containers/{id}/top"),
            &[("ps_args", "-ww -o pid,ruid,euid,suid,fsuid,args")],
        )?;
        let bad = |detail: String| Error::Parse {
            what: format!("engine /containers/{id}/top"),
            detail,
        };
        if raw.titles != TITLES {
            return Err(bad(format!("columns {:?}, not {TITLES:?}", raw.titles)));
        }
        raw.processes
            .unwrap_or_default()
            .into_iter()
            .map(|row| {
                let columns = row.len();
                let [pid, ruid, euid, suid, fsuid, args]: [String; 6] = row
                    .try_into()
                    .map_err(|_| bad(format!("a row of {columns} columns, not 6")))?;
                let number = |title: &str, v: &str| {
                    v.trim()
                        .parse::<u32>()
                        .map_err(|_| bad(format!("{title} {v:?} is not a number")))
                };
                Ok(TopProcess {
                    pid: number("PID", &pid)?,
                    uids: [
                        number("RUID", &ruid)?,
                        number("EUID", &euid)?,
                        number("SUID", &suid)?,
                        number("FSUID", &fsuid)?,
                    ],
                    args,
                })
            })
            .collect()
    }

    /// Stops container `id` (`POST /containers/{id}/stop?t=<grace>`): the engine's own stop,
    /// so its restart policy does not start it again. A container stopped already is no error.
    ///
    /// # Errors
    /// The engine's.
    pub fn stop(&self, id: &str, grace: Duration) -> Result<()> {
        check_container_id(id)?;
        let t = grace.as_secs().to_string();
        match self.call(
            Method::Post,
            &format!("/containers/{id}/stop"),
            &[("t", &t)],
            None,
        ) {
            Ok(_) | Err(Error::EngineStatus { status: 304, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every container (running or not), volume and network on the engine, by name, with
    /// the compose project that made it (`None`: made by another hand): three requests.
    pub fn named_objects(&self) -> Result<Vec<NamedObject>> {
        #[derive(Deserialize)]
        struct Named {
            #[serde(rename = "Name", default)]
            name: String,
            #[serde(rename = "Labels", default)]
            labels: Option<BTreeMap<String, String>>,
        }
        #[derive(Deserialize)]
        struct Volumes {
            #[serde(rename = "Volumes", default)]
            volumes: Option<Vec<Named>>,
        }
        let project = |labels: Option<&BTreeMap<String, String>>| {
            labels.and_then(|l| l.get(PROJECT_LABEL)).cloned()
        };
        let mut out = Vec::new();
        let containers: Vec<ApiContainer> = self.get_json("/containers/json", &[("all", "1")])?;
        for c in containers {
            for name in &c.names {
                out.push(NamedObject {
                    kind: ObjectKind::Container,
                    name: name.trim_start_matches('/').to_owned(),
                    project: project(c.labels.as_ref()),
                });
            }
        }
        let volumes: Volumes = self.get_json("/volumes", &[])?;
        for v in volumes.volumes.unwrap_or_default() {
            out.push(NamedObject {
                kind: ObjectKind::Volume,
                project: project(v.labels.as_ref()),
                name: v.name,
            });
        }
        let networks: Vec<Named> = self.get_json("/networks", &[])?;
        for n in networks {
            out.push(NamedObject {
                kind: ObjectKind::Network,
                project: project(n.labels.as_ref()),
                name: n.name,
            });
        }
        Ok(out)
    }

    /// A new connection to the engine's socket. A missing socket is told by the connect
    /// itself: no look before it, on every call.
    fn connect(&self, socket: &Path) -> Result<std::os::unix::net::UnixStream> {
        std::os::unix::net::UnixStream::connect(socket).map_err(|e| Error::EngineUnavailable {
            target: self.target_text(),
            reason: match e.kind() {
                std::io::ErrorKind::NotFound => "no such socket".to_owned(),
                _ => e.to_string(),
            },
        })
    }

    /// Writes `request` on `stream` and reads one whole answer, every write and read bounded
    /// by what is left until `deadline`. The answer, and the stream when the answer left it
    /// open for another request.
    fn exchange(
        &self,
        mut stream: std::os::unix::net::UnixStream,
        path: &str,
        request: &str,
        deadline: std::time::Instant,
    ) -> std::result::Result<(Vec<u8>, Option<std::os::unix::net::UnixStream>), Exchange> {
        let io = |e: std::io::Error| Error::EngineRequest {
            path: path.to_owned(),
            source: e,
        };
        let left = || {
            deadline
                .checked_duration_since(std::time::Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"))
        };
        let failed = |e| Exchange::Failed(io(e));
        stream
            .set_write_timeout(Some(left().map_err(failed)?))
            .map_err(failed)?;
        if let Err(e) = stream.write_all(request.as_bytes()) {
            return Err(Exchange::Unanswered(io(e)));
        }
        let cap = MAX_BODY + 64 * 1024;
        let mut answer = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        let end = loop {
            if let Some(end) = answer_end(&answer) {
                break Some(end);
            }
            stream
                .set_read_timeout(Some(left().map_err(failed)?))
                .map_err(failed)?;
            match stream.read(&mut buf) {
                Ok(0) if answer.is_empty() => {
                    let closed = std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the engine closed the connection before it answered",
                    );
                    return Err(Exchange::Unanswered(io(closed)));
                }
                Ok(0) => break None,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if answer.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Err(Exchange::Unanswered(io(e)));
                }
                Err(e) => return Err(failed(e)),
            }
            if answer.len() as u64 > cap {
                return Err(Exchange::Failed(Error::Parse {
                    what: format!("engine {path}"),
                    detail: format!("answer larger than {MAX_BODY} bytes"),
                }));
            }
        };
        // Open for another request: a whole answer, of a known length, that does not close.
        let stream = end
            .filter(|&end| end == answer.len() && !closes(&answer))
            .map(|_| stream);
        Ok((answer, stream))
    }

    fn target_text(&self) -> String {
        match &self.target {
            Target::Unix(p) => format!("unix://{}", p.display()),
            Target::Other(h) => h.clone(),
        }
    }

    fn get_json<T: DeserializeOwned>(&self, path: &str, query: &[(&str, &str)]) -> Result<T> {
        let body = self.call(Method::Get, path, query, None)?;
        serde_json::from_slice(&body).map_err(|e| Error::Parse {
            what: format!("engine {path}"),
            detail: e.to_string(),
        })
    }

    /// One request to the engine's socket, HTTP/1.1 over a plain `UnixStream` (no thread, no
    /// runtime: a heartbeat makes a few of these); the answer's body (at most `MAX_BODY`
    /// bytes) when its status is a success, else the engine's own message. Every read and write
    /// is bounded by what is left of the call's timeout.
    fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        json: Option<&serde_json::Value>,
    ) -> Result<Vec<u8>> {
        let socket = match &self.target {
            Target::Unix(p) => p.clone(),
            Target::Other(h) => {
                return Err(Error::EngineUnavailable {
                    target: h.clone(),
                    reason: "DOCKER_HOST is not a unix socket".to_owned(),
                });
            }
        };
        // The host name is never resolved: every connection goes to the socket.
        let mut url = Url::parse("http://docker").expect("static url parses");
        url.set_path(path);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let target = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        let body = json.map(ToString::to_string).unwrap_or_default();
        // A `GET` may leave its connection open for the next one; anything else closes it, so
        // a request that changes the engine is never sent twice on a connection that died.
        let keep = matches!(method, Method::Get);
        let mut request = format!(
            "{} {target} HTTP/1.1\r\nHost: docker\r\nUser-Agent: monky-deployd\r\n{}",
            method.as_str(),
            if keep { "" } else { "Connection: close\r\n" }
        );
        if json.is_some() {
            request.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        request.push_str("\r\n");
        request.push_str(&body);

        let deadline = std::time::Instant::now() + self.timeout;
        let idle = if keep {
            self.idle.lock().unwrap_or_else(|p| p.into_inner()).take()
        } else {
            None
        };
        let (answer, stream) = match idle {
            // An idle connection dockerd closed meanwhile fails before any byte of an answer:
            // the `GET` goes again on a new one.
            Some(stream) => match self.exchange(stream, path, &request, deadline) {
                Ok(done) => done,
                Err(Exchange::Unanswered(_)) => {
                    self.exchange(self.connect(&socket)?, path, &request, deadline)?
                }
                Err(Exchange::Failed(e)) => return Err(e),
            },
            None => self.exchange(self.connect(&socket)?, path, &request, deadline)?,
        };
        if let Some(stream) = stream.filter(|_| keep) {
            *self.idle.lock().unwrap_or_else(|p| p.into_inner()) = Some(stream);
        }
        let (status, body) = parse_response(&answer).ok_or_else(|| Error::Parse {
            what: format!("engine {path}"),
            detail: "not an HTTP answer".to_owned(),
        })?;
        *self.version_seen.lock().unwrap_or_else(|p| p.into_inner()) =
            server_version(&answer).map(str::to_owned);
        if body.len() as u64 > MAX_BODY {
            return Err(Error::Parse {
                what: format!("engine {path}"),
                detail: format!("answer larger than {MAX_BODY} bytes"),
            });
        }
        if !(200..300).contains(&status) {
            #[derive(Deserialize)]
            struct ApiError {
                message: String,
            }
            let message = serde_json::from_slice::<ApiError>(&body)
                .map(|e| e.message)
                .unwrap_or_else(|_| crate::error::tail_chars(&String::from_utf8_lossy(&body), 300));
            return Err(Error::EngineStatus {
                path: path.to_owned(),
                status,
                message,
            });
        }
        Ok(body)
    }
}

/// The methods the agent uses.
#[derive(Debug, Clone, Copy)]
enum Method {
    Get,
    Post,
    Delete,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }
}

/// Why an exchange on a connection gave no answer.
enum Exchange {
    /// Nothing of an answer came: the connection was closed or reset before it, which is how an
    /// idle connection dockerd closed meanwhile fails. A `GET` may go again on a new one.
    Unanswered(Error),
    /// The exchange failed after that, or for another cause.
    Failed(Error),
}

impl From<Exchange> for Error {
    fn from(e: Exchange) -> Self {
        match e {
            Exchange::Unanswered(e) | Exchange::Failed(e) => e,
        }
    }
}

/// The head of an HTTP/1.1 answer: its status, where its body starts, and its header lines.
/// `None` for bytes that are not (yet) a whole head, or a header line without a `:`.
struct Head<'a> {
    status: u16,
    body_at: usize,
    headers: Vec<(&'a str, &'a str)>,
}

/// How an answer's body ends.
enum Framing {
    /// A status that has no body.
    Empty,
    Length(usize),
    Chunked,
    /// With the connection.
    ToEnd,
}

impl<'a> Head<'a> {
    fn parse(answer: &'a [u8]) -> Option<Self> {
        let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
        let text = std::str::from_utf8(&answer[..head_end]).ok()?;
        let mut lines = text.split("\r\n");
        let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers = lines
            .map(|line| line.split_once(':').map(|(n, v)| (n, v.trim())))
            .collect::<Option<_>>()?;
        Some(Head {
            status,
            body_at: head_end + 4,
            headers,
        })
    }

    /// The first value of header `name`.
    fn header(&self, name: &str) -> Option<&'a str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    /// `None` for a `Content-Length` that is not a number.
    fn framing(&self) -> Option<Framing> {
        if self.status == 204 || self.status == 304 || (100..200).contains(&self.status) {
            return Some(Framing::Empty);
        }
        let chunked = self
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        Some(match self.header("content-length") {
            _ if chunked => Framing::Chunked,
            Some(n) => Framing::Length(n.parse().ok()?),
            None => Framing::ToEnd,
        })
    }
}

/// Walks a chunked body, handing each chunk's bytes to `each`; where the last (empty) chunk's
/// size line ends, `None` while it has not come.
fn chunks(body: &[u8], mut each: impl FnMut(&[u8])) -> Option<usize> {
    let mut at = 0;
    loop {
        let line_end = body.get(at..)?.windows(2).position(|w| w == b"\r\n")? + at;
        let size = std::str::from_utf8(&body[at..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            return Some(at);
        }
        each(body.get(at..at.checked_add(size)?)?);
        at = at.checked_add(size)?.checked_add(2)?;
    }
}

/// Where a whole HTTP/1.1 answer ends in `answer`, when it is whole: after the head for a
/// status without a body, after `Content-Length` bytes, or after the last chunk and the empty
/// line after it (no trailers). `None` while it is not, and for an answer whose end is the
/// connection's.
fn answer_end(answer: &[u8]) -> Option<usize> {
    let head = Head::parse(answer)?;
    let body = &answer[head.body_at..];
    let len = match head.framing()? {
        Framing::Empty => 0,
        Framing::Length(n) => Some(n).filter(|&n| n <= body.len())?,
        Framing::Chunked => {
            let at = chunks(body, |_| {})?;
            (body.get(at..at + 2)? == b"\r\n").then_some(at + 2)?
        }
        Framing::ToEnd => return None,
    };
    Some(head.body_at + len)
}

/// Whether the answer's head says the connection closes after it (or cannot be read).
fn closes(answer: &[u8]) -> bool {
    Head::parse(answer).is_none_or(|head| {
        head.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    })
}

/// The daemon version of an answer's `Server: Docker/<version> (<os>)` header.
fn server_version(answer: &[u8]) -> Option<&str> {
    let version = Head::parse(answer)?
        .header("server")?
        .strip_prefix("Docker/")?
        .split(' ')
        .next()?;
    (!version.is_empty()).then_some(version)
}

/// The status and body of a whole HTTP/1.1 answer: the body as `Content-Length` bounds it, or
/// de-chunked, or up to the end (the connection closed after it).
fn parse_response(answer: &[u8]) -> Option<(u16, Vec<u8>)> {
    let head = Head::parse(answer)?;
    let rest = &answer[head.body_at..];
    let body = match head.framing()? {
        Framing::Empty => Vec::new(),
        Framing::Length(n) => rest.get(..n)?.to_vec(),
        Framing::Chunked => {
            let mut body = Vec::new();
            chunks(rest, |chunk| body.extend_from_slice(chunk))?;
            body
        }
        Framing::ToEnd => rest.to_vec(),
    };
    Some((head.status, body))
}

/// What the agent reads of `GET /images/{reference}/json`.
#[derive(Deserialize)]
struct ApiImage {
    #[serde(rename = "Id")]
    id: String,
    #[serde(rename = "Config")]
    config: Option<ApiImageConfig>,
}

#[derive(Deserialize)]
struct ApiImageConfig {
    #[serde(rename = "User")]
    user: Option<String>,
}

impl ApiImage {
    fn user(&self) -> Option<String> {
        self.config
            .as_ref()
            .and_then(|c| c.user.as_deref())
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
    }
}

/// A reference that cannot address another endpoint of the engine's API.
fn check_reference(reference: &str) -> Result<()> {
    if reference.is_empty() || reference.contains(['?', '#', ' ']) || reference.contains("..") {
        return Err(Error::Parse {
            what: "image reference".to_owned(),
            detail: format!("{reference:?} is not an image reference"),
        });
    }
    Ok(())
}

/// The first regular file of a tar archive (what the engine's archive endpoint answers for
/// one file), as text.
fn first_file(tar: &[u8]) -> Option<String> {
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().ok()? {
        let mut entry = entry.ok()?;
        if entry.header().entry_type().is_file() {
            let mut text = String::new();
            entry.read_to_string(&mut text).ok()?;
            return Some(text);
        }
    }
    None
}

/// A container of a project with the facts drift detection compares: its id, compose's config
/// hash, the image it runs and, when it exited, its exit code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerFacts {
    /// The container's name, service, state and health.
    pub container: Container,
    /// The engine's id of the container.
    pub id: String,
    /// Compose's `com.docker.compose.config-hash` label; `None` on a container compose did not
    /// make (or when only the CLI could be asked).
    pub config_hash: Option<String>,
    /// The id of the image it runs (`sha256:...`), when the engine says.
    pub image_id: Option<String>,
    /// The exit code an exited container's status shows (`Exited (0) 3 minutes ago`).
    pub exit_code: Option<i32>,
    /// Another service of the project waits for this one to complete
    /// (`service_completed_successfully`): a one-shot whose end the start waits for.
    #[serde(default)]
    pub awaited: bool,
}

impl ContainerFacts {
    /// Facts that only the container itself is known of (the CLI fallback's rows).
    #[must_use]
    pub fn of(container: Container) -> Self {
        ContainerFacts {
            container,
            id: String::new(),
            config_hash: None,
            image_id: None,
            exit_code: None,
            awaited: false,
        }
    }
}

/// The exit code in an engine status text: `Exited (137) 2 seconds ago` gives 137.
#[must_use]
pub fn exit_code_from_status(status: &str) -> Option<i32> {
    let rest = status.trim_start().strip_prefix("Exited (")?;
    rest[..rest.find(')')?].trim().parse().ok()
}

#[derive(Debug, Deserialize)]
struct ApiContainer {
    #[serde(rename = "Id", default)]
    id: String,
    #[serde(rename = "ImageID", default)]
    image_id: String,
    #[serde(rename = "Names", default)]
    names: Vec<String>,
    #[serde(rename = "State", default)]
    state: String,
    #[serde(rename = "Status", default)]
    status: String,
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

impl ApiContainer {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }

    fn into_facts(self) -> ContainerFacts {
        let config_hash = self.label(CONFIG_HASH_LABEL).map(str::to_owned);
        let exit_code = exit_code_from_status(&self.status);
        let id = self.id.clone();
        let image_id = Some(self.image_id.clone()).filter(|i| !i.is_empty());
        ContainerFacts {
            container: self.into_container(),
            id,
            config_hash,
            image_id,
            exit_code,
            awaited: false,
        }
    }
}

impl Row for ApiContainer {
    fn is_oneoff(&self) -> bool {
        self.label(ONEOFF_LABEL).is_some_and(oneoff_word)
    }

    fn into_container(self) -> Container {
        // Legacy links add names like "/other/alias"; the container's own has one slash.
        let name = self
            .names
            .iter()
            .map(|n| n.trim_start_matches('/'))
            .find(|n| !n.contains('/'))
            .or_else(|| self.names.first().map(|n| n.trim_start_matches('/')))
            .unwrap_or_default()
            .to_owned();
        let service = self.label(SERVICE_LABEL).unwrap_or_default().to_owned();
        Container::from_row(name, service, &self.state, &self.status, "")
    }
}

/// One action the engine recorded of a container: see [`Engine::container_events`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerEvent {
    /// `start`, `kill`, `oom`, `die`, `stop`, ...
    pub action: String,
    /// When (unix seconds).
    pub time: u64,
    /// A `kill`'s signal number.
    pub signal: Option<i32>,
    /// A `die`'s exit code.
    pub exit_code: Option<i32>,
}

#[derive(Debug, Deserialize)]
struct ApiEvent {
    #[serde(rename = "Action", default)]
    action: String,
    /// The action's name before API 1.22.
    #[serde(default)]
    status: String,
    #[serde(default)]
    time: u64,
    #[serde(rename = "Actor", default)]
    actor: ApiActor,
}

#[derive(Debug, Default, Deserialize)]
struct ApiActor {
    #[serde(rename = "Attributes", default)]
    attributes: std::collections::BTreeMap<String, String>,
}

impl ApiEvent {
    fn into_event(self) -> ContainerEvent {
        let number = |key: &str| self.actor.attributes.get(key)?.parse::<i32>().ok();
        // A kill's signal is a number, or a name where the client gave one (`docker kill -s
        // KILL`).
        let signal = number("signal").or_else(|| {
            let name = self.actor.attributes.get("signal")?;
            match name.trim_start_matches("SIG") {
                "KILL" => Some(9),
                "TERM" => Some(15),
                "INT" => Some(2),
                "HUP" => Some(1),
                "QUIT" => Some(3),
                _ => None,
            }
        });
        let exit_code = number("exitCode");
        let action = if self.action.is_empty() {
            self.status
        } else {
            self.action
        };
        ContainerEvent {
            action,
            time: self.time,
            signal,
            exit_code,
        }
    }
}

/// One process of a container as the engine's `top` shows it: see [`Engine::top`].
#[derive(Clone, PartialEq, Eq)]
pub struct TopProcess {
    /// Its pid as the engine's host numbers it.
    pub pid: u32,
    /// Real, effective, saved and filesystem uid.
    pub uids: [u32; 4],
    /// Its arguments as `ps` joins them with spaces: the app's, maybe a secret; never shown.
    pub args: String,
}

impl std::fmt::Debug for TopProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopProcess")
            .field("pid", &self.pid)
            .field("uids", &self.uids)
            .finish_non_exhaustive()
    }
}

/// What runs of a container: see [`Engine::running`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Running {
    /// Its main process as the host numbers it; `None` when the engine says it does not run.
    pub pid: Option<u32>,
    /// Its environment, `NAME=value` each: values are the app's and may be secrets.
    pub env: Vec<String>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self
            .env
            .iter()
            .map(|kv| kv.split_once('=').map_or(kv.as_str(), |(k, _)| k))
            .collect();
        f.debug_struct("Running")
            .field("pid", &self.pid)
            .field("env", &names)
            .finish()
    }
}

/// A container ID or name, as a path segment: it addresses that container and no other
/// endpoint.
fn check_container_id(id: &str) -> Result<()> {
    if id.is_empty() || id.contains(['/', '?', '#']) {
        return Err(Error::Parse {
            what: "container id".to_owned(),
            detail: format!("{id:?} is not a container id"),
        });
    }
    Ok(())
}

/// What the engine says about one container beyond its state: see [`Engine::inspect`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerDetail {
    /// `State.Error`: why the engine could not start it (empty string: none).
    pub error: Option<String>,
    /// `State.ExitCode` of an exited container.
    pub exit_code: Option<i64>,
    /// The last healthcheck probe (`State.Health.Log`'s last entry), when it has one.
    pub last_probe: Option<Probe>,
    /// `State.OOMKilled`: the kernel's OOM killer ended its last run.
    #[serde(default)]
    pub oom_killed: bool,
    /// `RestartCount`: how often the engine restarted it under its restart policy after it
    /// exited on its own (a `docker stop` or `kill` is never restarted, nor counted).
    #[serde(default)]
    pub restart_count: u64,
}

impl ContainerDetail {
    /// The most characters kept of the engine's error or a probe's output.
    pub const MAX_TEXT: usize = 300;
}

/// One healthcheck probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// The probe command's exit code (0 healthy, 1 unhealthy; -1 when it could not run).
    pub exit_code: i64,
    /// Its output, trimmed and cut to [`ContainerDetail::MAX_TEXT`] characters.
    pub output: String,
}

#[derive(Debug, Default, Deserialize)]
struct ApiInspect {
    #[serde(rename = "State", default)]
    state: ApiState,
    #[serde(rename = "RestartCount", default)]
    restart_count: u64,
    #[serde(rename = "HostConfig", default)]
    host_config: ApiHostConfig,
}

#[derive(Debug, Default, Deserialize)]
struct ApiHostConfig {
    #[serde(rename = "RestartPolicy", default)]
    restart_policy: ApiRestartPolicy,
}

#[derive(Debug, Default, Deserialize)]
struct ApiRestartPolicy {
    #[serde(rename = "Name", default)]
    name: String,
}

/// The services another container of the project waits for with
/// `service_completed_successfully`, by compose's `com.docker.compose.depends_on` label
/// (`migrate:service_completed_successfully:false,db:service_healthy:false`).
fn completion_awaited(rows: &[ApiContainer]) -> std::collections::BTreeSet<String> {
    rows.iter()
        .filter_map(|r| r.label(DEPENDS_ON_LABEL))
        .flat_map(|deps| deps.split(','))
        .filter_map(|dep| {
            let mut parts = dep.split(':');
            let (service, condition) = (parts.next()?, parts.next()?);
            (condition == "service_completed_successfully").then(|| service.to_owned())
        })
        .collect()
}

#[derive(Debug, Default, Deserialize)]
struct ApiState {
    #[serde(rename = "Error", default)]
    error: Option<String>,
    #[serde(rename = "ExitCode", default)]
    exit_code: Option<i64>,
    #[serde(rename = "Status", default)]
    status: Option<String>,
    #[serde(rename = "Health", default)]
    health: Option<ApiHealth>,
    #[serde(rename = "OOMKilled", default)]
    oom_killed: bool,
}

#[derive(Debug, Default, Deserialize)]
struct ApiHealth {
    #[serde(rename = "Log", default)]
    log: Option<Vec<ApiProbe>>,
}

#[derive(Debug, Deserialize)]
struct ApiProbe {
    #[serde(rename = "ExitCode", default)]
    exit_code: i64,
    #[serde(rename = "Output", default)]
    output: String,
}

impl ApiInspect {
    fn into_detail(self) -> ContainerDetail {
        let cut = |t: &str| crate::error::tail_chars(&one_line(t), ContainerDetail::MAX_TEXT);
        let st = self.state;
        ContainerDetail {
            error: st.error.as_deref().map(cut).filter(|e| !e.is_empty()),
            // An exit code means something only once the container ran and stopped.
            exit_code: st.exit_code.filter(|_| {
                let (state, _) = docker_words(st.status.as_deref().unwrap_or(""), "", "");
                matches!(state.as_str(), "exited" | "dead")
            }),
            last_probe: st
                .health
                .and_then(|h| h.log)
                .and_then(|log| log.into_iter().last())
                .map(|p| Probe {
                    exit_code: p.exit_code,
                    output: cut(&p.output),
                }),
            oom_killed: st.oom_killed,
            restart_count: self.restart_count,
        }
    }
}

/// Lines joined with ` | `, blank ones dropped: a probe's or the engine's text on one line.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Bytes available to unprivileged users on the filesystem holding `path` (`statvfs`:
/// `f_bavail * f_frsize`). When `path` itself is missing (a data root on a not-yet-mounted
/// disk, a private mount namespace), its nearest existing ancestor is measured.
pub fn free_bytes(path: &Path) -> Result<u64> {
    let mut probe = path;
    loop {
        match rustix::fs::statvfs(probe) {
            Ok(st) => return Ok(st.f_bavail.saturating_mul(st.f_frsize)),
            Err(rustix::io::Errno::NOENT) => match probe.parent() {
                Some(parent) => probe = parent,
                None => break,
            },
            Err(e) => {
                return Err(Error::Statvfs {
                    path: path.to_owned(),
                    source: e.into(),
                });
            }
        }
    }
    Err(Error::Statvfs {
        path: path.to_owned(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_engines_record_of_a_container_reads_as_events() {
        let stream = concat!(
            r#"{"status":"start","id":"c1","Type":"container","Action":"start","Actor":{"ID":"c1","Attributes":{"name":"p-web-1"}},"time":100}"#,
            "\n",
            r#"{"Type":"container","Action":"kill","Actor":{"ID":"c1","Attributes":{"signal":"15"}},"time":160}"#,
            "\n",
            r#"{"Type":"container","Action":"die","Actor":{"ID":"c1","Attributes":{"exitCode":"0"}},"time":161}"#,
            "\n",
            r#"{"status":"kill","Actor":{"Attributes":{"signal":"SIGKILL"}},"time":170}"#,
        );
        let events: Vec<ContainerEvent> = serde_json::Deserializer::from_str(stream)
            .into_iter::<ApiEvent>()
            .map(|e| e.unwrap().into_event())
            .collect();
        let got: Vec<(&str, u64, Option<i32>, Option<i32>)> = events
            .iter()
            .map(|e| (e.action.as_str(), e.time, e.signal, e.exit_code))
            .collect();
        assert_eq!(
            got,
            [
                ("start", 100, None, None),
                ("kill", 160, Some(15), None),
                ("die", 161, None, Some(0)),
                ("kill", 170, Some(9), None),
            ]
        );
    }

    #[test]
    fn an_http_answer_is_read_by_length_by_chunks_or_to_its_end() {
        let by_length =
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nApi-Version: 1.47\r\n\r\n{}trailing";
        assert_eq!(
            super::parse_response(by_length),
            Some((200, b"{}".to_vec()))
        );
        let chunked =
            b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: Chunked\r\n\r\n3\r\n[1,\r\n2;x=y\r\n2]\r\n0\r\n\r\n";
        assert_eq!(
            super::parse_response(chunked),
            Some((404, b"[1,2]".to_vec()))
        );
        let to_end = b"HTTP/1.0 204 No Content\r\n\r\n";
        assert_eq!(super::parse_response(to_end), Some((204, Vec::new())));
        // Cut short, or no answer at all: nothing is made up.
        assert_eq!(
            super::parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}"),
            None
        );
        assert_eq!(
            super::parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"),
            None
        );
        assert_eq!(super::parse_response(b"garbage"), None);
    }

    /// The end of one answer on a connection that stays open: by length, after the last chunk
    /// and its empty line, right after the head without a body; never before all of it came.
    #[test]
    fn an_answer_on_an_open_connection_ends_where_its_framing_says() {
        let by_length = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1";
        assert_eq!(super::answer_end(by_length), Some(by_length.len() - 8));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert_eq!(super::answer_end(chunked), Some(chunked.len()));
        for cut in 0..chunked.len() {
            assert_eq!(super::answer_end(&chunked[..cut]), None, "{cut}");
        }
        assert_eq!(super::answer_end(&by_length[..by_length.len() - 9]), None);
        let empty = b"HTTP/1.1 204 No Content\r\nServer: Docker/28.3.0\r\n\r\n";
        assert_eq!(super::answer_end(empty), Some(empty.len()));
        // Ended by the connection: not whole until it closes.
        assert_eq!(super::answer_end(b"HTTP/1.1 200 OK\r\n\r\n{}"), None);
        assert!(super::closes(
            b"HTTP/1.1 200 OK\r\nconnection: Close\r\n\r\n"
        ));
        assert!(!super::closes(
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        ));
    }

    /// An engine that answers each connection's first request, keeps it open without a word,
    /// then closes it before the next: what an idle connection dockerd dropped looks like.
    fn forgetful_engine(
        dir: &std::path::Path,
    ) -> (PathBuf, std::sync::Arc<std::sync::Mutex<usize>>) {
        use std::io::BufRead;
        let socket = dir.join("docker.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let connections = std::sync::Arc::new(std::sync::Mutex::new(0));
        let counted = std::sync::Arc::clone(&connections);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                *counted.lock().unwrap() += 1;
                let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]");
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        (socket, connections)
    }

    #[test]
    fn a_get_on_a_connection_the_engine_closed_goes_again_on_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, connections) = forgetful_engine(dir.path());
        let engine = Engine::unix(&socket);
        for _ in 0..3 {
            let body = engine
                .call(Method::Get, "/containers/json", &[], None)
                .unwrap();
            assert_eq!(body, b"[]");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(*connections.lock().unwrap(), 3);
    }

    #[test]
    fn gets_share_one_connection_and_other_requests_close_theirs() {
        let fake = crate::testkit::FakeEngine::builder()
            .route("/containers/json", 200, "[]")
            .route("/_ping", 200, "OK")
            .start_in_temp_dir()
            .unwrap();
        let engine = fake.engine();
        for _ in 0..3 {
            engine
                .call(Method::Get, "/containers/json", &[], None)
                .unwrap();
        }
        assert_eq!(fake.connections(), 1, "{:?}", fake.requests());
        let _ = engine.call(Method::Post, "/_ping", &[], Some(&serde_json::json!({})));
        let _ = engine.call(Method::Post, "/_ping", &[], Some(&serde_json::json!({})));
        engine
            .call(Method::Get, "/containers/json", &[], None)
            .unwrap();
        assert_eq!(fake.connections(), 3, "{:?}", fake.requests());
        assert_eq!(fake.requests().len(), 6);
    }

    /// dockerd names its version on every answer; a header of another server, or in the body,
    /// names none.
    #[test]
    fn the_daemon_version_is_read_from_the_server_header() {
        let answer = b"HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nserver: Docker/20.10.24+dfsg1 (linux)\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(super::server_version(answer), Some("20.10.24+dfsg1"));
        for none in [
            &b"HTTP/1.1 200 OK\r\nServer: nginx/1.25\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nServer: Docker/\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 33\r\n\r\nServer: Docker/28.3.0 (linux)\r\n",
            b"HTTP/1.1 200 OK\r\nServer: Docker/28.3.0 (linux)",
        ] {
            assert_eq!(
                super::server_version(none),
                None,
                "{:?}",
                String::from_utf8_lossy(none)
            );
        }
    }

    use super::*;
    use crate::container::container;

    #[test]
    fn docker_host_values() {
        let check = |host: Option<&str>, socket: Option<&str>| {
            let e = Engine::for_docker_host(host);
            assert_eq!(e.socket(), socket.map(Path::new), "{host:?}");
        };
        check(None, Some(DEFAULT_SOCKET));
        check(Some(""), Some(DEFAULT_SOCKET));
        check(
            Some("unix:///run/user/1000/docker.sock"),
            Some("/run/user/1000/docker.sock"),
        );
        check(Some("tcp://10.0.0.1:2376"), None);
        check(Some("ssh://me@box"), None);
        check(Some("unix://relative.sock"), None);
    }

    #[test]
    fn a_non_unix_host_is_unavailable_not_an_attempt() {
        let err = Engine::for_docker_host(Some("tcp://10.0.0.1:2376"))
            .containers("p")
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::EngineUnavailable);
        assert!(err.to_string().contains("tcp://10.0.0.1:2376"), "{err}");
    }

    #[test]
    fn api_rows_become_containers() {
        let rows: Vec<ApiContainer> = serde_json::from_str(
            r#"[{"Names":["/p-web-1"],"State":"running","Status":"Up 2 minutes (healthy)",
                 "Labels":{"com.docker.compose.service":"web","com.docker.compose.oneoff":"False"}},
                {"Names":["/p-web-run-1"],"State":"running","Status":"Up 1 second",
                 "Labels":{"com.docker.compose.service":"web","com.docker.compose.oneoff":"True"}},
                {"Names":["/other/db","/p-db-1"],"Status":"Exited (0) 1 minute ago","Labels":null}]"#,
        )
        .unwrap();
        assert_eq!(
            crate::container::project_containers(rows),
            vec![
                container("p-db-1", "", "exited", None),
                container("p-web-1", "web", "running", Some("healthy")),
            ]
        );
    }

    #[test]
    fn exit_codes_from_status_texts() {
        let check = |status: &str, code: Option<i32>| {
            assert_eq!(exit_code_from_status(status), code, "{status:?}");
        };
        check("Exited (0) 3 minutes ago", Some(0));
        check("Exited (137) 2 seconds ago", Some(137));
        check("Exited (-1) now", Some(-1));
        check("Up 2 minutes (healthy)", None);
        check("Restarting (1) 5 seconds ago", None);
        check("Exited (x) now", None);
        check("Exited (", None);
        check("", None);
    }

    #[test]
    fn api_rows_carry_their_hash_image_and_exit_code() {
        let rows: Vec<ApiContainer> = serde_json::from_str(
            r#"[{"Id":"c1","ImageID":"sha256:aa","Names":["/p-web-1"],"State":"exited",
                 "Status":"Exited (137) 1 second ago",
                 "Labels":{"com.docker.compose.service":"web","com.docker.compose.config-hash":"h1"}},
                {"Id":"c2","Names":["/p-x-1"],"State":"running","Status":"Up 1 second","Labels":{}}]"#,
        )
        .unwrap();
        let facts: Vec<ContainerFacts> = rows.into_iter().map(ApiContainer::into_facts).collect();
        assert_eq!(facts[0].id, "c1");
        assert_eq!(facts[0].config_hash.as_deref(), Some("h1"));
        assert_eq!(facts[0].image_id.as_deref(), Some("sha256:aa"));
        assert_eq!(facts[0].exit_code, Some(137));
        assert_eq!(
            facts[0].container,
            container("p-web-1", "web", "exited", None)
        );
        assert_eq!(
            (
                facts[1].config_hash.as_deref(),
                facts[1].image_id.as_deref(),
                facts[1].exit_code
            ),
            (None, None, None)
        );
    }

    #[test]
    fn inspect_answers_become_details() {
        let detail = |json: &str| {
            serde_json::from_str::<ApiInspect>(json)
                .unwrap()
                .into_detail()
        };
        // A port taken on the host: created, never started, the engine says why.
        let d = detail(
            r#"{"State":{"Status":"created","ExitCode":128,"Error":"driver failed programming external connectivity on endpoint p-web-1: Bind for 0.0.0.0:8080 failed: port is already allocated"}}"#,
        );
        assert!(d.error.unwrap().ends_with("port is already allocated"));
        assert_eq!(d.exit_code, None);
        assert_eq!(d.last_probe, None);
        // A failing healthcheck: the last probe's output, on one line.
        let d = detail(
            r#"{"State":{"Status":"running","ExitCode":0,"Error":"","Health":{"Status":"unhealthy","Log":[
                {"ExitCode":1,"Output":"first"},
                {"ExitCode":1,"Output":"curl: (7) Failed to connect\nto localhost port 80\n"}]}}}"#,
        );
        assert_eq!(d.error, None);
        assert_eq!(
            d.last_probe,
            Some(Probe {
                exit_code: 1,
                output: "curl: (7) Failed to connect | to localhost port 80".into()
            })
        );
        // An exited app: its exit code; a huge output is cut.
        let long = "x".repeat(5000);
        let d = detail(&format!(
            r#"{{"State":{{"Status":"exited","ExitCode":3,"Health":{{"Log":[{{"ExitCode":1,"Output":"{long}"}}]}}}}}}"#
        ));
        assert_eq!(d.exit_code, Some(3));
        assert!(d.last_probe.unwrap().output.len() <= ContainerDetail::MAX_TEXT + 3);
        // Nothing known: nothing said.
        assert_eq!(detail("{}"), ContainerDetail::default());
    }

    #[test]
    fn inspect_refuses_a_name_that_is_a_path() {
        let e = Engine::unix("/nonexistent.sock");
        assert_eq!(
            e.inspect("../info").unwrap_err().kind(),
            crate::ErrorKind::Protocol
        );
    }

    #[test]
    fn free_bytes_of_a_missing_path_measures_its_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let here = free_bytes(dir.path()).unwrap();
        let below = free_bytes(&dir.path().join("not/yet/there")).unwrap();
        assert!(here > 0);
        // same filesystem; other tests may write meanwhile, so allow some drift
        assert!(
            here.abs_diff(below) < 512 * 1024 * 1024,
            "{here} vs {below}"
        );
    }
}
