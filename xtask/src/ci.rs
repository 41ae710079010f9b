//! `cargo xtask ci`: what `.ci/run` runs. setup, tidy (the crate rules), fmt (the workspace and
//! fuzz/), clippy, test (with the setup env file exported), examples (the libraries' examples
//! run, `cargo xtask ci examples` alone), demo (`cargo xtask demo --ci`: the
//! README's first command, asserted end to end), packaging (`cargo xtask dist --test`: the .deb
//! built, linted and installed under systemd), doc, then teardown whatever happened. One line per
//! step, a verdict at the end.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::cmd;
use crate::state::{self, EnvFile};
use crate::teardown;

/// Runs ci with the command-line `args` (after `ci`).
pub fn main(args: &[String]) -> Result<()> {
    let mut fail_fast = false;
    for arg in args {
        match arg.as_str() {
            "--fail-fast" => fail_fast = true,
            "examples" if args.len() == 1 => return examples(),
            "-h" | "--help" => {
                println!(
                    "cargo xtask ci [--fail-fast]\n  setup, tidy, fmt, fmt fuzz, check fuzz, clippy, test, examples, demo, packaging, doc, teardown (always)\n  --fail-fast  skip the remaining checks after the first failure\ncargo xtask ci examples\n  builds and runs every library crate's examples"
                );
                return Ok(());
            }
            other => bail!("ci: unknown argument {other:?} (try --help)"),
        }
    }
    let started = Instant::now();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let cargo_cmd = |args: &[&str]| {
        let mut c = Command::new(&cargo);
        c.args(args).current_dir(state::workspace_root());
        c
    };
    let total = 11;
    let mut failed: Vec<&str> = Vec::new();

    // Setup runs as a child process so that the services it starts are not our children.
    let exe = std::env::current_exe().context("cannot find the xtask binary")?;
    let mut setup = Command::new(&exe);
    setup.arg("setup");
    let setup_ok = step(1, total, "setup", &mut setup);
    if !setup_ok {
        failed.push("setup");
    }

    let mut checks: Vec<(&str, Command)> = vec![
        ("tidy", {
            let mut tidy = Command::new(&exe);
            tidy.arg("tidy");
            tidy
        }),
        ("fmt", cargo_cmd(&["fmt", "--all", "--check"])),
        // fuzz/ is a workspace of its own, which the step above does not see.
        (
            "fmt fuzz",
            cargo_cmd(&[
                "fmt",
                "--all",
                "--check",
                "--manifest-path",
                "fuzz/Cargo.toml",
            ]),
        ),
        // The fuzz targets (parser agreement among them) compile against today's crates;
        // running them needs cargo-fuzz and time, which `cargo xtask fuzz` has.
        (
            "check fuzz",
            cargo_cmd(&[
                "check",
                "--manifest-path",
                "fuzz/Cargo.toml",
                "--locked",
                "--bins",
            ]),
        ),
        (
            "clippy",
            cargo_cmd(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--all-features",
                "--locked",
                "--",
                "-D",
                "warnings",
            ]),
        ),
        (
            "test",
            cargo_cmd(&["test", "--workspace", "--all-features", "--locked"]),
        ),
        // Each library's examples, as tenancy would use the crate; each exits non-zero when
        // what it shows does not hold. Built with the test step's features, so nothing rebuilds.
        ("examples", {
            let mut examples = Command::new(&exe);
            examples.args(["ci", "examples"]);
            examples
        }),
        ("demo", {
            let mut demo = Command::new(&exe);
            demo.args(["demo", "--ci"]);
            demo
        }),
        // The .deb, lintian, shellcheck, systemd-analyze, and the package installed under
        // systemd in a container (xtask/src/pkgtest.rs).
        ("packaging", {
            let mut packaging = Command::new(&exe);
            packaging.args(["dist", "--test"]);
            packaging
        }),
        ("doc", cargo_cmd(&["doc", "--workspace", "--no-deps"])),
    ];
    for (n, (name, command)) in checks.iter_mut().enumerate() {
        if fail_fast && !failed.is_empty() {
            println!("==> ci [{}/{total}] {name}: skipped (--fail-fast)", n + 2);
            continue;
        }
        match *name {
            "test" => export_e2e_env(command, setup_ok),
            "doc" => {
                command.env("RUSTDOCFLAGS", "-Dwarnings");
            }
            _ => {}
        }
        if !step(n + 2, total, name, command) {
            failed.push(name);
        }
    }

    let teardown_started = Instant::now();
    println!("==> ci [{total}/{total}] teardown");
    match teardown::teardown() {
        Ok(()) => println!(
            "<== ci [{total}/{total}] teardown: ok in {:.1}s",
            teardown_started.elapsed().as_secs_f64()
        ),
        Err(e) => {
            println!("<== ci [{total}/{total}] teardown: FAILED: {e:#}");
            failed.push("teardown");
        }
    }

    let minutes = started.elapsed().as_secs_f64() / 60.0;
    if failed.is_empty() {
        println!("ci: OK, every step succeeded in {minutes:.1} min");
        Ok(())
    } else {
        bail!(
            "ci: FAILED step(s): {} (after {minutes:.1} min)",
            failed.join(", ")
        )
    }
}

/// Builds the workspace's examples as the test step does and runs each library crate's (the
/// agent's `devpeers` serves until killed: the demo step runs it).
fn examples() -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = state::workspace_root();
    let mut build = cmd::new(
        &cargo,
        [
            "build",
            "--workspace",
            "--all-features",
            "--examples",
            "--locked",
        ],
    );
    cmd::run(build.current_dir(&root))?;
    let mut metadata = cmd::new(
        &cargo,
        ["metadata", "--no-deps", "--format-version", "1", "--locked"],
    );
    let metadata: serde_json::Value =
        serde_json::from_str(&cmd::capture(metadata.current_dir(&root))?)
            .context("cargo metadata printed no JSON")?;
    let dir = std::path::Path::new(
        metadata["target_directory"]
            .as_str()
            .context("cargo metadata: no target_directory")?,
    )
    .join("debug/examples");
    let mut ran = 0;
    for package in metadata["packages"].as_array().into_iter().flatten() {
        if package["name"] == "monky-deployd" {
            continue;
        }
        for target in package["targets"].as_array().into_iter().flatten() {
            if !target["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "example"))
            {
                continue;
            }
            let name = target["name"]
                .as_str()
                .context("an example without a name")?;
            println!(
                "    example {} {name}",
                package["name"].as_str().unwrap_or("?")
            );
            cmd::run(Command::new(dir.join(name)).current_dir(&root))?;
            ran += 1;
        }
    }
    if ran == 0 {
        bail!("no library example found");
    }
    println!("examples: {ran} ran, each as it asserts");
    Ok(())
}

/// Exports what the end-to-end suite needs: `MONKY_E2E_ENV`, every key of the env file, and
/// `MONKY_E2E_REQUIRED=1` (so the suite fails instead of skipping when the env is missing).
fn export_e2e_env(command: &mut Command, setup_ok: bool) {
    command.env("MONKY_E2E_REQUIRED", "1");
    let path = state::e2e_env_path();
    if !setup_ok {
        println!("    setup failed: the end-to-end tests get no MONKY_E2E_ENV and must fail");
        return;
    }
    command.env("MONKY_E2E_ENV", &path);
    match EnvFile::load(&path) {
        Ok(Some(env)) => {
            for (key, value) in env.entries() {
                command.env(key, value);
            }
        }
        Ok(None) => println!("    warning: {} is missing after setup", path.display()),
        Err(e) => println!("    warning: {e:#}"),
    }
}

/// Runs one step, printing a start and an end line; true on success.
fn step(n: usize, total: usize, name: &str, command: &mut Command) -> bool {
    let line = cmd::display(command);
    println!("==> ci [{n}/{total}] {name}: {line}");
    let started = Instant::now();
    let result = cmd::run(command);
    let secs = started.elapsed().as_secs_f64();
    match result {
        Ok(()) => {
            println!("<== ci [{n}/{total}] {name}: ok in {secs:.1}s");
            true
        }
        Err(e) => {
            println!("<== ci [{n}/{total}] {name}: FAILED after {secs:.1}s: {e:#}");
            false
        }
    }
}
