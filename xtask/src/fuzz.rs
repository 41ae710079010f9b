//! `cargo xtask fuzz [--seconds N] [--target NAME]...`: every cargo-fuzz target in `fuzz/` for
//! N seconds each, one line per target (runs, runs/s, corpus), non-zero when one crashed.
//!
//! The targets build on the stable toolchain: `--sanitizer none` drops the one nightly-only
//! flag (`-Zsanitizer`), while the coverage instrumentation cargo-fuzz adds is stable. Rust's own
//! checks (panics, overflow checks, debug assertions) are what a crash is. Each corpus lives in
//! `fuzz/corpus/<target>` (not committed) and is seeded from the repository's test data.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::cmd;
use crate::state;

/// A target and where its seeds come from: directories and the file name endings taken there.
struct Target {
    name: &'static str,
    seeds: &'static [(&'static str, &'static [&'static str])],
    /// libFuzzer's `-max_len`: inputs longer than this are never tried.
    max_len: usize,
}

const TARGETS: &[Target] = &[
    Target {
        name: "bundle_tar",
        seeds: &[
            ("monky-bundle/tests/data", &[".tar", ".tar.gz"]),
            ("monky-deployd/tests/data/hostile", &[".tar", ".tar.gz"]),
        ],
        max_len: 64 * 1024,
    },
    Target {
        name: "env_template",
        seeds: &[("monky-bundle/tests/data/bundle", &[".env.template"])],
        max_len: 4096,
    },
    Target {
        name: "manifest_meta",
        seeds: &[("monky-bundle/tests/data/bundle", &[".json"])],
        max_len: 4096,
    },
    Target {
        name: "compose_privileged",
        seeds: &[("monky-bundle/tests/data/bundle", &[".yml"])],
        max_len: 8192,
    },
    Target {
        name: "compose_plain",
        seeds: &[
            ("monky-bundle/tests/data/bundle", &[".yml"]),
            ("monky-deployd/tests/data/benign", &[".yml"]),
            // The minimised corpus of its recorded run (docs/compose-policy.md).
            ("fuzz/seeds/compose_plain", &[""]),
        ],
        max_len: 8192,
    },
    Target {
        name: "config",
        seeds: &[("packaging", &[".yaml"])],
        max_len: 8192,
    },
    Target {
        name: "redact",
        seeds: &[("monky-agent-proto/tests/data", &[".json"])],
        max_len: 4096,
    },
    Target {
        name: "wire_decode",
        seeds: &[("monky-agent-proto/tests/data", &[".json"])],
        max_len: 4096,
    },
    Target {
        name: "checkin_answer",
        seeds: &[("monky-agent-proto/tests/data", &["checkin_response.json"])],
        max_len: 4096,
    },
];

/// What one run showed.
struct Outcome {
    name: &'static str,
    seconds: f64,
    runs: u64,
    per_second: u64,
    corpus: usize,
    crash: Option<String>,
}

const HELP: &str = "\
cargo xtask fuzz [--seconds N] [--target NAME]...
  builds fuzz/ with cargo-fuzz on the stable toolchain (--sanitizer none) and runs every target
  (or the named ones) for N seconds each (default 60); exits non-zero when a target crashed
  needs cargo-fuzz: cargo install cargo-fuzz --locked";

/// Runs fuzz with the command-line `args` (after `fuzz`).
pub fn main(args: &[String]) -> Result<()> {
    let mut seconds: u64 = 60;
    let mut only: Vec<String> = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                let n = args.next().context("--seconds needs a number")?;
                seconds = n
                    .parse()
                    .with_context(|| format!("--seconds {n:?} is not a whole number"))?;
            }
            "--target" => only.push(args.next().context("--target needs a name")?.clone()),
            "-h" | "--help" => {
                println!("{HELP}");
                return Ok(());
            }
            other => bail!("fuzz: unknown argument {other:?} (try --help)"),
        }
    }
    let root = state::workspace_root();
    let dir = root.join("fuzz");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let fuzz_cmd = |args: &[&str]| {
        let mut c = Command::new(&cargo);
        // Instrumented builds stay in fuzz/target, away from the workspace's own artifacts.
        c.arg("fuzz")
            .args(args)
            .current_dir(&dir)
            .env_remove("CARGO_TARGET_DIR");
        c
    };
    if cmd::output(&mut fuzz_cmd(&["--version"]))
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        bail!("cargo-fuzz is not installed: cargo install cargo-fuzz --locked");
    }

    // The table and fuzz/Cargo.toml must agree, so a new target cannot go unseeded or unrun.
    let listed = cmd::capture(&mut fuzz_cmd(&["list"]))?;
    let listed: Vec<&str> = listed.lines().map(str::trim).collect();
    for t in TARGETS {
        if !listed.contains(&t.name) {
            bail!("fuzz target {} is not in fuzz/Cargo.toml", t.name);
        }
    }
    for name in &listed {
        if !TARGETS.iter().any(|t| t.name == *name) {
            bail!("fuzz target {name} has no entry in xtask/src/fuzz.rs");
        }
    }
    for name in &only {
        if !listed.contains(&name.as_str()) {
            bail!("no fuzz target {name:?} (there are: {})", listed.join(", "));
        }
    }

    println!("building the fuzz targets (cargo fuzz build --sanitizer none)");
    cmd::run(&mut fuzz_cmd(&["build", "--sanitizer", "none"]))?;

    let logs = dir.join("target/logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let mut outcomes = Vec::new();
    for t in TARGETS
        .iter()
        .filter(|t| only.is_empty() || only.iter().any(|o| o == t.name))
    {
        let corpus = dir.join("corpus").join(t.name);
        let seeded = seed(&root, &corpus, t)?;
        println!("fuzzing {} for {seconds} s ({seeded} seed(s))", t.name);
        let log = logs.join(format!("{}.log", t.name));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let started = Instant::now();
        let status = fuzz_cmd(&["run", "--sanitizer", "none", t.name])
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-max_len={}", t.max_len))
            .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .status()
            .with_context(|| format!("cannot run cargo fuzz run {}", t.name))?;
        let elapsed = started.elapsed().as_secs_f64();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let crash = (!status.success()).then(|| crash_line(&text, &log));
        outcomes.push(Outcome {
            name: t.name,
            seconds: elapsed,
            runs: stat(&text, "number_of_executed_units"),
            per_second: stat(&text, "average_exec_per_sec"),
            corpus: count_files(&corpus),
            crash,
        });
    }

    println!(
        "\n{:<20} {:>8} {:>12} {:>9} {:>7}  result",
        "target", "seconds", "runs", "runs/s", "corpus"
    );
    for o in &outcomes {
        println!(
            "{:<20} {:>8.0} {:>12} {:>9} {:>7}  {}",
            o.name,
            o.seconds,
            o.runs,
            o.per_second,
            o.corpus,
            o.crash.as_deref().unwrap_or("ok")
        );
    }
    let crashed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.crash.is_some())
        .map(|o| o.name)
        .collect();
    if !crashed.is_empty() {
        bail!(
            "{} crashed; reproduce with `cargo fuzz run --sanitizer none <target> <artifact>` in fuzz/",
            crashed.join(", ")
        );
    }
    Ok(())
}

/// Copies the target's seeds into its corpus directory; returns how many there are.
fn seed(root: &Path, corpus: &Path, t: &Target) -> Result<usize> {
    std::fs::create_dir_all(corpus)
        .with_context(|| format!("cannot create {}", corpus.display()))?;
    let mut n = 0;
    for (dir, endings) in t.seeds {
        let dir = root.join(dir);
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let small = e
                .metadata()
                .is_ok_and(|m| m.is_file() && m.len() as usize <= t.max_len);
            if small && endings.iter().any(|end| name.ends_with(end)) {
                let to = corpus.join(format!("seed-{name}"));
                std::fs::copy(e.path(), &to)
                    .with_context(|| format!("cannot copy {} to {}", name, to.display()))?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// A `stat::<key>: <n>` line of libFuzzer's final statistics (0 when missing).
fn stat(log: &str, key: &str) -> u64 {
    let prefix = format!("stat::{key}:");
    log.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The line that says what crashed and where its input went.
fn crash_line(log: &str, log_path: &Path) -> String {
    let artifact = log
        .lines()
        .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()));
    let why = log
        .lines()
        .find(|l| l.contains("panicked at") || l.contains("==ERROR") || l.contains("deadly signal"))
        .map(str::trim);
    format!(
        "CRASH {} (input {}; log {})",
        why.unwrap_or("(see the log)"),
        artifact.unwrap_or("not written"),
        log_path.display()
    )
}

fn count_files(dir: &PathBuf) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.flatten().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_stats_and_crashes_are_read_from_the_log() {
        let log =
            "#1 INITED\nstat::number_of_executed_units: 1234\nstat::average_exec_per_sec:     56\n";
        assert_eq!(stat(log, "number_of_executed_units"), 1234);
        assert_eq!(stat(log, "average_exec_per_sec"), 56);
        assert_eq!(stat(log, "peak_rss_mb"), 0);
        let crash = "thread '<unnamed>' panicked at fuzz_targets/x.rs:3:5:\nboom\n\
                     ==1== ERROR: libFuzzer: deadly signal\n\
                     artifact_prefix='a/'; Test unit written to a/crash-abc\n";
        let line = crash_line(crash, Path::new("x.log"));
        assert!(line.contains("panicked at fuzz_targets/x.rs:3:5"), "{line}");
        assert!(line.contains("input a/crash-abc"), "{line}");
    }

    #[test]
    fn every_target_has_seeds_in_the_repository() {
        let root = state::workspace_root();
        for t in TARGETS {
            let dir = tempfile_dir(t.name);
            let n = seed(&root, &dir, t).unwrap();
            assert!(n > 0, "{} has no seeds", t.name);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    fn tempfile_dir(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("xtask-fuzz-seeds-{}-{name}", std::process::id()))
    }
}
