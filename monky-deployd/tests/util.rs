//! The test world: the agent binary in a temp dir, the testkit tenancy and OpenBao on
//! 127.0.0.1:0, a recording stub `docker` and a fake engine socket that serves its containers;
//! or, for the end-to-end suite, the real docker CLI and engine instead of the last two. The
//! OpenBao is the fake (`World`) or a real server set up as production (`World<RealBao>`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};

use monky_agent_proto::{ReportRequest, ReportResult};
use monky_bundle::MemberName;
use monky_compose::testkit::{FakeEngine, StubDocker};
use monky_testkit::bao::{BaoPeer, FakeBao, RealBao};
use monky_testkit::peers::{Peers, PeersBuilder};
use monky_testkit::tenancy::{Desired, FakeTenancy, Recorded};
use secrecy::ExposeSecret;
use serde_json::{Value, json};

pub const ENV: &str = "env-qa-02";

/// The secret values every default bundle reads; the redaction tests grep for them.
pub const GEMINI: &str = "gemini-Secret-Value-0001";
pub const PGPASS: &str = "pg-Secret-Value-0002-x";
pub const REGISTRY_PASS: &str = "registry-Robot-Pass-0003";

/// A bundle under construction; `Default` is a typical two-secret bundle.
#[derive(Clone)]
pub struct TestBundle {
    pub compose: String,
    pub env_template: String,
    pub manifest: Value,
    pub meta: Value,
}

impl Default for TestBundle {
    fn default() -> Self {
        Self {
            compose: "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    env_file: .env\n"
                .into(),
            env_template: "# rendered by monky-deploy; substitutes every ${VAR} from OpenBao\n\
                           GEMINI_API_KEY=${GEMINI_API_KEY}\nPOSTGRES_PASSWORD=${POSTGRES_PASSWORD}\n\
                           LOG_LEVEL=${LOG_LEVEL:-info}\n"
                .into(),
            manifest: json!({"vault_mode": "openbao", "entries": [
                {"var": "GEMINI_API_KEY", "path": format!("monky/{ENV}/see/gemini_api_key"), "kind": "supplied", "version": 1},
                {"var": "POSTGRES_PASSWORD", "path": format!("monky/data/{ENV}/see/pg_password"), "kind": "generated", "version": null},
            ]}),
            meta: json!({"env_id": ENV, "tier": "qa", "site": "cbs", "renderer": "compose"}),
        }
    }
}

impl TestBundle {
    /// A variant: the same bundle with another image tag (so another sha).
    pub fn tagged(tag: &str) -> Self {
        let mut b = Self::default();
        b.compose = b.compose.replace("web:1", &format!("web:{tag}"));
        b
    }

    pub fn with_registry_auth(mut self) -> Self {
        self.manifest["entries"]
            .as_array_mut()
            .unwrap()
            .push(json!({
            "var": "REGISTRY_AUTH", "path": format!("monky/{ENV}/see/registry"), "kind": "supplied",
            "version": null, "use": "registry-auth"}));
        self
    }

    fn files(&self) -> BTreeMap<MemberName, Vec<u8>> {
        let mut files = BTreeMap::new();
        let put = |files: &mut BTreeMap<_, _>, name: &[u8], bytes: Vec<u8>| {
            files.insert(MemberName::parse(name).unwrap(), bytes);
        };
        put(
            &mut files,
            b"docker-compose.yml",
            self.compose.clone().into_bytes(),
        );
        put(
            &mut files,
            b".env.template",
            self.env_template.clone().into_bytes(),
        );
        put(
            &mut files,
            b"secrets.manifest.json",
            self.manifest.to_string().into_bytes(),
        );
        put(
            &mut files,
            b"bundle.json",
            self.meta.to_string().into_bytes(),
        );
        files
    }

    pub fn tar(&self) -> Vec<u8> {
        monky_bundle::pack_tar(&self.files())
    }

    pub fn sha(&self) -> String {
        let files = self.files();
        monky_bundle::bundle_sha(files.iter().map(|(n, b)| (n.as_str(), b.as_slice()))).to_string()
    }
}

/// Options for building a world.
#[derive(Default)]
pub struct WorldOptions {
    /// Serve OpenBao over TLS with a private CA, reached as `bao.example.test` via the proxy
    /// transport.
    pub tls_proxy: bool,
}

/// The real engine a world drives in the end-to-end suite.
#[derive(Clone, Debug)]
pub struct RealDocker {
    /// The docker CLI (`docker_bin` in the agent's config).
    pub docker_bin: PathBuf,
    /// The compose project; unique per test so parallel tests never share containers.
    pub compose_project: String,
    /// The registry the images come from; the seeded credential names it.
    pub registry: String,
    /// The registry user and password seeded in OpenBao as the `registry` secret.
    pub registry_user: String,
    /// See `registry_user`.
    pub registry_password: String,
    /// `healthy_timeout_s` of the agent.
    pub healthy_timeout_s: u64,
}

/// One agent on one box, with its peers.
pub struct World<B: BaoPeer = FakeBao> {
    pub dir: tempfile::TempDir,
    pub tenancy: FakeTenancy,
    pub bao: B,
    stub: StubDocker,
    _engine: Option<FakeEngine>,
    real: Option<RealDocker>,
    config_extra: std::cell::RefCell<String>,
    bao_extra: std::cell::RefCell<String>,
    tls: Option<Pki>,
    /// The box's own registry for a world on the stub docker: a listener of this process on
    /// 127.0.0.1, which the seeded credential names, so the agent proves it the box's before
    /// each pull (the stub pulls nothing from it).
    registry: Option<std::net::TcpListener>,
}

/// A private CA and a leaf for `bao.example.test` and 127.0.0.1: the testkit's one test PKI.
pub use monky_testkit::pki::Pki;

impl<B: BaoPeer + 'static> World<B> {
    /// The registry the seeded credential names (`host:port`).
    #[allow(dead_code)] // Not every test binary sharing this file names it.
    pub fn registry(&self) -> String {
        match (&self.real, &self.registry) {
            (Some(r), _) => r.registry.clone(),
            (None, Some(l)) => l.local_addr().unwrap().to_string(),
            (None, None) => unreachable!(),
        }
    }
}

impl World {
    pub fn new() -> Self {
        Self::with(WorldOptions::default())
    }

    pub fn with(opts: WorldOptions) -> Self {
        Self::build(opts, None)
    }

    /// A world whose agent drives the real docker CLI and engine with the fake OpenBao (the
    /// benches; the end-to-end suite uses [`World::real_bao_with`]).
    #[allow(dead_code)] // Used by benches/perf.rs, which shares this file.
    pub fn real_docker(real: RealDocker) -> Self {
        Self::build(WorldOptions::default(), Some(real))
    }

    /// As [`World::new`], with the fake OpenBao's role set up further by `role` (its TTLs).
    pub fn fake_bao_with(
        role: impl FnOnce(monky_testkit::bao::FakeBaoBuilder) -> monky_testkit::bao::FakeBaoBuilder,
    ) -> Self {
        World::assemble(peers_over(None).fake_with(role), None, None)
    }

    /// As `tls_proxy`, with OpenBao serving `pki`'s certificate (one outside its dates, say).
    pub fn with_pki(pki: Pki) -> Self {
        let peers = peers_over(Some(&pki)).fake();
        World::assemble(peers, Some(pki), None)
    }

    fn build(opts: WorldOptions, real: Option<RealDocker>) -> Self {
        let pki = opts.tls_proxy.then(Pki::new);
        let peers = peers_over(pki.as_ref()).fake();
        World::assemble(peers, pki, real)
    }
}

/// The peers, with OpenBao serving HTTPS with `pki`'s leaf when there is one.
fn peers_over(pki: Option<&Pki>) -> PeersBuilder {
    match pki {
        Some(p) => Peers::builder().tls(p),
        None => Peers::builder(),
    }
}

impl World<RealBao> {
    /// A world whose OpenBao is a real server set up as production, with the stub docker;
    /// `None` when [`monky_testkit::bao::real_skipped`].
    pub fn real_bao() -> Option<Self> {
        Self::real_bao_with(None, |b| b)
    }

    /// As [`World::real_bao`], on the real engine, the role configured further by `role`.
    pub fn real_bao_with(
        real: Option<RealDocker>,
        role: impl FnOnce(monky_testkit::bao::RealBaoBuilder) -> monky_testkit::bao::RealBaoBuilder,
    ) -> Option<Self> {
        Self::real_bao_opts(WorldOptions::default(), real, role)
    }

    /// The real server with `opts` (`tls_proxy`: HTTPS with a private CA behind the proxy
    /// transport, as on a box).
    pub fn real_bao_opts(
        opts: WorldOptions,
        real: Option<RealDocker>,
        role: impl FnOnce(monky_testkit::bao::RealBaoBuilder) -> monky_testkit::bao::RealBaoBuilder,
    ) -> Option<Self> {
        if monky_testkit::bao::real_skipped() {
            return None;
        }
        let pki = opts.tls_proxy.then(Pki::new);
        let peers = peers_over(pki.as_ref())
            .real_with(role)
            .unwrap_or_else(|e| panic!("real openbao: {e}"));
        Some(World::assemble(peers, pki, real))
    }
}

impl<B: BaoPeer + 'static> World<B> {
    fn assemble(peers: Peers<B>, pki: Option<Pki>, real: Option<RealDocker>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let Peers { tenancy, bao } = peers;
        bao.put_secret(ENV, "gemini_api_key", GEMINI);
        bao.put_secret(ENV, "pg_password", "an-older-value");
        bao.put_secret(ENV, "pg_password", PGPASS);
        let listener = real
            .is_none()
            .then(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let registry = match (&real, &listener) {
            (Some(r), _) => json!({"registry": r.registry, "username": r.registry_user,
                              "password": r.registry_password}),
            (None, Some(l)) => {
                json!({"registry": l.local_addr().unwrap().to_string(), "username": "robot",
                       "password": REGISTRY_PASS})
            }
            (None, None) => unreachable!(),
        };
        bao.put_secret(ENV, "registry", &registry.to_string());
        // The agent's own HOME: in real mode nothing of the invoking user's `~/.docker` may help.
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        let stub = StubDocker::install(&dir.path().join("docker")).unwrap();
        let engine = real.is_none().then(|| stub.engine());
        let w = Self {
            dir,
            tenancy,
            bao,
            stub,
            _engine: engine,
            real,
            config_extra: std::cell::RefCell::new(String::new()),
            bao_extra: std::cell::RefCell::new(String::new()),
            tls: pki,
            registry: listener,
        };
        w.write_config();
        w
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("state")
    }

    pub fn config_path(&self) -> PathBuf {
        self.path("config.yaml")
    }

    pub fn bootstrap_path(&self) -> PathBuf {
        self.path("etc/bootstrap.jwt")
    }

    pub fn stub_dir(&self) -> PathBuf {
        self.path("docker")
    }

    /// Appends top-level config lines (YAML) and rewrites the file.
    pub fn config_extra(&self, lines: &str) {
        self.config_extra.borrow_mut().push_str(lines);
        self.write_config();
    }

    /// Replaces what [`config_extra`](Self::config_extra) appended with `lines`.
    pub fn set_config_extra(&self, lines: &str) {
        *self.config_extra.borrow_mut() = lines.to_owned();
        self.write_config();
    }

    /// Appends lines to the `bao:` section (two-space indented YAML).
    pub fn bao_extra(&self, lines: &str) {
        self.bao_extra.borrow_mut().push_str(lines);
        self.write_config();
    }

    fn write_config(&self) {
        let t = self.tenancy.url();
        let (transport, bao) = match &self.tls {
            Some(_) => {
                std::fs::write(self.path("ca.pem"), &self.tls.as_ref().unwrap().ca_pem).unwrap();
                (
                    format!(
                        "transport: proxy\ntenancy:\n  host: monky.tenancy.deploy\n  port: 443\n  proxy_addr: {}\n",
                        self.tenancy.addr()
                    ),
                    format!(
                        "bao:\n  addr: https://bao.example.test:8200\n  ca_bundle: {}\n  proxy_addr: {}\n",
                        self.path("ca.pem").display(),
                        self.bao.addr()
                    ),
                )
            }
            None => (
                format!("transport: system\ntenancy:\n  base_url: {t}\n"),
                format!("bao:\n  addr: {}\n", self.bao.url()),
            ),
        };
        let bao = format!("{bao}{}", self.bao_extra.borrow());
        let docker = match &self.real {
            Some(r) => format!(
                "docker_bin: {}\ncompose_project: {}\nhealthy_timeout_s: {}\nregistry_host: {}\n",
                r.docker_bin.display(),
                r.compose_project,
                r.healthy_timeout_s,
                r.registry
            ),
            None => format!(
                "docker_bin: {}\nhealthy_timeout_s: 5\nregistry_host: 127.0.0.1:5000\n",
                self.stub.program().display()
            ),
        };
        // The free-space check judges the machine the tests run on, whose disk is not the
        // test's subject: no headroom unless a test sets its own (a CI machine with under 2 GiB
        // free refused every apply). A bundle's `disk_need_bytes` is still checked.
        let extra = self.config_extra.borrow();
        let headroom = if extra.contains("disk_headroom_bytes:") {
            ""
        } else {
            "disk_headroom_bytes: 0\n"
        };
        let text = format!(
            "env_id: {ENV}\nsite: cbs\n{transport}{bao}state_dir: {}\nbootstrap_file: {}\n\
             {docker}{headroom}{extra}",
            self.state_dir().display(),
            self.bootstrap_path().display(),
        );
        std::fs::write(self.config_path(), text).unwrap();
    }

    /// Stages a fresh bootstrap grant from tenancy (0600), as install.sh does.
    pub fn stage_grant(&self) {
        let grant = self.tenancy.mint_grant(ENV);
        std::fs::create_dir_all(self.bootstrap_path().parent().unwrap()).unwrap();
        std::fs::write(self.bootstrap_path(), grant.expose_secret()).unwrap();
        std::fs::set_permissions(
            self.bootstrap_path(),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
    }

    /// Publishes a bundle and makes it the desired one; returns its sha.
    pub fn publish(&self, b: &TestBundle) -> String {
        let sha = b.sha();
        self.tenancy.publish_bundle(ENV, &sha, b.tar());
        self.tenancy.set_desired(ENV, Desired::sha(sha.clone()));
        sha
    }

    /// Sets a stub scenario variable (see `monky_compose::testkit::DOCKER_STUB`).
    pub fn stub(&self, key: &str, value: &str) {
        self.stub.set(key, value);
    }

    /// What the fake engine answers for `/info` from now on (text that is not JSON: an answer
    /// the agent cannot read).
    pub fn set_engine_info(&self, body: &str) {
        std::fs::write(self.stub_dir().join("info.json"), body).unwrap();
    }

    /// The requests the fake engine has answered, as `METHOD target`.
    pub fn engine_requests(&self) -> Vec<String> {
        self._engine
            .as_ref()
            .map(FakeEngine::requests)
            .unwrap_or_default()
    }

    /// Sets the fake engine's image for `reference` (`None`: the engine has none).
    pub fn set_engine_image(&self, reference: &str, id: Option<&str>) {
        self.stub.set_image(reference, id);
    }

    pub fn clear_stub(&self) {
        self.stub.clear();
    }

    /// The docker calls so far, each as its argument line.
    pub fn docker_calls(&self) -> Vec<String> {
        self.stub.calls().iter().map(|c| c.command_line()).collect()
    }

    /// The docker calls so far: argv, cwd and environment.
    pub fn docker_call_records(&self) -> Vec<monky_compose::testkit::Call> {
        self.stub.calls()
    }

    /// Everything the stub recorded (argv, cwd, env), as written.
    pub fn docker_log(&self) -> String {
        self.stub.log()
    }

    /// The agent's home directory (`HOME` of the agent process).
    pub fn home(&self) -> PathBuf {
        self.path("home")
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_monky-deployd"));
        self.agent_args_env(&mut c, args);
        c
    }

    /// The agent started through `wrapper` (a program and its arguments, e.g. `unshare ...`),
    /// with the same arguments and environment as [`World::command`].
    pub fn wrapped_command(&self, wrapper: &[&str], args: &[&str]) -> Command {
        let mut c = Command::new(wrapper[0]);
        c.args(&wrapper[1..])
            .arg(env!("CARGO_BIN_EXE_monky-deployd"));
        self.agent_args_env(&mut c, args);
        c
    }

    fn agent_args_env(&self, c: &mut Command, args: &[&str]) {
        c.arg("--config")
            .arg(self.config_path())
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("MONKY_DEPLOYD_CONFIG");
        // Time a test lets pass on the fake OpenBao (a token's age) passes on the box's clocks
        // too, as it would: else OpenBao's `Date` says the box is behind (TLS_CLOCK). A test
        // that sets the test clock itself overrides this.
        if let Some(fake) = (&self.bao as &dyn std::any::Any).downcast_ref::<FakeBao>() {
            let ahead = fake
                .now()
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default()
                .as_secs();
            if ahead > 0 {
                c.env("MONKY_DEPLOYD_TEST_CLOCK", format!("{ahead} {ahead}"));
            }
        }
        if self.real.is_some() {
            // The real engine: the agent finds it as it would on a box (DOCKER_HOST as
            // inherited, else the default socket), with a HOME of its own.
            c.env("HOME", self.home());
        } else {
            c.env(
                "DOCKER_HOST",
                format!("unix://{}", self.stub_dir().join("docker.sock").display()),
            );
        }
    }

    pub fn run(&self, args: &[&str]) -> Run {
        Run(self.command(args).output().unwrap())
    }

    /// Tenancy answers every checkin with `body` (200), however malformed.
    pub fn checkin_answers(&self, body: &Value) {
        self.tenancy.set_fault(
            monky_testkit::tenancy::Endpoint::Checkin,
            monky_testkit::tenancy::Fault::Status {
                status: 200,
                body: body.to_string(),
            },
        );
    }

    pub fn tick(&self) -> Run {
        self.run(&["run", "--once"])
    }

    pub fn reports(&self) -> Vec<ReportRequest> {
        self.tenancy.reports(ENV)
    }

    pub fn last_report(&self) -> ReportRequest {
        self.reports().pop().expect("a report")
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.tenancy.requests()
    }

    pub fn state(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.state_dir().join("state.json")).unwrap())
            .unwrap()
    }

    pub fn env_dir(&self) -> PathBuf {
        self.state_dir().join(ENV)
    }

    pub fn current_target(&self) -> Option<PathBuf> {
        std::fs::read_link(self.env_dir().join("current")).ok()
    }

    /// Asserts that `current` names `releases/<sha>`.
    #[track_caller]
    pub fn assert_current(&self, sha: &str) {
        assert_eq!(
            self.current_target(),
            Some(std::path::Path::new("releases").join(sha)),
            "current"
        );
    }

    /// Bootstraps and applies the default bundle; returns its sha.
    pub fn applied(&self) -> String {
        self.stage_grant();
        let sha = self.publish(&TestBundle::default());
        self.tick().ok();
        sha
    }
}

/// A finished agent process.
pub struct Run(pub Output);

impl Run {
    pub fn code(&self) -> i32 {
        self.0.status.code().unwrap_or(-1)
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }
    #[track_caller]
    pub fn ok(&self) -> &Self {
        self.expect(0)
    }
    /// Asserts that stderr holds each of `texts`.
    #[track_caller]
    pub fn says(&self, texts: &[&str]) -> &Self {
        assert_holds("stderr", &self.stderr(), texts);
        self
    }
    /// Asserts that stdout holds each of `texts`.
    #[track_caller]
    pub fn prints(&self, texts: &[&str]) -> &Self {
        assert_holds("stdout", &self.stdout(), texts);
        self
    }
    #[track_caller]
    pub fn expect(&self, code: i32) -> &Self {
        assert_eq!(
            self.code(),
            code,
            "exit status\n--- stderr\n{}\n--- stdout\n{}",
            self.stderr(),
            self.stdout()
        );
        self
    }
}

#[track_caller]
fn assert_holds(stream: &str, output: &str, texts: &[&str]) {
    for text in texts {
        assert!(output.contains(text), "{stream} lacks {text:?}:\n{output}");
    }
}

/// Asserts a report's result and, for failures, the start of its detail.
#[track_caller]
pub fn assert_report(r: &ReportRequest, result: ReportResult, detail_prefix: Option<&str>) {
    assert_eq!(r.result, result, "report: {r:?}");
    match detail_prefix {
        Some(p) => assert!(
            r.detail.as_deref().unwrap_or("").starts_with(p),
            "detail {:?} does not start with {p:?}",
            r.detail
        ),
        None => assert_eq!(r.detail, None),
    }
}

/// Lines added to the real `/etc/hosts` for one test, under a name no other test uses, and
/// removed again when dropped (a panicking test included). dockerd reads the real file, so the
/// real-engine cases cannot use a private one. Every edit, here and in the drop, rewrites the
/// file in place (it may be a bind mount) under an exclusive lock of a file beside the tests'
/// temp dirs, so two tests never lose each other's lines; lines of anyone else are kept as
/// they are.
#[allow(dead_code)] // Not every test binary sharing this file maps a name.
pub struct HostsEntry {
    /// The unique name the lines map.
    pub name: String,
    lines: Vec<String>,
}

#[allow(dead_code)]
const ETC_HOSTS: &str = "/etc/hosts";

#[allow(dead_code)]
impl HostsEntry {
    /// Maps a fresh name ending in `suffix` (e.g. `.test`, `.localhost`) to each of `ips`.
    pub fn add(ips: &[&str], suffix: &str) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("monky-reg-{}-{n}-{nanos:x}{suffix}", std::process::id());
        let lines: Vec<String> = ips
            .iter()
            .map(|ip| format!("{ip} {name} # monky-deployd test, removed at its end"))
            .collect();
        Self::edit(|text| {
            let mut text = text.to_owned();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            for l in &lines {
                text.push_str(l);
                text.push('\n');
            }
            text
        });
        Self { name, lines }
    }

    fn edit(change: impl FnOnce(&str) -> String) {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::env::temp_dir().join("monky-deployd-tests-etc-hosts.lock"))
            .unwrap();
        lock.lock().unwrap();
        let text = std::fs::read_to_string(ETC_HOSTS).unwrap();
        let changed = change(&text);
        std::fs::write(ETC_HOSTS, changed).unwrap_or_else(|e| {
            panic!("this test maps a name in {ETC_HOSTS} for dockerd and cannot write it: {e}")
        });
        lock.unlock().unwrap();
    }
}

impl Drop for HostsEntry {
    fn drop(&mut self) {
        let lines = self.lines.clone();
        Self::edit(|text| {
            text.lines()
                .filter(|l| !lines.iter().any(|ours| ours == l))
                .map(|l| format!("{l}\n"))
                .collect()
        });
    }
}
