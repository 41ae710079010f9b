//! One project's life through the driver, without docker: the testkit's recording stub `docker`
//! plays the CLI and its fake Engine API socket the daemon. Up, the containers as the heartbeat
//! reads them (from the socket, no process), the calls the driver made, and down. Exits non-zero
//! if any step does not do what it shows.
//!
//! `cargo run -p monky-compose --features testkit --example stub_project`

use std::process::ExitCode;
use std::time::Duration;

use monky_compose::testkit::StubDocker;
use monky_compose::{Docker, Engine};

fn run() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let stub = StubDocker::install(dir.path()).map_err(|e| e.to_string())?;
    stub.set("HEALTH", "healthy");
    let engine = stub.engine();
    let docker = Docker::builder(stub.program())
        .docker_config(dir.path().join("docker"))
        .engine(Engine::unix(engine.socket()))
        .build()
        .map_err(|e| e.to_string())?;
    let release = dir.path().join("release");
    std::fs::create_dir(&release).map_err(|e| e.to_string())?;
    std::fs::write(
        release.join("compose.yaml"),
        "services:\n  web:\n    image: nginx:1.27\n",
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(release.join(".env"), "").map_err(|e| e.to_string())?;
    let project = docker.compose(
        "monky-env-qa-02",
        &release,
        &release.join("compose.yaml"),
        &release.join(".env"),
    );

    project
        .up(Some(Duration::from_secs(10)))
        .map_err(|e| format!("up: {e}"))?;
    let containers = docker
        .containers("monky-env-qa-02")
        .map_err(|e| format!("containers: {e}"))?;
    for c in &containers {
        println!("{}: {} ready={}", c.name, c.state, c.is_ready());
    }
    if containers.is_empty() || !containers.iter().all(|c| c.is_ready()) {
        return Err(format!("not every container is ready: {containers:?}"));
    }
    for call in stub.calls() {
        println!("docker {}", call.args.join(" "));
    }
    let up = stub
        .calls()
        .into_iter()
        .find(|c| c.args.iter().any(|a| a == "up"))
        .ok_or("the driver never ran up")?;
    if !up.args.iter().any(|a| a == "--env-file") || up.cwd != release {
        return Err(format!("up ran as {:?} in {}", up.args, up.cwd.display()));
    }

    project.down(false).map_err(|e| format!("down: {e}"))?;
    let left = docker
        .containers("monky-env-qa-02")
        .map_err(|e| format!("containers: {e}"))?;
    println!("after down: {} container(s)", left.len());
    if !left.is_empty() {
        return Err(format!("down left {left:?}"));
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stub_project: {e}");
            ExitCode::FAILURE
        }
    }
}
