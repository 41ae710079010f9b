//! A loopback fake of the two forges `cargo xtask release` publishes to: GitLab's generic package
//! registry and releases API, and Gitea's releases and release assets API. It records every
//! request, keeps what was uploaded and serves it back at the URLs `install.sh` downloads from
//! (`--source gitlab`, with the kit's `DEPLOY-TOKEN`; `--source gitea`, without a token), so the
//! release's tests and the packaging step can publish and then install from what was published.
//!
//! std only, HTTP/1.1 with `Connection: close`, bound to 127.0.0.1. The first answers can be
//! scripted (a 503, a 403 with a message) to exercise the release's retries and refusals.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

/// The GitLab project id the fake answers for.
pub const PROJECT_ID: &str = "69";
/// The Gitea repository (`owner/name`) the fake answers for.
pub const GITEA_REPO: &str = "mdella/monky-deployd";

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `PUT`, `POST`, `GET`.
    pub method: String,
    /// The path with its query, as sent.
    pub path: String,
    /// Header names in lower case.
    pub headers: BTreeMap<String, String>,
    /// The body, as received.
    pub body: Vec<u8>,
}

impl Received {
    /// A header's value, by its lower-case name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// The tokens the fake accepts.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// `JOB-TOKEN` (or `PRIVATE-TOKEN`) for uploads and the GitLab release.
    pub job: String,
    /// `DEPLOY-TOKEN` for downloads from the generic package registry.
    pub deploy: String,
    /// `Authorization: token …` for Gitea.
    pub gitea: String,
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    /// What a GET of a path returns: uploads to both forges, by their download path.
    files: BTreeMap<String, Vec<u8>>,
    /// The GitLab releases created, their JSON bodies by tag.
    gitlab_releases: BTreeMap<String, serde_json::Value>,
    /// The Gitea releases created: id -> tag.
    gitea_releases: BTreeMap<u64, String>,
    /// Scripted answers for the next requests: status and `message`.
    script: VecDeque<(u16, String)>,
}

/// The running fake; stops when dropped.
pub struct Forge {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Forge {
    /// Starts the fake on 127.0.0.1 with an ephemeral port.
    pub fn start(tokens: Tokens) -> Result<Self> {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("cannot bind 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            // One connection at a time: curl sends one request per connection.
                            let _ = serve(stream, &state, &tokens);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(_) => break,
                    }
                }
            })
        };
        Ok(Self {
            addr,
            state,
            stop,
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What GitLab CI sets as `CI_API_V4_URL`.
    pub fn api_v4_url(&self) -> String {
        format!("{}/api/v4", self.url())
    }

    /// The generic package registry's base for the package, which install.sh's
    /// `MONKY_DEPLOYD_GITLAB_URL` names (the version and file are appended).
    pub fn generic_base(&self) -> String {
        format!(
            "{}/projects/{PROJECT_ID}/packages/generic/monky-deployd",
            self.api_v4_url()
        )
    }

    /// The Gitea release downloads' base, which install.sh's `MONKY_DEPLOYD_GITEA_URL` names.
    pub fn gitea_download_base(&self) -> String {
        format!("{}/{GITEA_REPO}/releases/download", self.url())
    }

    /// Every request received so far.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// What a GET of `path` would serve.
    pub fn file(&self, path: &str) -> Option<Vec<u8>> {
        self.lock().files.get(path).cloned()
    }

    /// The GitLab release of `tag`, as its creation request carried it.
    pub fn gitlab_release(&self, tag: &str) -> Option<serde_json::Value> {
        self.lock().gitlab_releases.get(tag).cloned()
    }

    /// The tags of the Gitea releases created.
    #[cfg(test)]
    pub fn gitea_release_tags(&self) -> Vec<String> {
        self.lock().gitea_releases.values().cloned().collect()
    }

    #[cfg(test)]
    /// Answers the next request with `status` and a GitLab-style `{"message": …}`.
    pub fn answer_next(&self, status: u16, message: &str) {
        self.lock().script.push_back((status, message.to_string()));
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Forge {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>, tokens: &Tokens) -> Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim_end().is_empty() {
            break;
        }
        if let Some((k, v)) = h.trim_end().split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let mut out = stream;
    if headers
        .get("expect")
        .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"))
    {
        out.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    let request = Received {
        method,
        path,
        headers,
        body,
    };
    let (status, answer) = {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        st.received.push(request.clone());
        match st.script.pop_front() {
            Some((status, message)) => (
                status,
                serde_json::json!({ "message": message })
                    .to_string()
                    .into_bytes(),
            ),
            None => route(&mut st, &request, tokens),
        }
    };
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\nContent-Type: {}\r\nConnection: close\r\n\r\n",
        if status < 400 { "OK" } else { "Error" },
        answer.len(),
        if request.method == "GET" && status == 200 {
            "application/octet-stream"
        } else {
            "application/json"
        }
    );
    out.write_all(head.as_bytes())?;
    out.write_all(&answer)?;
    Ok(())
}

fn message(status: u16, text: &str) -> (u16, Vec<u8>) {
    (
        status,
        serde_json::json!({ "message": text })
            .to_string()
            .into_bytes(),
    )
}

/// The API's answer to `r`.
fn route(st: &mut State, r: &Received, tokens: &Tokens) -> (u16, Vec<u8>) {
    let generic = format!("/api/v4/projects/{PROJECT_ID}/packages/generic/monky-deployd/");
    let gitlab_releases = format!("/api/v4/projects/{PROJECT_ID}/releases");
    let gitea_releases = format!("/api/v1/repos/{GITEA_REPO}/releases");
    let job_ok = r.header("job-token") == Some(tokens.job.as_str())
        || r.header("private-token") == Some(tokens.job.as_str());
    let gitea_ok = r.header("authorization") == Some(format!("token {}", tokens.gitea).as_str());
    match r.method.as_str() {
        "PUT" if r.path.starts_with(&generic) => {
            if !job_ok {
                return message(401, "401 Unauthorized");
            }
            // <version>/<file>, nothing more, nothing less.
            let rest = &r.path[generic.len()..];
            let segments: Vec<&str> = rest.split('/').collect();
            if segments.len() != 2 || segments.iter().any(|s| s.is_empty()) {
                return message(400, "400 Bad request - path is invalid");
            }
            st.files.insert(r.path.clone(), r.body.clone());
            (201, br#"{"message":"201 Created"}"#.to_vec())
        }
        "GET" if r.path.starts_with(&generic) => {
            if r.header("deploy-token") != Some(tokens.deploy.as_str()) {
                return message(401, "401 Unauthorized");
            }
            match st.files.get(&r.path) {
                Some(bytes) => (200, bytes.clone()),
                None => message(404, "404 Not Found"),
            }
        }
        "POST" if r.path == gitlab_releases => {
            if !job_ok {
                return message(401, "401 Unauthorized");
            }
            let Ok(json) = serde_json::from_slice::<serde_json::Value>(&r.body) else {
                return message(400, "400 Bad request - body is not JSON");
            };
            let Some(tag) = json["tag_name"].as_str().map(str::to_string) else {
                return message(400, "tag_name is missing");
            };
            if st.gitlab_releases.contains_key(&tag) {
                return message(409, "Release already exists");
            }
            st.gitlab_releases.insert(tag.clone(), json);
            (
                201,
                serde_json::json!({ "tag_name": tag })
                    .to_string()
                    .into_bytes(),
            )
        }
        "POST" if r.path == gitea_releases => {
            if !gitea_ok {
                return message(401, "token is required");
            }
            let Ok(json) = serde_json::from_slice::<serde_json::Value>(&r.body) else {
                return message(422, "body is not JSON");
            };
            let Some(tag) = json["tag_name"].as_str().map(str::to_string) else {
                return message(422, "tag_name is missing");
            };
            if st.gitea_releases.values().any(|t| *t == tag) {
                return message(409, "release tag already exist");
            }
            let id = st.gitea_releases.len() as u64 + 1;
            st.gitea_releases.insert(id, tag.clone());
            (
                201,
                serde_json::json!({ "id": id, "tag_name": tag })
                    .to_string()
                    .into_bytes(),
            )
        }
        "POST" if r.path.starts_with(&format!("{gitea_releases}/")) => {
            if !gitea_ok {
                return message(401, "token is required");
            }
            // <id>/assets?name=<file>
            let rest = &r.path[gitea_releases.len() + 1..];
            let Some((id, query)) = rest.split_once("/assets?name=") else {
                return message(404, "not found");
            };
            let Some(tag) = id
                .parse()
                .ok()
                .and_then(|id: u64| st.gitea_releases.get(&id))
            else {
                return message(404, "release not found");
            };
            let Some(content) = multipart_attachment(r) else {
                return message(400, "no attachment");
            };
            let path = format!("/{GITEA_REPO}/releases/download/{tag}/{query}");
            st.files.insert(path, content);
            (
                201,
                serde_json::json!({ "name": query })
                    .to_string()
                    .into_bytes(),
            )
        }
        "GET"
            if r.path
                .starts_with(&format!("/{GITEA_REPO}/releases/download/")) =>
        {
            match st.files.get(&r.path) {
                Some(bytes) => (200, bytes.clone()),
                None => message(404, "not found"),
            }
        }
        _ => message(404, "404 Not Found"),
    }
}

/// The content of the multipart form field `attachment`.
fn multipart_attachment(r: &Received) -> Option<Vec<u8>> {
    let boundary = r
        .header("content-type")?
        .split(';')
        .find_map(|p| p.trim().strip_prefix("boundary="))?
        .trim_matches('"')
        .to_string();
    let body = &r.body;
    let start = find(body, b"name=\"attachment\"")?;
    let content_start = start + find(&body[start..], b"\r\n\r\n")? + 4;
    let end_marker = format!("\r\n--{boundary}");
    let len = find(&body[content_start..], end_marker.as_bytes())?;
    Some(body[content_start..content_start + len].to_vec())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
