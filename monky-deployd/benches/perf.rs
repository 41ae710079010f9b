//! The measurements behind `cargo xtask bench` and docs/PERFORMANCE.md (harness = false).
//!
//! Every figure comes from a real process: the agent as the .deb ships it (dist profile)
//! against the testkit peers on loopback, with the stub docker or the real engine, next to the
//! floors it is compared with (`docker compose ps`, a python3 that imports what the original
//! agent imported, `sha256sum`).
//! A process is measured by this same binary re-run as `--measure <program> <args>`: a fresh
//! parent whose only child is the measured one, so that `getrusage(RUSAGE_CHILDREN)` is exactly
//! that process tree (CPU in microseconds, the peak RSS of its largest member), and whose
//! `waitid(WNOWAIT)` lets it read the child's `/proc/<pid>/stat` before the zombie is reaped.
//! Reaped, its only child's usage is in `RUSAGE_CHILDREN`: what `wait4` returns for that pid
//! (the workspace forbids the `unsafe` a raw `wait4` would need). The heartbeat is measured so
//! twice: with the bench's own agent and with the dist binary `cargo xtask bench` builds as
//! `cargo xtask dist` does (`MONKY_BENCH_DIST_AGENT`), the agent the grandchild of this harness.
//!
//! The apply cases also split the agent's own CPU from its children's: the stub docker is reached
//! through a symlink to this binary (`docker` -> perf), which runs the real stub
//! (`docker-real`) and appends what the stub and it used (`getrusage`, µs) to `children.tsv`
//! beside it. The agent's own CPU is the tree's less both; the shim's exit, which it cannot
//! count, is left in the agent's figure, so it errs high.
//!
//! Output: one TSV line per sample set, `case<TAB>metric<TAB>unit<TAB>v1,v2,...`; xtask turns
//! them into medians and spreads. Speed is never asserted here or in any test.

#[path = "../tests/util.rs"]
#[allow(dead_code)]
mod util;

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use monky_testkit::tenancy::{Rate, RateLimits};
use serde_json::json;

use util::{RealDocker, TestBundle, World, WorldOptions};

fn main() {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if Path::new(&argv0).file_name().is_some_and(|n| n == "docker") {
        docker_shim(Path::new(&argv0));
    }
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == "--measure") {
        measure(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "--handshake") {
        handshake(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "--serve") {
        serve();
    }
    let mut runs = 15usize;
    let mut out: Option<PathBuf> = None;
    let mut policy_only = false;
    let mut real_engine_only = false;
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        match a.as_str() {
            "--runs" => runs = it.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--out" => out = it.next().map(PathBuf::from),
            // Only the in-process compose policy case: no peers, no docker.
            "--policy-only" => policy_only = true,
            // Only the real-engine cases (the heartbeat's figure), for a quick look at it.
            "--real-engine-only" => real_engine_only = true,
            // What cargo bench passes along.
            "--bench" => {}
            other => {
                panic!(
                    "perf: unknown argument {other:?} (--runs N, --out FILE, --policy-only, \
                     --real-engine-only)"
                )
            }
        }
    }
    let mut rows = Rows::default();
    if policy_only {
        compose_policy(&mut rows, runs);
        print!("{}", rows.0.join("\n") + "\n");
        return;
    }
    if real_engine_only {
        let e2e = E2e::from_env().expect("--real-engine-only needs MONKY_E2E_ENV");
        real_engine(&mut rows, runs, &e2e);
        print!("{}", rows.0.join("\n") + "\n");
        return;
    }
    noise_probe(&mut rows, runs);
    startup_and_size(&mut rows, runs);
    heartbeat_stub(&mut rows, runs);
    tls_handshake(&mut rows, runs);
    apply_stub(&mut rows, runs, "apply 10 KiB bundle", 10 * 1024);
    apply_stub(
        &mut rows,
        runs,
        "apply 4 MiB bundle",
        4 * 1024 * 1024 - 24 * 1024,
    );
    verify_throughput(&mut rows, runs);
    compose_policy(&mut rows, runs);
    python_floor(&mut rows, runs);
    match E2e::from_env() {
        Some(e2e) => real_engine(&mut rows, runs, &e2e),
        None => eprintln!("perf: no MONKY_E2E_ENV: the real-engine cases are skipped"),
    }
    let text = rows.0.join("\n") + "\n";
    match out {
        Some(path) => {
            std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).unwrap();
            std::fs::write(&path, text).unwrap();
            eprintln!("perf: wrote {}", path.display());
        }
        None => print!("{text}"),
    }
}

#[derive(Default)]
struct Rows(Vec<String>);

impl Rows {
    fn add(&mut self, case: &str, metric: &str, unit: &str, values: &[f64]) {
        let v: Vec<String> = values.iter().map(|v| format!("{v:.4}")).collect();
        self.0
            .push(format!("{case}\t{metric}\t{unit}\t{}", v.join(",")));
        eprintln!("perf: {case} / {metric}: {} {unit}", median(values));
    }

    fn add_process(&mut self, case: &str, samples: &[Sample]) {
        let col = |f: fn(&Sample) -> f64| samples.iter().map(f).collect::<Vec<_>>();
        self.add(case, "wall", "ms", &col(|s| s.wall_ms));
        self.add(case, "cpu total", "ms", &col(|s| s.cpu_ms));
        self.add(case, "cpu children", "ms", &col(|s| s.children_ms));
        self.add(case, "peak rss", "MiB", &col(|s| s.maxrss_kib / 1024.0));
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

// ---- measuring one process ---------------------------------------------------------------------

/// One measured run of a process tree.
#[derive(Debug, Clone, Copy)]
struct Sample {
    wall_ms: f64,
    /// The process and every child it waited for, from getrusage (microsecond resolution).
    cpu_ms: f64,
    /// Its waited-for children alone, from the zombie's /proc stat (clock-tick resolution).
    children_ms: f64,
    /// The largest RSS of any member of the tree.
    maxrss_kib: f64,
}

/// `--measure PROGRAM ARGS...`: run it, print `wall_ns cpu_us children_ticks maxrss_kib code`.
fn measure(args: &[OsString]) -> ! {
    use nix::sys::resource::{UsageWho, getrusage};
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    let started = Instant::now();
    let mut child = Command::new(&args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the measured program");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT).expect("waitid");
    let wall = started.elapsed();
    // Fields 16 and 17 (cutime, cstime) of the zombie: what its own children cost.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = [13, 14]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    let status = child.wait().expect("reap");
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage");
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    println!(
        "{} {} {} {} {}",
        wall.as_nanos(),
        us(usage.user_time()) + us(usage.system_time()),
        ticks,
        usage.max_rss(),
        status.code().unwrap_or(-1)
    );
    std::process::exit(0)
}

/// Runs `cmd` under `--measure`, keeping its program, arguments, environment and directory.
fn run_measured(cmd: &Command) -> Sample {
    let mut m = Command::new(std::env::current_exe().unwrap());
    m.arg("--measure")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => m.env(k, v),
            None => m.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        m.current_dir(dir);
    }
    let out = m.output().expect("the measuring wrapper");
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<f64> = text
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(
        f.len(),
        5,
        "wrapper said {text:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(f[4], 0.0, "{:?} exited {}", cmd, f[4]);
    // USER_HZ is 100 on every Linux architecture the agent ships for.
    let tick_ms = 10.0;
    Sample {
        wall_ms: f[0] / 1e6,
        cpu_ms: f[1] / 1e3,
        children_ms: f[2] * tick_ms,
        maxrss_kib: f[3],
    }
}

/// The agent exactly as `cargo xtask dist` builds it (`MONKY_BENCH_DIST_AGENT`, which `cargo
/// xtask bench` sets): `cargo build --profile dist -p monky-deployd --bin monky-deployd`, whose
/// features are the agent's alone. The bench's own agent (`CARGO_BIN_EXE_monky-deployd`) is
/// built in the same cargo run as this harness, so its dependencies carry the features the
/// harness's dev-dependencies turn on too (feature unification): a different binary.
fn dist_agent() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os("MONKY_BENCH_DIST_AGENT")?);
    assert!(
        path.is_file(),
        "MONKY_BENCH_DIST_AGENT={} is not a file",
        path.display()
    );
    Some(path)
}

/// `cmd` with `program` in place of its own: the same arguments, environment and directory.
fn with_program(cmd: &Command, program: &Path) -> Command {
    let mut c = Command::new(program);
    c.args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        c.current_dir(dir);
    }
    c
}

fn measure_n(runs: usize, mut before: impl FnMut(usize), cmd: &dyn Fn() -> Command) -> Vec<Sample> {
    (0..runs)
        .map(|i| {
            before(i);
            run_measured(&cmd())
        })
        .collect()
}

// ---- the cases ---------------------------------------------------------------------------------

/// A fixed in-process workload (sha256 of 1 MiB): its spread is the machine's noise.
fn noise_probe(rows: &mut Rows, runs: usize) {
    let data = vec![7u8; 1 << 20];
    let times: Vec<f64> = (0..runs.max(10) * 3)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(monky_bundle::bundle_sha([("x", data.as_slice())]));
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    rows.add(
        "noise probe (sha256 of 1 MiB, in process)",
        "wall",
        "ms",
        &times,
    );
}

fn agent_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_monky-deployd"))
}

fn startup_and_size(rows: &mut Rows, runs: usize) {
    // `cargo xtask bench` builds this bench, and so the agent, in the dist profile.
    let size = std::fs::metadata(agent_bin()).unwrap().len() as f64 / (1024.0 * 1024.0);
    rows.add(
        "binary (dist profile: optimised for size, fat LTO, stripped)",
        "size",
        "MiB",
        &[size],
    );
    let samples = measure_n(runs, |_| {}, &|| {
        let mut c = Command::new(agent_bin());
        c.arg("version");
        c
    });
    rows.add_process("start-up: monky-deployd version", &samples);
}

/// Tenancy's buckets opened wide: a benchmark ticks faster than a box ever does.
fn unlimited(w: &World) {
    let wide = Rate::per_minute(1_000_000);
    w.tenancy.set_limits(RateLimits {
        checkin: wide,
        bundle: wide,
        report: wide,
        lease: wide,
    });
}

/// The production transport: tenancy plain HTTP via the proxy mapping, OpenBao over TLS with
/// the configured CA bundle.
fn stub_world() -> World {
    let w = World::with(WorldOptions { tls_proxy: true });
    unlimited(&w);
    w
}

fn heartbeat_stub(rows: &mut Rows, runs: usize) {
    let w = stub_world();
    w.applied();
    w.tick().ok();
    let samples = measure_n(runs, |_| {}, &|| w.command(&["run", "--once"]));
    assert!(w.reports().iter().all(|r| r.detail.is_none()));
    rows.add_process(
        "heartbeat tick (loopback peers, stub engine socket)",
        &samples,
    );
}

/// A bundle of about `size` bytes of tar: the default bundle, padded with comment lines in the
/// compose file and `.env.template` (each member stays under the 2 MiB member limit); `run`
/// makes each one a new sha.
fn sized_bundle(size: usize, run: usize) -> TestBundle {
    let mut b = TestBundle::default();
    b.compose = format!("# run {run}\n{}", b.compose);
    let pad = size.saturating_sub(b.tar().len());
    let line = "# padding so that the bundle has a realistic size for this benchmark ......\n";
    let lines = |n: usize| line.repeat(n / line.len());
    let half = pad / 2;
    b.compose.push_str(&lines(half));
    b.env_template.push_str(&lines(pad - half));
    b
}

fn apply_stub(rows: &mut Rows, runs: usize, case: &str, size: usize) {
    let w = stub_world();
    w.applied();
    let shim = DockerShim::install(&w.stub_dir());
    let bytes = sized_bundle(size, 0).tar().len();
    let mut own = Vec::new();
    let mut stub = Vec::new();
    let mut samples = Vec::new();
    for i in 0..runs {
        w.publish(&sized_bundle(size, i + 1));
        shim.reset();
        let mut s = run_measured(&w.command(&["run", "--once"]));
        let (stub_ms, shim_ms) = shim.used_ms();
        // The shim is the benchmark's, not the agent's: the tree is the agent and the stub.
        s.cpu_ms -= shim_ms;
        s.children_ms = stub_ms;
        own.push(s.cpu_ms - stub_ms);
        stub.push(stub_ms);
        samples.push(s);
    }
    let last = w.last_report();
    assert!(last.detail.is_none(), "{last:?}");
    assert_eq!(
        w.state()["applied_sha"],
        json!(sized_bundle(size, runs).sha())
    );
    rows.add(case, "bundle", "KiB", &[bytes as f64 / 1024.0]);
    rows.add_process(case, &samples);
    rows.add(case, "cpu own", "ms", &own);
    rows.add(case, "cpu stub", "ms", &stub);
}

/// `--serve`: a stub world for profiling a tick by hand (`perf record`, `valgrind`). It prints
/// the agent's command line, then on every line read from stdin publishes a new 10 KiB bundle
/// (an empty line) or leaves the applied one (`h`, a heartbeat) and prints the command again.
fn serve() -> ! {
    let w = stub_world();
    w.applied();
    w.tick().ok();
    let mut line = String::new();
    for i in 1.. {
        if line.trim() != "h" {
            w.publish(&sized_bundle(10 * 1024, i));
        }
        let c = w.command(&["run", "--once"]);
        let env: Vec<String> = c
            .get_envs()
            .filter_map(|(k, v)| Some(format!("{}={}", k.to_str()?, v?.to_str()?)))
            .collect();
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        println!(
            "env {} {} {}",
            env.join(" "),
            c.get_program().to_string_lossy(),
            args.join(" ")
        );
        line.clear();
        if std::io::stdin().read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
    }
    std::process::exit(0)
}

/// The stub docker behind a measuring shim (see the module's comment).
struct DockerShim {
    log: PathBuf,
}

impl DockerShim {
    fn install(stub_dir: &Path) -> Self {
        std::fs::rename(stub_dir.join("docker"), stub_dir.join("docker-real")).unwrap();
        std::os::unix::fs::symlink(std::env::current_exe().unwrap(), stub_dir.join("docker"))
            .unwrap();
        DockerShim {
            log: stub_dir.join("children.tsv"),
        }
    }

    fn reset(&self) {
        std::fs::write(&self.log, "").unwrap();
    }

    /// The stub's CPU and the shim's own since the last reset, in ms.
    fn used_ms(&self) -> (f64, f64) {
        let text = std::fs::read_to_string(&self.log).unwrap();
        let mut sum = (0.0, 0.0);
        for line in text.lines() {
            let (stub, shim) = line.split_once(' ').expect("children.tsv line");
            sum.0 += stub.parse::<f64>().unwrap() / 1e3;
            sum.1 += shim.parse::<f64>().unwrap() / 1e3;
        }
        assert!(!text.is_empty(), "the apply ran no docker command");
        sum
    }
}

/// Runs as `docker` (a symlink in the stub's directory): runs `docker-real` beside it with the
/// same arguments and stdio, then appends `stub_us shim_us` to `children.tsv` there.
fn docker_shim(argv0: &Path) -> ! {
    use nix::sys::resource::{UsageWho, getrusage};
    use std::io::Write as _;
    let dir = argv0.parent().expect("the shim's directory");
    let status = Command::new(dir.join("docker-real"))
        .arg0(argv0)
        .args(std::env::args_os().skip(1))
        .status()
        .expect("run the stub docker");
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    let cpu = |who| {
        let u = getrusage(who).expect("getrusage");
        us(u.user_time()) + us(u.system_time())
    };
    let line = format!(
        "{} {}\n",
        cpu(UsageWho::RUSAGE_CHILDREN),
        cpu(UsageWho::RUSAGE_SELF)
    );
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("children.tsv"))
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .expect("append to children.tsv");
    std::process::exit(status.code().unwrap_or(1))
}

/// One TLS handshake to the fake OpenBao, as the agent makes it (rustls on AWS-LC, the
/// configured CA as the only root), each in a fresh process: the first handshake of a process
/// is the one every tick pays, random generator seeding included.
fn tls_handshake(rows: &mut Rows, runs: usize) {
    let w = stub_world();
    let ca = w.path("ca.pem");
    let cpu: Vec<f64> = (0..runs)
        .map(|_| {
            let out = Command::new(std::env::current_exe().unwrap())
                .arg("--handshake")
                .arg(w.bao.addr().to_string())
                .arg("bao.example.test")
                .arg(&ca)
                .output()
                .expect("the handshake process");
            assert!(
                out.status.success(),
                "handshake: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<f64>()
                .unwrap()
                / 1e3
        })
        .collect();
    rows.add(HANDSHAKE, "cpu total", "ms", &cpu);
}

const HANDSHAKE: &str = "one TLS handshake to OpenBao (fresh process, CA bundle, FakeBao)";

/// `--handshake ADDR NAME CA`: prints the CPU (µs, user + system) of one TLS handshake.
fn handshake(args: &[OsString]) -> ! {
    use nix::sys::resource::{UsageWho, getrusage};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let [addr, name, ca] = args else {
        panic!("--handshake ADDR NAME CA")
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("read the CA") {
        roots.add(cert.expect("a CA certificate")).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(name.to_string_lossy().into_owned()).unwrap();
    let mut tcp = std::net::TcpStream::connect(addr.to_string_lossy().as_ref()).unwrap();
    let cpu = || {
        let u = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
        let us = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
        us(u.user_time()) + us(u.system_time())
    };
    let before = cpu();
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).expect("the handshake");
    }
    let used = cpu() - before;
    println!("{used}");
    std::process::exit(0)
}

fn verify_throughput(rows: &mut Rows, runs: usize) {
    let b = sized_bundle(4 * 1024 * 1024 - 24 * 1024, 0);
    let tar = b.tar();
    let sha = monky_agent_proto::Sha::parse(&b.sha()).unwrap().digest();
    let limits = monky_bundle::Limits::default();
    let ours: Vec<f64> = (0..runs.max(10))
        .map(|_| {
            let t = Instant::now();
            let parsed = monky_bundle::Bundle::parse(&tar, &limits).unwrap();
            parsed.check_sha(&sha).unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let case = "verify 4 MiB bundle (parse + limits + sha256, in process)";
    rows.add(case, "bundle", "KiB", &[tar.len() as f64 / 1024.0]);
    rows.add(case, "wall", "ms", &ours);
    let file = std::env::temp_dir().join(format!("monky-bench-bundle.{}.tar", std::process::id()));
    std::fs::write(&file, &tar).unwrap();
    let samples = measure_n(runs.max(10), |_| {}, &|| {
        let mut c = Command::new("sha256sum");
        c.arg(&file);
        c
    });
    let _ = std::fs::remove_file(&file);
    rows.add_process("sha256sum of the same bytes (process)", &samples);
}

/// The compose policy's own cost on a typical bundle (a web app, its database and a worker):
/// the check of the file before the lease and the check of compose's model before pull, in
/// process. compose's own `config` run is the model's price, measured with the apply ticks.
fn compose_policy(rows: &mut Rows, runs: usize) {
    let yaml = concat!(
        "x-common: &common\n  restart: unless-stopped\n  env_file: .env\n",
        "  logging: {driver: json-file, options: {max-size: 10m}}\n",
        "services:\n  web:\n    <<: *common\n    image: registry.example/monky/web:${TAG:-1}\n",
        "    ports: [\"8080:80\"]\n",
        "    volumes: [./conf:/conf:ro, webdata:/data, /etc/localtime:/etc/localtime:ro]\n",
        "    depends_on: {db: {condition: service_healthy}}\n",
        "    healthcheck: {test: [CMD, wget, -qO-, http://localhost/health], interval: 10s}\n",
        "    security_opt: [no-new-privileges:true]\n    cap_drop: [ALL]\n",
        "    cap_add: [NET_BIND_SERVICE]\n",
        "    deploy: {resources: {limits: {cpus: \"1\", memory: 512M}}}\n",
        "  db:\n    <<: *common\n    image: postgres:16\n",
        "    volumes: [pgdata:/var/lib/postgresql/data]\n",
        "    healthcheck: {test: [CMD-SHELL, pg_isready], interval: 5s}\n    tmpfs: [/run]\n",
        "  worker:\n    <<: *common\n    image: registry.example/monky/worker:${TAG:-1}\n",
        "    command: [worker, --queue, default]\n    profiles: [jobs]\n",
        "volumes:\n  webdata: {}\n  pgdata: {}\n",
    );
    let dir = Path::new("/var/lib/monky-deployd/env-qa-02/releases/0123456789abcdef");
    let bind = |src: &str, target: &str, ro: bool| json!({"type": "bind", "source": src, "target": target, "read_only": ro, "bind": {"create_host_path": true}});
    let common = |image: &str| {
        json!({"image": image, "command": null, "entrypoint": null, "restart": "unless-stopped",
               "environment": {"GEMINI_API_KEY": "x", "POSTGRES_PASSWORD": "y", "LOG_LEVEL": "info"},
               "logging": {"driver": "json-file", "options": {"max-size": "10m"}},
               "networks": {"default": null}, "pids_limit": 1024, "mem_limit": "2147483648"})
    };
    let mut web = common("registry.example/monky/web:1");
    web.as_object_mut().unwrap().extend(json!({
        "ports": [{"mode": "ingress", "target": 80, "published": "8080", "protocol": "tcp"}],
        "volumes": [bind(&format!("{}/conf", dir.display()), "/conf", true),
                    {"type": "volume", "source": "webdata", "target": "/data", "volume": {}},
                    bind("/etc/localtime", "/etc/localtime", true)],
        "depends_on": {"db": {"condition": "service_healthy", "required": true}},
        "healthcheck": {"test": ["CMD", "wget", "-qO-", "http://localhost/health"], "interval": "10s"},
        "security_opt": ["no-new-privileges:true"], "cap_drop": ["ALL"], "cap_add": ["NET_BIND_SERVICE"],
        "deploy": {"resources": {"limits": {"cpus": 1.0, "memory": "536870912"}}, "placement": {}}
    }).as_object().unwrap().clone());
    let mut db = common("postgres:16");
    db.as_object_mut().unwrap().extend(json!({
        "volumes": [{"type": "volume", "source": "pgdata", "target": "/var/lib/postgresql/data", "volume": {}}],
        "healthcheck": {"test": ["CMD-SHELL", "pg_isready"], "interval": "5s"}, "tmpfs": ["/run"]
    }).as_object().unwrap().clone());
    let mut worker = common("registry.example/monky/worker:1");
    worker.as_object_mut().unwrap().extend(
        json!({"command": ["worker", "--queue", "default"], "profiles": ["jobs"]})
            .as_object()
            .unwrap()
            .clone(),
    );
    let project = "monky-env-qa-02";
    let model = json!({"name": project, "services": {"web": web, "db": db, "worker": worker},
        "networks": {"default": {"name": format!("{project}_default"), "ipam": {}}},
        "volumes": {"webdata": {"name": format!("{project}_webdata")}, "pgdata": {"name": format!("{project}_pgdata")}}});
    // As the agent judges: the box's budget with the host's memory and CPUs, and the pids and
    // memory limits the agent supplies through its override, which the model carries.
    let policy = monky_bundle::ComposePolicy::new(project)
        .budget(monky_bundle::Budget {
            max_memory: Some(8 << 30),
            max_cpus: Some(4.0),
            ..monky_bundle::Budget::default()
        })
        .pids_supplied(true);
    let secrets = std::collections::BTreeSet::from([
        "GEMINI_API_KEY".to_string(),
        "POSTGRES_PASSWORD".to_string(),
    ]);
    let read_link = |p: &Path| std::fs::read_link(p).ok();
    let samples: Vec<f64> = (0..runs.max(10) * 10)
        .map(|_| {
            let m = model.clone();
            let t = Instant::now();
            policy.check_file(yaml, &|_| None, &secrets).unwrap();
            std::hint::black_box(policy.budget_of().budget_override_for(yaml));
            policy.check_model(m, yaml, dir, &read_link).unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    rows.add(
        "compose policy, typical bundle (file + model, in process)",
        "wall",
        "ms",
        &samples,
    );
}

fn python_floor(rows: &mut Rows, runs: usize) {
    // The system python, not a version manager's shim script in front of it.
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).is_file());
    let Some(python) = python else {
        eprintln!("perf: no python3: its floor is skipped");
        return;
    };
    let samples = measure_n(runs, |_| {}, &|| {
        let mut c = Command::new(python);
        c.args([
            "-c",
            "import json, urllib.request, subprocess, ssl, hashlib, tarfile, logging, argparse, pathlib",
        ]);
        c
    });
    rows.add_process("python3 importing the original agent's modules", &samples);
}

/// The heartbeat's look at what runs, alone and in process, on the 3 running containers: per
/// container one engine request (`GET /containers/{id}/json`) and the /proc reads of its
/// processes, then the judgement against the host's accounts and the release's secret values.
fn runtime_look(rows: &mut Rows, runs: usize, e2e: &E2e, project: &str) {
    use monky_deployd::runtime_look as look;
    let out = Command::new(&e2e.docker)
        .args(["ps", "-q", "--no-trunc", "--filter"])
        .arg(format!("label=com.docker.compose.project={project}"))
        .output()
        .expect("docker ps");
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    let engine = monky_compose::Engine::from_env();
    let roots = look::Roots::default();
    let secrets = look::SecretValues::new(vec![
        (
            "GEMINI_API_KEY".into(),
            secrecy::SecretString::from("gemini-Key-bench-0001"),
        ),
        (
            "POSTGRES_PASSWORD".into(),
            secrecy::SecretString::from("pg-Password-bench-02"),
        ),
    ]);
    let cpu = || {
        use nix::sys::resource::{UsageWho, getrusage};
        let u = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
        let us = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e6 + t.tv_usec() as f64;
        (us(u.user_time()) + us(u.system_time())) / 1e3
    };
    let (mut wall, mut used) = (Vec::new(), Vec::new());
    for _ in 0..runs.max(10) * 5 {
        let (t, c) = (Instant::now(), cpu());
        let accounts = monky_deployd::shared_uid::HostAccounts::read();
        let sharing = look::Sharing {
            accounts: Some(&accounts),
            allowed: &[],
        };
        for id in &ids {
            let running = engine.running(id).expect("inspect");
            let pid = running.pid.expect("running");
            let procs = look::processes(&roots, id, pid).expect("processes");
            let subject = look::Subject {
                service: "web",
                holds_a_secret: secrets.in_env(&running.env),
                args_judged: true,
            };
            std::hint::black_box(look::judge(subject, &procs, &sharing, &secrets));
        }
        wall.push(t.elapsed().as_secs_f64() * 1e3);
        used.push(cpu() - c);
    }
    let case = "runtime look at 3 containers (engine + /proc, in process)";
    rows.add(case, "wall", "ms", &wall);
    rows.add(case, "cpu total", "ms", &used);
}

// ---- the real engine ---------------------------------------------------------------------------

struct E2e {
    docker: PathBuf,
    prefix: String,
    registry: String,
    user: String,
    password: String,
    image: String,
}

impl E2e {
    fn from_env() -> Option<Self> {
        let file = std::env::var_os("MONKY_E2E_ENV")?;
        let text = std::fs::read_to_string(file).ok()?;
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .map(str::to_string)
        };
        Some(E2e {
            docker: get("MONKY_E2E_DOCKER")?.into(),
            prefix: get("MONKY_E2E_NAME_PREFIX")?,
            registry: get("MONKY_E2E_REGISTRY")?,
            user: get("MONKY_E2E_REGISTRY_USER")?,
            password: get("MONKY_E2E_REGISTRY_PASSWORD")?,
            image: get("MONKY_E2E_IMAGE_WEB_1")?,
        })
    }
}

/// Takes the benchmark's compose project down, whatever happened.
struct Down<'a> {
    docker: &'a Path,
    project: String,
}

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = Command::new(self.docker)
            .args([
                "compose",
                "-p",
                &self.project,
                "down",
                "-v",
                "--remove-orphans",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn real_engine(rows: &mut Rows, runs: usize, e2e: &E2e) {
    let project = format!("{}bench-{}", e2e.prefix, std::process::id());
    let _down = Down {
        docker: &e2e.docker,
        project: project.clone(),
    };
    let w = World::real_docker(RealDocker {
        docker_bin: e2e.docker.clone(),
        compose_project: project.clone(),
        registry: e2e.registry.clone(),
        registry_user: e2e.user.clone(),
        registry_password: e2e.password.clone(),
        healthy_timeout_s: 120,
    });
    unlimited(&w);
    let mut b = TestBundle::default().with_registry_auth();
    b.compose = ["web", "api", "worker"]
        .iter()
        .map(|s| format!("  {s}:\n    image: {}\n    env_file: .env\n", e2e.image))
        .fold("services:\n".to_string(), |acc, s| acc + &s);
    w.stage_grant();
    w.publish(&b);
    let t = Instant::now();
    let run = w.tick();
    assert_eq!(run.code(), 0, "real-engine apply: {}", run.stderr());
    eprintln!(
        "perf: 3-container apply on the real engine took {:.1?}",
        t.elapsed()
    );
    // One heartbeat first: it saves the compose facts that later ticks reuse.
    w.tick().ok();
    let samples = measure_n(runs, |_| {}, &|| w.command(&["run", "--once"]));
    let last = w.last_report();
    assert!(
        last.detail.is_none() && last.containers.len() == 3,
        "{last:?}"
    );
    rows.add_process(
        "heartbeat tick (loopback peers, real engine, 3 containers)",
        &samples,
    );
    if let Some(dist) = dist_agent() {
        let samples = measure_n(runs, |_| {}, &|| {
            with_program(&w.command(&["run", "--once"]), &dist)
        });
        let last = w.last_report();
        assert!(
            last.detail.is_none() && last.containers.len() == 3,
            "{last:?}"
        );
        rows.add_process(
            "heartbeat tick from outside (the dist binary, real engine, 3 containers)",
            &samples,
        );
    }
    runtime_look(rows, runs, e2e, &project);
    let samples = measure_n(runs, |_| {}, &|| {
        let mut c = Command::new(&e2e.docker);
        c.args(["compose", "-p", &project, "ps", "-a", "--format", "json"])
            .env("HOME", w.home());
        c
    });
    rows.add_process(
        "docker compose ps -a --format json (same project)",
        &samples,
    );
}
