//! `cargo xtask bench`: measures the agent next to its floors in one run and writes
//! docs/PERFORMANCE.md from the figures.
//!
//! The measuring itself is `monky-deployd/benches/perf.rs` (it needs the testkit peers); this
//! task prepares the engine and registry (`setup`), runs it in the dist profile (the binary the
//! .deb ships: optimised for size but for the byte-crunching crates, fat LTO, one codegen unit, stripped) with the e2e env file, and turns its samples into medians, spreads and the issue's goals. Figures are
//! reported, never asserted.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cmd;
use crate::state;

const USAGE: &str = "cargo xtask bench [--runs N] [--no-setup] [--out FILE]
  --runs N     samples per case (default 15)
  --no-setup   do not run `cargo xtask setup` first (the real-engine cases need its env file)
  --out FILE   where the report goes (default docs/PERFORMANCE.md)";

const HEARTBEAT_REAL: &str = "heartbeat tick (loopback peers, real engine, 3 containers)";
const HEARTBEAT_OUTSIDE: &str =
    "heartbeat tick from outside (the dist binary, real engine, 3 containers)";
const HEARTBEAT_STUB: &str = "heartbeat tick (loopback peers, stub engine socket)";
const APPLY_10K: &str = "apply 10 KiB bundle";
const HANDSHAKE: &str = "one TLS handshake to OpenBao (fresh process, CA bundle, FakeBao)";
const COMPOSE_PS: &str = "docker compose ps -a --format json (same project)";
const PYTHON: &str = "python3 importing the original agent's modules";
const VERIFY: &str = "verify 4 MiB bundle (parse + limits + sha256, in process)";
const SHA256SUM: &str = "sha256sum of the same bytes (process)";
const NOISE: &str = "noise probe (sha256 of 1 MiB, in process)";
const POLICY: &str = "compose policy, typical bundle (file + model, in process)";
const RUNTIME_LOOK: &str = "runtime look at 3 containers (engine + /proc, in process)";

/// Runs the benchmark with the command-line `args` (after `bench`).
pub fn main(args: &[String]) -> Result<()> {
    let mut runs = 15usize;
    let mut setup = true;
    let mut out = state::workspace_root().join("docs/PERFORMANCE.md");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--runs" => {
                runs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .context("--runs needs a number")?;
            }
            "--no-setup" => setup = false,
            "--out" => out = PathBuf::from(it.next().context("--out needs a file")?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("bench: unknown argument {other:?} (try --help)"),
        }
    }
    let root = state::workspace_root();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    if setup {
        // A child process, as in ci: what setup starts must not be ours.
        let exe = std::env::current_exe().context("cannot find the xtask binary")?;
        cmd::run(Command::new(exe).arg("setup"))?;
    }
    // The heartbeat from outside measures the binary `cargo xtask dist` packs, built as it
    // builds it: the bench's own agent is built with the harness's dev-dependencies' features.
    println!("==> bench: cargo build --profile dist -p monky-deployd --bin monky-deployd");
    cmd::run(
        Command::new(&cargo)
            .args([
                "build",
                "--profile",
                "dist",
                "--locked",
                "-p",
                "monky-deployd",
            ])
            .args(["--bin", "monky-deployd"])
            .current_dir(&root),
    )?;
    let dist_agent = target_dir().join("dist/monky-deployd");
    let before = Machine::now();
    let tsv = target_dir().join("bench/perf.tsv");
    let mut bench = Command::new(&cargo);
    bench
        // The agent measured is the one a box runs: the .deb's profile.
        .args([
            "bench",
            "--profile",
            "dist",
            "-p",
            "monky-deployd",
            "--bench",
            "perf",
            "--",
        ])
        .arg("--runs")
        .arg(runs.to_string())
        .arg("--out")
        .arg(&tsv)
        .env("MONKY_BENCH_DIST_AGENT", &dist_agent)
        .current_dir(&root);
    let env_file = state::e2e_env_path();
    if env_file.is_file() {
        bench.env("MONKY_E2E_ENV", &env_file);
    } else {
        println!(
            "bench: {} is missing: the real-engine cases are skipped",
            env_file.display()
        );
    }
    cmd::run(&mut bench)?;
    let after = Machine::now();
    let text =
        std::fs::read_to_string(&tsv).with_context(|| format!("cannot read {}", tsv.display()))?;
    let figures = Figures::parse(&text)?;
    let report = render(&figures, runs, &before, &after);
    std::fs::write(&out, &report).with_context(|| format!("cannot write {}", out.display()))?;
    println!("{}", summary(&figures));
    println!("bench: wrote {}", out.display());
    Ok(())
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| state::workspace_root().join("target"))
}

// ---- figures -----------------------------------------------------------------------------------

/// The samples of one case and metric, and their order statistics.
#[derive(Debug, Clone)]
struct Series {
    values: Vec<f64>,
}

impl Series {
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    fn median(&self) -> f64 {
        let v = self.sorted();
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(f64::NAN)
    }

    fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(f64::NAN)
    }

    /// "median (min-max)", or the single value.
    fn cell(&self) -> String {
        if self.values.len() == 1 {
            return fmt(self.values[0]);
        }
        format!(
            "{} ({}–{})",
            fmt(self.median()),
            fmt(self.min()),
            fmt(self.max())
        )
    }
}

fn fmt(v: f64) -> String {
    if v.is_nan() {
        "–".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Every case's series, in the order the benchmark wrote them.
#[derive(Debug, Default)]
struct Figures {
    order: Vec<String>,
    series: BTreeMap<(String, String), Series>,
}

impl Figures {
    fn parse(text: &str) -> Result<Self> {
        let mut f = Figures::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let cols: Vec<&str> = line.split('\t').collect();
            // The unit column is for readers of the TSV; the report knows each metric's.
            let [case, metric, _unit, values] = cols[..] else {
                bail!("bench: malformed line {line:?}");
            };
            let values = values
                .split(',')
                .map(str::parse)
                .collect::<Result<Vec<f64>, _>>()
                .with_context(|| format!("bench: values of {line:?}"))?;
            if !f.order.iter().any(|c| c == case) {
                f.order.push(case.to_string());
            }
            f.series
                .insert((case.to_string(), metric.to_string()), Series { values });
        }
        Ok(f)
    }

    fn get(&self, case: &str, metric: &str) -> Option<&Series> {
        self.series.get(&(case.to_string(), metric.to_string()))
    }

    fn median(&self, case: &str, metric: &str) -> Option<f64> {
        self.get(case, metric).map(Series::median)
    }

    fn cell(&self, case: &str, metric: &str) -> String {
        self.get(case, metric)
            .map_or_else(|| "–".to_string(), Series::cell)
    }
}

// ---- the machine -------------------------------------------------------------------------------

/// What the machine was like around the run.
struct Machine {
    loadavg: String,
}

impl Machine {
    fn now() -> Self {
        Machine {
            loadavg: read("/proc/loadavg")
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn machine_facts() -> Vec<(String, String)> {
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown".into());
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let mem = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or("unknown".into(), |kib| {
            format!("{:.1} GiB", kib / 1024.0 / 1024.0)
        });
    let version = |program: &str, arg: &str| {
        Command::new(program)
            .arg(arg)
            .output()
            .ok()
            .map(|o| {
                let text = String::from_utf8_lossy(&o.stdout).into_owned()
                    + &String::from_utf8_lossy(&o.stderr);
                text.lines().next().unwrap_or_default().trim().to_string()
            })
            .unwrap_or_else(|| "absent".into())
    };
    vec![
        ("cpu".into(), format!("{model}, {cpus} logical")),
        ("memory".into(), mem),
        (
            "kernel".into(),
            read("/proc/sys/kernel/osrelease").trim().into(),
        ),
        ("rustc".into(), version("rustc", "--version")),
        ("python3".into(), version("/usr/bin/python3", "--version")),
    ]
}

// ---- the report --------------------------------------------------------------------------------

/// One figure the report holds against a goal: a case's metric, its limit, and what it was
/// before the issue that set the goal. A new goal is one more entry in [`GOALS`].
struct Goal {
    /// The issue that set it.
    issue: u32,
    /// What the row says.
    label: &'static str,
    case: &'static str,
    metric: &'static str,
    unit: &'static str,
    /// `None` for a figure shown beside the goals without one of its own.
    limit: Option<f64>,
    /// The median before the issue's work, with where it comes from.
    before: Option<(f64, &'static str)>,
}

/// The figures before issue 14, from the report it was filed against.
const BEFORE_14: &str = "docs/PERFORMANCE.md before issue 14";

const GOALS: &[Goal] = &[
    Goal {
        issue: 14,
        label: "apply 10 KiB bundle, stub docker: the agent's own CPU",
        case: APPLY_10K,
        metric: "cpu own",
        unit: "ms",
        limit: Some(20.0),
        before: Some((
            69.5,
            "the tree's 79.5 ms less the stub's 10.0 ms (clock ticks) in that report",
        )),
    },
    Goal {
        issue: 14,
        label: "apply 10 KiB bundle: agent + children (the stub docker)",
        case: APPLY_10K,
        metric: "cpu total",
        unit: "ms",
        limit: Some(40.0),
        before: Some((79.5, BEFORE_14)),
    },
    Goal {
        issue: 14,
        label: "one TLS handshake to OpenBao, first of a process",
        case: HANDSHAKE,
        metric: "cpu total",
        unit: "ms",
        limit: None,
        before: None,
    },
    Goal {
        issue: 14,
        label: "heartbeat tick, real engine: CPU, agent + children",
        case: HEARTBEAT_REAL,
        metric: "cpu total",
        unit: "ms",
        limit: Some(6.0),
        before: Some((8.11, BEFORE_14)),
    },
    Goal {
        issue: 14,
        label: "heartbeat tick, real engine: peak RSS",
        case: HEARTBEAT_REAL,
        metric: "peak rss",
        unit: "MiB",
        limit: Some(10.0),
        before: Some((9.93, BEFORE_14)),
    },
    Goal {
        issue: 37,
        label: "heartbeat tick from outside, dist binary, real engine: CPU",
        case: HEARTBEAT_OUTSIDE,
        metric: "cpu total",
        unit: "ms",
        limit: Some(4.0),
        before: Some((5.8, BEFORE_37)),
    },
    Goal {
        issue: 37,
        label: "heartbeat tick from outside, dist binary, real engine: peak RSS",
        case: HEARTBEAT_OUTSIDE,
        metric: "peak rss",
        unit: "MiB",
        limit: Some(8.0),
        before: Some((9.0, BEFORE_37)),
    },
];

/// The heartbeat from outside when issue 37 was filed.
const BEFORE_37: &str = "issue 37's measurement from outside (wait4 of the dist binary)";

fn verdict(value: Option<f64>, goal: Option<f64>) -> &'static str {
    match (value, goal) {
        (None, _) => "not measured",
        (Some(_), None) => "",
        (Some(v), Some(g)) if v <= g => "met",
        (Some(_), Some(_)) => "missed",
    }
}

fn summary(f: &Figures) -> String {
    GOALS
        .iter()
        .map(|g| {
            let limit = g.limit.map_or_else(String::new, |l| {
                format!(
                    " (goal ≤ {l} {}: {})",
                    g.unit,
                    verdict(f.median(g.case, g.metric), g.limit)
                )
            });
            format!(
                "bench: {}: {} {}{limit}",
                g.label,
                f.cell(g.case, g.metric),
                g.unit
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The goals table: each figure, its goal and verdict, and the figure before as a ratio.
fn goals_table(w: &mut String, f: &Figures) {
    let _ = writeln!(
        w,
        "| figure (issue) | measured | goal | | before | now / before |\n|---|---|---|---|---|---|"
    );
    let mut sources = Vec::new();
    for g in GOALS {
        let median = f.median(g.case, g.metric);
        let (before, ratio) = match (g.before, median) {
            (Some((b, source)), m) => {
                if !sources.contains(&source) {
                    sources.push(source);
                }
                let mark = "*".repeat(sources.iter().position(|s| *s == source).unwrap_or(0) + 1);
                let ratio = m.map_or_else(|| "–".to_string(), |m| format!("{:.2}×", m / b));
                (format!("{} {}{mark}", fmt(b), g.unit), ratio)
            }
            (None, _) => ("–".to_string(), "–".to_string()),
        };
        let _ = writeln!(
            w,
            "| {} ({}) | {} | {} | {} | {before} | {ratio} |",
            g.label,
            g.issue,
            f.get(g.case, g.metric)
                .map_or_else(|| "–".to_string(), |s| format!("{} {}", s.cell(), g.unit)),
            g.limit
                .map_or_else(|| "–".to_string(), |l| format!("≤ {l} {}", g.unit)),
            verdict(median, g.limit),
        );
    }
    let _ = writeln!(w);
    for (i, source) in sources.iter().enumerate() {
        let _ = writeln!(w, "{}: {source}.  ", "\\*".repeat(i + 1));
    }
    let _ = writeln!(w);
}

/// The heartbeat from outside beside the bench's own figure, and why they differ.
fn heartbeat_outside(w: &mut String, f: &Figures) {
    let (Some(outside), Some(inside)) = (
        f.median(HEARTBEAT_OUTSIDE, "cpu total"),
        f.median(HEARTBEAT_REAL, "cpu total"),
    ) else {
        return;
    };
    let _ = writeln!(
        w,
        "### The heartbeat from outside\n\n\
         | binary | CPU ms | peak RSS MiB |\n|---|---|---|\n\
         | the bench's own (`CARGO_BIN_EXE_monky-deployd`) | {} | {} |\n\
         | the dist binary (`cargo build --profile dist -p monky-deployd --bin monky-deployd`) | {} | {} |\n\n\
         Both are measured the same way, from outside: a launcher (this harness re-run as \
         `--measure`) whose only child is the agent reaps it, so its `RUSAGE_CHILDREN` is what \
         `wait4` returns for that one process (user + system CPU, its max RSS), and the agent is \
         the grandchild of the harness, as under a timer. Same tick, same peers, same engine, \
         interleaved in one run. What differs is the binary: the bench's agent is built in the \
         same cargo invocation as the harness, so its dependencies carry the features the \
         harness's dev-dependencies enable too (cargo unifies them), while the dist binary has \
         the agent's own features only, as the .deb ships it. The difference here is {} ms \
         ({:+.0} %); a larger one from a measurement taken on another run is the machine's load \
         (2 cores shared with builds), which the noise row above shows.\n",
        f.cell(HEARTBEAT_REAL, "cpu total"),
        f.cell(HEARTBEAT_REAL, "peak rss"),
        f.cell(HEARTBEAT_OUTSIDE, "cpu total"),
        f.cell(HEARTBEAT_OUTSIDE, "peak rss"),
        fmt(outside - inside),
        (outside / inside - 1.0) * 100.0,
    );
}

fn render(f: &Figures, runs: usize, before: &Machine, after: &Machine) -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "# Performance\n");
    let _ = writeln!(
        w,
        "Generated by `cargo xtask bench` (`monky-deployd/benches/perf.rs`); do not edit by hand, \
         run it again. Every figure is a process measured on this machine in one run, side by \
         side: **median (min–max)** of {runs} runs unless one value is shown. CPU is user + \
         system time of the process and every child it waited for (`getrusage`, µs); \
         \"children\" is the part its own children used (clock ticks, 10 ms resolution, but µs \
         for the apply cases, see below); peak \
         RSS is the largest resident set of any process of the tree. The agent is the dist \
         build, the binary the .deb ships (optimised for size, fat LTO, stripped; the figures before issue 14 were of \
         the release build); its peers are the testkit tenancy and OpenBao on loopback (tenancy plain HTTP \
         through the proxy mapping, OpenBao over TLS with a CA bundle, as on a box). Wall times \
         include the fake peers' own latency (they run inside the measuring process); CPU and \
         RSS are the measured process tree's alone.\n"
    );
    let _ = writeln!(w, "## The machine\n");
    let _ = writeln!(w, "| | |\n|---|---|");
    for (k, v) in machine_facts() {
        let _ = writeln!(w, "| {k} | {v} |");
    }
    let _ = writeln!(
        w,
        "| load average (1/5/15 min) | {} before, {} after |",
        before.loadavg, after.loadavg
    );
    let _ = writeln!(
        w,
        "| noise | {} ms for a fixed in-process workload ({}): how steady the machine was \
         during the run |\n",
        f.cell(NOISE, "wall"),
        NOISE
            .trim_start_matches("noise probe ")
            .trim_matches(['(', ')'])
    );

    let _ = writeln!(w, "## Goals\n");
    goals_table(w, f);
    let hb = if f.get(HEARTBEAT_REAL, "cpu total").is_some() {
        HEARTBEAT_REAL
    } else {
        HEARTBEAT_STUB
    };
    let floor = f
        .median(COMPOSE_PS, "cpu total")
        .zip(f.median(PYTHON, "cpu total"));
    if let (Some((ps, py)), Some(ours)) = (floor, f.median(hb, "cpu total")) {
        let _ = writeln!(
            w,
            "The original agent paid at least a python3 start with its imports ({} ms) plus a \
             `docker compose ps` ({} ms) on every tick: **{} ms of CPU**, against **{} ms** for \
             a whole heartbeat tick here ({:.0}× less).\n",
            fmt(py),
            fmt(ps),
            fmt(py + ps),
            fmt(ours),
            (py + ps) / ours
        );
    }

    heartbeat_outside(w, f);

    let _ = writeln!(w, "## Processes\n");
    let _ = writeln!(
        w,
        "| case | wall ms | CPU ms (tree) | of which children | the agent alone | peak RSS MiB |\n|---|---|---|---|---|---|"
    );
    for case in &f.order {
        if f.get(case, "cpu total").is_none() || f.get(case, "wall").is_none() {
            continue;
        }
        let _ = writeln!(
            w,
            "| {case} | {} | {} | {} | {} | {} |",
            f.cell(case, "wall"),
            f.cell(case, "cpu total"),
            f.cell(case, "cpu children"),
            f.cell(case, "cpu own"),
            f.cell(case, "peak rss")
        );
    }
    let _ = writeln!(
        w,
        "\nThe apply cases run the whole tick against the stub docker, so they measure what the \
         agent itself does for an apply (bundle fetch, verify, refusals, lease-token check, \
         secret reads, `.env`, staging, promotion, report) without `compose pull`/`up`; the \
         stub's own cost (a shell per compose call) is the \"children\" column. There the stub \
         measures itself (`getrusage`, µs, through a shim the benchmark puts in front of it and \
         leaves out of the tree), so \"the agent alone\" is the tree less the stub, to the \
         microsecond; the shim's exit, which it cannot count, stays in the agent's figure. \
         Sizes: 10 KiB bundle {} KiB, 4 MiB bundle {} KiB of tar.\n",
        f.cell(APPLY_10K, "bundle"),
        f.cell("apply 4 MiB bundle", "bundle")
    );
    let _ = writeln!(
        w,
        "## TLS\n\n{HANDSHAKE}: **{} ms** of CPU (user + system, `getrusage` around \
         `ClientConnection::new` and the handshake), each in a fresh process, as the agent \
         makes it: rustls on AWS-LC, the CA bundle as the only root, TLS 1.3 to the testkit's \
         FakeBao on loopback (its own CPU is not counted). The first handshake of a process is \
         the one every tick that speaks TLS pays, the seeding of AWS-LC's random generator \
         included (from the kernel's `getrandom`; see docs/architecture.md, \"Crypto\"). A \
         real OpenBao would cost the agent the same: the client's work depends on the \
         certificate chain and key exchange, not on the server.\n",
        f.cell(HANDSHAKE, "cpu total")
    );

    let _ = writeln!(w, "## Bundle verification\n");
    if let (Some(ours), Some(kib), Some(sum)) = (
        f.median(VERIFY, "wall"),
        f.median(VERIFY, "bundle"),
        f.median(SHA256SUM, "cpu total"),
    ) {
        let mib = kib / 1024.0;
        let _ = writeln!(
            w,
            "| | time ms | throughput MiB/s |\n|---|---|---|\n\
             | {VERIFY} | {} | {:.0} |\n\
             | {SHA256SUM}, CPU | {} | {:.0} |\n\n\
             The agent's whole verification (tar parsing with its limits, member names, \
             sha256) takes **{:.2}×** the time `sha256sum` spends hashing the same {:.1} MiB \
             (its figure includes starting its process, as ours in the apply ticks does): \
             verifying a bundle costs no more than the hashing that is its physical floor.\n",
            f.cell(VERIFY, "wall"),
            mib / (ours / 1e3),
            f.cell(SHA256SUM, "cpu total"),
            mib / (sum / 1e3),
            ours / sum,
            mib,
        );
    }

    if let Some(ms) = f.median(POLICY, "wall") {
        let _ = writeln!(
            w,
            "## Compose policy\n\n| | time ms |\n|---|---|\n| {POLICY} | {} |\n\n\
             The policy judges a typical bundle's compose file before the lease and compose's \
             model of it before pull in {ms:.2} ms of the agent's own CPU, against a budget of \
             20 ms (compose's own `config` run is a child, counted in the apply ticks).\n",
            f.cell(POLICY, "wall"),
        );
    }

    if let Some(ms) = f.median(RUNTIME_LOOK, "cpu total") {
        let _ = writeln!(
            w,
            "## The look at what runs\n\n| | wall ms | CPU ms |\n|---|---|---|\n\
             | {RUNTIME_LOOK} | {} | {} |\n\n\
             A heartbeat of a release with secrets reads, per running container, the engine's \
             `State.Pid` and `Config.Env` and the uids and arguments of its processes from \
             `/proc` (docs/compose-policy.md, \"What runs, judged\"): {ms:.2} ms of the agent's \
             CPU for the 3 containers of the real-engine heartbeat above, which includes it.\n",
            f.cell(RUNTIME_LOOK, "wall"),
            f.cell(RUNTIME_LOOK, "cpu total"),
        );
    }

    let _ = writeln!(w, "## Binary\n");
    let _ = writeln!(w, "| build | size MiB |\n|---|---|");
    for case in &f.order {
        if let Some(size) = f.get(case, "size") {
            let _ = writeln!(w, "| {case} | {} |", size.cell());
        }
    }
    let _ = writeln!(
        w,
        "\nStart-up (`monky-deployd version`, page cache warm): {} ms wall, {} ms CPU, {} MiB \
         peak RSS.",
        f.cell("start-up: monky-deployd version", "wall"),
        f.cell("start-up: monky-deployd version", "cpu total"),
        f.cell("start-up: monky-deployd version", "peak rss"),
    );
    let _ = writeln!(
        w,
        "\nWhat a tick costs the peers is a test, not a figure: `apply::request_counts_of_a_first_\
         apply_a_heartbeat_and_a_second_apply` fails if a heartbeat makes more than its two \
         tenancy requests or any OpenBao request, or an apply more than one lease."
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_parse_and_summarise() {
        let f = Figures::parse(&format!(
            "{HEARTBEAT_STUB}\tcpu total\tms\t3,1,2\n{HEARTBEAT_STUB}\tpeak rss\tMiB\t14,13,15,16\n"
        ))
        .unwrap();
        let cpu = f.get(HEARTBEAT_STUB, "cpu total").unwrap();
        assert_eq!((cpu.median(), cpu.min(), cpu.max()), (2.0, 1.0, 3.0));
        assert_eq!(f.median(HEARTBEAT_STUB, "peak rss"), Some(14.5));
        assert_eq!(cpu.cell(), "2.00 (1.00–3.00)");
        let real = Figures::parse(&format!(
            "{HEARTBEAT_REAL}\tcpu total\tms\t5,6,7\n{HEARTBEAT_REAL}\tpeak rss\tMiB\t11\n"
        ))
        .unwrap();
        let line = summary(&real);
        assert!(
            line.contains("CPU, agent + children: 6.00 (5.00–7.00) ms (goal ≤ 6 ms: met)")
                && line.contains("peak RSS: 11.0 MiB (goal ≤ 10 MiB: missed)")
                && line.contains("own CPU: – ms (goal ≤ 20 ms: not measured)"),
            "{line}"
        );
        let mut table = String::new();
        goals_table(&mut table, &real);
        assert!(
            table.contains("| 6.00 (5.00–7.00) ms | ≤ 6 ms | met | 8.11 ms** | 0.74× |"),
            "{table}"
        );
        // The heartbeat from outside goes beside the bench's own, against issue 37's goals.
        let both = Figures::parse(&format!(
            "{HEARTBEAT_REAL}\tcpu total\tms\t4,4.5,5\n{HEARTBEAT_REAL}\tpeak rss\tMiB\t9\n\
             {HEARTBEAT_OUTSIDE}\tcpu total\tms\t5,5.5,6\n{HEARTBEAT_OUTSIDE}\tpeak rss\tMiB\t9.5\n"
        ))
        .unwrap();
        let mut text = String::new();
        heartbeat_outside(&mut text, &both);
        assert!(
            text.contains("| the dist binary (`cargo build --profile dist -p monky-deployd --bin monky-deployd`) | 5.50 (5.00–6.00) | 9.50 |")
                && text.contains("The difference here is 1.00 ms (+22 %)"),
            "{text}"
        );
        let line = summary(&both);
        assert!(
            line.contains("from outside, dist binary, real engine: CPU: 5.50 (5.00–6.00) ms (goal ≤ 4 ms: missed)"),
            "{line}"
        );
        assert!(Figures::parse("a\tb\tms\t1,x\n").is_err());
        assert!(Figures::parse("a\tb\n").is_err());
    }
}
