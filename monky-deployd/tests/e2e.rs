//! The end-to-end suite: the real agent binary against the testkit tenancy, a real OpenBao set
//! up as production (`RealBao`), the real docker CLI and engine, and the authenticated loopback
//! registry `cargo xtask setup` starts.
//!
//! Every test reads the env file setup writes (`MONKY_E2E_ENV`, else
//! `$MONKY_CI_RUN_DIR/e2e.env`, else `target/ci-run/e2e.env`). Without it every test fails and
//! says to run `cargo xtask setup`; only `MONKY_E2E=skip` skips them, and says so. Each test owns
//! a compose project named with `MONKY_E2E_NAME_PREFIX`, which a drop guard takes down with its
//! volumes, pass or fail.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{OnceLock, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use monky_agent_proto::ReportResult;
use monky_testkit::bao::{BaoPeer, RealBao};
use monky_testkit::tenancy::{Desired, Endpoint, Rate, RateLimits};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

use crate::util::*;

mod registry;
mod runtime;

/// The secret values the e2e bundles read; `/env.txt` must show them, reports never.
const DEMO_KEY: &str = "demo-Api-Key-e2e-0101";
const ADMIN_TOKEN: &str = "see-Admin-Token-e2e-0202";

// ---- the environment setup made --------------------------------------------------------------

/// What `cargo xtask setup` recorded for this run.
struct E2e {
    file: PathBuf,
    docker: PathBuf,
    compose: PathBuf,
    prefix: String,
    registry: String,
    user: String,
    password: String,
    image_1: String,
    image_2: String,
    image_bad: String,
    image_missing: String,
    web_port: u16,
}

impl E2e {
    fn load() -> Result<E2e, String> {
        // The same lookup as xtask's: MONKY_E2E_ENV, else the run dir's e2e.env.
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let file = var("MONKY_E2E_ENV")
            .or_else(|| var("MONKY_CI_RUN_DIR").map(|d| d.join("e2e.env")))
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/ci-run/e2e.env")
            });
        let text = std::fs::read_to_string(&file).map_err(|e| {
            format!(
                "the end-to-end env file {} cannot be read ({e}): run `cargo xtask setup` first \
                 (or set MONKY_E2E=skip to skip the real-engine tests on purpose)",
                file.display()
            )
        })?;
        let vars: BTreeMap<&str, &str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .collect();
        let get = |key: &str| {
            vars.get(key).map(|v| (*v).to_string()).ok_or_else(|| {
                format!(
                    "{} has no {key}: run `cargo xtask setup` again",
                    file.display()
                )
            })
        };
        let e2e = E2e {
            docker: get("MONKY_E2E_DOCKER")?.into(),
            compose: get("MONKY_E2E_COMPOSE")?.into(),
            prefix: get("MONKY_E2E_NAME_PREFIX")?,
            registry: get("MONKY_E2E_REGISTRY")?,
            user: get("MONKY_E2E_REGISTRY_USER")?,
            password: get("MONKY_E2E_REGISTRY_PASSWORD")?,
            image_1: get("MONKY_E2E_IMAGE_WEB_1")?,
            image_2: get("MONKY_E2E_IMAGE_WEB_2")?,
            image_bad: get("MONKY_E2E_IMAGE_WEB_BAD")?,
            image_missing: get("MONKY_E2E_IMAGE_WEB_MISSING")?,
            web_port: get("MONKY_E2E_WEB_PORT")?
                .parse()
                .map_err(|e| format!("MONKY_E2E_WEB_PORT: {e}"))?,
            file,
        };
        // A stale env file (the registry stopped by a teardown) would otherwise surface as
        // puzzling pull failures in every scenario.
        let addr: SocketAddr = e2e
            .registry
            .parse()
            .map_err(|e| format!("MONKY_E2E_REGISTRY {:?}: {e}", e2e.registry))?;
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| {
            format!(
                "the registry {addr} named in {} does not answer ({e}): run `cargo xtask setup`",
                e2e.file.display()
            )
        })?;
        Ok(e2e)
    }
}

/// The suite's environment, or `None` when `MONKY_E2E=skip` asks to skip; anything else
/// missing fails the test.
fn e2e() -> Option<&'static E2e> {
    static E2E: OnceLock<Result<E2e, String>> = OnceLock::new();
    if std::env::var("MONKY_E2E").as_deref() == Ok("skip") {
        assert!(
            std::env::var("MONKY_E2E_REQUIRED").as_deref() != Ok("1"),
            "MONKY_E2E=skip contradicts MONKY_E2E_REQUIRED=1"
        );
        eprintln!("end-to-end test skipped: MONKY_E2E=skip");
        return None;
    }
    match E2E.get_or_init(E2e::load) {
        Ok(e) => Some(e),
        Err(msg) => panic!("{msg}"),
    }
}

/// The real docker CLI (with compose v2) of the setup, for suites that need real compose but no
/// engine; `None` only when `MONKY_E2E=skip` asks to skip.
pub fn real_docker_cli() -> Option<PathBuf> {
    e2e().map(|e| e.docker.clone())
}

// ---- docker, from the test's side -------------------------------------------------------------

/// A container of a project as the engine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    name: String,
    id: String,
    started_at: String,
    state: String,
    health: String,
}

/// One compose project on the real engine. Dropping it removes its containers, networks and
/// volumes, also when the test failed.
struct Project {
    name: String,
    docker: PathBuf,
    /// An empty DOCKER_CONFIG and working directory for the test's own docker calls.
    scratch: tempfile::TempDir,
    /// Held while the project exists, so the daemon is not restarted under it; `None` in the
    /// one test that restarts the daemon and holds the engine alone.
    _engine: Option<RwLockReadGuard<'static, ()>>,
}

/// The docker daemon as the real-engine tests share it: each project holds the read side, the
/// test that restarts the daemon the write side (see `restart_dockerd`).
static ENGINE: RwLock<()> = RwLock::new(());

thread_local! {
    /// Set on the thread that holds `ENGINE` for writing: its own project takes no read lock.
    static ENGINE_ALONE: Cell<bool> = const { Cell::new(false) };
}

impl Project {
    fn new(e2e: &E2e, short: &str) -> Self {
        let p = Project {
            // The pid keeps two runs of the suite with the same setup apart.
            name: format!("{}{}-{short}", e2e.prefix, std::process::id()),
            docker: e2e.docker.clone(),
            scratch: tempfile::tempdir().unwrap(),
            // A test that panicked with the write side held leaves the lock poisoned; the
            // daemon it restarted is still the one to share.
            _engine: (!ENGINE_ALONE.get()).then(|| {
                ENGINE
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            }),
        };
        p.clean();
        p
    }

    fn docker<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        Command::new(&self.docker)
            .args(args)
            .current_dir(self.scratch.path())
            .env("DOCKER_CONFIG", self.scratch.path())
            .output()
            .expect("run the docker CLI")
    }

    #[track_caller]
    fn docker_ok<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let out = self.docker(args);
        assert!(
            out.status.success(),
            "docker failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn label(&self) -> String {
        format!("label=com.docker.compose.project={}", self.name)
    }

    /// The ids of the project's containers, volumes or networks; `None` when docker failed.
    fn try_ids(&self, kind: &str) -> Option<Vec<String>> {
        let args: Vec<String> = match kind {
            "container" => vec!["ps".into(), "-aq".into(), "--no-trunc".into()],
            _ => vec![kind.into(), "ls".into(), "-q".into()],
        };
        let out = self.docker(
            args.iter()
                .map(String::as_str)
                .chain(["--filter", &self.label()]),
        );
        out.status.success().then(|| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
    }

    /// Like `try_ids`, but a docker failure fails the test instead of looking like "none".
    #[track_caller]
    fn ids(&self, kind: &str) -> Vec<String> {
        self.try_ids(kind)
            .unwrap_or_else(|| panic!("cannot list the {kind}s of {}", self.name))
    }

    /// The project's containers, from `docker inspect`.
    fn containers(&self) -> Vec<Seen> {
        let ids = self.ids("container");
        if ids.is_empty() {
            return Vec::new();
        }
        // `.State.Health` is absent, not empty, for a container without a healthcheck, and a
        // template that names an absent key fails: the state comes whole, as JSON.
        let format = "{{.Name}}|{{.Id}}|{{.State.StartedAt}}|{{.State.Status}}|{{json .State}}";
        let text = self.docker_ok(
            ["inspect", "--format", format]
                .into_iter()
                .chain(ids.iter().map(String::as_str)),
        );
        let mut seen: Vec<Seen> = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.splitn(5, '|').collect();
                let state: Value = serde_json::from_str(f.get(4)?).ok()?;
                (f.len() == 5).then(|| Seen {
                    name: f[0].trim_start_matches('/').to_string(),
                    id: f[1].to_string(),
                    started_at: f[2].to_string(),
                    state: f[3].to_string(),
                    health: state["Health"]["Status"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                })
            })
            .collect();
        seen.sort_by(|a, b| a.name.cmp(&b.name));
        seen
    }

    /// The project's named volumes (`docker volume ls`).
    fn volumes(&self) -> Vec<String> {
        self.docker_ok([
            "volume",
            "ls",
            "--format",
            "{{.Name}}",
            "--filter",
            &self.label(),
        ])
        .lines()
        .map(str::to_string)
        .collect()
    }

    /// `compose down -v`, then whatever a retire without `-v` left behind.
    fn clean(&self) {
        let _ = self.docker([
            "compose",
            "-p",
            &self.name,
            "down",
            "-v",
            "--remove-orphans",
            "-t",
            "1",
        ]);
        let containers = self.try_ids("container").unwrap_or_default();
        if !containers.is_empty() {
            let _ = self.docker(
                ["rm", "-f", "-v"]
                    .into_iter()
                    .chain(containers.iter().map(String::as_str)),
            );
        }
        for kind in ["volume", "network"] {
            let ids = self.try_ids(kind).unwrap_or_default();
            if !ids.is_empty() {
                let _ = self.docker(
                    [kind, "rm"]
                        .into_iter()
                        .chain(ids.iter().map(String::as_str)),
                );
            }
        }
        // Images a test made under the project's name (a container committed by hand): left
        // behind, they are children of the suite's images, and teardown could not remove those.
        let images = self.docker([
            "images",
            "-q",
            "--filter",
            &format!("reference={}*", self.name),
        ]);
        let images: Vec<String> = String::from_utf8_lossy(&images.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if !images.is_empty() {
            let _ = self.docker(
                ["rmi", "-f"]
                    .into_iter()
                    .chain(images.iter().map(String::as_str)),
            );
        }
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        self.clean();
        let left: Vec<String> = ["container", "volume", "network"]
            .iter()
            .flat_map(|k| self.try_ids(k).unwrap_or_default())
            .collect();
        if !left.is_empty() && !std::thread::panicking() {
            panic!("project {} left docker objects behind: {left:?}", self.name);
        }
    }
}

// ---- http --------------------------------------------------------------------------------------

/// One HTTP/1.0 GET on 127.0.0.1: status and body.
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)?;
    Ok((status, body.to_string()))
}

/// The body of a 200 answer, retried for a few seconds while the published port settles.
#[track_caller]
fn get_200(port: u16, path: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let last = match http_get(port, path) {
            Ok((200, body)) => return body,
            other => format!("{other:?}"),
        };
        assert!(
            Instant::now() < deadline,
            "GET 127.0.0.1:{port}{path}: {last}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---- bundles -----------------------------------------------------------------------------------

/// The web service's compose file: `image`, optionally published on 127.0.0.1:`port`, with a
/// named volume, plus `service` lines (four-space indented) and extra `volumes` entries.
fn compose_yaml(
    e2e: &E2e,
    image: &str,
    port: Option<u16>,
    service: &str,
    volumes: &[&str],
) -> String {
    let mut y = format!("services:\n  web:\n    image: {image}\n    env_file: .env\n");
    if let Some(port) = port {
        y.push_str(&format!(
            "    ports:\n      - \"127.0.0.1:{port}:{}\"\n",
            e2e.web_port
        ));
    }
    y.push_str("    volumes:\n      - data:/data\n");
    for v in volumes {
        y.push_str(&format!("      - \"{v}\"\n"));
    }
    y.push_str(service);
    y.push_str("volumes:\n  data: {}\n");
    y
}

/// A bundle of the web image reading two secrets whose names `/env.txt` lists, and the
/// registry credential as the manifest's `use: registry-auth` entry.
fn web_bundle(compose: String) -> TestBundle {
    TestBundle {
        compose,
        env_template: "# rendered by monky-deploy; the agent substitutes every ${VAR}\n\
                       DEMO_API_KEY=${DEMO_API_KEY}\nSEE_ADMIN_TOKEN=${SEE_ADMIN_TOKEN}\n\
                       LOG_LEVEL=${LOG_LEVEL:-info}\n"
            .into(),
        manifest: json!({"vault_mode": "openbao", "entries": [
            {"var": "DEMO_API_KEY", "path": format!("monky/{ENV}/see/demo_api_key"), "kind": "supplied", "version": 1},
            {"var": "SEE_ADMIN_TOKEN", "path": format!("monky/data/{ENV}/see/admin_token"), "kind": "generated", "version": null},
        ]}),
        meta: json!({"env_id": ENV, "tier": "qa", "site": "cbs", "renderer": "compose"}),
    }
    .with_registry_auth()
}

/// A world on the real engine for `project`, with the e2e bundles' secrets seeded in a real
/// OpenBao set up as production; `None` only when `MONKY_REALBAO=skip` outside CI.
fn real_world(e2e: &E2e, project: &Project, healthy_timeout_s: u64) -> Option<World<RealBao>> {
    let real = RealDocker {
        docker_bin: e2e.docker.clone(),
        compose_project: project.name.clone(),
        registry: e2e.registry.clone(),
        registry_user: e2e.user.clone(),
        registry_password: e2e.password.clone(),
        healthy_timeout_s,
    };
    let w = World::real_bao_with(Some(real), |b| b)?;
    w.bao.put_secret(ENV, "demo_api_key", DEMO_KEY);
    w.bao.put_secret(ENV, "admin_token", "an-older-admin-token");
    w.bao.put_secret(ENV, "admin_token", ADMIN_TOKEN);
    Some(w)
}

// ---- one box -----------------------------------------------------------------------------------

/// One box for one test: an agent world on the real engine, its project and its port.
struct E2eBox {
    e2e: &'static E2e,
    w: World<RealBao>,
    port: u16,
    // Dropped last: the project is taken down after the world's peers stopped.
    project: Project,
}

impl E2eBox {
    fn new(short: &str) -> Option<Self> {
        Self::with_timeout(short, 30)
    }

    fn with_timeout(short: &str, healthy_timeout_s: u64) -> Option<Self> {
        let e2e = e2e()?;
        let project = Project::new(e2e, short);
        let w = real_world(e2e, &project, healthy_timeout_s)?;
        Some(E2eBox {
            e2e,
            w,
            port: free_port(),
            project,
        })
    }

    /// The default bundle of `image`, published on this box's port.
    fn bundle(&self, image: &str) -> TestBundle {
        web_bundle(compose_yaml(self.e2e, image, Some(self.port), "", &[]))
    }

    /// Bootstraps and applies `b`; asserts it applied and returns its sha.
    #[track_caller]
    fn first_apply(&self, b: &TestBundle) -> String {
        self.w.stage_grant();
        let sha = self.w.publish(b);
        self.w.tick().ok();
        assert_report(&self.w.last_report(), ReportResult::Applied, None);
        sha
    }

    fn current(&self) -> Option<PathBuf> {
        self.w.current_target()
    }
}

fn release(sha: &str) -> PathBuf {
    Path::new("releases").join(sha)
}

#[track_caller]
fn assert_healthy(seen: &[Seen], project: &str) {
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].name, format!("{project}-web-1"));
    assert_eq!(
        (seen[0].state.as_str(), seen[0].health.as_str()),
        ("running", "healthy"),
        "{seen:?}"
    );
}

#[track_caller]
fn assert_reported_healthy(r: &monky_agent_proto::ReportRequest, project: &str) {
    let got: Vec<(String, String, Option<String>)> = r
        .containers
        .iter()
        .map(|c| (c.name.clone(), c.state.clone(), c.health.clone()))
        .collect();
    assert_eq!(
        got,
        [(
            format!("{project}-web-1"),
            "running".to_string(),
            Some("healthy".to_string())
        )]
    );
}

/// Asserts no secret value is in the report, the agent's output or state.json.
#[track_caller]
fn assert_no_secret(b: &E2eBox, run: &Run) {
    let state = std::fs::read_to_string(b.w.state_dir().join("state.json")).unwrap_or_default();
    let reports = format!("{:?}", b.w.reports());
    for v in [DEMO_KEY, ADMIN_TOKEN, b.e2e.password.as_str()] {
        assert!(
            !reports.contains(v),
            "a secret value in a report: {reports}"
        );
        assert!(!run.stderr().contains(v), "a secret value on stderr");
        assert!(!state.contains(v), "a secret value in state.json");
    }
}

// ---- 1. first apply ---------------------------------------------------------------------------

#[test]
fn first_apply_pulls_with_the_agents_own_docker_config() {
    let Some(b) = E2eBox::new("first-apply") else {
        return;
    };
    // Nobody's `docker login` may be what makes the pull work: not the invoking user's
    // ~/.docker (checked here), not the agent's HOME (empty).
    if let Some(home) = std::env::var_os("HOME") {
        let cfg = Path::new(&home).join(".docker/config.json");
        let text = std::fs::read_to_string(&cfg).unwrap_or_default();
        assert!(
            !text.contains(&b.e2e.registry),
            "{} holds a credential for {}: this test could not tell whose credential the pull \
             used; remove it (`docker logout {}`)",
            cfg.display(),
            b.e2e.registry,
            b.e2e.registry
        );
    }
    b.w.stage_grant();
    let sha = b.w.publish(&b.bundle(&b.e2e.image_1));
    let run = b.w.tick();
    run.ok();

    // The credential came from the manifest into the agent's docker dir, nowhere else; its
    // registry is on loopback, so config.json held it for the pull alone.
    assert!(!b.w.state_dir().join("docker/config.json").exists());
    let cfg: Value = serde_json::from_slice(
        &std::fs::read(b.w.state_dir().join("docker/credential.json")).unwrap(),
    )
    .unwrap();
    assert!(cfg["auths"][&b.e2e.registry]["auth"].is_string(), "{cfg}");
    assert!(!b.w.home().join(".docker").exists());

    // Healthy on the engine, the page answers, the secrets reached the container via .env.
    assert_healthy(&b.project.containers(), &b.project.name);
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");
    assert!(get_200(b.port, "/").contains('1'));
    assert_eq!(
        get_200(b.port, "/env.txt"),
        format!("DEMO_API_KEY={DEMO_KEY}\nSEE_ADMIN_TOKEN={ADMIN_TOKEN}\n")
    );

    let r = b.w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert_reported_healthy(&r, &b.project.name);
    assert!(
        r.log_tail.contains(&format!(
            "registry credential in place for {}",
            b.e2e.registry
        )),
        "{}",
        r.log_tail
    );
    assert_eq!(b.current(), Some(release(&sha)));
    assert_eq!(b.w.state()["applied_sha"], json!(sha));
    assert_no_secret(&b, &run);
}

// ---- 2. heartbeat -----------------------------------------------------------------------------

#[test]
fn heartbeat_reports_real_health_and_touches_nothing() {
    let Some(b) = E2eBox::new("heartbeat") else {
        return;
    };
    let sha = b.first_apply(&b.bundle(&b.e2e.image_1));
    let before = b.project.containers();
    assert_healthy(&before, &b.project.name);
    let n = b.w.requests().len();

    b.w.tick().ok();
    let new: Vec<Option<Endpoint>> = b.w.requests()[n..].iter().map(|r| r.endpoint).collect();
    assert_eq!(new, [Some(Endpoint::Checkin), Some(Endpoint::Report)]);
    let r = b.w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert_reported_healthy(&r, &b.project.name);
    assert!(!r.log_tail.contains("compose pull"), "{}", r.log_tail);
    // Same containers, never restarted: no pull/up happened.
    assert_eq!(b.project.containers(), before);
}

// ---- 3. new bundle ----------------------------------------------------------------------------

#[test]
fn a_new_bundle_recreates_the_containers_and_keeps_the_old_release() {
    let Some(b) = E2eBox::new("new-bundle") else {
        return;
    };
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    let before = b.project.containers();

    let second = b.w.publish(&b.bundle(&b.e2e.image_2));
    b.w.tick().ok();
    let after = b.project.containers();
    assert_healthy(&after, &b.project.name);
    assert_ne!(after[0].id, before[0].id, "the container was not recreated");
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "2");
    assert!(b.w.env_dir().join(release(&first)).join(".env").is_file());
    assert_eq!(b.current(), Some(release(&second)));
    let r = b.w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(second.as_str()));
}

// ---- 4. unhealthy -----------------------------------------------------------------------------

#[test]
fn an_unhealthy_bundle_fails_with_the_redacted_compose_logs() {
    let Some(b) = E2eBox::with_timeout("unhealthy", 20) else {
        return;
    };
    // The container prints a secret it got through .env; the report must carry *** instead.
    // (It reads the value from its environment: naming the variable for its shell to expand
    // is refused before start, SECRET_ON_COMMAND_LINE.)
    let service = "    entrypoint: [\"/bin/sh\", \"-c\", \"env | sed -n s/^SEE_ADMIN_TOKEN=/leak=/p; exec /bin/sh /app/entrypoint.sh\"]\n";
    let bundle = web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_bad,
        Some(b.port),
        service,
        &[],
    ));
    b.w.stage_grant();
    let sha = b.w.publish(&bundle);
    let run = b.w.tick();
    run.expect(1);

    let r = b.w.last_report();
    assert_report(&r, ReportResult::Failed, Some("UNHEALTHY: "));
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert!(
        r.detail.as_deref().unwrap().contains(&b.project.name),
        "{r:?}"
    );
    assert!(
        r.log_tail.contains("--- compose logs ---"),
        "{}",
        r.log_tail
    );
    assert!(
        r.log_tail.contains("healthz disabled"),
        "the container's own output: {}",
        r.log_tail
    );
    assert!(r.log_tail.contains("leak=***"), "{}", r.log_tail);
    assert!(
        !r.log_tail.contains('\u{1b}'),
        "terminal escapes in the report: {:?}",
        r.log_tail
    );
    assert_no_secret(&b, &run);
    let seen = b.project.containers();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].health, "unhealthy");
    assert!(b.w.state()["applied_sha"].is_null());
}

#[test]
fn an_unhealthy_bundle_over_a_good_one_falls_back_to_it() {
    let Some(b) = E2eBox::with_timeout("unhealthy-revert", 20) else {
        return;
    };
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    b.w.publish(&b.bundle(&b.e2e.image_bad));
    b.w.tick().expect(1);
    let r = b.w.last_report();
    assert_report(&r, ReportResult::Failed, Some("UNHEALTHY: "));
    assert!(r.detail.as_deref().unwrap().contains(&first[..12]), "{r:?}");
    // The last healthy release runs again, from its own release directory.
    assert_eq!(b.current(), Some(release(&first)));
    assert_eq!(b.w.state()["applied_sha"], json!(first));
    assert_healthy(&b.project.containers(), &b.project.name);
    // The failed release's logs and probe output outlive its containers: kept before the
    // fallback replaced them, and `explain` points at them.
    let detail = r.detail.unwrap();
    assert!(detail.contains("probe exit"), "{detail}");
    let logs = b.w.run(&["logs"]);
    logs.ok();
    let text = logs.stdout();
    assert!(text.contains("last probe exit"), "{text}");
    assert!(text.contains("--- compose logs ---"), "{text}");
    assert!(text.contains("healthz disabled"), "{text}");
    let explain = b.w.run(&["explain"]);
    explain.ok();
    assert!(
        explain.stdout().contains("monky-deployd logs ")
            && explain.stdout().contains("bundle author"),
        "{}",
        explain.stdout()
    );
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");

    // The next tick is inside the backoff window: a report, but no lease, pull or up.
    let (leases, ids) = (b.w.tenancy.lease_count(ENV), b.project.ids("container"));
    let run = b.w.tick();
    run.expect(1);
    assert!(
        !run.stderr().contains("compose pull") && !run.stderr().contains("compose up"),
        "{}",
        run.stderr()
    );
    assert_eq!(b.w.tenancy.lease_count(ENV), leases);
    assert_eq!(b.project.ids("container"), ids, "nothing was recreated");
    let detail = b.w.last_report().detail.unwrap();
    assert!(
        detail.contains("next attempt") && detail.contains(&format!("running {}", &first[..12])),
        "{detail}"
    );
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");
}

/// The attack of a container that rewrote its own release's compose file: the next release
/// fails, and the fallback finds the old release changed. compose's model of it is judged
/// again before its `up`, so the rewritten file never starts.
#[test]
fn a_fallback_to_a_release_changed_on_disk_is_refused() {
    let Some(b) = E2eBox::with_timeout("changed-revert", 20) else {
        return;
    };
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    let file =
        b.w.env_dir()
            .join(release(&first))
            .join("docker-compose.yml");
    let text = std::fs::read_to_string(&file).unwrap();
    let rewritten = text.replace(
        "    env_file: .env\n",
        "    env_file: .env\n    privileged: true\n    cap_add: [SYS_ADMIN]\n",
    );
    assert_ne!(text, rewritten);
    std::fs::write(&file, rewritten).unwrap();

    b.w.publish(&b.bundle(&b.e2e.image_bad));
    b.w.tick().expect(1);
    let r = b.w.last_report();
    let detail = r.detail.clone().unwrap();
    assert!(
        detail.contains(&format!("fallback to {} refused", &first[..12])),
        "{detail}"
    );
    // Nothing of the project runs privileged: the changed release was not started again.
    for id in b.project.ids("container") {
        let privileged = b.project.docker_ok([
            "inspect",
            "--format",
            "{{.HostConfig.Privileged}}",
            id.as_str(),
        ]);
        assert_eq!(privileged.trim(), "false", "{id}");
    }
    assert_ne!(b.current(), Some(release(&first)));
    assert!(b.w.state()["applied_sha"].is_null());
}

// ---- 5. pull failures -------------------------------------------------------------------------

/// A failed pull: exit 1, `code` (`COMPOSE_PULL_FAILED`, or `IMAGE_NOT_FOUND` for a tag never
/// pushed) with the registry's words, and the running release (if any) untouched.
#[track_caller]
fn check_pull_failure(
    b: &E2eBox,
    bundle: &TestBundle,
    code: &str,
    registry_says: &[&str],
    previous: Option<&str>,
) {
    let before = b.project.containers();
    b.w.publish(bundle);
    let run = b.w.tick();
    run.expect(1);
    let r = b.w.last_report();
    assert_report(&r, ReportResult::Failed, Some(&format!("{code}: ")));
    let detail = r.detail.clone().unwrap();
    for words in registry_says {
        assert!(detail.contains(words), "{words:?} not in {detail:?}");
    }
    assert!(
        run.stderr().contains(registry_says[0]),
        "the journal line: {}",
        run.stderr()
    );
    assert_no_secret(b, &run);
    assert_eq!(
        b.project.containers(),
        before,
        "the running containers changed"
    );
    match previous {
        Some(sha) => {
            assert_eq!(b.current(), Some(release(sha)), "current moved");
            assert_eq!(b.w.state()["applied_sha"], json!(sha));
            assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");
        }
        None => {
            assert_eq!(b.current(), None);
            assert!(before.is_empty());
        }
    }
}

#[test]
fn a_pull_without_any_credential_says_so() {
    let Some(b) = E2eBox::new("pull-no-cred") else {
        return;
    };
    let mut bundle = b.bundle(&b.e2e.image_1);
    bundle.manifest["entries"]
        .as_array_mut()
        .unwrap()
        .retain(|e| e.get("use").is_none());
    b.w.stage_grant();
    check_pull_failure(
        &b,
        &bundle,
        "COMPOSE_PULL_FAILED",
        &["no basic auth credentials"],
        None,
    );
    assert!(!b.w.state_dir().join("docker/config.json").exists());
}

#[test]
fn a_pull_with_a_wrong_password_keeps_the_running_release() {
    let Some(b) = E2eBox::new("pull-wrong-pass") else {
        return;
    };
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    let wrong = json!({"registry": b.e2e.registry, "username": b.e2e.user,
                       "password": "not-the-registry-password"});
    b.w.bao.put_secret(ENV, "registry", &wrong.to_string());
    check_pull_failure(
        &b,
        &b.bundle(&b.e2e.image_2),
        "COMPOSE_PULL_FAILED",
        &[
            "unauthorized",
            "authentication required",
            // Where the credential is kept: the manifest's entry and its OpenBao path.
            "the registry rejected the credential from the manifest's entry REGISTRY_AUTH",
            &format!("at monky/data/{ENV}/"),
        ],
        Some(&first),
    );
}

#[test]
fn a_pull_of_a_missing_tag_keeps_the_running_release() {
    let Some(b) = E2eBox::new("pull-missing") else {
        return;
    };
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    check_pull_failure(
        &b,
        &b.bundle(&b.e2e.image_missing),
        "IMAGE_NOT_FOUND",
        &["manifest unknown", "not found"],
        Some(&first),
    );
}

/// A worker whose tag was never pushed, beside a web whose image is there: the failure names
/// the worker and its image, never `web`.
#[test]
fn a_missing_worker_image_is_blamed_on_the_worker() {
    let Some(b) = E2eBox::new("pull-worker") else {
        return;
    };
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    let compose = compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        &format!("  worker:\n    image: {}\n", b.e2e.image_missing),
        &[],
    );
    check_pull_failure(
        &b,
        &web_bundle(compose),
        "IMAGE_NOT_FOUND",
        &["worker", &b.e2e.image_missing],
        Some(&first),
    );
    let detail = b.w.last_report().detail.unwrap();
    assert!(
        detail.starts_with(&format!(
            "IMAGE_NOT_FOUND: worker: image {} not found",
            b.e2e.image_missing
        )),
        "{detail}"
    );
    assert!(!detail.contains("web Error"), "{detail}");
}

/// A host port another process holds: docker's own words, `COMPOSE_UP_FAILED`, the box
/// admin's move; not `UNHEALTHY` after the health wait.
#[test]
fn a_port_in_use_is_compose_up_failed_with_dockers_reason() {
    let Some(b) = E2eBox::with_timeout("port-in-use", 20) else {
        return;
    };
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    // The next release publishes on a port this test holds.
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap().port();
    b.w.publish(&web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_2,
        Some(taken),
        "",
        &[],
    )));
    let run = b.w.tick();
    run.expect(1);
    let r = b.w.last_report();
    assert_report(&r, ReportResult::Failed, Some("COMPOSE_UP_FAILED: "));
    let detail = r.detail.unwrap();
    assert!(
        detail.contains("address already in use") || detail.contains("port is already allocated"),
        "docker's reason: {detail}"
    );
    assert!(!detail.contains("--env-file"), "no command line: {detail}");
    assert!(
        run.stderr().contains("owner=\"box admin\""),
        "{}",
        run.stderr()
    );
    assert_eq!(b.current(), Some(release(&first)));
    let explain = b.w.run(&["explain"]);
    explain.ok();
    assert!(
        explain.stdout().contains("whose move  box admin"),
        "{}",
        explain.stdout()
    );
    assert_no_secret(&b, &run);
    drop(holder);
}

/// The docker socket gone (never the shared daemon stopped): the heartbeat says
/// `DOCKER_UNAVAILABLE`, nothing says converged, and doctor fails the socket without a false
/// disk failure.
#[test]
fn docker_down_is_named_everywhere_without_a_false_disk_failure() {
    let Some(b) = E2eBox::new("docker-down") else {
        return;
    };
    b.first_apply(&b.bundle(&b.e2e.image_1));
    let gone = b.project.scratch.path().join("no-docker.sock");
    let run_with = |args: &[&str]| {
        Run(b
            .w
            .command(args)
            .env("DOCKER_HOST", format!("unix://{}", gone.display()))
            .output()
            .unwrap())
    };
    let tick = run_with(&["run", "--once"]);
    tick.expect(1);
    assert!(
        tick.stderr().contains("code=DOCKER_UNAVAILABLE"),
        "{}",
        tick.stderr()
    );
    let status = run_with(&["status", "--json"]);
    status.ok();
    let doc: Value = serde_json::from_str(&status.stdout()).unwrap();
    assert_eq!(doc["converged"], false, "{doc:#}");
    let explain = run_with(&["explain"]);
    explain.ok();
    assert!(
        !explain.stdout().contains("nothing to do"),
        "{}",
        explain.stdout()
    );
    let doctor = run_with(&["doctor", "--json"]);
    doctor.expect(1);
    let doc: Value = serde_json::from_str(&doctor.stdout()).unwrap();
    let verdict = |name: &str| {
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["verdict"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(verdict("docker socket"), "fail", "{doc:#}");
    assert_eq!(verdict("disk"), "skip", "{doc:#}");
    assert_no_secret(&b, &tick);
}

// ---- 6. retire --------------------------------------------------------------------------------

/// Applies a bundle of `tier`, retires it with `purge`, and checks the named volume's fate.
fn check_retire(short: &str, tier: &str, purge: bool, volume_kept: bool) {
    let Some(b) = E2eBox::new(short) else {
        return;
    };
    let mut bundle = b.bundle(&b.e2e.image_1);
    bundle.meta["tier"] = json!(tier);
    let sha = b.first_apply(&bundle);
    let volume = format!("{}_data", b.project.name);
    assert_eq!(b.project.volumes(), std::slice::from_ref(&volume));

    b.w.tenancy.set_desired(ENV, Desired::down(purge));
    b.w.tick().ok();
    let r = b.w.last_report();
    assert_report(&r, ReportResult::Down, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert_eq!(b.project.containers(), []);
    assert_eq!(b.current(), None);
    let expected: Vec<String> = if volume_kept { vec![volume] } else { vec![] };
    assert_eq!(
        b.project.volumes(),
        expected,
        "tier {tier}, purge_volumes {purge}"
    );
}

#[test]
fn retire_keeps_the_volume_without_purge() {
    check_retire("retire-keep", "qa", false, true);
}

#[test]
fn retire_with_purge_removes_the_volume() {
    check_retire("retire-purge", "qa", true, false);
}

#[test]
fn retire_never_purges_prod() {
    check_retire("retire-prod", "prod", true, true);
}

// ---- 7. compose only in root's ~/.docker/cli-plugins ------------------------------------------

/// A shell script for `unshare --mount` that hides `dirs` behind empty tmpfs mounts in the
/// private namespace (the machine's own mounts are untouched), then runs its arguments.
fn hide_dirs_script(dirs: &[&str]) -> String {
    let mut s = String::from("set -e\n");
    for d in dirs {
        s.push_str(&format!(
            "mount -t tmpfs -o size=1m monky-e2e-hide '{d}' || {{ echo 'monky-e2e: cannot mount over {d}' >&2; exit 97; }}\n"
        ));
    }
    s.push_str("exec \"$@\"\n");
    s
}

#[test]
fn compose_only_in_roots_home_plugins_is_run_standalone() {
    let Some(b) = E2eBox::new("home-plugin") else {
        return;
    };
    let plugins = b.w.home().join(".docker/cli-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let plugin = plugins.join("docker-compose");
    let real = std::fs::canonicalize(&b.e2e.compose).unwrap();
    std::fs::copy(&real, &plugin).unwrap();

    let hidden: Vec<&str> = [
        "/usr/local/lib/docker/cli-plugins",
        "/usr/local/libexec/docker/cli-plugins",
        "/usr/lib/docker/cli-plugins",
        "/usr/libexec/docker/cli-plugins",
    ]
    .into_iter()
    .filter(|d| Path::new(d).is_dir())
    .collect();
    // Also hide the directory of the machine's compose binary, wherever it is installed.
    let real_dir = real.parent().unwrap().to_str().unwrap().to_string();
    let mut dirs = hidden.clone();
    if !dirs.contains(&real_dir.as_str()) && !matches!(real_dir.as_str(), "/usr/bin" | "/bin") {
        dirs.push(&real_dir);
    }
    let script = hide_dirs_script(&dirs);
    let wrapper = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        &script,
        "sh",
    ];

    // The premise: in that namespace the docker CLI has no compose plugin.
    let probe = Command::new(wrapper[0])
        .args(&wrapper[1..])
        .arg(&b.e2e.docker)
        .args(["compose", "version"])
        .env("DOCKER_CONFIG", b.project.scratch.path())
        .output()
        .unwrap();
    let probe_err = String::from_utf8_lossy(&probe.stderr);
    assert!(
        probe.status.code() != Some(97) && !probe_err.contains("unshare:"),
        "cannot hide the system compose plugin in a private mount namespace (needs root and \
         CAP_SYS_ADMIN, as `cargo xtask setup` does): {probe_err}"
    );
    assert!(
        !probe.status.success(),
        "`docker compose` still works with {dirs:?} hidden: {}",
        String::from_utf8_lossy(&probe.stdout)
    );

    b.w.stage_grant();
    let sha = b.w.publish(&b.bundle(&b.e2e.image_1));
    let run = Run(b
        .w
        .wrapped_command(&wrapper, &["run", "--once"])
        .output()
        .unwrap());
    run.ok();
    assert_report(&b.w.last_report(), ReportResult::Applied, None);
    assert_eq!(b.w.state()["applied_sha"], json!(sha));
    let compose = &b.w.state()["compose"];
    assert_eq!(compose["program"], json!(plugin), "{compose}");
    assert_eq!(compose["plugin"], json!(false), "{compose}");
    assert_healthy(&b.project.containers(), &b.project.name);
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");
}

// ---- 8. hostile compose files -----------------------------------------------------------------

/// A hostile bundle is refused before any container of the project exists.
fn check_hostile(e2e: &'static E2e, project: &Project, case: &Hostile) {
    let port = None; // host networking and published ports do not mix; nothing may start anyway
    let mut bundle = web_bundle(compose_yaml(
        e2e,
        &e2e.image_1,
        port,
        case.service,
        case.volumes,
    ));
    bundle.env_template.push_str(case.env);
    let Some(w) = real_world(e2e, project, 30) else {
        return;
    };
    if let Some((var, value)) = case.secret {
        let name = var.to_ascii_lowercase();
        bundle.manifest["entries"]
            .as_array_mut()
            .unwrap()
            .push(json!({
            "var": var, "path": format!("monky/{ENV}/see/{name}"), "kind": "supplied",
            "version": null}));
        bundle.env_template.push_str(&format!("{var}=${{{var}}}\n"));
        w.bao.put_secret(ENV, &name, value);
    }
    w.stage_grant();
    w.publish(&bundle);
    let run = w.tick();
    run.expect(1);
    let r = w.last_report();
    assert_report(&r, ReportResult::Failed, Some("PRIVILEGED_REFUSED: "));
    assert!(
        r.detail.as_deref().unwrap().contains(case.reason),
        "{}: {:?}",
        case.name,
        r.detail
    );
    if let Some(leases) = case.leases {
        assert_eq!(w.tenancy.lease_count(ENV), leases, "{}", case.name);
    }
    assert_eq!(project.containers(), [], "{}", case.name);
    assert_eq!(w.current_target(), None, "{}", case.name);
    assert!(w.state()["applied_sha"].is_null());
}

struct Hostile {
    name: &'static str,
    service: &'static str,
    volumes: &'static [&'static str],
    /// Lines added to `.env.template`.
    env: &'static str,
    /// A variable the manifest reads from OpenBao, and its value there.
    secret: Option<(&'static str, &'static str)>,
    reason: &'static str,
    /// Leases before the refusal: 0 when the bundle alone shows the danger, 1 when only
    /// compose's interpolation with the secrets does; `None` where either is right (a literal
    /// in `.env.template` may be judged offline or on compose's model).
    leases: Option<usize>,
}

const HOSTILE: [Hostile; 12] = [
    Hostile {
        name: "privileged",
        service: "    privileged: true\n",
        volumes: &[],
        env: "",
        secret: None,
        reason: "web: privileged",
        leases: Some(0),
    },
    Hostile {
        name: "host network",
        service: "    network_mode: host\n",
        volumes: &[],
        env: "",
        secret: None,
        reason: "web: network_mode host",
        leases: Some(0),
    },
    Hostile {
        name: "docker socket bind",
        service: "",
        volumes: &["/var/run/docker.sock:/var/run/docker.sock"],
        env: "",
        secret: None,
        reason: "web: volumes /var/run/docker.sock",
        leases: Some(0),
    },
    Hostile {
        name: "socket as an interpolation default",
        service: "",
        volumes: &["${X:-/var/run/docker.sock}:/host.sock"],
        env: "",
        secret: None,
        reason: "web: volumes /var/run/docker.sock",
        leases: Some(0),
    },
    Hostile {
        name: "host network from a literal in .env",
        service: "    network_mode: ${NET_MODE:-bridge}\n",
        volumes: &[],
        env: "NET_MODE=host\n",
        secret: None,
        reason: "web: network_mode host",
        leases: None,
    },
    Hostile {
        name: "socket directory from a literal in .env",
        service: "",
        volumes: &["${SOCK_DIR:-/srv}/docker.sock:/host.sock"],
        env: "SOCK_DIR=/var/run\n",
        secret: None,
        reason: "web: volumes /var/run/docker.sock",
        leases: None,
    },
    Hostile {
        name: "a capability beyond docker's defaults",
        service: "    cap_add: [SYS_MODULE]\n",
        volumes: &[],
        env: "",
        secret: None,
        reason: "web: cap_add SYS_MODULE",
        leases: Some(0),
    },
    Hostile {
        name: "a host path off the box's allowed_binds",
        service: "",
        volumes: &["/etc:/host-etc:ro"],
        env: "",
        secret: None,
        reason: "web: volumes /etc",
        leases: Some(0),
    },
    Hostile {
        name: "the release dir bound writable",
        service: "",
        volumes: &[".:/cfg"],
        env: "",
        secret: None,
        reason: "web: volumes . writable over the release's own files",
        leases: Some(0),
    },
    Hostile {
        name: "an external network called host",
        service: "    networks: [h]\nnetworks:\n  h:\n    external: true\n    name: host\n",
        volumes: &[],
        env: "",
        secret: None,
        reason: "networks.h: external host",
        leases: Some(0),
    },
    // Only compose's own interpolation of the rendered .env shows these two.
    Hostile {
        name: "a capability from a secret's value",
        service: "    cap_add: [\"${SEE_CAP:-CHOWN}\"]\n",
        volumes: &[],
        env: "",
        secret: Some(("SEE_CAP", "SYS_PTRACE")),
        reason: "web: cap_add from ${SEE_CAP}",
        leases: Some(1),
    },
    Hostile {
        name: "privileged from a secret's value",
        service: "    privileged: ${SEE_PRIVILEGED:-false}\n",
        volumes: &[],
        env: "",
        secret: Some(("SEE_PRIVILEGED", "true")),
        reason: "web: privileged",
        leases: Some(1),
    },
];

#[test]
fn hostile_compose_files_are_refused_before_any_container_starts() {
    let Some(e2e) = e2e() else {
        return;
    };
    let project = Project::new(e2e, "hostile");
    for case in &HOSTILE {
        check_hostile(e2e, &project, case);
    }
}

// ---- secret values that compose's .env reader would otherwise change ------------------------

/// `$` (interpolation), ` #` (a comment in an unquoted value), quotes, a backslash and blanks
/// at both ends: each once changed what a container got from a naive `.env`.
const AWKWARD: &str = " pa$s w'o\"rd #1 \\ $$x ${HOME} ";

#[test]
fn awkward_secret_values_reach_the_container_byte_exact() {
    let Some(b) = E2eBox::new("awkward") else {
        return;
    };
    b.w.bao.put_secret(ENV, "awkward", AWKWARD);
    let mut bundle = b.bundle(&b.e2e.image_1);
    bundle.env_template = "DEMO_API_KEY=${DEMO_API_KEY}\n\
                           SEE_ADMIN_TOKEN=\"tok:${SEE_ADMIN_TOKEN} #not a comment\"\n"
        .into();
    bundle.manifest["entries"][0]["path"] = json!(format!("monky/{ENV}/see/awkward"));
    bundle.manifest["entries"][0]["version"] = json!(null);
    b.w.bao.put_secret(ENV, "admin_token", AWKWARD);
    let run = {
        b.w.stage_grant();
        b.w.publish(&bundle);
        b.w.tick()
    };
    run.ok();
    assert_eq!(
        get_200(b.port, "/env.txt"),
        format!("DEMO_API_KEY={AWKWARD}\nSEE_ADMIN_TOKEN=tok:{AWKWARD} #not a comment\n")
    );
    let reports = format!("{:?}", b.w.reports());
    assert!(!reports.contains(AWKWARD.trim()), "{reports}");
    assert!(
        !run.stderr().contains(AWKWARD.trim()),
        "a secret value on stderr"
    );
}

/// compose's own `.env` reader, on every way a template can place a value: what `render_env`
/// writes reads back as the value, or the render refuses naming the variable. This is the
/// ground truth for the model `monky-bundle`'s property tests read back with.
#[test]
fn compose_reads_every_rendered_value_back_exactly() {
    let Some(e2e) = e2e() else {
        return;
    };
    let values = [
        "plain",
        "",
        "pa$s",
        "$$",
        "${HOME}",
        "a #b",
        "a#b",
        " lead and trail ",
        "\u{a0}nbsp\u{a0}",
        "tab\tinside",
        "line1\nline2",
        "cr\r\nlf",
        "back\\slash\\",
        "back\\'quote",
        "dq\"sq'",
        "\\n is not a newline",
        "ünïcödé ✓",
    ];
    let templates = [
        ("whole", "V=${V}\n", "", ""),
        ("double", "V=\"<${V}> #x\"\n", "<", "> #x"),
        ("single", "V='<${V}>'\n", "<", ">"),
        ("unquoted", "V=<${V}>\n", "<", ">"),
        ("export", "export V=${V}\n", "", ""),
    ];
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("compose.yaml"),
        "services:\n  s:\n    image: scratch\n    env_file: .env\n",
    )
    .unwrap();
    let mut checked = 0;
    for (place, template, pre, post) in templates {
        for value in values {
            let map = BTreeMap::from([("V".to_string(), SecretString::from(value))]);
            let rendered = match monky_bundle::render_env(template, &map) {
                Ok(r) => r,
                Err(refusal) => {
                    assert_eq!(
                        refusal.to_string(),
                        "ENV_VALUE_UNSAFE: V, .env.template line 1",
                        "{place} {value:?}"
                    );
                    assert!(
                        matches!(place, "unquoted" | "single"),
                        "{place} refused {value:?}"
                    );
                    continue;
                }
            };
            std::fs::write(dir.path().join(".env"), rendered.expose_secret()).unwrap();
            let out = Command::new(&e2e.docker)
                .args([
                    "compose",
                    "--project-name",
                    "dotenv",
                    "config",
                    "--format",
                    "json",
                ])
                .current_dir(dir.path())
                .env("DOCKER_CONFIG", dir.path())
                .output()
                .expect("run docker compose config");
            assert!(
                out.status.success(),
                "{place} {value:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let model: Value = serde_json::from_slice(&out.stdout).unwrap();
            // `config` writes a literal `$` as `$$` so that its output reads back the same.
            let got = model["services"]["s"]["environment"]["V"]
                .as_str()
                .unwrap_or_else(|| panic!("{place} {value:?}: no V in {model}"))
                .replace("$$", "$");
            assert_eq!(got, format!("{pre}{value}{post}"), "{place} {value:?}");
            checked += 1;
        }
    }
    // Refusals are the exception: the whole and double-quoted places take every value.
    assert!(checked >= 2 * values.len() + values.len() / 2, "{checked}");
}

// ---- 9. paths compose and dockerd open ---------------------------------------------------------

/// Files compose would read by path and binds a container could swap before the next start:
/// refused before any container of the project exists, whatever compose's variables hold.
const PATH_HOSTILE: [Hostile; 9] = [
    Hostile {
        name: "env_file from compose's own PATH",
        service: "  reader:\n    image: busybox\n    env_file: \"${PATH:+/etc/os-release}\"\n",
        volumes: &[],
        env: "",
        secret: None,
        reason: "reader: env_file ${PATH:+/etc/os-release}: a file compose reads must be named literally",
        leases: Some(0),
    },
    Hostile {
        name: "env_file from a secret's value",
        service: "  reader:\n    image: busybox\n    env_file: \"${SEE_FILE:-.env}\"\n",
        volumes: &[],
        env: "",
        secret: Some(("SEE_FILE", "/etc/os-release")),
        reason: "reader: env_file ${SEE_FILE:-.env}:",
        leases: Some(0),
    },
    Hostile {
        name: "env_file from a `KEY: value` template line",
        service: "  reader:\n    image: busybox\n    env_file: \"${ENVF:-.env}\"\n",
        volumes: &[],
        env: "ENVF: /etc/os-release\n",
        secret: None,
        reason: "reader: env_file ${ENVF:-.env}:",
        leases: Some(0),
    },
    Hostile {
        name: "env_file of another env",
        service: "  reader:\n    image: busybox\n    env_file: ../../../monky-env-other/current/.env\n",
        volumes: &[],
        env: "",
        secret: None,
        reason: "reader: env_file ../../../monky-env-other/current/.env: only the release's own .env",
        leases: Some(0),
    },
    Hostile {
        name: "label_file of the agent's token",
        service: "    label_file: /var/lib/monky-deployd/bao.token\n",
        volumes: &[],
        env: "",
        secret: None,
        reason: "web: label_file /var/lib/monky-deployd/bao.token:",
        leases: Some(0),
    },
    Hostile {
        name: "a bind below the same service's writable bind",
        service: "",
        volumes: &["./data:/d", "./data/sub:/host"],
        env: "",
        secret: None,
        reason: "web: volumes ./data/sub lies below the writable bind ./data of web",
        leases: Some(0),
    },
    Hostile {
        name: "a restarting service bound below another's writable bind",
        service: "  b:\n    image: busybox\n    restart: always\n    depends_on: [web]\n    volumes: [\"./data/sub:/host:ro\"]\n",
        volumes: &["./data:/d"],
        env: "",
        secret: None,
        reason: "b: volumes ./data/sub lies below the writable bind ./data of web",
        leases: Some(0),
    },
    Hostile {
        name: "volumes_from and a bind below the shared writable bind",
        service: "  b:\n    image: busybox\n    volumes_from: [web]\n    volumes: [\"./data/sub/etc:/e\"]\n",
        volumes: &["./data:/d"],
        env: "",
        secret: None,
        reason: "b: volumes ./data/sub/etc lies below the writable bind ./data of web",
        leases: Some(0),
    },
    Hostile {
        name: "an upper-case rtprio ulimit",
        service: "    ulimits:\n      RTPRIO: 99\n",
        volumes: &[],
        env: "",
        secret: None,
        reason: "web: ulimits RTPRIO",
        leases: Some(0),
    },
];

#[test]
fn hostile_paths_are_refused_before_any_container_starts() {
    let Some(e2e) = e2e() else {
        return;
    };
    let project = Project::new(e2e, "hostile-paths");
    for case in &PATH_HOSTILE {
        check_hostile(e2e, &project, case);
    }
}

/// A container plants a link to `/` in its writable bind and restarts: the link leads only into
/// its own root, and a bundle that would bind that link (for another service, or for this one
/// at its next start) is refused before any `up`, with the running release untouched.
#[test]
fn a_link_planted_in_a_writable_bind_is_never_bound() {
    let Some(b) = E2eBox::new("planted-link") else {
        return;
    };
    let good = web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        "",
        &["./data:/planted"],
    ));
    let first = b.first_apply(&good);
    let web = format!("{}-web-1", b.project.name);
    // A harmless stand-in for a host secret, owned by the test.
    let canary = tempfile::Builder::new()
        .prefix("monky-e2e-canary.")
        .tempfile_in("/tmp")
        .unwrap();
    std::fs::write(canary.path(), "host-only\n").unwrap();
    b.project
        .docker_ok(["exec", web.as_str(), "ln", "-s", "/", "/planted/sub"]);
    let planted = b.w.env_dir().join(release(&first)).join("data/sub");
    assert_eq!(std::fs::read_link(&planted).unwrap(), Path::new("/"));
    b.project.docker_ok(["restart", web.as_str()]);
    let through = canary
        .path()
        .to_str()
        .unwrap()
        .replacen("/tmp", "/planted/sub/tmp", 1);
    let out = b
        .project
        .docker(["exec", web.as_str(), "cat", through.as_str()]);
    assert!(
        !out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("host-only"),
        "the planted link reached the host after a restart"
    );
    // The restart above leaves the health check "starting" for a while: a recreated container
    // is told by its id and start time, not by its health.
    let started = |cs: Vec<Seen>| {
        cs.into_iter()
            .map(|c| (c.name, c.id, c.started_at))
            .collect::<Vec<_>>()
    };
    let before = started(b.project.containers());

    // The same service's next start, or a second service with a restart policy, binding the
    // link's path: refused on the compose file, before any lease, pull or up.
    for (service, volumes) in [
        ("", &["./data:/planted", "./data/sub:/host:ro"][..]),
        (
            "  b:\n    image: busybox\n    restart: always\n    volumes: [\"./data/sub:/host\"]\n",
            &["./data:/planted"][..],
        ),
    ] {
        let hostile = web_bundle(compose_yaml(
            b.e2e,
            &b.e2e.image_1,
            Some(b.port),
            service,
            volumes,
        ));
        let leases = b.w.tenancy.lease_count(ENV);
        b.w.publish(&hostile);
        b.w.tenancy.advance_clock(Duration::from_secs(60));
        b.w.tick().expect(1);
        let r = b.w.last_report();
        assert_report(&r, ReportResult::Failed, Some("PRIVILEGED_REFUSED: "));
        assert!(
            r.detail
                .as_deref()
                .unwrap_or_default()
                .contains("./data/sub lies below the writable bind ./data of web"),
            "{:?}",
            r.detail
        );
        assert_eq!(b.w.tenancy.lease_count(ENV), leases);
        assert_eq!(
            started(b.project.containers()),
            before,
            "a container was recreated"
        );
        assert_eq!(b.current(), Some(release(&first)));
    }
}

// ---- a secret on a command line ---------------------------------------------------------------

/// A healthcheck whose `test` interpolates a secret would put the value in a process's
/// arguments, readable by every local user: refused before the lease, nothing started. The
/// escaped `$${...}` is no way around it (the container's shell expands it into the same
/// arguments): refused the same way. The route that keeps it off argv, the program reading
/// the variable from its own environment (the image's entrypoint does), applies healthy.
#[test]
fn a_secret_on_a_command_line_is_refused_before_anything_starts() {
    let Some(b) = E2eBox::new("cmdline") else {
        return;
    };
    let healthcheck = "    healthcheck:\n      test: [\"CMD-SHELL\", \"test -n \\\"${SEE_ADMIN_TOKEN}\\\" && \
                       wget -q -O /dev/null http://127.0.0.1:8080/healthz\"]\n      \
                       interval: 1s\n      timeout: 2s\n      retries: 3\n";
    let bad = web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        healthcheck,
        &[],
    ));
    b.w.stage_grant();
    b.w.publish(&bad);
    let run = b.w.tick();
    run.expect(1);
    let why = "SECRET_ON_COMMAND_LINE: web: healthcheck.test uses ${SEE_ADMIN_TOKEN}";
    run.says(&[why]);
    assert_report(&b.w.last_report(), ReportResult::Failed, Some(why));
    assert_eq!(b.w.tenancy.lease_count(ENV), 0, "refused before the lease");
    assert_eq!(b.project.containers(), []);
    assert_eq!(b.w.current_target(), None);
    assert_no_secret(&b, &run);

    let mut escaped = bad.clone();
    escaped.compose = bad
        .compose
        .replace("${SEE_ADMIN_TOKEN}", "$${SEE_ADMIN_TOKEN}");
    b.w.publish(&escaped);
    b.w.tenancy.advance_clock(Duration::from_secs(60));
    let run = b.w.tick();
    run.expect(1);
    let why =
        "SECRET_ON_COMMAND_LINE: web: healthcheck.test has the container expand $SEE_ADMIN_TOKEN";
    run.says(&[why]);
    assert!(!run.stderr().contains("$${"), "the fix offered is no fix");
    assert_eq!(b.w.tenancy.lease_count(ENV), 0, "refused before the lease");
    assert_eq!(b.project.containers(), []);

    b.next_applies(&b.bundle(&b.e2e.image_1));
    assert_healthy(&b.project.containers(), &b.project.name);
}

/// `$$VAR` through `sh -c`: compose hands `$SEE_ADMIN_TOKEN` on and the container's shell
/// expands it into the server's arguments, where `ps` shows it to every local user (measured
/// below with the guard waived: the value is in `/proc/<pid>/cmdline`). Refused before the
/// lease; `sh -c 'exec ...'` naming no secret applies.
#[test]
fn a_secret_expanded_by_the_containers_shell_is_refused_before_anything_starts() {
    let Some(b) = E2eBox::new("shell-expand") else {
        return;
    };
    let command = |script: &str| {
        format!(
            "    entrypoint: [\"/bin/sh\", \"-c\", \"{script}\"]\n    \
             healthcheck:\n      test: [\"CMD\", \"/bin/busybox\", \"true\"]\n      interval: 1s\n"
        )
    };
    let bad = web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        &command("exec /bin/busybox httpd -f -p 127.0.0.1:8099 -h /tmp -r $$SEE_ADMIN_TOKEN"),
        &[],
    ));
    b.w.stage_grant();
    b.w.publish(&bad);
    let run = b.w.tick();
    run.expect(1);
    let why = "SECRET_ON_COMMAND_LINE: web: entrypoint has the container expand $SEE_ADMIN_TOKEN";
    run.says(&[why]);
    assert_report(&b.w.last_report(), ReportResult::Failed, Some(why));
    assert_eq!(b.w.tenancy.lease_count(ENV), 0, "refused before the lease");
    assert_eq!(b.project.containers(), []);
    assert_eq!(b.w.current_target(), None);
    assert_no_secret(&b, &run);

    // What the rule prevents, measured with the box admin's waiver: the value in argv.
    b.w.config_extra("allow_secrets_on_command_lines: true\n");
    let run = b.w.run(&["run", "--once", "--force"]);
    run.ok();
    let pid = b
        .project
        .docker_ok(["inspect", "-f", "{{.State.Pid}}", &b.web()]);
    let pids = std::iter::once(pid.trim().parse::<u32>().unwrap())
        .chain(descendants(pid.trim().parse().unwrap()));
    assert!(
        pids.map(cmdline).any(|c| c.contains(ADMIN_TOKEN)),
        "the shell did not expand the secret into an argv"
    );
    b.w.set_config_extra("");

    let ordinary = web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        &command("exec /bin/busybox sleep $${SLEEP_S:-3600}"),
        &[],
    ));
    b.next_applies(&ordinary);
    assert_report(&b.w.last_report(), ReportResult::Applied, None);
}

/// A `.env` value over two lines (`MULTI="x` and `${SEE_ADMIN_TOKEN}"`) is one value to
/// compose, with the secret in it: `command: ["echo", "${MULTI}"]` would carry it into
/// `/proc/<pid>/cmdline`. Refused before the lease; the same value in the environment only
/// applies and reaches the container whole.
#[test]
fn a_multi_line_env_value_into_a_command_is_refused_before_anything_starts() {
    let Some(b) = E2eBox::new("multi-line") else {
        return;
    };
    let multi = |service: &str| {
        let mut bundle = web_bundle(compose_yaml(
            b.e2e,
            &b.e2e.image_1,
            Some(b.port),
            service,
            &[],
        ));
        bundle
            .env_template
            .push_str("MULTI=\"x\n${SEE_ADMIN_TOKEN}\"\n");
        bundle
    };
    let bad = multi("    command: [\"echo\", \"${MULTI}\"]\n");
    b.w.stage_grant();
    b.w.publish(&bad);
    let run = b.w.tick();
    run.expect(1);
    let why = "SECRET_ON_COMMAND_LINE: web: command uses ${MULTI}";
    run.says(&[why]);
    assert_report(&b.w.last_report(), ReportResult::Failed, Some(why));
    assert_eq!(b.w.tenancy.lease_count(ENV), 0, "refused before the lease");
    assert_eq!(b.project.containers(), []);
    assert_no_secret(&b, &run);

    b.next_applies(&multi(""));
    assert_healthy(&b.project.containers(), &b.project.name);
    let env = b.project.docker_ok(["exec", &b.web(), "env"]);
    assert!(
        env.contains(&format!("\nMULTI=x\n{ADMIN_TOKEN}\n")),
        "the two-line value did not reach the container whole"
    );
}

/// A service that gets the env's secrets (`env_file: .env`) and runs as uid 65534, which the
/// box's `nobody` account has too, on an engine without userns-remap: refused before anything
/// starts (nobody could read `/proc/<pid>/environ`). The box's admin may accept the uid, and
/// the waiver applies at the next tick, whatever the refusal's backoff.
#[test]
fn a_secret_for_a_uid_a_host_account_shares_is_refused_before_anything_starts() {
    let Some(b) = E2eBox::new("shared-uid") else {
        return;
    };
    let bad = web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        &format!("    user: \"65534:65534\"\n    {AS_ANY_UID}"),
        &[],
    ));
    b.w.stage_grant();
    b.w.publish(&bad);
    let run = b.w.tick();
    run.expect(1);
    run.says(&[
        "SECRET_READABLE_ON_HOST",
        "web: runs as uid 65534",
        "nobody",
    ]);
    let r = b.w.last_report();
    assert!(
        r.detail
            .as_deref()
            .is_some_and(|d| d.starts_with("SECRET_READABLE_ON_HOST: web: runs as uid 65534")),
        "{r:?}"
    );
    assert_eq!(b.project.containers(), [], "a container started");
    assert_eq!(b.w.current_target(), None);
    assert_no_secret(&b, &run);

    // Without a change the refusal waits out its backoff, and every view names the retry
    // that does not wait.
    let run = b.w.tick();
    run.expect(1);
    run.says(&["SECRET_READABLE_ON_HOST", "run --once --force"]);
    b.w.run(&["explain"])
        .ok()
        .prints(&["failed and waits", "run --once --force"]);

    // The box admin's waiver is the verdict's to change: the next tick, no `--force`, applies.
    b.w.config_extra("allowed_shared_uids: [65534]\n");
    b.w.run(&["explain"]).ok().prints(&[
        "failed under another config",
        "the next tick tries it again",
    ]);
    let run = b.w.tick();
    run.ok();
    assert_healthy(&b.project.containers(), &b.project.name);
    assert_report(&b.w.last_report(), ReportResult::Applied, None);
    assert_no_secret(&b, &run);
}

/// A secret as a file instead of a variable: compose's `secrets:` from the release's `.env`
/// (`environment:`) is copied into the container at `/run/secrets/<name>` with the mode and
/// owner the service asks, and is in no environment: not `docker inspect`'s, not the
/// process's. No file of it is on the host besides the release's `.env`.
#[test]
fn a_secret_as_a_file_reaches_the_container_and_no_environment() {
    let Some(b) = E2eBox::new("secret-file") else {
        return;
    };
    let compose = format!(
        "services:\n  web:\n    image: {}\n    ports:\n      - \"127.0.0.1:{}:{}\"\n    \
         secrets:\n      - source: admin_token\n        target: admin_token\n        \
         uid: \"999\"\n        gid: \"999\"\n        mode: 0400\n\
         secrets:\n  admin_token:\n    environment: SEE_ADMIN_TOKEN\n",
        b.e2e.image_1, b.port, b.e2e.web_port
    );
    let bundle = web_bundle(compose);
    b.w.stage_grant();
    b.w.publish(&bundle);
    let run = b.w.tick();
    run.ok();
    assert_healthy(&b.project.containers(), &b.project.name);
    let web = b.web();
    let file = b
        .project
        .docker_ok(["exec", &web, "cat", "/run/secrets/admin_token"]);
    assert_eq!(file.trim(), ADMIN_TOKEN);
    let mode = b.project.docker_ok([
        "exec",
        &web,
        "stat",
        "-c",
        "%a %u %g",
        "/run/secrets/admin_token",
    ]);
    // The owner asked for, not the container's own (root): compose honours `uid`/`gid`.
    assert_eq!(mode.trim(), "400 999 999");
    let env = b
        .project
        .docker_ok(["inspect", "-f", "{{json .Config.Env}}", &web]);
    assert!(
        !env.contains(ADMIN_TOKEN),
        "the secret is in the container's environment"
    );
    let environ = b
        .project
        .docker_ok(["exec", &web, "cat", "/proc/1/environ"]);
    assert!(
        !environ.contains(ADMIN_TOKEN),
        "the secret is in the process's environment"
    );
    assert_no_secret(&b, &run);
}

/// A secret given only as a file does not escape the shared-uid finding: a host account at
/// the container's uid (and gid) reads it through `/proc/<pid>/root` as it would read
/// `/proc/<pid>/environ`. Refused before anything starts; once the box's admin accepts the
/// uid it applies, and the kernel's own check is measured: the file is readable with the
/// container's uid and gid, and not with its uid and another gid.
#[test]
fn a_secret_only_as_a_file_for_a_shared_uid_is_refused_and_the_kernel_agrees() {
    let Some(b) = E2eBox::new("shared-uid-file") else {
        return;
    };
    let compose = format!(
        "services:\n  web:\n    image: {}\n    user: \"65534\"\n    ports:\n      \
         - \"127.0.0.1:{}:{}\"\n    {AS_ANY_UID}    secrets:\n      - source: admin_token\n        \
         uid: \"65534\"\n        mode: 0400\n\
         secrets:\n  admin_token:\n    environment: SEE_ADMIN_TOKEN\n",
        b.e2e.image_1, b.port, b.e2e.web_port
    );
    b.w.stage_grant();
    b.w.publish(&web_bundle(compose));
    let run = b.w.tick();
    run.expect(1);
    run.says(&[
        "SECRET_READABLE_ON_HOST",
        "web: runs as uid 65534",
        "SEE_ADMIN_TOKEN as a file under /run/secrets",
    ]);
    assert_eq!(b.project.containers(), [], "a container started");
    assert_eq!(b.w.current_target(), None);
    assert_no_secret(&b, &run);

    b.w.config_extra("allowed_shared_uids: [65534]\n");
    let run = b.w.run(&["run", "--once", "--force"]);
    run.ok();
    assert_healthy(&b.project.containers(), &b.project.name);
    assert_no_secret(&b, &run);
    let web = b.web();
    let pid = b
        .project
        .docker_ok(["inspect", "-f", "{{.State.Pid}}", &web]);
    let ids = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap();
    assert!(ids.contains("Uid:\t65534\t65534\t65534"), "{ids}");
    // No passwd entry in the image for 65534: the runtime gives it gid 0.
    assert!(ids.contains("Gid:\t0\t0\t0"), "{ids}");
    let read_as = |gid: &str| {
        std::process::Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", gid, "--clear-groups", "cat"])
            .arg(format!("/proc/{}/root/run/secrets/admin_token", pid.trim()))
            .output()
    };
    match read_as("0") {
        Ok(out) if out.status.success() => {
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), ADMIN_TOKEN);
            let other = read_as("65534").unwrap();
            assert!(!other.status.success(), "read with another gid");
        }
        // setpriv needs root; the refusal above is the test's point.
        Ok(out) => assert!(
            !String::from_utf8_lossy(&out.stderr).contains("Permission denied")
                || !running_as_root(),
            "uid 65534 gid 0 could not read the file: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => eprintln!("setpriv: {e}; the kernel's check not measured"),
    }
}

/// A config from a secret (`configs: {token: {environment: SEE_ADMIN_TOKEN}}`, written 0444
/// into the container) at a uid the box's `nobody` shares: refused before any pull or start,
/// naming the route; the same config from a key that holds no secret applies.
#[test]
fn a_config_from_a_secret_at_a_shared_uid_is_refused_before_the_pull() {
    let Some(b) = E2eBox::new("shared-uid-config") else {
        return;
    };
    let compose = |key: &str| {
        format!(
            "services:\n  web:\n    image: {}\n    user: \"65534:65534\"\n    ports:\n      \
             - \"127.0.0.1:{}:{}\"\n    {AS_ANY_UID}    configs:\n      - source: token\n        \
             target: /token\n        mode: 0444\n\
             configs:\n  token:\n    environment: {key}\n",
            b.e2e.image_1, b.port, b.e2e.web_port
        )
    };
    b.w.stage_grant();
    b.w.publish(&web_bundle(compose("SEE_ADMIN_TOKEN")));
    let run = b.w.tick();
    b.refused_before_the_pull(&run);
    run.says(&[
        "SECRET_READABLE_ON_HOST",
        "web: runs as uid 65534",
        "SEE_ADMIN_TOKEN as a config file",
    ]);

    b.next_applies(&web_bundle(compose("LOG_LEVEL")));
    assert_healthy(&b.project.containers(), &b.project.name);
}

/// A secret reference inherited through `extends` from a base service that runs as root:
/// the service that extends it runs at uid 65534 with the secret in its environment. The
/// finding names that service, not the base, and comes before any pull or start; a base
/// without a secret applies.
#[test]
fn a_secret_inherited_through_extends_at_a_shared_uid_is_refused_before_the_pull() {
    let Some(b) = E2eBox::new("shared-uid-extends") else {
        return;
    };
    let compose = |value: &str| {
        format!(
            "services:\n  base:\n    image: {image}\n    \
             environment:\n      TOKEN: \"{value}\"\n  web:\n    extends: {{service: base}}\n    \
             user: \"65534:65534\"\n    ports:\n      \
             - \"127.0.0.1:{port}:{web_port}\"\n    {AS_ANY_UID}",
            image = b.e2e.image_1,
            port = b.port,
            web_port = b.e2e.web_port
        )
    };
    b.w.stage_grant();
    b.w.publish(&web_bundle(compose("${SEE_ADMIN_TOKEN}")));
    let run = b.w.tick();
    b.refused_before_the_pull(&run);
    run.says(&[
        "SECRET_READABLE_ON_HOST: web: runs as uid 65534",
        "SEE_ADMIN_TOKEN in its environment",
    ]);
    let detail = b.w.last_report().detail.unwrap_or_default();
    assert!(!detail.contains("base:"), "{detail}");

    b.next_applies(&web_bundle(compose("not-a-secret")));
    // The base runs too, as root: no finding.
    let web = b
        .project
        .containers()
        .into_iter()
        .find(|c| c.name == b.web());
    assert!(
        web.is_some_and(|c| (c.state.as_str(), c.health.as_str()) == ("running", "healthy")),
        "{:?}",
        b.project.containers()
    );
}

impl E2eBox {
    /// Publishes `b` as the next desired sha, runs a tick and asserts it applied, with no
    /// secret on any way out.
    #[track_caller]
    fn next_applies(&self, b: &TestBundle) -> Run {
        self.w.publish(b);
        self.w.tenancy.advance_clock(Duration::from_secs(60));
        let run = self.w.tick();
        run.ok();
        assert_no_secret(self, &run);
        run
    }

    /// Asserts the tick `run` was refused before anything was pulled or started.
    #[track_caller]
    fn refused_before_the_pull(&self, run: &Run) {
        run.expect(1);
        assert_eq!(self.project.containers(), [], "a container started");
        assert!(
            !self.w.env_dir().join("pulled-images").exists(),
            "pulled before the refusal"
        );
        assert_eq!(self.w.current_target(), None);
        assert_no_secret(self, run);
    }
}

/// The web image's entrypoint writes its page as root; a service at another uid runs this
/// instead (nothing written, healthy at once).
const AS_ANY_UID: &str = "entrypoint: [\"/bin/busybox\", \"sleep\", \"3600\"]\n    \
                          healthcheck:\n      test: [\"CMD\", \"/bin/busybox\", \"true\"]\n      \
                          interval: 1s\n";

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")))
}

// ---- the box stays converged: drift, interrupted applies, holds --------------------------------

impl E2eBox {
    /// Lets the next drift be healed at once, as the heal backoff's clock running out would.
    fn forget_heal_backoff(&self) {
        let mut st = self.w.state();
        st["next_heal_at"] = Value::Null;
        st["next_heal_boot"] = Value::Null;
        st["last_heal_at"] = Value::Null;
        st["heal_attempts"] = json!(0);
        std::fs::write(self.w.state_dir().join("state.json"), st.to_string()).unwrap();
    }

    /// The tenancy endpoints called since request `from`.
    fn endpoints_since(&self, from: usize) -> Vec<Option<Endpoint>> {
        self.w.requests()[from..]
            .iter()
            .map(|r| r.endpoint)
            .collect()
    }

    fn web(&self) -> String {
        format!("{}-web-1", self.project.name)
    }

    /// A container added to the project by hand, of image `image`, with `labels` besides the
    /// project's.
    fn run_by_hand(&self, name: &str, image: &str, labels: &[(String, String)]) {
        let mut args: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name.into()];
        for (k, v) in labels {
            args.extend(["--label".into(), format!("{k}={v}")]);
        }
        args.push(image.into());
        self.project.docker_ok(&args);
    }

    fn labels_of(&self, container: &str) -> Vec<(String, String)> {
        let text =
            self.project
                .docker_ok(["inspect", "--format", "{{json .Config.Labels}}", container]);
        let labels: BTreeMap<String, String> = serde_json::from_str(text.trim()).unwrap();
        labels.into_iter().collect()
    }
}

/// Each drift made by hand on the real engine is healed by the next tick: the report names it,
/// the release runs healthy again, tenancy saw only a checkin and a report (no bundle, no
/// lease), the agent read nothing from OpenBao, and no secret is anywhere.
#[test]
fn drift_made_by_hand_is_healed_by_the_next_tick() {
    let Some(b) = E2eBox::new("heal") else {
        return;
    };
    // Ten ticks in a minute, where a box makes one: tenancy's checkin bucket is widened.
    b.w.tenancy.set_limits(RateLimits {
        checkin: Rate::per_minute(60),
        ..RateLimits::default()
    });
    let sha = b.first_apply(&b.bundle(&b.e2e.image_1));
    let web = b.web();
    // Another image with the same content: the running container committed under a name of
    // this run, so the by-hand container differs from the release in its image only.
    let other = format!("{}other:1", b.project.name);
    b.project.docker_ok(["commit", &web, &other]);
    let by_hand = other;
    /// A drift made by hand: its name, how it is made, what the report names.
    type Case<'a> = (&'a str, Box<dyn Fn(&E2eBox)>, String);
    let cases: Vec<Case> = vec![
        (
            "removed",
            Box::new(|b: &E2eBox| {
                b.project.docker_ok(["rm", "-f", &b.web()]);
            }),
            format!("web missing ({web})"),
        ),
        (
            "stopped",
            Box::new(|b: &E2eBox| {
                b.project.docker_ok(["stop", "-t", "1", &b.web()]);
            }),
            "web exited".to_string(),
        ),
        (
            "killed",
            Box::new(|b: &E2eBox| {
                b.project.docker_ok(["kill", &b.web()]);
            }),
            format!("web exited (137) ({web})"),
        ),
        (
            "recreated with another image",
            Box::new(move |b: &E2eBox| {
                let labels = b.labels_of(&b.web());
                b.project.docker_ok(["rm", "-f", &b.web()]);
                b.run_by_hand(&b.web(), &by_hand, &labels);
            }),
            format!("web recreated by hand ({web})"),
        ),
        (
            "an extra container",
            Box::new(|b: &E2eBox| {
                let name = format!("{}-intruder-1", b.project.name);
                let labels = vec![
                    (
                        "com.docker.compose.project".to_string(),
                        b.project.name.clone(),
                    ),
                    (
                        "com.docker.compose.service".to_string(),
                        "intruder".to_string(),
                    ),
                ];
                b.run_by_hand(&name, &b.e2e.image_1, &labels);
            }),
            format!("intruder not the release's ({}-intruder-1)", b.project.name),
        ),
    ];
    for (name, make, drift) in &cases {
        b.forget_heal_backoff();
        make(&b);
        let from = b.w.requests().len();
        let run = b.w.tick();
        run.ok();
        let r = b.w.last_report();
        assert_eq!(r.result, ReportResult::Applied, "{name}: {r:?}");
        let detail = r.detail.clone().unwrap_or_default();
        assert!(
            detail.starts_with("HEALED: ") && detail.contains(drift.as_str()),
            "{name}: {detail}"
        );
        assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
        assert_eq!(
            b.endpoints_since(from),
            [Some(Endpoint::Checkin), Some(Endpoint::Report)],
            "{name}"
        );
        assert!(!r.log_tail.contains("secret(s)"), "{name}: {}", r.log_tail);
        assert_healthy(&b.project.containers(), &b.project.name);
        assert_eq!(get_200(b.port, "/variant.txt").trim(), "1", "{name}");
        assert_no_secret(&b, &run);
        // Converged: the next heartbeat changes nothing.
        let seen = b.project.containers();
        b.w.tick().ok();
        assert_report(&b.w.last_report(), ReportResult::Applied, None);
        assert_eq!(b.project.containers(), seen, "{name}");
    }
}

/// The agent killed at each step of an apply on the real engine, `compose up` included (the
/// agent and its compose child killed while the containers are being made): the next tick
/// clears compose's leftovers and finishes the apply from disk, without an OpenBao read.
#[test]
fn an_apply_killed_at_any_step_is_finished_by_the_next_tick() {
    for point in [
        "before-swap",
        "before-up",
        "during-up",
        "after-up",
        "before-save",
    ] {
        let Some(b) = E2eBox::new(&format!("kill-{point}")) else {
            return;
        };
        b.first_apply(&b.bundle(&b.e2e.image_1));
        let second = b.w.publish(&b.bundle(&b.e2e.image_2));
        if point == "during-up" {
            kill_during_up(&b);
        } else {
            let out =
                b.w.command(&["run", "--once"])
                    .env("MONKY_DEPLOYD_FAILPOINT", point)
                    .output()
                    .unwrap();
            assert_eq!(out.status.code(), None, "{point}: killed by a signal");
        }
        assert!(b.w.env_dir().join("applying").exists(), "{point}: the mark");
        b.w.run(&["explain"]).ok().prints(&["cut short"]);
        let from = b.w.requests().len();
        let run = b.w.tick();
        run.ok();
        let r = b.w.last_report();
        assert_eq!(r.result, ReportResult::Applied, "{point}: {r:?}");
        assert!(
            r.detail
                .as_deref()
                .is_some_and(|d| d.starts_with("APPLY_INTERRUPTED: finished the apply of")),
            "{point}: {r:?}"
        );
        assert_eq!(
            b.endpoints_since(from),
            [Some(Endpoint::Checkin), Some(Endpoint::Report)],
            "{point}: no bundle, no lease"
        );
        assert_eq!(b.w.state()["applied_sha"], json!(second), "{point}");
        assert_eq!(b.current(), Some(release(&second)), "{point}");
        assert_healthy(&b.project.containers(), &b.project.name);
        assert_eq!(get_200(b.port, "/variant.txt").trim(), "2", "{point}");
        assert!(!b.w.env_dir().join("applying").exists(), "{point}");
        assert_no_secret(&b, &run);
    }
}

/// Runs a tick and kills it, and every process it started, once compose has begun making the
/// new release's containers: what a power cut in the middle of `compose up` leaves.
fn kill_during_up(b: &E2eBox) {
    let mut child = b.w.command(&["run", "--once"]).spawn().unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(120);
    // The mark is written before `current` moves; compose's `up` follows it.
    loop {
        assert!(Instant::now() < deadline, "the apply never reached up");
        if descendants(pid)
            .iter()
            .any(|p| cmdline(*p).split('\0').any(|a| a == "up"))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut victims = descendants(pid);
    victims.push(pid);
    for p in victims {
        let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
    }
    let _ = child.wait();
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Every process below `pid` (children of any depth), from /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let parent_of = |p: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        // The fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split_whitespace().nth(1)?.parse().ok()
    };
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for c in all.iter().copied().filter(|c| parent_of(*c) == Some(p)) {
            out.push(c);
            frontier.push(c);
        }
    }
    out
}

/// A held box on the real engine: tenancy's apply and retire and a drift change nothing; the
/// hold ends at its --until and the next tick converges.
#[test]
fn a_held_box_is_not_changed_and_unholds_at_its_until() {
    let Some(b) = E2eBox::new("held") else {
        return;
    };
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    b.w.run(&["hold", "--reason", "disk swap", "--until", "1h"])
        .ok();
    let before = b.project.containers();

    let second = b.w.publish(&b.bundle(&b.e2e.image_2));
    b.w.tick().ok();
    let r = b.w.last_report();
    assert!(
        r.detail
            .as_deref()
            .is_some_and(|d| d.starts_with("HELD: disk swap")),
        "{r:?}"
    );
    assert_eq!(
        r.hold.as_ref().and_then(|h| h.reason.as_deref()),
        Some("disk swap")
    );
    assert_eq!(
        b.project.containers(),
        before,
        "an apply changed a held box"
    );
    assert_eq!(b.current(), Some(release(&first)));

    b.w.tenancy.set_desired(ENV, Desired::down(true));
    b.w.tick().ok();
    assert_eq!(
        b.project.containers(),
        before,
        "a retire changed a held box"
    );

    // A service stopped during the hold is the operator's doing: held, exit 0, not healed.
    b.project.docker_ok(["stop", "-t", "1", &b.web()]);
    let stopped = b.project.containers();
    b.w.tick().ok();
    assert_eq!(b.project.containers(), stopped, "a heal changed a held box");
    let detail = b.w.last_report().detail.unwrap();
    assert!(
        detail.starts_with("HELD: disk swap") && detail.contains("not running and healthy: "),
        "{detail}"
    );

    // The hour passes (the hold's end moved into the past on both clocks, as time would).
    let path = b.w.state_dir().join("hold");
    let mut hold: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    hold["until"] = json!(1);
    hold["until_boot"]["at_s"] = json!(1);
    std::fs::write(&path, hold.to_string()).unwrap();
    b.w.tenancy.set_desired(ENV, Desired::sha(second.clone()));
    b.w.tick().ok();
    assert_report(&b.w.last_report(), ReportResult::Applied, None);
    assert_eq!(b.current(), Some(release(&second)));
    assert_healthy(&b.project.containers(), &b.project.name);
    assert!(!path.exists());
}

/// The verdict of `doctor --json`'s check `name`, and its whole document.
fn doctor_verdict(doc: &Value, name: &str) -> String {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .map(|c| c["verdict"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("no check {name}: {doc:#}"))
}

/// A token revoked at the real OpenBao, its grant superseded at tenancy: the tick that sees it
/// and every tick after name the cause (not `NO_CREDENTIALS`), as do `status`, `explain`,
/// `doctor` and the metrics, until the box has a token again. OPERATIONS.md's "Rotate the
/// token", followed line by line as written, ends with a green `doctor`, and the next tick
/// applies with the new token.
#[test]
fn a_lost_token_keeps_its_cause_and_the_rotation_runbook_ends_green() {
    let Some(b) = E2eBox::new("token-runbook") else {
        return;
    };
    let metrics = b.w.state_dir().join("metrics.prom");
    b.w.config_extra(&format!("metrics_textfile: {}\n", metrics.display()));
    let sha = b.first_apply(&b.bundle(&b.e2e.image_1));
    b.w.tenancy.supersede(ENV);
    assert!(b.w.bao.revoke_tokens_for_env(ENV) >= 1);
    for _ in 0..3 {
        let run = b.w.tick();
        run.expect(1);
        run.says(&[
            "AGENT_UNAUTHENTICATED",
            "the token was revoked or superseded by tenancy",
        ]);
        assert!(!run.stderr().contains("NO_CREDENTIALS"), "{}", run.stderr());
    }
    assert_eq!(b.w.state()["last_code"], "AGENT_UNAUTHENTICATED");
    let status: Value =
        serde_json::from_str(&b.w.run(&["status", "--json"]).ok().stdout()).unwrap();
    assert_eq!(status["token"]["lost"]["cause"], "revoked", "{status:#}");
    b.w.run(&["status"])
        .ok()
        .prints(&["absent: the token was revoked or superseded by tenancy"]);
    b.w.run(&["explain"])
        .ok()
        .prints(&["none: the token was revoked or superseded by tenancy"]);
    let text = std::fs::read_to_string(&metrics).unwrap();
    assert!(
        text.contains(&format!(
            "monky_deployd_token_lost{{env_id=\"{ENV}\",cause=\"revoked\"}} 1"
        )),
        "{text}"
    );
    let doctor = b.w.run(&["doctor", "--json"]);
    doctor.expect(1);
    let doc: Value = serde_json::from_str(&doctor.stdout()).unwrap();
    assert_eq!(doctor_verdict(&doc, "token"), "fail", "{doc:#}");
    assert!(
        !doctor.stdout().contains("wait for the next apply"),
        "no apply leases without a token: {}",
        doctor.stdout()
    );

    for line in crate::runbooks::commands("Rotate the token") {
        if let Some(run) = crate::runbooks::run_line(&b.w, &line, &[]) {
            assert_eq!(run.code(), 0, "{line}: {}{}", run.stdout(), run.stderr());
        }
    }
    let doc: Value = serde_json::from_str(&b.w.run(&["doctor", "--json"]).ok().stdout()).unwrap();
    for check in doc["checks"].as_array().unwrap() {
        assert_ne!(check["verdict"], "fail", "{check:#}");
    }
    assert_eq!(doctor_verdict(&doc, "token"), "ok", "{doc:#}");
    assert_eq!(doctor_verdict(&doc, "last tick"), "ok", "{doc:#}");
    b.w.tick().ok();
    let r = b.w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    let status: Value =
        serde_json::from_str(&b.w.run(&["status", "--json"]).ok().stdout()).unwrap();
    assert_eq!(status["token"]["present"], true, "{status:#}");
    assert!(status["token"].get("lost").is_none(), "{status:#}");
    assert!(
        std::fs::read_to_string(&metrics)
            .unwrap()
            .contains("cause=\"revoked\"} 0")
    );
}

/// A fresh install before its first tick: the kit staged a valid grant and nothing ran yet.
/// `explain` and `doctor` read it as the first tick's login, not as a failure; the first tick
/// then logs in and applies.
#[test]
fn a_fresh_install_before_its_first_tick_reads_as_the_first_login() {
    let Some(b) = E2eBox::new("fresh-install") else {
        return;
    };
    // What the package and the kit leave: the state dir (0700, the agent's) and the grant.
    std::fs::create_dir_all(b.w.state_dir()).unwrap();
    std::fs::set_permissions(
        b.w.state_dir(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    b.w.stage_grant();
    let sha = b.w.publish(&b.bundle(&b.e2e.image_1));
    let explain = b.w.run(&["explain"]);
    explain.ok().prints(&[
        "before the first tick",
        "none yet: the first tick will log in with the staged bootstrap grant",
        "the next tick logs in with the staged bootstrap grant",
    ]);
    assert!(
        !explain.stdout().contains("re-run the install kit"),
        "{}",
        explain.stdout()
    );
    let doctor = b.w.run(&["doctor", "--json"]);
    let doc: Value = serde_json::from_str(&doctor.stdout()).unwrap();
    assert_eq!(doctor_verdict(&doc, "grant"), "ok", "{doc:#}");
    assert_eq!(doctor_verdict(&doc, "token"), "skip", "{doc:#}");
    assert!(
        doctor.stdout().contains("the first tick will log in"),
        "{}",
        doctor.stdout()
    );
    doctor.ok();
    let status: Value =
        serde_json::from_str(&b.w.run(&["status", "--json"]).ok().stdout()).unwrap();
    assert_eq!(status["token"]["grant_staged"], true, "{status:#}");

    b.w.tick().ok();
    let r = b.w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
}

/// Tenancy away (503) for three of the token's TTLs on the real engine and the real OpenBao:
/// every heartbeat renews the token at OpenBao alone, the release keeps running, and when
/// tenancy is back the same token checks in: no lease, no kit.
#[test]
fn the_token_outlives_a_tenancy_outage_on_the_real_engine() {
    let Some(b) = E2eBox::new("outage") else {
        return;
    };
    let sha = b.first_apply(&b.bundle(&b.e2e.image_1));
    // An 8 s role TTL from now on, and a token minted under it (the apply ran under the
    // default, so its pull and health wait did not race the TTL).
    let ttl = Duration::from_secs(8);
    b.w.bao.set_token_ttl(ttl);
    b.w.stage_grant();
    b.w.run(&["bootstrap", "--force"]).ok();
    let token = std::fs::read(b.w.state_dir().join("bao.token")).unwrap();
    let leases = b.w.tenancy.lease_count(ENV);

    b.w.tenancy.set_fault(
        Endpoint::Checkin,
        monky_testkit::tenancy::Fault::Status {
            status: 503,
            body: r#"{"code":"UNAVAILABLE","detail":"maintenance"}"#.into(),
        },
    );
    let started = Instant::now();
    let mut ticks = 0;
    while started.elapsed() < ttl * 3 + Duration::from_secs(1) {
        let run = b.w.tick();
        run.expect(75);
        run.says(&["token renewed (ttl 8s)"]);
        ticks += 1;
        std::thread::sleep(Duration::from_secs(2));
    }
    assert!(ticks >= 4, "{ticks} ticks");

    b.w.tenancy.clear_faults();
    b.w.tick().ok();
    let r = b.w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert_eq!(
        std::fs::read(b.w.state_dir().join("bao.token")).unwrap(),
        token,
        "the same token, kept alive"
    );
    assert_eq!(b.w.tenancy.lease_count(ENV), leases, "no lease was needed");
    assert_healthy(&b.project.containers(), &b.project.name);
}

// ---- the docker daemon restarted -----------------------------------------------------------------

/// Stops the docker daemon and brings it back with the same command line and environment,
/// unless whatever supervises it (systemd, the machine's init) does so first. The caller holds
/// `ENGINE` for writing, so no other test's project is on the engine meanwhile.
fn restart_dockerd(docker: &Path) {
    let pid: u32 = std::fs::read_to_string("/var/run/docker.pid")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .or_else(|| {
            let out = Command::new("pidof").arg("dockerd").output().ok()?;
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .expect("the docker daemon's pid (/var/run/docker.pid or pidof dockerd)");
    let proc_file = |name: &str| std::fs::read(format!("/proc/{pid}/{name}")).unwrap();
    let split = |raw: Vec<u8>| -> Vec<String> {
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    };
    let argv = split(proc_file("cmdline"));
    let env: Vec<(String, String)> = split(proc_file("environ"))
        .into_iter()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    let answers = || {
        Command::new(docker)
            .args(["info", "--format", "{{.ID}}"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let until = |what: &str, secs: u64, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !done() {
            assert!(Instant::now() < deadline, "{what} within {secs} s");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -TERM {pid}");
    until("the docker daemon stopped", 90, &|| {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    // A supervisor that restarts it is given a few seconds; else it is started here, detached
    // in a session of its own so that it outlives this test process.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !answers() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
    }
    if !answers() {
        Command::new("setsid")
            .arg("-f")
            .args(&argv)
            .env_clear()
            .envs(env)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("start the docker daemon again");
    }
    until("the docker daemon answering again", 120, &answers);
}

/// After the docker daemon restarts, a service with no restart policy stays exited: docker
/// does not bring it back, so it is drift, and the next tick heals it without tenancy's apply
/// or OpenBao, as it heals a container stopped by hand.
#[test]
fn a_service_without_a_restart_policy_comes_back_after_a_daemon_restart() {
    // The engine alone: every other real-engine test waits, or has finished.
    let _alone = ENGINE
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    ENGINE_ALONE.set(true);
    let Some(b) = E2eBox::new("dockerd") else {
        return;
    };
    let sha = b.first_apply(&b.bundle(&b.e2e.image_1));
    let web = b.web();
    restart_dockerd(&b.e2e.docker);
    let state = b
        .project
        .docker_ok(["inspect", "--format", "{{.State.Status}}", &web]);
    assert_eq!(
        state.trim(),
        "exited",
        "docker brought back a container without a policy"
    );

    let from = b.w.requests().len();
    let run = b.w.tick();
    run.ok();
    let r = b.w.last_report();
    assert_eq!(r.result, ReportResult::Applied, "{r:?}");
    let detail = r.detail.clone().unwrap_or_default();
    assert!(
        detail.starts_with("HEALED: ") && detail.contains("web exited"),
        "{detail}"
    );
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert_eq!(
        b.endpoints_since(from),
        [Some(Endpoint::Checkin), Some(Endpoint::Report)]
    );
    assert_healthy(&b.project.containers(), &b.project.name);
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");
    assert_no_secret(&b, &run);
}

// ---- the budget's supplied defaults ------------------------------------------------------------

/// `(Memory, PidsLimit, LogConfig)` of the project's one container, as the engine holds them.
/// An elasticsearch-like service's `ulimits` (`nproc: 4096` beside `nofile`)
/// apply as asked on the real engine: no refusal, the container runs with them, and `doctor`
/// says what the per-uid count means instead of refusing.
#[test]
fn an_elasticsearch_like_nproc_ulimit_applies() {
    let Some(b) = E2eBox::new("es-nproc") else {
        return;
    };
    let es = web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        "    ulimits:\n      nproc: 4096\n      nofile: {soft: 1024, hard: 1024}\n    \
         mem_limit: 512m\n",
        &[],
    ));
    b.first_apply(&es);
    assert_healthy(&b.project.containers(), &b.project.name);
    let ids = b.project.ids("container");
    let text = b.project.docker_ok([
        "inspect",
        "--format",
        "{{json .HostConfig.Ulimits}}",
        ids[0].as_str(),
    ]);
    let ulimits: Value = serde_json::from_str(text.trim()).unwrap();
    let nproc = ulimits
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["Name"] == "nproc")
        .unwrap_or_else(|| panic!("{ulimits}"));
    assert_eq!(
        (nproc["Soft"].as_i64(), nproc["Hard"].as_i64()),
        (Some(4096), Some(4096))
    );
    let doctor = b.w.run(&["doctor", "--json"]);
    let doc: Value = serde_json::from_str(&doctor.stdout()).unwrap();
    assert_eq!(doctor_verdict(&doc, "ulimits"), "warn", "{doc:#}");
    assert!(
        doctor.stdout().contains("web: ulimits nproc 4096"),
        "{}",
        doctor.stdout()
    );
}

/// `$PWD` in a compose file is the release dir, as a shell there would have it: compose runs
/// with `PWD` set to it, the policy judges `${PWD}/bundle.json` as the release's own file
/// (no host path refused, no hint to allow `/bundle.json`), and the container gets that file.
#[test]
fn pwd_in_a_compose_file_is_the_release_dir() {
    let Some(b) = E2eBox::new("pwd") else {
        return;
    };
    let bundle = web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        "",
        &["${PWD}/bundle.json:/srv/bundle.json:ro"],
    ));
    let sha = b.first_apply(&bundle);
    assert_healthy(&b.project.containers(), &b.project.name);
    let ids = b.project.ids("container");
    let text = b
        .project
        .docker_ok(["inspect", "--format", "{{json .Mounts}}", ids[0].as_str()]);
    let mounts: Value = serde_json::from_str(text.trim()).unwrap();
    let source = mounts
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["Destination"] == "/srv/bundle.json")
        .and_then(|m| m["Source"].as_str())
        .unwrap_or_else(|| panic!("{mounts}"))
        .to_string();
    let release_dir = std::fs::canonicalize(b.w.env_dir().join("releases").join(&sha)).unwrap();
    // compose runs in the env's `current` link to the release, as relative paths resolve too.
    assert_eq!(
        std::fs::canonicalize(&source).unwrap(),
        release_dir.join("bundle.json"),
        "{mounts}"
    );
}

fn limits_of(project: &Project) -> (u64, i64, Value) {
    let ids = project.ids("container");
    assert_eq!(ids.len(), 1, "{ids:?}");
    let text = project.docker_ok([
        "inspect",
        "--format",
        "{{json .HostConfig}}",
        ids[0].as_str(),
    ]);
    let host: Value = serde_json::from_str(text.trim()).unwrap();
    (
        host["Memory"].as_u64().unwrap(),
        host["PidsLimit"].as_i64().unwrap(),
        host["LogConfig"].clone(),
    )
}

#[test]
fn the_supplied_memory_pids_and_logging_land_in_the_containers_host_config() {
    let Some(b) = E2eBox::new("supplied") else {
        return;
    };
    // A service that says nothing: the box's defaults, not the daemon's unbounded json-file.
    b.first_apply(&b.bundle(&b.e2e.image_1));
    let (memory, pids, log) = limits_of(&b.project);
    let host = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let kb = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            kb.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(u64::MAX, |kb| kb * 1024);
    assert_eq!(memory, (2u64 << 30).min(host));
    assert_eq!(pids, 1024);
    assert_eq!(
        log,
        json!({"Type": "json-file", "Config": {"max-size": "10485760", "max-file": "3"}})
    );

    // Options without a driver: json-file, the bundle's max-size kept, the box's max-file
    // added; the bundle's own memory limit kept.
    let compose = compose_yaml(
        b.e2e,
        &b.e2e.image_2,
        Some(b.port),
        "    mem_limit: 256m\n    logging:\n      options: {max-size: 5m}\n",
        &[],
    );
    b.w.publish(&web_bundle(compose));
    b.w.tick().ok();
    assert_report(&b.w.last_report(), ReportResult::Applied, None);
    let (memory, pids, log) = limits_of(&b.project);
    assert_eq!((memory, pids), (256 << 20, 1024));
    assert_eq!(
        log,
        json!({"Type": "json-file", "Config": {"max-size": "5m", "max-file": "3"}})
    );
}

/// An image already on the engine proves nothing: with no registry credential for this env, a
/// bundle whose `pull_policy` would skip the pull (the image is there, built and pushed by
/// setup) is pulled anyway, refused by the registry, and nothing starts.
#[test]
fn an_image_on_the_engine_this_env_cannot_pull_never_runs() {
    let Some(b) = E2eBox::new("image-unproven") else {
        return;
    };
    let image = b.e2e.image_1.clone();
    let on_engine = Command::new(&b.e2e.docker)
        .args(["image", "inspect", "--format", "{{.Id}}", &image])
        .output()
        .unwrap();
    assert!(
        on_engine.status.success(),
        "setup left {image} on the engine"
    );
    b.w.stage_grant();
    for policy in ["never", "missing", "if_not_present"] {
        let mut bundle = b.bundle(&image);
        bundle.compose = bundle.compose.replacen(
            "    env_file: .env\n",
            &format!("    env_file: .env\n    pull_policy: {policy}\n"),
            1,
        );
        bundle.manifest["entries"]
            .as_array_mut()
            .unwrap()
            .retain(|e| e.get("use").is_none());
        // Past the failed sha's backoff and tenancy's checkin bucket.
        b.w.tenancy.advance_clock(Duration::from_secs(3600 * 2));
        check_pull_failure(
            &b,
            &bundle,
            "COMPOSE_PULL_FAILED",
            &["no basic auth credentials"],
            None,
        );
        assert!(
            b.project.containers().is_empty(),
            "{policy}: a container started"
        );
    }
}

/// Names no other env can own, on the real engine: env B (`<project>-b`) runs a container;
/// this env's bundle names its own container `<project>-b-web-1` (B's default name), or
/// declares a volume whose name a hand-made volume already has. Each is refused before
/// anything starts, naming both projects, and B's container is untouched.
#[test]
fn a_name_another_env_owns_is_refused_before_anything_starts() {
    let Some(b) = E2eBox::new("names") else {
        return;
    };
    let victim = format!("{}-b", b.project.name);
    // Not compose's default form (`<project>-<service>-<n>`, refused by spelling before the
    // lease whoever holds it): a name only what is on the box says is another's.
    let victims_web = format!("{victim}-web");
    b.run_by_hand(
        &victims_web,
        &b.e2e.image_1,
        &[("com.docker.compose.project".into(), victim.clone())],
    );
    let by_hand_volume = format!("{}_data", b.project.name);
    b.project.docker_ok(["volume", "create", &by_hand_volume]);
    b.w.stage_grant();

    let mut taking = b.bundle(&b.e2e.image_1);
    taking.compose = taking.compose.replacen(
        "    env_file: .env\n",
        &format!("    env_file: .env\n    container_name: {victims_web}\n"),
        1,
    );
    b.w.publish(&taking);
    b.w.tick().expect(1);
    let r = b.w.last_report();
    assert_report(&r, ReportResult::Failed, Some("BUNDLE_NONCONFORMING: "));
    let detail = r.detail.unwrap_or_default();
    assert!(
        detail.contains(&format!(
            "container {victims_web} is project {victim}'s name, not {}'s",
            b.project.name
        )),
        "{detail}"
    );
    // The default bundle's volume `data` is `<project>_data`, which the hand-made one holds.
    assert!(
        detail.contains(&format!("volume {by_hand_volume} exists, made by hand")),
        "{detail}"
    );
    assert!(b.project.containers().is_empty(), "a container started");
    let state = b
        .project
        .docker_ok(["inspect", "--format", "{{.State.Status}}", &victims_web]);
    assert_eq!(state.trim(), "running", "B's container was touched");
    b.project.docker_ok(["rm", "-f", &victims_web]);
    b.project.docker_ok(["volume", "rm", &by_hand_volume]);
}

/// A Django- or Rails-shaped stack on the real engine: a database stand-in, a migration that
/// runs once after it is healthy, a web service that waits for the migration to complete, a
/// worker, and a seed job nothing waits for (`restart: "no"`). It applies and is healthy, its
/// heartbeats report it applied with the one-shots exited 0, a heal brings back a removed web
/// container, and a migration that fails fails the apply with its own output, keeping the
/// running release.
#[test]
fn a_stack_with_one_shot_services_applies_stays_up_and_heals() {
    let Some(b) = E2eBox::new("oneshot") else {
        return;
    };
    b.w.tenancy.set_limits(RateLimits {
        checkin: Rate::per_minute(60),
        ..RateLimits::default()
    });
    let image = &b.e2e.image_1;
    let stack = |migrate_exit: u8| {
        let mut y = String::from("services:\n");
        y.push_str(&format!("  db:\n    image: {image}\n    env_file: .env\n"));
        y.push_str(&format!(
            "  migrate:\n    image: {image}\n    restart: \"no\"\n    healthcheck: {{disable: true}}\n\
             \x20   entrypoint: [/bin/sh, -c, \"echo applying migration 0042; exit {migrate_exit}\"]\n\
             \x20   depends_on: {{db: {{condition: service_healthy}}}}\n"
        ));
        y.push_str(&format!(
            "  web:\n    image: {image}\n    env_file: .env\n    ports:\n      - \"127.0.0.1:{}:{}\"\n\
             \x20   depends_on:\n      migrate: {{condition: service_completed_successfully}}\n\
             \x20     db: {{condition: service_healthy}}\n",
            b.port, b.e2e.web_port
        ));
        y.push_str(&format!(
            "  worker:\n    image: {image}\n    env_file: .env\n    depends_on: [db]\n"
        ));
        y.push_str(&format!(
            "  seed:\n    image: {image}\n    restart: \"no\"\n    healthcheck: {{disable: true}}\n\
             \x20   entrypoint: [/bin/sh, -c, \"echo seeded\"]\n"
        ));
        web_bundle(y)
    };
    let sha = b.first_apply(&stack(0));
    let seen = b.project.containers();
    let state_of = |seen: &[Seen], service: &str| {
        seen.iter()
            .find(|c| c.name.ends_with(&format!("-{service}-1")))
            .map(|c| c.state.clone())
            .unwrap_or_else(|| panic!("no {service} in {seen:?}"))
    };
    for one_shot in ["migrate", "seed"] {
        assert_eq!(state_of(&seen, one_shot), "exited", "{seen:?}");
    }
    for service in ["db", "web", "worker"] {
        assert_eq!(state_of(&seen, service), "running", "{seen:?}");
    }
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");

    // Heartbeats: applied, the completed one-shots are done, not down.
    for _ in 0..2 {
        b.w.tick().ok();
        assert_report(&b.w.last_report(), ReportResult::Applied, None);
    }
    b.w.run(&["status"]).ok().prints(&["converged      true"]);

    // A heal: the web container removed by hand comes back.
    b.project.docker_ok(["rm", "-f", &b.web()]);
    b.w.tick().ok();
    assert_report(
        &b.w.last_report(),
        ReportResult::Applied,
        Some("HEALED: web missing"),
    );
    assert_eq!(state_of(&b.project.containers(), "web"), "running");

    // A migration that fails: the apply fails with the migration's own words, and the
    // running release stays.
    b.w.publish(&stack(3));
    b.w.tick().expect(1);
    let r = b.w.last_report();
    assert_eq!(r.result, ReportResult::Failed, "{r:?}");
    let detail = r.detail.clone().unwrap_or_default();
    assert!(detail.contains("migrate"), "{detail}");
    let logs = b.w.run(&["logs"]);
    assert!(
        format!("{detail}\n{}", logs.stdout()).contains("applying migration 0042"),
        "the migration's output: {detail}\n{}",
        logs.stdout()
    );
    assert_eq!(b.w.state()["applied_sha"], json!(sha));
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");
}

/// A key only compose's YAML parser would see (an `env_file` of the box's `/etc/os-release`
/// after a U+2028 in a comment) on the real engine: the release applies from the agent's own
/// rewrite, and the container's environment holds nothing of the host file.
#[test]
fn a_key_hidden_from_the_agents_parser_never_reaches_a_container() {
    let Some(b) = E2eBox::new("hidden-key") else {
        return;
    };
    let mut bundle = b.bundle(&b.e2e.image_1);
    // The agent's parser sees a service with no env_file; go-yaml sees this one.
    bundle.compose = bundle.compose.replacen(
        "    env_file: .env\n",
        "    labels: {a: b} # note\u{2028}    env_file: [.env, /etc/os-release]\n",
        1,
    );
    b.first_apply(&bundle);
    let env = b
        .project
        .docker_ok(["inspect", "--format", "{{json .Config.Env}}", &b.web()]);
    for host_key in ["PRETTY_NAME", "VERSION_CODENAME", "ID_LIKE"] {
        assert!(
            !env.contains(host_key),
            "{host_key} reached the container: {env}"
        );
    }
}

/// Release 2 fails its healthcheck and waits out its backoff; release 1 runs again. Its web
/// container is then removed by hand: the next tick, still backing off from 2, heals 1 on the
/// real engine, and the report names the heal, not "running".
#[test]
fn the_running_release_is_healed_while_the_new_sha_backs_off() {
    let Some(b) = E2eBox::with_timeout("heal-in-backoff", 20) else {
        return;
    };
    b.w.tenancy.set_limits(RateLimits {
        checkin: Rate::per_minute(60),
        ..RateLimits::default()
    });
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    b.w.publish(&b.bundle(&b.e2e.image_bad));
    b.w.tick().expect(1);
    assert_eq!(b.w.state()["applied_sha"], json!(first));
    assert_healthy(&b.project.containers(), &b.project.name);

    b.project.docker_ok(["rm", "-f", &b.web()]);
    let leases = b.w.tenancy.lease_count(ENV);
    b.w.tick().ok();
    let r = b.w.last_report();
    assert_report(&r, ReportResult::Applied, Some("HEALED: web missing"));
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(first.as_str()));
    assert_eq!(
        b.w.tenancy.lease_count(ENV),
        leases,
        "the backing-off sha was not tried"
    );
    assert_healthy(&b.project.containers(), &b.project.name);
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");
}

/// A container's published port is never a peer: docker's proxy for it runs as root, whom the
/// listener check trusts as the tunneler's user, yet it serves whatever the container (any
/// env's bundle) answers. The agent sends nothing there and names docker-proxy.
#[test]
fn a_published_port_on_tenancys_address_is_never_a_peer() {
    let Some(b) = E2eBox::new("published-peer") else {
        return;
    };
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    let seen_by_tenancy = b.w.requests().len();
    let text = std::fs::read_to_string(b.w.config_path()).unwrap();
    let from = text
        .lines()
        .find(|l| l.starts_with("  base_url: "))
        .expect("a system-transport tenancy url")
        .to_owned();
    let to = format!("  base_url: http://127.0.0.1:{}/", b.port);
    std::fs::write(b.w.config_path(), text.replace(&from, &to)).unwrap();
    let run = b.w.tick();
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(
        run.stderr().contains("TENANCY_LISTENER_UNTRUSTED")
            && run.stderr().contains("docker-proxy"),
        "{}",
        run.stderr()
    );
    assert_eq!(b.w.requests().len(), seen_by_tenancy);
    // An agent that cannot see root's processes (the unit's ProtectProc=invisible; here a
    // pid namespace of its own) asks the engine who publishes the port, with the same verdict.
    let agent = b.w.command(&["run", "--once"]);
    let mut hidden = Command::new("unshare");
    hidden
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(agent.get_program())
        .args(agent.get_args());
    for (k, v) in agent.get_envs() {
        match v {
            Some(v) => hidden.env(k, v),
            None => hidden.env_remove(k),
        };
    }
    if let Some(dir) = agent.get_current_dir() {
        hidden.current_dir(dir);
    }
    let run = Run(hidden.output().unwrap());
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(
        run.stderr().contains("TENANCY_LISTENER_UNTRUSTED")
            && run.stderr().contains("a port a container publishes"),
        "{}",
        run.stderr()
    );
    assert_eq!(b.w.requests().len(), seen_by_tenancy);
    assert_eq!(b.current(), Some(release(&first)));
    assert_no_secret(&b, &run);
}

/// A worker that dies by its own exit on the real engine (`exit 3` after a panic line, when the
/// test tells it to): the first death is healed, the second within the hour is a crash loop, and
/// from then on every view says the same from the one record: the tick's exit code and report,
/// `status`, `explain`, doctor and the metrics, on the crash loop's tick and on the heartbeat
/// after it, with the bundle author as owner throughout, and the worker's own last line in the
/// journal and `explain`.
#[test]
fn a_service_that_keeps_dying_is_a_crash_loop_on_the_real_engine() {
    let Some(b) = E2eBox::new("crash-loop") else {
        return;
    };
    let prom = b.w.path("metrics/monky-deployd.prom");
    std::fs::create_dir_all(prom.parent().unwrap()).unwrap();
    b.w.config_extra(&format!("metrics_textfile: {}\n", prom.display()));
    let worker = format!(
        "  worker:\n    image: {}\n    env_file: .env\n    healthcheck: {{disable: true}}\n\
         \x20   entrypoint: [/bin/sh, -c, \"while [ ! -e /tmp/die ]; do sleep 0.2; done; rm -f /tmp/die; \
         echo 'panic: lost connection to queue'; exit 3\"]\n",
        b.e2e.image_1
    );
    b.first_apply(&web_bundle(with_service(
        compose_yaml(b.e2e, &b.e2e.image_1, Some(b.port), "", &[]),
        &worker,
    )));
    let name = format!("{}-worker-1", b.project.name);
    let die = || {
        b.project.docker_ok(["exec", &name, "touch", "/tmp/die"]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while b
            .project
            .docker_ok(["inspect", "--format", "{{.State.Status}}", &name])
            .trim()
            != "exited"
        {
            assert!(Instant::now() < deadline, "the worker exits when told");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let said = |run: &Run| {
        assert!(
            run.stderr().contains("panic: lost connection to queue"),
            "the worker's own last line in the journal: {}",
            run.stderr()
        );
    };

    die();
    let run = b.w.tick();
    run.ok();
    said(&run);
    let detail = b.w.last_report().detail.unwrap();
    assert!(detail.starts_with("HEALED: worker exited (3)"), "{detail}");

    die();
    // Within the heal backoff the death is drift, waiting: not converged either.
    b.w.tick().expect(1);
    let detail = b.w.last_report().detail.unwrap();
    assert!(detail.starts_with("DRIFT: worker exited (3)"), "{detail}");
    // The next heal (now, as the backoff's end would) is the second within the hour.
    let run = b.w.run(&["run", "--once", "--force"]);
    run.expect(1);
    said(&run);
    let views_agree = |run: &Run| {
        run.expect(1);
        let r = b.w.last_report();
        assert_report(&r, ReportResult::Failed, Some("CRASH_LOOP: "));
        let detail = r.detail.clone().unwrap();
        for text in [
            "worker died by its own exit with exit code 3 again within the hour",
            "(2 heals",
            "panic: lost connection to queue",
        ] {
            assert!(detail.contains(text), "{text:?} not in {detail}");
        }
        let status: Value = serde_json::from_str(&b.w.run(&["status", "--json"]).stdout()).unwrap();
        assert_eq!(status["converged"], false, "{status:#}");
        assert!(status.to_string().contains("CRASH_LOOP"), "{status:#}");
        let metrics = std::fs::read_to_string(&prom).unwrap();
        for line in [
            "monky_deployd_crash_loop{env_id=\"env-qa-02\"} 1",
            "monky_deployd_converged{env_id=\"env-qa-02\"} 0",
            "monky_deployd_exit_code{env_id=\"env-qa-02\"} 1",
        ] {
            assert!(metrics.contains(line), "{line} not in {metrics}");
        }
        b.w.run(&["explain"]).ok().prints(&[
            "CRASH_LOOP",
            "panic: lost connection to queue",
            "whose move  bundle author",
        ]);
        b.w.run(&["doctor"])
            .prints(&["CRASH_LOOP", "bundle author's move"]);
    };
    views_agree(&run);
    // Brought back, and running: the heartbeat after it says the same.
    assert_eq!(
        b.project
            .docker_ok(["inspect", "--format", "{{.State.Status}}", &name])
            .trim(),
        "running"
    );
    views_agree(&b.w.tick());
    // It dies again inside the heal backoff: still the crash loop, still the bundle author's.
    die();
    b.w.tick().expect(1);
    let detail = b.w.last_report().detail.unwrap();
    assert!(
        detail.starts_with("CRASH_LOOP: worker exited (3)"),
        "{detail}"
    );
    b.w.run(&["explain"])
        .ok()
        .prints(&["whose move  bundle author"]);
    assert_no_secret(&b, &run);
}

/// The next tick after a stop from outside: healed at once, named and counted as a stop from
/// outside (the `n`-th within the hour), and every view says converged and no crash loop.
#[track_caller]
fn assert_healed_from_outside(b: &E2eBox, prom: &Path, n: u32) {
    let run = b.w.tick();
    run.ok();
    let r = b.w.last_report();
    assert_eq!(r.result, ReportResult::Applied, "{r:?}");
    let detail = r.detail.clone().unwrap_or_default();
    assert!(
        detail.starts_with("HEALED: web exited (")
            && detail.contains("stopped from outside")
            && detail.contains(&format!("({n} stop(s) from outside within the hour)")),
        "{detail}"
    );
    assert_healthy(&b.project.containers(), &b.project.name);
    let status: Value = serde_json::from_str(&b.w.run(&["status", "--json"]).stdout()).unwrap();
    assert_eq!(status["converged"], true, "{status:#}");
    let metrics = std::fs::read_to_string(prom).unwrap();
    for line in [
        "monky_deployd_crash_loop{env_id=\"env-qa-02\"} 0",
        "monky_deployd_converged{env_id=\"env-qa-02\"} 1",
        "monky_deployd_exit_code{env_id=\"env-qa-02\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
    b.w.run(&["explain"])
        .ok()
        .prints(&["converged", "stopped from outside"]);
}

/// A box on the real engine with a metrics file, its web applied; the file's path.
fn applied_with_metrics(b: &E2eBox) -> PathBuf {
    let prom = b.w.path("metrics/monky-deployd.prom");
    std::fs::create_dir_all(prom.parent().unwrap()).unwrap();
    b.w.config_extra(&format!("metrics_textfile: {}\n", prom.display()));
    b.first_apply(&b.bundle(&b.e2e.image_1));
    prom
}

/// An operator's `docker stop` (the web exits 0 on its SIGTERM), twice within the heal backoff:
/// each is healed at once, named and counted as a stop from outside, the box admin's, and is
/// no crash loop.
#[test]
fn a_docker_stop_is_healed_at_once_and_no_crash_loop() {
    let Some(b) = E2eBox::new("stopped-by-hand") else {
        return;
    };
    let prom = applied_with_metrics(&b);
    for n in 1..=2 {
        b.project.docker_ok(["stop", "-t", "1", &b.web()]);
        assert_healed_from_outside(&b, &prom, n);
    }
}

/// Stops from outside are no crash loop: an operator's `docker stop`, then an engine restart,
/// each healed at once (no heal backoff to wait out), named as a stop from outside with the box
/// admin as owner and counted; the box stays converged and nothing pages. The engine restart
/// holds the engine alone, as the other daemon restart does.
#[test]
fn a_docker_stop_then_an_engine_restart_is_no_crash_loop() {
    let _alone = ENGINE
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    ENGINE_ALONE.set(true);
    let Some(b) = E2eBox::new("stopped-outside") else {
        return;
    };
    let prom = applied_with_metrics(&b);
    let web = b.web();
    b.project.docker_ok(["stop", "-t", "1", &web]);
    assert_healed_from_outside(&b, &prom, 1);
    restart_dockerd(&b.e2e.docker);
    assert_eq!(
        b.project
            .docker_ok(["inspect", "--format", "{{.State.Status}}", &web])
            .trim(),
        "exited"
    );
    assert_healed_from_outside(&b, &prom, 2);
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");
}

/// An `up` that hangs on the real engine (the running container's PID 1 ignores SIGTERM and has
/// five minutes to stop when the next release replaces it) is bounded by `healthy_timeout_s`,
/// not by the tick's deadline: the tick ends UNHEALTHY, "the start did not finish", and every
/// channel says so: the journal's summary line, the metrics (not converged, exit 1), `status`.
/// (A tick cut short at `tick_timeout_s` is tests/deadline.rs's.)
#[test]
fn an_up_that_hangs_on_the_real_engine_is_named_on_every_channel() {
    let Some(b) = E2eBox::with_timeout("hang", 10) else {
        return;
    };
    let prom = b.w.path("metrics/monky-deployd.prom");
    std::fs::create_dir_all(prom.parent().unwrap()).unwrap();
    b.w.config_extra(&format!(
        "metrics_textfile: {}\ntick_timeout_s: 60\n",
        prom.display()
    ));
    let stubborn = "    stop_grace_period: 300s\n    \
                    entrypoint: [\"/bin/busybox\", \"sh\", \"-c\", \"trap '' TERM; /bin/sh /app/entrypoint.sh & wait; wait\"]\n";
    b.first_apply(&web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        stubborn,
        &[],
    )));
    b.w.publish(&b.bundle(&b.e2e.image_2));
    let run = b.w.tick();
    run.expect(1);
    let summary = run
        .stderr()
        .lines()
        .find(|l| l.contains("tick: ") && l.contains("code=UNHEALTHY"))
        .unwrap_or_else(|| panic!("no summary line in\n{}", run.stderr()))
        .to_owned();
    assert!(summary.contains("exit=1"), "{summary}");
    let detail = b.w.last_report().detail.unwrap_or_default();
    assert!(
        detail.starts_with("UNHEALTHY: the start did not finish within "),
        "{detail}"
    );
    let metrics = std::fs::read_to_string(&prom).unwrap();
    assert!(
        metrics.contains("monky_deployd_converged{env_id=\"env-qa-02\"} 0")
            && metrics.contains("monky_deployd_exit_code{env_id=\"env-qa-02\"} 1"),
        "{metrics}"
    );
    b.w.run(&["status"]).prints(&["UNHEALTHY"]);
}

// ---- readiness is the agent's rule ------------------------------------------------------------

/// `yaml` of [`compose_yaml`] with one more service (two-space indented lines), before its
/// top-level `volumes`.
fn with_service(yaml: String, service: &str) -> String {
    yaml.replacen(
        "\nvolumes:\n  data",
        &format!("\n{service}volumes:\n  data"),
        1,
    )
}

/// A worker whose image healthcheck is disabled (`healthcheck: {disable: true}`) deploys on
/// the compose the project installs: a running container with no healthcheck is ready. compose
/// 2.26's `up --wait` ended this apply with "has no healthcheck configured".
#[test]
fn a_worker_with_its_healthcheck_disabled_deploys() {
    let Some(b) = E2eBox::new("no-healthcheck") else {
        return;
    };
    let worker = format!(
        "  worker:\n    image: {}\n    env_file: .env\n    healthcheck: {{disable: true}}\n",
        b.e2e.image_1
    );
    let bundle = web_bundle(with_service(
        compose_yaml(b.e2e, &b.e2e.image_1, Some(b.port), "", &[]),
        &worker,
    ));
    let sha = b.first_apply(&bundle);
    let seen = b.project.containers();
    let worker = seen
        .iter()
        .find(|c| c.name.ends_with("-worker-1"))
        .unwrap_or_else(|| panic!("no worker in {seen:?}"));
    assert_eq!(
        (worker.state.as_str(), worker.health.as_str()),
        ("running", ""),
        "{seen:?}"
    );
    assert_eq!(b.w.state()["applied_sha"], json!(sha));
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");
    b.w.run(&["status"]).ok().prints(&["converged      true"]);
}

/// A migration that never ends, which the new web waits for with
/// `service_completed_successfully`: `healthy_timeout_s` bounds the whole start, so the apply
/// ends UNHEALTHY naming the migration first with its own last output, the last good release
/// comes back, tenancy gets the report, and the site is served when the tick ends. Without the
/// bound the tick sat inside `compose up` until its deadline, with the old web gone and the new
/// one `created`.
#[test]
fn a_one_shot_that_never_ends_falls_back_and_the_site_stays_served() {
    let Some(b) = E2eBox::with_timeout("hung-one-shot", 15) else {
        return;
    };
    // A deadline well past the start and its fallback: without the start's own bound the tick
    // ends here, TICK_TIMEOUT, instead of hanging the test.
    b.w.config_extra("tick_timeout_s: 90\n");
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    let hung = format!(
        "  migrate:\n    image: {image}\n    restart: \"no\"\n    healthcheck: {{disable: true}}\n\
         \x20   stop_grace_period: 1s\n\
         \x20   entrypoint: [/bin/sh, -c, \"echo waiting for the schema lock held by deploy-7; exec sleep 100000\"]\n",
        image = b.e2e.image_1
    );
    let web = "    depends_on:\n      migrate: {condition: service_completed_successfully}\n";
    let second = b.w.publish(&web_bundle(with_service(
        compose_yaml(b.e2e, &b.e2e.image_2, Some(b.port), web, &[]),
        &hung,
    )));
    let run = b.w.tick();
    run.expect(1);
    let r = b.w.last_report();
    assert_eq!(r.result, ReportResult::Failed, "{r:?}");
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(second.as_str()));
    let detail = r.detail.clone().unwrap_or_default();
    assert!(
        detail.starts_with("UNHEALTHY: the start did not finish within "),
        "{detail}"
    );
    let migrate = format!("{}-migrate-1", b.project.name);
    let named = detail.find(&migrate).unwrap_or_else(|| panic!("{detail}"));
    let web_named = detail.find(&b.web()).unwrap_or(usize::MAX);
    assert!(named < web_named, "the migration is named first: {detail}");
    assert!(
        detail.contains("waiting for the schema lock held by deploy-7"),
        "its own last output: {detail}"
    );
    assert!(
        detail.contains(&format!("reverted to {}", &first[..12])),
        "{detail}"
    );
    assert!(
        run.stderr()
            .contains("waiting for the schema lock held by deploy-7"),
        "the journal: {}",
        run.stderr()
    );
    // The site it found serving is served when the tick ends.
    assert_eq!(b.w.state()["applied_sha"], json!(first));
    assert_eq!(b.current(), Some(release(&first)));
    assert_eq!(get_200(b.port, "/variant.txt").trim(), "1");
    let seen = b.project.containers();
    assert!(
        seen.iter().all(|c| !c.name.ends_with("-migrate-1")),
        "the fallback removed the migration: {seen:?}"
    );
    assert_healthy(&seen, &b.project.name);
    b.w.run(&["explain"])
        .ok()
        .prints(&["UNHEALTHY", "waiting for the schema lock"]);
}
