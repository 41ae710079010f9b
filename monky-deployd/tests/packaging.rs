//! Packaging: what a box gets, checked from the outside.
//!
//! Always run: install.sh in `--dry-run` (every action printed, the config it writes parsed by
//! the agent's own parser, secrets never printed, bad input refused), the systemd units' required
//! directives, and every command in the docs' `sh` blocks against the clap definition.
//!
//! Run by `cargo xtask dist --test` (the ci packaging step), which installs Debian's tools, builds
//! the .deb and a Debian image first, so these are `#[ignore]`d in a plain `cargo test`:
//! shellcheck, the ansible role's template rendered by jinja2 and parsed by the agent,
//! `systemd-analyze security`, lintian, the .deb's contents, and the .deb installed in a
//! container that boots systemd as PID 1, where the timer's tick applies a bundle through the
//! host's docker engine against the testkit peers of this process.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use monky_agent_proto::ReportResult;
use monky_deployd::config::{Config, TransportKind};
use monky_testkit::peers::Peers;
use secrecy::ExposeSecret;
use serde_json::json;

use crate::util::TestBundle;

mod pipeline;
mod upgrade_box;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed:\n{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---- install.sh --dry-run --------------------------------------------------------------------

const GRANT: &str = "grant-Secret-Value-pkg-0301";
const TOKEN: &str = "download-Token-pkg-0302";

/// A folder that looks like a release (a .deb and its .sha256) and a grant file.
struct DryRun {
    dir: tempfile::TempDir,
}

impl DryRun {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let rel = dir.path().join("release");
        std::fs::create_dir_all(&rel).unwrap();
        std::fs::write(dir.path().join("grant.jwt"), GRANT).unwrap();
        std::fs::write(dir.path().join("enrol.jwt"), "enrol-jwt").unwrap();
        std::fs::write(dir.path().join("ca.pem"), CA_PEM).unwrap();
        std::fs::write(
            dir.path().join("daemon.json"),
            "{\"data-root\": \"/srv/d\", \"log-driver\": \"local\"}\n",
        )
        .unwrap();
        Self { dir }
    }

    fn path(&self, rel: &str) -> String {
        self.dir.path().join(rel).display().to_string()
    }

    /// install.sh --dry-run with `args` (`{dir}` stands for this folder).
    fn run(&self, args: &[&str]) -> Output {
        let args: Vec<String> = args
            .iter()
            .map(|a| a.replace("{dir}", &self.dir.path().display().to_string()))
            .collect();
        self.command(&args).stdin(Stdio::null()).output().unwrap()
    }

    /// `bash install.sh --dry-run ARGS`, with no token or forge URL from this environment and
    /// no daemon.json of this machine's.
    fn command(&self, args: &[String]) -> Command {
        let mut c = Command::new("bash");
        c.arg(root().join("packaging/install.sh"))
            .arg("--dry-run")
            .args(args)
            .env(
                "MONKY_DEPLOYD_DOCKER_DAEMON_JSON",
                self.path("absent/daemon.json"),
            )
            .env_remove("MONKY_DEPLOYD_TOKEN")
            .env_remove("MONKY_DEPLOYD_GITLAB_URL")
            .env_remove("MONKY_DEPLOYD_GITEA_URL");
        c
    }
}

/// `--userns-remap`: the operator's daemon.json keeps every key (and a data-root given beside
/// it), `"userns-remap": "default"` is merged in, dockerd checks the file before it replaces
/// the old one, the old one is kept to come back to, and the restart is checked for remapping.
/// A userns-remap the operator set already is kept, never replaced.
#[test]
fn install_sh_userns_remap_merges_daemon_json_and_restarts_docker_checked() {
    let dry = DryRun::new();
    let daemon = dry.path("daemon.json");
    let remap = |extra: &[&str]| {
        let out = Command::new("bash")
            .arg(root().join("packaging/install.sh"))
            .args(["--dry-run", "--env", "e1", "--source"])
            .arg(dry.path("release"))
            .arg("--userns-remap")
            .args(extra)
            .env("MONKY_DEPLOYD_DOCKER_DAEMON_JSON", &daemon)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        text(&out)
    };
    let last_written = |out: &str| -> serde_json::Value {
        let start = format!("--- {daemon}\n");
        let from = out.rfind(&start).expect("daemon.json written") + start.len();
        let to = out[from..].find(&format!("--- end of {daemon}\n")).unwrap() + from;
        serde_json::from_str(&out[from..to]).unwrap()
    };
    let out = remap(&[]);
    assert_eq!(
        last_written(&out),
        serde_json::json!({"data-root": "/srv/d", "log-driver": "local", "userns-remap": "default"})
    );
    let validate = out.find("+ dockerd --validate --config-file").expect(&out);
    let keep = out
        .find(&format!("+ cp -p {daemon} {daemon}.before-monky-deployd"))
        .expect(&out);
    let write = out.rfind(&format!("+ write {daemon}")).expect(&out);
    let restart = out.rfind("+ systemctl restart docker.service").expect(&out);
    let checked = out.find("name=userns").expect(&out);
    assert!(
        validate < write && keep < write && write < restart && restart < checked,
        "{out}"
    );
    assert_eq!(
        out.matches("+ systemctl restart docker.service").count(),
        1,
        "{out}"
    );
    // With a data root too: one file with both, one restart.
    let out = remap(&["--docker-data-root", "/home/docker-data"]);
    assert_eq!(
        last_written(&out),
        serde_json::json!({
            "data-root": "/home/docker-data", "log-driver": "local", "userns-remap": "default"
        })
    );
    assert_eq!(
        out.matches("+ systemctl restart docker.service").count(),
        1,
        "{out}"
    );
    // The operator's own remap user stays.
    std::fs::write(&daemon, "{\"userns-remap\": \"ops:ops\"}\n").unwrap();
    let out = remap(&[]);
    assert_eq!(
        last_written(&out),
        serde_json::json!({"userns-remap": "ops:ops"})
    );
    assert!(
        out.contains("keeping the userns-remap \"ops:ops\""),
        "{out}"
    );
    // Without the flag nothing of it happens.
    let out = dry.run(&["--env", "e1", "--source", "{dir}/release"]);
    assert!(!text(&out).contains("userns"), "{}", text(&out));
}

/// A file that looks like a CA bundle to install.sh, which only copies it.
const CA_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

/// The file a dry run would write, as printed between its markers.
fn written(out: &str, path: &str) -> Option<String> {
    let start = format!("--- {path}\n");
    let end = format!("--- end of {path}\n");
    let from = out.find(&start)? + start.len();
    let to = out[from..].find(&end)? + from;
    Some(out[from..to].to_string())
}

/// The config a dry run writes, parsed by the agent.
pub(crate) fn written_config(out: &str) -> Config {
    let yaml = written(out, "/etc/monky-deployd/config.yaml")
        .unwrap_or_else(|| panic!("no config.yaml in the dry run:\n{out}"));
    Config::parse(&yaml, Path::new("/etc/monky-deployd/config.yaml"))
        .unwrap_or_else(|e| panic!("the agent refuses the config install.sh writes: {e:#}\n{yaml}"))
}

struct Case {
    args: &'static [&'static str],
    /// Lines (or parts of lines) the dry run must print.
    prints: &'static [&'static str],
    /// Text it must not print.
    not: &'static [&'static str],
    check: fn(&Config),
}

#[test]
fn install_sh_dry_run_prints_every_action_and_writes_a_config_the_agent_parses() {
    let arch = Command::new("dpkg")
        .arg("--print-architecture")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "amd64".to_string(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_string(),
        );
    let deb = format!("monky-deployd_{}_{arch}.deb", monky_deployd::VERSION);
    let cases = [
        Case {
            // The kit's own invocation: the defaults.
            args: &[
                "--env",
                "env-qa-02",
                "--source",
                "{dir}/release",
                "--bootstrap-file",
                "{dir}/grant.jwt",
            ],
            prints: &[
                "+ cp {dir}/release/DEB {tmp}/DEB",
                "+ cp {dir}/release/DEB.sha256 {tmp}/DEB.sha256",
                "sha256sum --check --strict DEB.sha256",
                "apt-get install -y -q {tmp}/DEB",
                "+ install -d -o monky-deployd -g monky-deployd -m 0750 /etc/monky-deployd",
                "+ write /etc/monky-deployd/config.yaml (mode 0640, owner root:monky-deployd)",
                "+ write /etc/monky-deployd/proxy.env (mode 0640, owner root:monky-deployd)",
                "MONKY_ZITI_IDENTITY=/opt/openziti/etc/identities/monky-host.env-qa-02.json",
                "+ write /etc/monky-deployd/bootstrap.jwt (mode 0600, owner monky-deployd:monky-deployd)",
                "+ systemctl daemon-reload",
                "+ systemctl enable --now monky-deployd-proxy.service",
                "+ systemctl enable --now monky-deployd.timer",
                "+ systemctl start monky-deployd.service",
                "+ runuser -u monky-deployd -- monky-deployd --config /etc/monky-deployd/config.yaml doctor",
            ],
            not: &["daemon.json", "ziti-edge-tunnel enroll", "ca_bundle"],
            check: |c| {
                assert_eq!(c.env_id, "env-qa-02");
                assert_eq!(c.site, "cbs");
                assert_eq!(c.transport, TransportKind::Proxy);
                assert!(!c.laptop_mode);
                assert_eq!(
                    c.tenancy_url().unwrap().as_str(),
                    "http://monky.tenancy.deploy:443/"
                );
                assert_eq!(
                    c.tenancy_mapping().unwrap(),
                    Some("127.0.0.1:18443".parse().unwrap())
                );
                assert_eq!(c.bao.addr, "https://bao.cbs.tikali.net:8200");
                assert_eq!(
                    c.bao_mapping().unwrap(),
                    Some("127.0.0.1:18200".parse().unwrap())
                );
                assert_eq!(
                    c.bootstrap_file,
                    PathBuf::from("/etc/monky-deployd/bootstrap.jwt")
                );
                assert_eq!(c.state_dir, PathBuf::from("/var/lib/monky-deployd"));
            },
        },
        Case {
            // A laptop whose tunneler resolves names itself: no proxy at all.
            args: &[
                "--env",
                "env-dev-07",
                "--site",
                "lab",
                "--transport",
                "system",
                "--laptop",
                "--source",
                "{dir}/release",
            ],
            prints: &[
                "laptop mode: the timer stays off",
                "+ systemctl disable --now monky-deployd.timer",
            ],
            not: &[
                "proxy.env",
                "monky-deployd-proxy",
                "bootstrap.jwt (mode",
                "enable --now monky-deployd.timer",
                "run-host",
                " openziti",
            ],
            check: |c| {
                assert_eq!(c.transport, TransportKind::System);
                assert!(c.laptop_mode);
                assert_eq!(c.site, "lab");
                assert_eq!(c.bao.addr, "https://bao.lab.tikali.net:8200");
                assert_eq!(c.tenancy_mapping().unwrap(), None);
            },
        },
        Case {
            args: &[
                "--env",
                "env-qa-02",
                "--source",
                "{dir}/release",
                "--bao-ca",
                "{dir}/ca.pem",
                "--docker-data-root",
                "/home/docker-data",
                "--enrol-jwt",
                "{dir}/enrol.jwt",
                "--version",
                "0.3.1",
            ],
            prints: &[
                "monky-deployd_0.3.1_",
                "+ write /etc/monky-deployd/openbao-ca.pem (mode 0640, owner root:monky-deployd)",
                "(copy of {dir}/ca.pem)",
                "+ install -d -m 0711 /home/docker-data",
                "\"data-root\": \"/home/docker-data\"",
                "+ systemctl restart docker.service",
                "+ ziti-edge-tunnel enroll --jwt {dir}/enrol.jwt --identity /opt/openziti/etc/identities/monky-host.env-qa-02.json",
                "+ rm -f {dir}/enrol.jwt",
                "+ setfacl -m u:monky-deployd:r /opt/openziti/etc/identities/monky-host.env-qa-02.json",
            ],
            not: &["MIIB"],
            check: |c| {
                assert_eq!(
                    c.bao.ca_bundle.as_deref(),
                    Some(Path::new("/etc/monky-deployd/openbao-ca.pem"))
                );
            },
        },
        Case {
            // A download: the token goes to curl on stdin, so neither argv nor the output has it.
            args: &[
                "--env",
                "env-qa-02",
                "--source",
                "https://release.invalid/monky-deployd/0.2.0",
                "--token",
                TOKEN,
            ],
            prints: &[
                "+ curl -fsSL --config - https://release.invalid/monky-deployd/0.2.0/DEB -o {tmp}/DEB",
                "DEPLOY-TOKEN header from --token, on stdin",
            ],
            not: &[],
            check: |_| {},
        },
    ];
    for case in &cases {
        let dry = DryRun::new();
        let out = dry.run(case.args);
        let all = text(&out);
        assert!(out.status.success(), "{:?} failed:\n{all}", case.args);
        let fill = |s: &str| {
            s.replace("{dir}", &dry.path(""))
                .replace("//", "/")
                .replace("{tmp}", "/tmp/monky-deployd-install.XXXXXX")
                .replace("DEB", &deb)
        };
        let all_flat = all.replace("//", "/");
        for p in case.prints {
            let p = if case.args.contains(&"0.3.1") {
                fill(p).replace(monky_deployd::VERSION, "0.3.1")
            } else {
                fill(p)
            };
            assert!(
                all_flat.contains(&p),
                "{:?}: {p:?} not printed:\n{all}",
                case.args
            );
        }
        for n in case.not {
            assert!(!all.contains(n), "{:?}: {n:?} printed:\n{all}", case.args);
        }
        for secret in [GRANT, TOKEN, "enrol-jwt\n"] {
            assert!(!all.contains(secret), "a secret was printed:\n{all}");
        }
        (case.check)(&written_config(&all));
    }
}

#[test]
fn install_sh_refuses_what_it_cannot_install_before_changing_anything() {
    let dry = DryRun::new();
    let source: &[&str] = &["--source", "{dir}/release"];
    let cases: &[(&[&str], &str)] = &[
        (
            &["--transport", "tun", "--env", "e1"],
            "use proxy or system",
        ),
        (&["--env", "env qa"], "letters, digits"),
        (&["--site", "a/b", "--env", "e1"], "--site"),
        (&[], "--env is required"),
        (&["--env", "e1", "--version", "latest"], "is not a version"),
        (
            &["--env", "e1", "--bootstrap-file", "{dir}/none.jwt"],
            "missing or empty",
        ),
        (
            &["--env", "e1", "--bao-ca", "{dir}/grant.jwt"],
            "not a PEM certificate",
        ),
        (
            &["--env", "e1", "--docker-data-root", "rel/path"],
            "absolute path",
        ),
        (
            &["--env", "e1", "--frobnicate"],
            "unknown argument '--frobnicate'",
        ),
        (&["--env", "e1", "--token"], "--token needs a value"),
    ];
    for (args, message) in cases {
        let mut all_args = source.to_vec();
        all_args.extend_from_slice(args);
        let out = dry.run(&all_args);
        let all = text(&out);
        assert!(!out.status.success(), "{args:?} was accepted:\n{all}");
        assert!(
            all.contains(message),
            "{args:?}: {message:?} not said:\n{all}"
        );
        assert!(
            !all.contains("+ "),
            "{args:?}: acted before refusing:\n{all}"
        );
    }
    // An operator's own daemon.json keeps its keys; data-root is merged in.
    let out = Command::new("bash")
        .arg(root().join("packaging/install.sh"))
        .args(["--dry-run", "--env", "e1", "--source"])
        .arg(dry.path("release"))
        .args(["--docker-data-root", "/home/docker-data"])
        .env("MONKY_DEPLOYD_DOCKER_DAEMON_JSON", dry.path("daemon.json"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let merged = written(&text(&out), &dry.path("daemon.json")).expect("daemon.json written");
    let merged: serde_json::Value = serde_json::from_str(&merged).unwrap();
    assert_eq!(
        merged,
        serde_json::json!({"data-root": "/home/docker-data", "log-driver": "local"})
    );
    // Without a source the built-in GitLab download is used, with the kit's token.
    let out = dry.run(&["--env", "e1", "--token", TOKEN]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(
            "+ curl -fsSL --config - https://scm.tikali.ai/api/v4/projects/69/packages/generic/monky-deployd/"
        ),
        "{}",
        text(&out)
    );
}

/// The original kit's command lines, 0.1.0 to 0.1.7, as its README and the tenancy kit ran them
/// (after `curl ... | sudo bash -s --`), with every optional flag the original took.
const KIT_LINES: &[&str] = &[
    // 0.1.0: the grant on stdin, the enrolment JWT, the original's optional flags.
    "--env env-qa-02 --site cbs --enrol-jwt ./monky-host.env-qa-02.jwt",
    "--env env-qa-02 --site cbs --enrol-jwt ./monky-host.env-qa-02.jwt --transport sdk --version 0.1.0 --bao-ca openbao-ca.pem",
    "--env env-qa-02 --site cbs --enrol-jwt ./monky-host.env-qa-02.jwt --transport proxy --laptop",
    "--env env-dev-07 --site cbs --enrol-jwt ./monky-host.env-qa-02.jwt --transport system --laptop",
    // The tenancy kit since !22: it stages the grant and pins the version.
    "--env env-qa-02 --site cbs --version 0.1.3 --bootstrap-file bootstrap.jwt",
    // 0.1.4 to 0.1.7: the deploy token and the grant file.
    "--env env-qa-02 --site cbs --token TOKEN --bootstrap-file bootstrap.jwt --enrol-jwt ./monky-host.env-qa-02.jwt",
    "--env env-qa-02 --site cbs --token TOKEN --bootstrap-file bootstrap.jwt --enrol-jwt ./monky-host.env-qa-02.jwt --transport sdk --version 0.1.6 --docker-data-root /home/docker-data --bao-ca openbao-ca.pem --source gitlab",
    "--env env-qa-02 --site cbs --token TOKEN --bootstrap-file bootstrap.jwt --transport proxy --version 0.1.7 --source gitea",
    "--env env-qa-02 --site cbs --token TOKEN --bootstrap-file bootstrap.jwt --enrol-jwt ./monky-host.env-qa-02.jwt --transport system --laptop --version 0.1.5",
];

#[test]
fn install_sh_accepts_every_kit_command_line_of_the_original() {
    // The kit's own file names, in the folder the kit ran the script from.
    let kit = DryRun::new();
    let dir = kit.dir.path();
    std::fs::write(dir.join("bootstrap.jwt"), GRANT).unwrap();
    std::fs::write(dir.join("monky-host.env-qa-02.jwt"), "enrol-jwt").unwrap();
    std::fs::write(dir.join("openbao-ca.pem"), CA_PEM).unwrap();
    for line in KIT_LINES {
        let args: Vec<String> = line
            .split_whitespace()
            .map(|a| a.replace("TOKEN", TOKEN))
            .collect();
        // The script is a file here, as the 0.1.0 kit ran it, so the grant comes on stdin when
        // no --bootstrap-file names it.
        let out = kit
            .command(&args)
            .current_dir(dir)
            .stdin(std::fs::File::open(dir.join("bootstrap.jwt")).unwrap())
            .output()
            .unwrap();
        let all = text(&out);
        assert!(out.status.success(), "{line}:\n{all}");
        for secret in [GRANT, TOKEN] {
            assert!(
                !all.contains(secret),
                "{line}: a secret was printed:\n{all}"
            );
        }
        let c = written_config(&all);
        let system = line.contains("--transport system");
        let laptop = line.contains("--laptop");
        assert_eq!(
            c.transport,
            if system {
                TransportKind::System
            } else {
                TransportKind::Proxy
            },
            "{line}"
        );
        assert_eq!(c.laptop_mode, laptop, "{line}");
        // The script installs its own version, never the original agent's 0.1.x.
        let deb = format!("monky-deployd_{}_", monky_deployd::VERSION);
        assert!(all.contains(&deb), "{line}:\n{all}");
        assert!(!all.contains("monky-deployd_0.1."), "{line}:\n{all}");
        // The built-in download sources.
        if line.contains("--source gitea") {
            assert!(
                all.contains(&format!(
                    "https://gitea.cbs.tikali.net/mdella/monky-deployd/releases/download/v{}/",
                    monky_deployd::VERSION
                )),
                "{line}:\n{all}"
            );
        } else {
            assert!(
                all.contains(&format!(
                    "https://scm.tikali.ai/api/v4/projects/69/packages/generic/monky-deployd/{}/",
                    monky_deployd::VERSION
                )),
                "{line}:\n{all}"
            );
        }
        // The grant is staged, from the file or from stdin.
        assert!(
            all.contains("+ write /etc/monky-deployd/bootstrap.jwt (mode 0600"),
            "{line}:\n{all}"
        );
        // The mesh: the tunneler, and the ziti CLI for the proxy, from OpenZiti's suite; the
        // tunneler hosts only when the proxy dials.
        if line.contains("--enrol-jwt") {
            assert!(
                all.contains("+ ziti-edge-tunnel enroll --jwt"),
                "{line}:\n{all}"
            );
        }
        let install = all
            .lines()
            .find(|l| {
                l.starts_with(
                    "+ env DEBIAN_FRONTEND=noninteractive apt-get install -y -q ziti-edge-tunnel",
                )
            })
            .unwrap_or_else(|| panic!("{line}: no tunneler install:\n{all}"));
        assert_eq!(install.contains("openziti"), !system, "{line}: {install}");
        assert_eq!(all.contains("run-host"), !system, "{line}:\n{all}");
        assert_eq!(
            all.contains("+ systemctl enable --now monky-deployd.timer"),
            !laptop,
            "{line}"
        );
        assert!(all.contains("doctor"), "{line}:\n{all}");
    }
}

#[test]
fn install_sh_takes_the_original_flags_and_defaults_to_its_own_version() {
    let script = read("packaging/install.sh");
    for flag in [
        "--env",
        "--site",
        "--token",
        "--bootstrap-file",
        "--enrol-jwt",
        "--transport",
        "--version",
        "--docker-data-root",
        "--laptop",
        "--bao-ca",
        "--source",
        "--dry-run",
    ] {
        assert!(
            script.contains(&format!("    {flag})")),
            "install.sh does not parse {flag}"
        );
    }
    assert!(script.contains(&format!("DEFAULT_VERSION=\"{}\"", monky_deployd::VERSION)));
    assert!(script.contains("TRANSPORT=\"proxy\""));
}

// ---- systemd units -----------------------------------------------------------------------------

/// `Key=value` pairs of a unit file, in order (repeated keys kept).
fn directives(unit: &str) -> Vec<(String, String)> {
    unit.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[test]
fn the_units_say_what_the_issue_asks() {
    let service = directives(&read("packaging/systemd/monky-deployd.service"));
    let has = |k: &str, v: &str| service.iter().any(|(a, b)| a == k && b == v);
    for (k, v) in [
        ("Type", "oneshot"),
        ("ExecStart", "/usr/bin/monky-deployd run --once"),
        ("User", "monky-deployd"),
        ("SupplementaryGroups", "docker"),
        ("SuccessExitStatus", "75"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("StateDirectory", "monky-deployd"),
        ("StateDirectoryMode", "0700"),
        ("ReadWritePaths", "-/etc/monky-deployd"),
        ("UMask", "0077"),
        ("LimitCORE", "0"),
        ("CapabilityBoundingSet", ""),
        ("AmbientCapabilities", ""),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
    ] {
        assert!(has(k, v), "monky-deployd.service lacks {k}={v}");
    }
    let values = |k: &str| -> Vec<&str> {
        service
            .iter()
            .filter(|(a, _)| a == k)
            .map(|(_, b)| b.as_str())
            .collect()
    };
    // Only the two paths the agent writes; nothing else is writable.
    assert_eq!(values("ReadWritePaths"), ["-/etc/monky-deployd"]);
    let filters = values("SystemCallFilter").join(" ");
    assert!(filters.contains("@system-service"), "{filters}");
    assert!(
        !filters.contains("@resources"),
        "@resources must stay allowed (setrlimit, for the Go docker CLI): {filters}"
    );
    let families = values("RestrictAddressFamilies").join(" ");
    for family in ["AF_UNIX", "AF_NETLINK"] {
        assert!(
            families.split_whitespace().any(|f| f == family),
            "{family}: {families}"
        );
    }

    let timer = directives(&read("packaging/systemd/monky-deployd.timer"));
    for (k, v) in [
        ("OnUnitInactiveSec", "60s"),
        ("Persistent", "true"),
        ("Unit", "monky-deployd.service"),
        ("WantedBy", "timers.target"),
    ] {
        assert!(
            timer.iter().any(|(a, b)| a == k && b == v),
            "monky-deployd.timer lacks {k}={v}"
        );
    }
    assert!(
        timer
            .iter()
            .any(|(a, b)| a == "RandomizedDelaySec" && b != "0")
    );

    let proxy = read("packaging/systemd/monky-deployd-proxy.service");
    assert!(proxy.contains(
        "ExecStart=/usr/bin/ziti tunnel proxy -i ${MONKY_ZITI_IDENTITY} monky.tenancy.deploy:18443 openbao:18200"
    ));
    // The proxy's ports are the config's defaults.
    let example = Config::parse(
        &read("packaging/config.example.yaml"),
        Path::new("config.example.yaml"),
    )
    .unwrap();
    assert_eq!(example.tenancy.proxy_addr, "127.0.0.1:18443");
    assert_eq!(example.bao.proxy_addr, "127.0.0.1:18200");
}

#[test]
#[ignore = "needs systemd-analyze: run by `cargo xtask dist --test` (ci's packaging step)"]
fn systemd_analyze_security_exposure_is_ok() {
    for (unit, limit) in [
        ("monky-deployd.service", 2.0),
        ("monky-deployd-proxy.service", 2.0),
    ] {
        let path = root().join("packaging/systemd").join(unit);
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(&path)
            .output()
            .expect("systemd-analyze (package systemd)");
        let all = text(&out);
        let exposure = exposure_of(&all).unwrap_or_else(|| panic!("no exposure in:\n{all}"));
        println!("systemd-analyze security {unit}: exposure {exposure:.1}");
        if unit == "monky-deployd.service" {
            // OPERATIONS.md quotes the figure; it must be the one measured.
            let doc = read("docs/OPERATIONS.md");
            assert!(
                doc.contains(&format!("rates the unit\n{exposure:.1}"))
                    || doc.contains(&format!("rates the unit {exposure:.1}")),
                "docs/OPERATIONS.md does not quote the measured exposure {exposure:.1}"
            );
        }
        assert!(
            exposure <= limit,
            "{unit}: exposure {exposure} > {limit}\n{all}"
        );
    }
}

/// The figure of `Overall exposure level for X: 1.4 OK`.
fn exposure_of(report: &str) -> Option<f64> {
    report
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for "))
        .and_then(|(_, rest)| rest.split_once(": "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

// ---- maintainer scripts ---------------------------------------------------------------------

#[test]
fn preinst_refuses_an_sdk_box_without_the_ziti_cli_and_lets_every_other_box_upgrade() {
    // dpkg's DPKG_ROOT puts the script's view of / in a folder.
    let check = |config: Option<&str>, ziti: bool, action: &str| -> Output {
        let dir = tempfile::tempdir().unwrap();
        if let Some(text) = config {
            std::fs::create_dir_all(dir.path().join("etc/monky-deployd")).unwrap();
            std::fs::write(dir.path().join("etc/monky-deployd/config.yaml"), text).unwrap();
        }
        if ziti {
            use std::os::unix::fs::PermissionsExt;
            let bin = dir.path().join("usr/bin/ziti");
            std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
            std::fs::write(&bin, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Command::new("sh")
            .arg(root().join("packaging/debian/preinst"))
            .args([action, "0.1.7"])
            .env("DPKG_ROOT", dir.path())
            .output()
            .unwrap()
    };
    let env = "env_id: env-qa-02\nsite: cbs\n";
    for (config, ziti, refused) in [
        (Some(format!("{env}transport: sdk\n")), false, true),
        (
            Some(format!("{env}transport: 'sdk'   # the default\n")),
            false,
            true,
        ),
        // No transport meant sdk to the original.
        (Some(env.to_string()), false, true),
        (Some(format!("{env}transport: sdk\n")), true, false),
        (Some(env.to_string()), true, false),
        (Some(format!("{env}transport: proxy\n")), false, false),
        (Some(format!("{env}transport: system\n")), false, false),
        // A nested `transport:` is not the top-level key.
        (
            Some(format!(
                "{env}transport: system\ntenancy:\n  transport: sdk\n"
            )),
            false,
            false,
        ),
        (None, false, false),
    ] {
        for action in ["upgrade", "install"] {
            let out = check(config.as_deref(), ziti, action);
            let said = text(&out);
            assert_eq!(
                !out.status.success(),
                refused,
                "{config:?} ziti={ziti} {action}: {said}"
            );
            if refused {
                assert!(said.contains("sudo apt-get install openziti"), "{said}");
                assert!(said.contains("running agent keeps working"), "{said}");
            }
        }
    }
}

// ---- shell scripts, the ansible role -----------------------------------------------------------

#[test]
#[ignore = "needs shellcheck: run by `cargo xtask dist --test` (ci's packaging step)"]
fn shellcheck_is_clean() {
    for (script, shell) in [
        ("packaging/install.sh", "bash"),
        ("packaging/debian/preinst", "sh"),
        ("packaging/debian/postinst", "sh"),
        ("packaging/debian/prerm", "sh"),
        ("packaging/debian/postrm", "sh"),
    ] {
        let out = Command::new("shellcheck")
            .args(["--shell", shell, "--severity", "style"])
            .arg(root().join(script))
            .output()
            .expect("shellcheck (package shellcheck)");
        assert!(
            out.status.success() && out.stdout.is_empty(),
            "shellcheck {script}:\n{}",
            text(&out)
        );
    }
}

/// Renders the role's templates the way ansible would (its variables resolved against each
/// other, its `bool` filter) and prints one JSON object of file name -> text.
const RENDER_ROLE: &str = r#"
import json, sys, yaml, jinja2
role, overrides = sys.argv[1], json.loads(sys.argv[2])
env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                         loader=jinja2.FileSystemLoader(role + "/templates"))
def to_bool(v):  # ansible's bool filter
    return v if isinstance(v, bool) else str(v).strip().lower() in ("yes", "on", "1", "true", "y")
env.filters["bool"] = to_bool
with open(role + "/defaults/main.yml") as f:
    vars = yaml.safe_load(f)
vars.update(overrides)
for _ in range(10):  # defaults refer to each other, as ansible resolves lazily
    vars = {k: env.from_string(v).render(vars) if isinstance(v, str) and "{{" in v else v
            for k, v in vars.items()}
import re
env.tests["match"] = lambda v, p: re.match(p, str(v)) is not None  # ansible's match test
docs = {}
for name in ("tasks/main.yml", "handlers/main.yml", "meta/main.yml"):
    with open(role + "/" + name) as f:
        docs[name] = yaml.safe_load(f)
# The role's own assert, evaluated as ansible would: a failing condition is named.
failed = [c for t in docs["tasks/main.yml"] if "ansible.builtin.assert" in t
          for c in t["ansible.builtin.assert"]["that"] if not env.compile_expression(c)(**vars)]
out = {t: env.get_template(t).render(vars) for t in ("config.yaml.j2", "proxy.env.j2")}
out["vars"] = vars
out["assert_failed"] = failed
print(json.dumps(out))
"#;

/// Evaluates the role's daemon.json merge for `--userns-remap` as ansible would, with
/// ansible's filters the expression uses, against a daemon.json given as text (`null`: none
/// there). Prints the merged document, the task's validate command and the role's default.
const ROLE_USERNS: &str = r#"
import base64, json, sys, yaml, jinja2
role, existing = sys.argv[1], json.loads(sys.argv[2])
with open(role + "/tasks/main.yml") as f:
    tasks = yaml.safe_load(f)
with open(role + "/defaults/main.yml") as f:
    defaults = yaml.safe_load(f)
block = next(t for t in tasks if t.get("name") == "Make docker remap user namespaces")
merge = next(t for t in block["block"] if "ansible.builtin.copy" in t)
env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
env.filters["b64decode"] = lambda v: base64.b64decode(v).decode()
env.filters["from_json"] = json.loads
env.filters["to_nice_json"] = lambda v: json.dumps(v, indent=4, sort_keys=True)
env.filters["combine"] = lambda a, b: {**a, **b}
slurp = {} if existing is None else {"content": base64.b64encode(existing.encode()).decode()}
vars = {"monky_deployd_daemon_json": slurp}
vars["monky_deployd_daemon_doc"] = env.compile_expression(
    merge["vars"]["monky_deployd_daemon_doc"].strip()[2:-2])(**vars)
content = env.from_string(merge["ansible.builtin.copy"]["content"]).render(vars)
print(json.dumps({"merged": json.loads(content), "when": block["when"],
                  "validate": merge["ansible.builtin.copy"]["validate"],
                  "default": defaults["monky_deployd_userns_remap"]}))
"#;

/// The role's `monky_deployd_userns_remap` merges as install.sh's `--userns-remap` does: the
/// operator's keys kept, an operator's own remap user kept, dockerd's check before the write;
/// off by default.
#[test]
#[ignore = "needs python3 with jinja2 and yaml: run by `cargo xtask dist --test` (ci's packaging step)"]
fn the_ansible_role_merges_userns_remap_into_daemon_json() {
    let role = root().join("packaging/ansible/roles/monky_deployd");
    let merge = |existing: serde_json::Value| -> serde_json::Value {
        let out = Command::new("python3")
            .arg("-c")
            .arg(ROLE_USERNS)
            .arg(&role)
            .arg(existing.to_string())
            .output()
            .expect("python3");
        assert!(out.status.success(), "render failed:\n{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let r = merge(json!(
        "{\"data-root\": \"/srv/d\", \"log-driver\": \"local\"}"
    ));
    assert_eq!(
        r["merged"],
        json!({"data-root": "/srv/d", "log-driver": "local", "userns-remap": "default"})
    );
    assert_eq!(r["default"], json!(false));
    assert_eq!(r["when"], json!("monky_deployd_userns_remap | bool"));
    assert!(
        r["validate"]
            .as_str()
            .unwrap()
            .starts_with("dockerd --validate --config-file"),
        "{r}"
    );
    let r = merge(json!("{\"userns-remap\": \"ops:ops\"}"));
    assert_eq!(r["merged"], json!({"userns-remap": "ops:ops"}));
    let r = merge(json!(null));
    assert_eq!(r["merged"], json!({"userns-remap": "default"}));
}

#[test]
#[ignore = "needs python3 with jinja2 and yaml: run by `cargo xtask dist --test` (ci's packaging step)"]
fn the_ansible_template_renders_configs_the_agent_parses() {
    let role = root().join("packaging/ansible/roles/monky_deployd");
    let render = |overrides: serde_json::Value| -> serde_json::Value {
        let out = Command::new("python3")
            .arg("-c")
            .arg(RENDER_ROLE)
            .arg(&role)
            .arg(overrides.to_string())
            .output()
            .expect("python3");
        assert!(out.status.success(), "render failed:\n{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let parse = |r: &serde_json::Value| {
        let yaml = r["config.yaml.j2"].as_str().unwrap();
        Config::parse(yaml, Path::new("config.yaml"))
            .unwrap_or_else(|e| panic!("the agent refuses the role's config: {e:#}\n{yaml}"))
    };

    let plain = render(json!({"monky_deployd_env_id": "env-dev-06"}));
    assert_eq!(plain["assert_failed"], json!([]));
    let c = parse(&plain);
    assert_eq!(c.env_id, "env-dev-06");
    assert_eq!(c.transport, TransportKind::Proxy);
    assert_eq!(c.tenancy.port, 443);
    assert_eq!(c.tenancy.service, "monky.tenancy.deploy");
    assert_eq!(c.bao.addr, "https://bao.cbs.tikali.net:8200");
    assert_eq!(c.bao.auth_mount, "jwt-tenancy");
    assert_eq!(c.bao.role, "see-env");
    assert_eq!(c.bao.ca_bundle, None);
    assert_eq!(c.disk_factor, 1.5);
    assert_eq!(c.disk_headroom_bytes, 2 << 30);
    assert!(!c.laptop_mode);
    assert_eq!(
        c.identity.as_deref(),
        Some(Path::new(
            "/opt/openziti/etc/identities/monky-host.env-dev-06.json"
        ))
    );
    assert_eq!(
        plain["proxy.env.j2"].as_str().unwrap().lines().last(),
        Some("MONKY_ZITI_IDENTITY=/opt/openziti/etc/identities/monky-host.env-dev-06.json")
    );

    let custom = render(json!({
        "monky_deployd_env_id": "env-dev-09",
        "monky_deployd_site": "lab",
        "monky_deployd_transport": "system",
        "monky_deployd_laptop_mode": "yes",
        "monky_deployd_tenancy_port": 8443,
        "monky_deployd_bao_ca_pem": "-----BEGIN CERTIFICATE-----\n",
        "monky_deployd_disk_factor": 2.0,
        "monky_deployd_disk_headroom_bytes": 1024,
    }));
    let c = parse(&custom);
    assert_eq!(c.transport, TransportKind::System);
    assert!(c.laptop_mode);
    assert_eq!(c.tenancy.port, 8443);
    assert_eq!(c.bao.addr, "https://bao.lab.tikali.net:8200");
    assert_eq!(
        c.bao.ca_bundle.as_deref(),
        Some(Path::new("/etc/monky-deployd/openbao-ca.pem"))
    );
    assert_eq!((c.disk_factor, c.disk_headroom_bytes), (2.0, 1024));

    // The original role's variables, with the defaults boxes already rely on.
    let vars = &plain["vars"];
    for (name, value) in [
        ("monky_deployd_version", json!(monky_deployd::VERSION)),
        ("monky_deployd_download_token", json!("")),
        ("monky_deployd_site", json!("cbs")),
        ("monky_deployd_transport", json!("proxy")),
        ("monky_deployd_bootstrap_grant", json!("")),
        ("monky_deployd_tenancy_port", json!(443)),
        ("monky_deployd_bao_auth_mount", json!("jwt-tenancy")),
        ("monky_deployd_bao_role", json!("see-env")),
        ("monky_deployd_disk_factor", json!(1.5)),
        ("monky_deployd_disk_headroom_bytes", json!(2147483648u64)),
    ] {
        assert_eq!(vars[name], value, "{name}");
    }
    assert!(vars["monky_deployd_bao_addr"].is_string());
    assert!(vars["monky_deployd_env_id"].is_string());

    // An inventory written for the original role: its own example's `sdk`, no base_url (the
    // original defaulted it), the deploy token and a grant. The role's assert passes, the box
    // runs the proxy with the same identity, and the download is the original's.
    let original = render(json!({
        "monky_deployd_version": monky_deployd::VERSION,
        "monky_deployd_env_id": "env-dev-06",
        "monky_deployd_site": "cbs",
        "monky_deployd_transport": "sdk",
        "monky_deployd_download_token": "vaulted-token",
        "monky_deployd_bootstrap_grant": "vaulted-grant",
        "monky_deployd_tenancy_port": 443,
        "monky_deployd_bao_addr": "https://bao.cbs.tikali.net:8200",
    }));
    assert_eq!(original["assert_failed"], json!([]), "{original}");
    let c = parse(&original);
    assert_eq!(c.transport, TransportKind::Proxy);
    assert_eq!(
        original["vars"]["monky_deployd_effective_transport"],
        "proxy"
    );
    assert_eq!(
        original["vars"]["monky_deployd_deb_url"],
        format!(
            "https://scm.tikali.ai/api/v4/projects/69/packages/generic/monky-deployd/{v}/monky-deployd_{v}_amd64.deb",
            v = monky_deployd::VERSION
        )
    );
    assert!(
        original["proxy.env.j2"]
            .as_str()
            .unwrap()
            .contains("monky-host.env-dev-06.json")
    );
    // What the assert still refuses.
    let bad =
        render(json!({"monky_deployd_env_id": "env-dev-06", "monky_deployd_transport": "tun"}));
    assert_eq!(
        bad["assert_failed"],
        json!(["monky_deployd_transport in ['proxy', 'system', 'sdk']"])
    );
}

// ---- the .deb ---------------------------------------------------------------------------------

/// The .deb under test: `MONKY_PKG_DEB`, as `cargo xtask dist --test` sets it.
/// What a test of the package on a booted box starts from: the .deb, the Debian image, and the
/// end-to-end env's docker, name prefix and registry.
struct BoxTest {
    deb: PathBuf,
    deb_name: String,
    image: String,
    e2e: E2e,
    docker: String,
    prefix: String,
    registry: String,
}

impl BoxTest {
    fn load() -> Self {
        let deb = deb();
        let deb_name = deb.file_name().unwrap().to_string_lossy().into_owned();
        let image = std::env::var("MONKY_PKG_IMAGE")
            .expect("MONKY_PKG_IMAGE is not set: run `cargo xtask dist --test`");
        let e2e = E2e::load();
        let get = |key| e2e.get(key).to_string();
        let (docker, prefix, registry) = (
            get("MONKY_E2E_DOCKER"),
            get("MONKY_E2E_NAME_PREFIX"),
            get("MONKY_E2E_REGISTRY"),
        );
        Self {
            deb,
            deb_name,
            image,
            e2e,
            docker,
            prefix,
            registry,
        }
    }
}

fn deb() -> PathBuf {
    let deb = std::env::var_os("MONKY_PKG_DEB")
        .map(PathBuf::from)
        .expect("MONKY_PKG_DEB is not set: run `cargo xtask dist --test`");
    assert!(deb.is_file(), "{} is missing", deb.display());
    deb
}

#[test]
#[ignore = "needs the .deb: run by `cargo xtask dist --test` (ci's packaging step)"]
fn the_deb_holds_what_a_box_needs_and_its_sha256_matches() {
    let deb = deb();
    let size = std::fs::metadata(&deb).unwrap().len();
    println!(
        "{}: {:.2} MiB",
        deb.file_name().unwrap().to_string_lossy(),
        size as f64 / 1048576.0
    );
    let listing = run_ok(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    let entries: BTreeMap<String, String> = listing
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            Some((
                cols.get(5)?.trim_start_matches('.').to_string(),
                format!("{} {}", cols[0], cols[1]),
            ))
        })
        .collect();
    let v = monky_deployd::VERSION;
    for (path, mode) in [
        ("/usr/bin/monky-deployd", "-rwxr-xr-x root/root"),
        (
            "/lib/systemd/system/monky-deployd.service",
            "-rw-r--r-- root/root",
        ),
        (
            "/lib/systemd/system/monky-deployd.timer",
            "-rw-r--r-- root/root",
        ),
        (
            "/lib/systemd/system/monky-deployd-proxy.service",
            "-rw-r--r-- root/root",
        ),
        (
            "/usr/share/doc/monky-deployd/config.example.yaml",
            "-rw-r--r-- root/root",
        ),
        (
            "/usr/share/doc/monky-deployd/install.sh",
            "-rw-r--r-- root/root",
        ),
        (
            "/usr/share/doc/monky-deployd/copyright",
            "-rw-r--r-- root/root",
        ),
        (
            "/usr/share/doc/monky-deployd/changelog.Debian.gz",
            "-rw-r--r-- root/root",
        ),
        (
            "/usr/share/doc/monky-deployd/changelog.gz",
            "-rw-r--r-- root/root",
        ),
        (
            "/usr/share/man/man1/monky-deployd.1.gz",
            "-rw-r--r-- root/root",
        ),
        (
            "/usr/share/man/man1/monky-deployd-run.1.gz",
            "-rw-r--r-- root/root",
        ),
        (
            "/usr/share/bash-completion/completions/monky-deployd",
            "-rw-r--r-- root/root",
        ),
        (
            "/usr/share/zsh/vendor-completions/_monky-deployd",
            "-rw-r--r-- root/root",
        ),
        (
            "/usr/share/fish/vendor_completions.d/monky-deployd.fish",
            "-rw-r--r-- root/root",
        ),
    ] {
        assert_eq!(
            entries.get(path).map(String::as_str),
            Some(mode),
            "{path} in\n{listing}"
        );
    }
    let field = |f: &str| run_ok(Command::new("dpkg-deb").arg("--field").arg(&deb).arg(f));
    assert_eq!(field("Version").trim(), v);
    // The name the install kit and the original ansible role download.
    assert_eq!(
        deb.file_name().unwrap().to_string_lossy(),
        format!("monky-deployd_{v}_amd64.deb")
    );
    assert!(field("Depends").contains("adduser"));
    // The TLS client loads the system's roots even for plain-http tenancy.
    assert!(field("Depends").contains("ca-certificates"));
    assert!(field("Depends").contains("libc6"));
    let scripts = run_ok(Command::new("dpkg-deb").arg("--info").arg(&deb));
    for s in ["preinst", "postinst", "prerm", "postrm"] {
        assert!(scripts.contains(s), "{s} missing:\n{scripts}");
    }
    // The .sha256 beside it is in `sha256sum --check` form and matches.
    let dir = deb.parent().unwrap();
    let sums = format!("{}.sha256", deb.file_name().unwrap().to_string_lossy());
    run_ok(
        Command::new("sha256sum")
            .args(["--check", "--strict", &sums])
            .current_dir(dir),
    );
    // The binary in the package is the one its version says.
    let tmp = tempfile::tempdir().unwrap();
    run_ok(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(tmp.path()));
    let out = run_ok(Command::new(tmp.path().join("usr/bin/monky-deployd")).arg("version"));
    assert_eq!(out.trim(), format!("monky-deployd {v}"));
}

#[test]
#[ignore = "needs lintian and the .deb: run by `cargo xtask dist --test` (ci's packaging step)"]
fn lintian_is_clean_and_every_override_says_why() {
    let out = Command::new("lintian")
        .args(["--fail-on", "warning", "--tag-display-limit", "0"])
        .arg(deb())
        .output()
        .expect("lintian (package lintian)");
    println!("lintian:\n{}", text(&out));
    assert!(
        out.status.success(),
        "lintian --fail-on warning:\n{}",
        text(&out)
    );
    // Each override line follows a comment that justifies it.
    let overrides = read("packaging/debian/lintian-overrides");
    let mut justified = false;
    for line in overrides.lines().map(str::trim) {
        if line.starts_with('#') {
            justified = true;
        } else if line.is_empty() {
            justified = false;
        } else {
            assert!(
                justified,
                "lintian override {line:?} has no comment above it"
            );
        }
    }
}

// ---- the .deb on a box: systemd as PID 1 in a container ----------------------------------------

const ENV: &str = "env-qa-02";
const SEE_VALUE: &str = "see-Value-pkg-0303";

/// The run's keys from `cargo xtask setup`'s env file.
struct E2e(BTreeMap<String, String>);

impl E2e {
    fn load() -> Self {
        let file = std::env::var_os("MONKY_E2E_ENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join("target/ci-run/e2e.env"));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
            panic!(
                "{}: {e}: run `cargo xtask setup` (ci does) before the install test",
                file.display()
            )
        });
        Self(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> &str {
        self.0
            .get(key)
            .unwrap_or_else(|| panic!("{key} missing in the e2e env file"))
    }
}

/// A container booting systemd, removed with everything the agent started when dropped.
struct Machine {
    name: String,
    docker: String,
    project: String,
}

impl Machine {
    /// Starts a box of `image` with systemd as its init, the host's docker engine, CLI and
    /// compose plugin, and `volumes` (`src:dst[:ro]`) mounted; waits until systemd has booted
    /// and adds the `docker` group that owns the host's socket, as a box where docker came first.
    fn boot(
        e2e: &E2e,
        image: &str,
        (name, hostname, project): (String, &str, String),
        volumes: &[String],
    ) -> Self {
        let docker = e2e.get("MONKY_E2E_DOCKER").to_string();
        let socket = e2e
            .get("MONKY_E2E_DOCKER_HOST")
            .strip_prefix("unix://")
            .expect("a box under systemd needs the engine on a unix socket")
            .to_string();
        let socket_gid = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&socket).unwrap().gid()
        };
        let mut run = Command::new(&docker);
        run.args(["run", "--detach", "--name", &name, "--hostname", hostname])
            .args(["--network=host", "--label"])
            .arg(format!(
                "{}={}",
                e2e.get("MONKY_E2E_LABEL"),
                e2e.get("MONKY_E2E_RUN_ID")
            ))
            .args(systemd_flags())
            .arg(format!("--volume={socket}:/run/docker.sock"))
            .arg(format!("--volume={docker}:/usr/bin/docker:ro"))
            .arg(format!(
                "--volume={}:/usr/libexec/docker/cli-plugins/docker-compose:ro",
                e2e.get("MONKY_E2E_COMPOSE")
            ))
            .args(volumes.iter().map(|v| format!("--volume={v}")))
            .arg(image);
        let b = Machine {
            name,
            docker,
            project,
        };
        run_ok(&mut run);
        let state = wait_for("systemd to finish booting", Duration::from_secs(90), || {
            let out = b.sh("systemctl is-system-running");
            let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
            matches!(s.as_str(), "running" | "degraded").then_some(s)
        });
        if state == "degraded" {
            println!(
                "systemd degraded at boot:\n{}",
                b.ok("systemctl --failed --no-pager")
            );
        }
        b.ok(&format!(
            "groupadd --system --non-unique --gid {socket_gid} docker"
        ));
        b
    }

    fn docker(&self) -> Command {
        Command::new(&self.docker)
    }

    /// `sh -c script` in the container, as root; the output whatever the status.
    fn sh(&self, script: &str) -> Output {
        self.docker()
            .args(["exec", &self.name, "sh", "-c", script])
            .output()
            .unwrap()
    }

    /// Like [`Machine::sh`], asserting success; returns stdout.
    #[track_caller]
    fn ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(out.status.success(), "in the box: {script}\n{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Writes `content` to `path` in the container through stdin (secrets never reach argv).
    fn put(&self, path: &str, content: &str) {
        let mut child = self
            .docker()
            .args([
                "exec",
                "-i",
                &self.name,
                "sh",
                "-c",
                &format!("cat > {path}"),
            ])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(content.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "cannot write {path}");
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if std::env::var_os("MONKY_PKG_KEEP").is_some() {
            eprintln!("MONKY_PKG_KEEP: leaving container {} running", self.name);
            return;
        }
        let _ = self
            .docker()
            .args(["rm", "--force", "--volumes", &self.name])
            .output();
        let _ = self
            .docker()
            .args([
                "compose",
                "-p",
                &self.project,
                "down",
                "--volumes",
                "--remove-orphans",
            ])
            .output();
    }
}

/// The flags that let systemd run as PID 1. With cgroup v1 (or hybrid) the host's hierarchy is
/// bind-mounted writable (docker mounts it read-only otherwise; systemd makes its cgroups under
/// the container's own) and the container gets every capability the engine itself holds:
/// `--privileged` asks for all of them and fails where the engine runs with a reduced bounding
/// set, as on this project's CI machines. With cgroup v2 it is privileged with a private cgroup
/// namespace.
fn systemd_flags() -> Vec<String> {
    let mut flags: Vec<String> = [
        "--security-opt=seccomp=unconfined",
        "--security-opt=apparmor=unconfined",
        "--tmpfs=/run",
        "--tmpfs=/run/lock",
        "--tmpfs=/tmp",
        "--cap-add=ALL",
    ]
    .map(String::from)
    .to_vec();
    let caps = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapBnd:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(u64::MAX);
    // Capability numbers docker knows by name, for those this process's bounding set lacks.
    const NAMES: [&str; 41] = [
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "KILL",
        "SETGID",
        "SETUID",
        "SETPCAP",
        "LINUX_IMMUTABLE",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_ADMIN",
        "NET_RAW",
        "IPC_LOCK",
        "IPC_OWNER",
        "SYS_MODULE",
        "SYS_RAWIO",
        "SYS_CHROOT",
        "SYS_PTRACE",
        "SYS_PACCT",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_NICE",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "MKNOD",
        "LEASE",
        "AUDIT_WRITE",
        "AUDIT_CONTROL",
        "SETFCAP",
        "MAC_OVERRIDE",
        "MAC_ADMIN",
        "SYSLOG",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
        "AUDIT_READ",
        "PERFMON",
        "BPF",
        "CHECKPOINT_RESTORE",
    ];
    for (bit, name) in NAMES.iter().enumerate() {
        if caps & (1 << bit) == 0 {
            flags.push(format!("--cap-drop={name}"));
        }
    }
    let v2 = Command::new("stat")
        .args(["-f", "-c", "%T", "/sys/fs/cgroup"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "cgroup2fs");
    if v2 {
        // docker mounts a private cgroup2 writable only for privileged containers.
        flags.retain(|f| !f.starts_with("--cap-"));
        flags.push("--privileged".into());
        flags.push("--cgroupns=private".into());
    } else {
        flags.push("--cgroupns=host".into());
        flags.push("--volume=/sys/fs/cgroup:/sys/fs/cgroup:rw".into());
    }
    flags
}

fn wait_for<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
#[ignore = "needs the .deb, the Debian image and docker: run by `cargo xtask dist --test` (ci's packaging step)"]
fn the_deb_installs_and_ticks_under_systemd() {
    let started = Instant::now();
    let t = BoxTest::load();
    let (deb, deb_name, image, e2e) = (&t.deb, &t.deb_name, &t.image, &t.e2e);
    let (docker, prefix, registry) = (&t.docker, &t.prefix, &t.registry);

    // The peers: this process's testkit tenancy and OpenBao on 127.0.0.1, which the container
    // reaches because it shares the host's network namespace.
    let Peers { tenancy, bao } = Peers::fake();
    bao.put_secret(ENV, "see_value", SEE_VALUE);
    bao.put_secret(
        ENV,
        "registry",
        &json!({"registry": registry, "username": e2e.get("MONKY_E2E_REGISTRY_USER"),
                "password": e2e.get("MONKY_E2E_REGISTRY_PASSWORD")})
        .to_string(),
    );

    // OpenZiti's apt suite cannot be reached here: a local file-based apt repository holds
    // stand-ins for the packages install.sh takes from it.
    let repo = tempfile::tempdir().unwrap();
    upgrade_box::stand_in_apt_repo(repo.path());
    let b = Machine::boot(
        e2e,
        image,
        (
            format!("{prefix}pkg-systemd"),
            "pkgtest",
            format!("{prefix}pkg"),
        ),
        &[
            format!("{}:/pkg:ro", deb.parent().unwrap().display()),
            format!("{}:/repo:ro", repo.path().display()),
        ],
    );
    println!("box booted in {:.1}s", started.elapsed().as_secs_f64());

    // install.sh refuses a package whose .sha256 does not match, before installing anything.
    let bad = b.sh(&format!(
        "mkdir -p /tmp/bad && cp /pkg/{deb_name} /tmp/bad/ && \
         echo '{zero}  {deb_name}' > /tmp/bad/{deb_name}.sha256 && \
         bash /pkg/install.sh --source /tmp/bad --env {ENV}",
        zero = "0".repeat(64)
    ));
    assert!(!bad.status.success());
    assert!(text(&bad).contains("does not match"), "{}", text(&bad));
    assert!(!b.sh("dpkg -s monky-deployd").status.success());

    // apt-get install ./x.deb: user, groups, directories, units.
    b.ok(&format!(
        "cd /pkg && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ./{deb_name}"
    ));
    let who = b.ok("getent passwd monky-deployd");
    assert!(
        who.trim_end()
            .ends_with(":/var/lib/monky-deployd:/usr/sbin/nologin"),
        "{who}"
    );
    let groups = b.ok("id -nG monky-deployd");
    assert!(groups.split_whitespace().any(|g| g == "docker"), "{groups}");
    assert_eq!(
        b.ok("stat -c '%a %U %G %n' /var/lib/monky-deployd /etc/monky-deployd"),
        "700 monky-deployd monky-deployd /var/lib/monky-deployd\n\
         750 monky-deployd monky-deployd /etc/monky-deployd\n"
    );
    // Not enabled until install.sh (or ansible) has written a config.
    assert_eq!(
        b.sh("systemctl is-enabled monky-deployd.timer").stdout,
        b"disabled\n"
    );

    // systemd-analyze verify on the installed units: no complaint at all. OpenZiti's `ziti`
    // is not part of this package; an empty executable stands in for it while verify looks.
    b.ok("printf '#!/bin/sh\\n' > /usr/bin/ziti && chmod 755 /usr/bin/ziti");
    let verify = b.sh(
        "systemd-analyze verify /lib/systemd/system/monky-deployd.service \
         /lib/systemd/system/monky-deployd.timer /lib/systemd/system/monky-deployd-proxy.service",
    );
    b.ok("rm /usr/bin/ziti");
    assert!(
        verify.status.success() && verify.stderr.is_empty() && verify.stdout.is_empty(),
        "systemd-analyze verify:\n{}",
        text(&verify)
    );
    let security = b.ok("systemd-analyze security --no-pager monky-deployd.service");
    let exposure = exposure_of(&security).expect("an exposure figure");
    println!("systemd-analyze security monky-deployd.service (loaded, in the box): {exposure:.1}");
    assert!(exposure <= 2.0, "{security}");

    // install.sh for real: the mesh packages from the (stand-in) OpenZiti suite, the
    // enrolment, the config, the grant, the proxy, the timer and a first tick. Nothing answers
    // behind the proxy, so that tick ends 75 (temporary; the unit counts it as a success) and
    // install.sh says the box cannot reach the mesh instead of "done".
    //
    // It runs as OPERATIONS.md's runbook "Install from a build" spells it, so a doc edit that
    // breaks the runbook fails here: the folder `cargo xtask dist` filled (mounted at /pkg) is
    // copied where the `scp` line puts it, and the install.sh line runs as written in the
    // folder that holds it, with the grant under the name it gives; only the stand-ins for the
    // mesh (an enrolment JWT, the local apt suite) are appended.
    let grant = tenancy.mint_grant(ENV);
    b.put("/tmp/enrol.jwt", "enrol-jwt-stand-in");
    let install_line = install_runbook(&b, deb_name, grant.expose_secret());
    let install = b.sh(&format!(
        "cd /root/box && {install_line} --enrol-jwt /tmp/enrol.jwt \
         --ziti-apt-source 'deb [trusted=yes] file:/repo ./'"
    ));
    let said = text(&install);
    assert!(!install.status.success(), "{said}");
    assert!(
        said.contains("==> installing ziti-edge-tunnel acl openziti"),
        "{said}"
    );
    assert!(said.contains("==> running one tick"), "{said}");
    assert!(
        said.contains("could not reach tenancy or OpenBao (exit 75"),
        "{said}"
    );
    assert!(said.contains("==> doctor"), "{said}");
    assert!(!said.contains("==> done"), "{said}");
    assert!(!said.contains(grant.expose_secret()));
    assert_eq!(
        b.ok("dpkg-query -W -f '${Package} ${db:Status-Abbrev}\n' acl openziti ziti-edge-tunnel"),
        "acl ii \nopenziti ii \nziti-edge-tunnel ii \n"
    );
    b.ok(&format!(
        "test -s /opt/openziti/etc/identities/monky-host.{ENV}.json && test ! -e /tmp/enrol.jwt"
    ));
    // The tunneler hosts only; the proxy dials with the identity, as the agent's user.
    assert!(
        b.ok("systemctl show -p ExecStart --value ziti-edge-tunnel.service")
            .contains("run-host"),
    );
    assert_eq!(
        b.ok("systemctl is-active ziti-edge-tunnel.service"),
        "active\n"
    );
    assert_eq!(
        b.ok("systemctl show -p User --value monky-deployd-proxy.service"),
        "monky-deployd\n"
    );
    wait_for("the proxy to run", Duration::from_secs(30), || {
        (b.sh("systemctl is-active monky-deployd-proxy.service")
            .stdout
            == b"active\n")
            .then_some(())
    });
    assert_eq!(
        b.ok("systemctl show -p Result -p ExecMainStatus monky-deployd.service"),
        "Result=success\nExecMainStatus=75\n"
    );
    assert_eq!(
        b.ok(
            "stat -c '%a %U %G %n' /etc/monky-deployd/config.yaml /etc/monky-deployd/bootstrap.jwt"
        ),
        "640 root monky-deployd /etc/monky-deployd/config.yaml\n\
         600 monky-deployd monky-deployd /etc/monky-deployd/bootstrap.jwt\n"
    );
    assert_eq!(
        b.ok("systemctl is-enabled monky-deployd.timer monky-deployd-proxy.service"),
        "enabled\nenabled\n"
    );
    let tick_log = b.ok("journalctl -u monky-deployd.service --no-pager -o cat");
    assert!(!tick_log.contains(grant.expose_secret()), "{tick_log}");

    // Now the peers are this process's fakes, reached without a proxy. No free-space headroom:
    // the engine's disk is the CI machine's, not this test's subject.
    let config = format!(
        "env_id: {ENV}\nsite: cbs\ntransport: system\ncompose_project: {}\n\
         registry_host: {registry}\nhealthy_timeout_s: 120\n\
         disk_headroom_bytes: 0\n\
         tenancy:\n  base_url: {}\nbao:\n  addr: {}\n",
        b.project,
        tenancy.url(),
        bao.url()
    );
    b.put("/etc/monky-deployd/config.yaml", &config);
    let bundle = TestBundle {
        compose: format!(
            "services:\n  web:\n    image: {}\n    env_file: .env\n",
            e2e.get("MONKY_E2E_IMAGE_WEB_1")
        ),
        env_template: "# the agent fills every ${VAR} from OpenBao\nSEE_VALUE=${SEE_VALUE}\n"
            .into(),
        manifest: json!({"vault_mode": "openbao", "entries": [
            {"var": "SEE_VALUE", "path": format!("monky/{ENV}/see/see_value"), "kind": "supplied", "version": null},
            {"var": "REGISTRY_AUTH", "path": format!("monky/{ENV}/see/registry"), "kind": "supplied",
             "version": null, "use": "registry-auth"},
        ]}),
        meta: json!({"env_id": ENV, "tier": "qa", "site": "cbs", "renderer": "compose"}),
    };
    let sha = bundle.sha();
    tenancy.publish_bundle(ENV, &sha, bundle.tar());
    tenancy.set_desired(ENV, monky_testkit::tenancy::Desired::sha(sha.clone()));

    // The timer fires a minute after the last tick (plus its random delay); that tick bootstraps
    // with the staged grant and applies the bundle.
    let waited = Instant::now();
    let report = wait_for(
        "the timer's tick to report",
        Duration::from_secs(240),
        || tenancy.reports(ENV).into_iter().last(),
    );
    println!(
        "the timer's tick reported {:?} after {:.1}s",
        report.result,
        waited.elapsed().as_secs_f64()
    );
    let journal = b.ok("journalctl -u monky-deployd.service --no-pager -o cat");
    assert_eq!(
        report.result,
        ReportResult::Applied,
        "{report:?}\n{journal}"
    );
    assert_eq!(report.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert!(!report.containers.is_empty());
    assert!(
        report
            .containers
            .iter()
            .all(|c| c.state == "running" && c.health.as_deref() == Some("healthy")),
        "{report:?}"
    );
    let triggers = b.ok("systemctl show -p LastTriggerUSecMonotonic monky-deployd.timer");
    assert!(
        !triggers.contains("=0\n") && !triggers.contains("n/a"),
        "{triggers}"
    );
    // The tick ran as monky-deployd: its journal lines carry that uid, its files are its own.
    let uid = b.ok("id -u monky-deployd").trim().to_string();
    let applied_uids = b.ok(&format!(
        "journalctl -u monky-deployd.service -o json --no-pager | grep -F 'applied {}' \
         | grep -o '\"_UID\":\"[0-9]*\"' | sort -u",
        &sha[..12]
    ));
    assert_eq!(
        applied_uids.trim(),
        format!("\"_UID\":\"{uid}\""),
        "{journal}"
    );
    // The journal reads as systemd's own units do: the agent's <N> prefixes are parsed into
    // priorities (none is left in a message), and each tick has one summary line at the
    // priority its exit deserves: the install tick's 75 a warning, the apply's 0 info.
    let unparsed =
        b.sh("journalctl -u monky-deployd.service --no-pager -o cat | grep -E '^<[0-7]>'");
    assert!(
        !unparsed.status.success(),
        "unparsed priority prefixes: {}",
        text(&unparsed)
    );
    let priority_of = |needle: &str| {
        b.ok(&format!(
            "journalctl -u monky-deployd.service -o json --no-pager | grep -F '{needle}' \
             | grep -o '\"PRIORITY\":\"[0-9]\"' | sort -u"
        ))
    };
    assert_eq!(
        priority_of("outcome=temporary").trim(),
        "\"PRIORITY\":\"4\"",
        "{journal}"
    );
    assert_eq!(
        priority_of(&format!(
            "tick: action=apply sha={} outcome=applied code=- ",
            &sha[..12]
        ))
        .trim(),
        "\"PRIORITY\":\"6\"",
        "{journal}"
    );
    let warnings = b.ok("journalctl -u monky-deployd.service -p warning --no-pager -o cat");
    assert!(warnings.contains("tick: action=- "), "{warnings}");
    assert!(!warnings.contains("outcome=applied"), "{warnings}");
    // Every tick of the unit, once the last one has ended: one summary line each, with its
    // fields in order and the priority its exit deserves; a failed tick's error line is an
    // error (3) that `journalctl -p warning` finds; the info lines are info (6).
    b.ok("systemctl stop monky-deployd.timer");
    wait_for("the last tick to end", Duration::from_secs(300), || {
        let state = b.sh("systemctl is-active monky-deployd.service").stdout;
        (state != b"activating\n" && state != b"active\n").then_some(())
    });
    let warnings = b.ok("journalctl -u monky-deployd.service -p warning --no-pager -o cat");
    let ticks = journal_by_tick(
        &b.ok("journalctl -u monky-deployd.service -o json --all --no-pager"),
        &uid,
    );
    check_tick_journal(&ticks, &warnings);
    assert_eq!(
        b.ok("stat -c '%a %U' /var/lib/monky-deployd/bao.token /var/lib/monky-deployd/state.json"),
        "600 monky-deployd\n600 monky-deployd\n"
    );
    assert!(
        !b.sh("test -e /etc/monky-deployd/bootstrap.jwt")
            .status
            .success(),
        "the grant was not consumed"
    );
    // The secret reached the container through .env (and nothing else of the journal).
    let web = String::from_utf8_lossy(
        &Command::new(docker)
            .args(["ps", "-q", "--filter"])
            .arg(format!("label=com.docker.compose.project={}", b.project))
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .to_string();
    let env_txt = run_ok(Command::new(docker).args([
        "exec",
        &web,
        "wget",
        "-qO-",
        &format!("http://127.0.0.1:{}/env.txt", e2e.get("MONKY_E2E_WEB_PORT")),
    ]));
    assert!(
        env_txt.contains(&format!("SEE_VALUE={SEE_VALUE}")),
        "{env_txt}"
    );
    assert!(
        !journal.contains(SEE_VALUE) && !journal.contains(e2e.get("MONKY_E2E_REGISTRY_PASSWORD"))
    );

    // remove keeps the config and the state; a reinstall finds them untouched; purge removes
    // them and keeps the system user.
    let config_sum = b.ok("sha256sum /etc/monky-deployd/config.yaml");
    b.ok("DEBIAN_FRONTEND=noninteractive apt-get remove -y -q monky-deployd");
    b.ok("test -s /var/lib/monky-deployd/bao.token && test -s /etc/monky-deployd/config.yaml");
    b.ok("test ! -e /usr/bin/monky-deployd && test ! -e /lib/systemd/system/monky-deployd.timer");
    b.ok(&format!(
        "cd /pkg && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ./{deb_name}"
    ));
    assert_eq!(b.ok("sha256sum /etc/monky-deployd/config.yaml"), config_sum);
    b.ok("DEBIAN_FRONTEND=noninteractive apt-get purge -y -q monky-deployd");
    b.ok("test ! -e /var/lib/monky-deployd && test ! -e /etc/monky-deployd");
    b.ok("getent passwd monky-deployd");

    install_from_the_published_release(&b, deb_name);
    println!(
        "install test: {:.1}s in the box",
        started.elapsed().as_secs_f64()
    );
}

/// The release as a tag pipeline leaves it: the packaging step (`xtask/src/pkgtest.rs`) ran
/// `cargo xtask release` against a loopback fake of GitLab and Gitea with dist's folder, and
/// names the fake's download bases in the env. install.sh's built-in `--source gitlab` (with the
/// kit's deploy token) and `--source gitea` (without one), pointed at the fake, download the
/// package from there, check its sha256 and install it; a wrong token is the registry's 401,
/// and nothing is installed.
fn install_from_the_published_release(b: &Machine, deb_name: &str) {
    let env = |key: &str| {
        std::env::var(key).unwrap_or_else(|_| {
            panic!("{key} is not set: run `cargo xtask dist --test`, which publishes to a fake GitLab first")
        })
    };
    let (gitlab, gitea) = (env("MONKY_PKG_GITLAB_URL"), env("MONKY_PKG_GITEA_URL"));
    let version = deb_name
        .strip_prefix("monky-deployd_")
        .and_then(|r| r.split('_').next())
        .unwrap();
    // The token reaches install.sh as the kit gives it, through MONKY_DEPLOYD_TOKEN, read from a
    // file so that it is not in docker exec's arguments either.
    b.put("/tmp/download.token", "not-the-deploy-token");
    let install = |source: &str| {
        format!(
            "MONKY_DEPLOYD_GITLAB_URL={gitlab} MONKY_DEPLOYD_GITEA_URL={gitea} \
             bash /pkg/install.sh --env {ENV} --transport system --source {source}"
        )
    };
    let refused = b.sh(&format!(
        "MONKY_DEPLOYD_TOKEN=$(cat /tmp/download.token) {}",
        install("gitlab")
    ));
    let said = text(&refused);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("401"),
        "a wrong token is the registry's 401: {said}"
    );
    assert!(!b.sh("dpkg -s monky-deployd").status.success(), "{said}");

    b.put("/tmp/download.token", &env("MONKY_PKG_DEPLOY_TOKEN"));
    let gitlab_install = b.sh(&format!(
        "MONKY_DEPLOYD_TOKEN=$(cat /tmp/download.token) {}",
        install("gitlab")
    ));
    let said = text(&gitlab_install);
    assert!(
        said.contains(&format!(
            "==> downloading {deb_name} and {deb_name}.sha256 from {gitlab}/{version}"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!("==> checking the sha256 of {deb_name}")),
        "{said}"
    );
    assert!(
        said.contains(&format!("==> installing {deb_name}")),
        "{said}"
    );
    assert!(!said.contains(&env("MONKY_PKG_DEPLOY_TOKEN")), "{said}");
    assert_eq!(
        b.ok("dpkg-query -W -f '${Version} ${db:Status-Abbrev}' monky-deployd"),
        format!("{version} ii ")
    );
    // The installed agent is the published package's, byte for byte the .deb dist built.
    b.ok(&format!(
        "dpkg-deb --fsys-tarfile /pkg/{deb_name} | tar -xO ./usr/bin/monky-deployd | cmp - /usr/bin/monky-deployd"
    ));
    b.ok("DEBIAN_FRONTEND=noninteractive apt-get purge -y -q monky-deployd");

    let gitea_install = b.sh(&install("gitea"));
    let said = text(&gitea_install);
    assert!(
        said.contains(&format!(
            "==> downloading {deb_name} and {deb_name}.sha256 from {gitea}/v{version}"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!("==> installing {deb_name}")),
        "{said}"
    );
    assert_eq!(
        b.ok("dpkg-query -W -f '${Version} ${db:Status-Abbrev}' monky-deployd"),
        format!("{version} ii ")
    );
    b.ok("rm -f /tmp/download.token");
}

/// Plays OPERATIONS.md's "Install from a build" on `b` up to its install.sh line, which it
/// returns for the caller to run in `/root/box` (as root, so without `sudo`): the `scp` line's
/// copy of dist's folder (mounted at /pkg: the package, its .sha256 and install.sh, nothing
/// else), and the grant staged under the line's `--bootstrap-file` name.
fn install_runbook(b: &Machine, deb_name: &str, grant: &str) -> String {
    let lines = crate::runbooks::commands("Install from a build");
    let [scp, install] = lines.as_slice() else {
        panic!("the install runbook is one scp line and one install.sh line: {lines:?}")
    };
    let scp = words(scp);
    let [cmd, flag, from, to] = scp.as_slice() else {
        panic!("{scp:?}")
    };
    assert_eq!(
        (cmd.as_str(), flag.as_str(), from.as_str()),
        ("scp", "-r", "target/dist-pkg"),
        "the runbook copies dist's folder"
    );
    let folder = to.strip_prefix("box:").expect("scp to the box");
    let mut held: Vec<String> = b.ok("ls /pkg").lines().map(str::to_string).collect();
    held.sort();
    let mut wanted = [
        deb_name.to_string(),
        format!("{deb_name}.sha256"),
        "install.sh".to_string(),
    ];
    wanted.sort();
    assert_eq!(held, wanted, "dist's folder holds what the runbook says");
    b.ok(&format!(
        "mkdir -p /root/box && cp -r /pkg /root/box/{folder}"
    ));
    let line = install
        .strip_prefix("sudo ")
        .expect("the runbook runs install.sh with sudo");
    let args = words(line);
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .unwrap_or_else(|| panic!("{flag} not in {line:?}"))
            .clone()
    };
    assert_eq!(value("--env"), ENV, "{line}");
    assert_eq!(
        args.get(1).map(String::as_str),
        Some(format!("{folder}/install.sh").as_str()),
        "{line}"
    );
    assert_eq!(value("--source"), format!("./{folder}"), "{line}");
    b.put(&format!("/root/box/{}", value("--bootstrap-file")), grant);
    line.to_string()
}

/// One journal line of the agent: its priority and message.
type JournalLine = (u8, String);

/// The agent's own lines (those of `uid`) in `journalctl -o json` output, by the unit's
/// invocation (one per tick).
fn journal_by_tick(json: &str, uid: &str) -> BTreeMap<String, Vec<JournalLine>> {
    let mut ticks: BTreeMap<String, Vec<JournalLine>> = BTreeMap::new();
    for entry in json
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["_UID"] == uid)
    {
        let (Some(id), Some(priority), Some(message)) = (
            entry["_SYSTEMD_INVOCATION_ID"].as_str(),
            entry["PRIORITY"].as_str().and_then(|p| p.parse().ok()),
            entry["MESSAGE"].as_str(),
        ) else {
            panic!("a journal line of the agent without invocation, priority or text: {entry}");
        };
        ticks
            .entry(id.to_string())
            .or_default()
            .push((priority, message.to_string()));
    }
    ticks
}

/// The journal of each finished tick reads as an operator needs it (issue 22): exactly one
/// summary line, `tick: action= sha= outcome= code= duration=<n>s exit=`, at info for exit 0, at
/// warning for 75 and at error otherwise; a tick that did not end 0 has an error line (3) naming
/// the summary's code, which `journalctl -p warning` (`warnings`) shows; `checkin:` lines are
/// info (6) and never reach `-p warning`. Both a 75 tick and a 0 tick must be among them.
fn check_tick_journal(ticks: &BTreeMap<String, Vec<JournalLine>>, warnings: &str) {
    let mut exits = Vec::new();
    for (id, lines) in ticks {
        let all = format!("tick {id}:\n{lines:#?}");
        let summaries: Vec<&JournalLine> = lines
            .iter()
            .filter(|(_, m)| m.contains("tick: action="))
            .collect();
        assert_eq!(summaries.len(), 1, "one summary line per tick: {all}");
        let (priority, summary) = summaries[0];
        let at = |field: &str| {
            summary
                .find(field)
                .unwrap_or_else(|| panic!("{field:?} not in {summary:?}"))
        };
        let order = [
            "tick: action=",
            " sha=",
            " outcome=",
            " code=",
            " duration=",
            " exit=",
        ];
        let places: Vec<usize> = order.iter().map(|f| at(f)).collect();
        assert!(places.windows(2).all(|w| w[0] < w[1]), "{summary:?}");
        let value = |field: &str| {
            summary[at(field) + field.len()..]
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string()
        };
        let duration = value(" duration=");
        assert!(
            duration
                .strip_suffix('s')
                .is_some_and(|d| d.parse::<f64>().is_ok()),
            "{summary:?}"
        );
        let exit: u8 = value(" exit=").parse().expect("a numeric exit");
        let want = match exit {
            0 => 6,
            75 => 4,
            _ => 3,
        };
        assert_eq!(
            *priority, want,
            "the summary's priority for exit {exit}: {all}"
        );
        if exit != 0 {
            let code = value(" code=");
            let error = lines
                .iter()
                .find(|(p, m)| *p == 3 && !m.contains("tick: action=") && m.contains(&code))
                .unwrap_or_else(|| panic!("no error line naming {code}: {all}"));
            assert!(
                warnings.contains(error.1.trim()),
                "journalctl -p warning misses {:?}:\n{warnings}",
                error.1
            );
        }
        for (p, m) in lines.iter().filter(|(_, m)| m.contains("checkin: action=")) {
            assert_eq!(*p, 6, "{m:?} is info: {all}");
            assert!(!warnings.contains(m.trim()), "{m:?} in -p warning");
        }
        exits.push(exit);
    }
    assert!(exits.contains(&75) && exits.contains(&0), "{exits:?}");
}

#[test]
fn the_journal_check_catches_what_it_must() {
    let tick = |lines: &[(u8, &str)]| -> Vec<JournalLine> {
        lines.iter().map(|(p, m)| (*p, (*m).to_string())).collect()
    };
    let temporary = tick(&[
        (3, "ERROR TENANCY_UNAVAILABLE: checkin: connection refused"),
        (
            4,
            " WARN tick: action=- sha=- outcome=temporary code=TENANCY_UNAVAILABLE duration=0.1s exit=75 owner=\"no one\"",
        ),
    ]);
    let applied = tick(&[
        (6, " INFO checkin: action=apply desired=ab applied=-"),
        (
            6,
            " INFO tick: action=apply sha=ab outcome=applied code=- duration=9.5s exit=0",
        ),
    ]);
    let warnings = "ERROR TENANCY_UNAVAILABLE: checkin: connection refused\n WARN tick: action=- sha=- outcome=temporary code=TENANCY_UNAVAILABLE duration=0.1s exit=75 owner=\"no one\"\n";
    let ticks = |a: &[JournalLine], b: &[JournalLine]| {
        BTreeMap::from([("a".to_string(), a.to_vec()), ("b".to_string(), b.to_vec())])
    };
    check_tick_journal(&ticks(&temporary, &applied), warnings);
    let fails = |t: BTreeMap<String, Vec<JournalLine>>, w: &str| {
        std::panic::catch_unwind(|| check_tick_journal(&t, w)).is_err()
    };
    // The error line at info, or missing from -p warning.
    let mut quiet = temporary.clone();
    quiet[0].0 = 6;
    assert!(fails(ticks(&quiet, &applied), warnings));
    assert!(fails(ticks(&temporary, &applied), ""));
    // Two summaries in one tick, or none.
    let mut twice = applied.clone();
    twice.push(applied[1].clone());
    assert!(fails(ticks(&temporary, &twice), warnings));
    assert!(fails(ticks(&temporary, &applied[..1]), warnings));
    // A summary without its duration, or at the wrong priority.
    let mut no_duration = applied.clone();
    no_duration[1].1 = " INFO tick: action=apply sha=ab outcome=applied code=- exit=0".into();
    assert!(fails(ticks(&temporary, &no_duration), warnings));
    let mut loud = applied.clone();
    loud[1].0 = 4;
    assert!(fails(ticks(&temporary, &loud), warnings));
    // The info line at warning.
    let mut checkin = applied.clone();
    checkin[0].0 = 4;
    assert!(fails(ticks(&temporary, &checkin), warnings));
    // The agent's lines are read by uid, under their invocation.
    let json = format!(
        "{}\n{}\n{}\n",
        json!({"_UID": "998", "_SYSTEMD_INVOCATION_ID": "i1", "PRIORITY": "6", "MESSAGE": "x"}),
        json!({"_UID": "0", "INVOCATION_ID": "i1", "PRIORITY": "6", "MESSAGE": "Starting"}),
        json!({"_UID": "998", "_SYSTEMD_INVOCATION_ID": "i2", "PRIORITY": "3", "MESSAGE": "y"}),
    );
    let by = journal_by_tick(&json, "998");
    assert_eq!(by["i1"], [(6, "x".to_string())]);
    assert_eq!(by["i2"], [(3, "y".to_string())]);
}

// ---- the docs' commands ------------------------------------------------------------------------

/// The docs whose `sh` blocks hold commands an operator types.
const DOCS: [&str; 4] = [
    "README.md",
    "docs/OPERATIONS.md",
    "docs/PROTOCOL.md",
    "packaging/ansible/roles/monky_deployd/README.md",
];

/// Splits a command line into words, honouring single and double quotes.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    for ch in line.chars() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(ch);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out
}

/// Every command in the ```sh blocks of `text`: continuation lines joined, comments dropped,
/// pipelines and `&&` chains split.
fn sh_commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_block = t == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        let code = match t.find(" #") {
            Some(i) => &t[..i],
            None if t.starts_with('#') => "",
            None => t,
        };
        if let Some(head) = code.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(code);
        for part in pending.split(" | ").flat_map(|p| p.split(" && ")) {
            let part = part.split_whitespace().collect::<Vec<_>>().join(" ");
            if !part.is_empty() {
                out.push(part);
            }
        }
        pending.clear();
    }
    out
}

/// The tasks `cargo xtask` knows, from the match in its main.rs (`"name" => module::main(rest)`).
fn xtask_tasks() -> Vec<String> {
    read("xtask/src/main.rs")
        .lines()
        .filter_map(|l| l.trim().strip_prefix('"'))
        .filter_map(|l| l.split_once("\" => "))
        .filter(|(_, rest)| rest.contains("::main("))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// The flags install.sh parses, from its own `case`.
fn install_sh_flags() -> Vec<String> {
    read("packaging/install.sh")
        .lines()
        .filter_map(|l| l.trim().split(')').next())
        .filter(|w| w.starts_with("--"))
        .map(str::to_string)
        .collect()
}

const UNITS: [&str; 3] = [
    "monky-deployd.service",
    "monky-deployd.timer",
    "monky-deployd-proxy.service",
];

/// Checks one documented command; `Err` says what is wrong with it.
fn check_command(cmd: &str) -> Result<(), String> {
    let mut w = words(cmd);
    if w.first().is_some_and(|x| x == "sudo") {
        w.remove(0);
        // `sudo -u monky-deployd ...`: the agent's own user, nobody else's.
        if w.first().is_some_and(|x| x == "-u") {
            if w.get(1).is_none_or(|u| u != "monky-deployd") {
                return Err("sudo -u names another user than monky-deployd".into());
            }
            w.drain(..2);
        }
    }
    let first = w.first().cloned().unwrap_or_default();
    // A word naming one of our units must name a unit the package ships (with or without
    // its .service suffix); `monky-deployd` alone is the agent's service.
    let units_known = |w: &[String]| {
        w.iter()
            .filter(|a| a.starts_with("monky-deployd"))
            .all(|a| {
                UNITS.contains(&a.as_str()) || UNITS.contains(&format!("{a}.service").as_str())
            })
    };
    match first.as_str() {
        "monky-deployd" => monky_deployd::cli::Cli::try_parse_from(&w)
            .map(|_| ())
            .map_err(|e| format!("the CLI refuses it: {e}")),
        "cargo" => match w.get(1).map(String::as_str) {
            Some("xtask") => {
                let task = w.get(2).cloned().unwrap_or_default();
                if xtask_tasks().contains(&task) {
                    Ok(())
                } else {
                    Err(format!("xtask has no task {task:?}"))
                }
            }
            Some("test" | "build" | "run" | "fmt" | "clippy" | "doc" | "bench" | "fuzz") => Ok(()),
            other => Err(format!("unexpected cargo command {other:?}")),
        },
        "bash" => {
            // `bash install.sh ...`, or `bash -s -- ...` reading install.sh from a pipe.
            let script = w.get(1).ok_or("bash without a script")?;
            let args = if script == "-s" && w.get(2).is_some_and(|a| a == "--") {
                3
            } else if script.ends_with("install.sh") {
                2
            } else {
                return Err(format!("bash runs {script}, not install.sh"));
            };
            let flags = install_sh_flags();
            w.iter()
                .skip(args)
                .filter(|a| a.starts_with("--"))
                .find(|a| !flags.contains(a))
                .map_or(Ok(()), |a| Err(format!("install.sh has no {a}")))
        }
        "systemctl" | "journalctl" | "systemd-analyze" => {
            if units_known(&w) {
                Ok(())
            } else {
                Err("names a unit the package does not ship".into())
            }
        }
        "docker" | "apt-get" | "dpkg" | "dpkg-deb" | "sha256sum" | "curl" | "lintian"
        | "setfacl" | "getfacl" | "stat" | "ls" | "cat" | "df" | "id" | "rm" | "ziti" | "grep"
        | "tail" | "scp" | "install" => Ok(()),
        // The release runbook's tag (xtask/tests/release_runbook.rs checks it names the version).
        "git" => match w.get(1).map(String::as_str) {
            Some("tag" | "push") => Ok(()),
            other => Err(format!("unexpected git command {other:?}")),
        },
        other => Err(format!("{other:?} is not a command the docs may use")),
    }
}

#[test]
fn every_command_in_the_docs_exists() {
    let mut checked = 0;
    for doc in DOCS {
        let path = root().join(doc);
        let Ok(text) = std::fs::read_to_string(&path) else {
            panic!("{doc} is missing");
        };
        for cmd in sh_commands(&text) {
            if let Err(why) = check_command(&cmd) {
                panic!("{doc}: `{cmd}`: {why}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} commands found in the docs");
}

#[test]
fn the_docs_checker_catches_wrong_commands() {
    let check = |cmd: &str, ok: bool| {
        assert_eq!(
            check_command(cmd).is_ok(),
            ok,
            "{cmd}: {:?}",
            check_command(cmd)
        );
    };
    check("monky-deployd run --once", true);
    check("sudo monky-deployd status --json", true);
    check("monky-deployd run --twice", false);
    check("monky-deployd deploy", false);
    check("cargo xtask dist --test", true);
    check("cargo xtask publish", false);
    assert!(
        xtask_tasks().contains(&"dist".to_string()),
        "{:?}",
        xtask_tasks()
    );
    check("systemctl status monky-deployd.timer", true);
    check("systemctl status monky-agent.timer", true); // not ours, but not a monky-deployd name
    check("journalctl -u monky-deployd.socket", false);
    check("sudo bash install.sh --env e1 --laptop", true);
    check("bash install.sh --env e1 --fast", false);
    check("frobnicate --all", false);
    check("sudo -u monky-deployd monky-deployd run", true);
    check("sudo -u root monky-deployd run", false);
    assert_eq!(
        sh_commands(
            "x\n```sh\n# c\nmonky-deployd status   # why\nbash install.sh --env e \\\n  --laptop\na | b && c\n```\n```\nnot sh\n```\n"
        ),
        [
            "monky-deployd status",
            "bash install.sh --env e --laptop",
            "a",
            "b",
            "c"
        ]
    );
    assert_eq!(words("a 'b c' \"d\"e"), ["a", "b c", "de"]);
}
