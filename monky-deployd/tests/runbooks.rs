//! docs/OPERATIONS.md's runbooks, run as written: the commands are taken from the page's `sh`
//! blocks (not copied here), with the box's paths mapped to the test box, so a command the docs
//! show that stops working fails here, and each runbook's outcome is checked. The free-disk
//! lines run with the real docker CLI against a stand-in engine; a move's install.sh line runs
//! as a dry run whose effects are played on the test box; the install runbook runs under
//! systemd in the packaging test. Box-level commands nothing here runs (systemctl) are listed
//! by name, so a new line is never skipped unseen.

use monky_agent_proto::ReportResult;
use monky_testkit::tenancy::Desired;
use serde_json::json;

use crate::util::*;

const DOC: &str = include_str!("../../docs/OPERATIONS.md");

/// The lines of the `sh` blocks under the runbook titled `title` (the packaging test runs
/// the install runbook's under systemd).
pub(crate) fn commands(title: &str) -> Vec<String> {
    let runbooks = DOC
        .split("\n## Runbooks\n")
        .nth(1)
        .expect("OPERATIONS.md has a Runbooks section");
    let runbooks = runbooks.split("\n## ").next().unwrap();
    let section = runbooks
        .split(&format!("\n### {title}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("no runbook {title:?}"));
    let section = section.split("\n### ").next().unwrap();
    let mut out = Vec::new();
    let mut inside = false;
    for line in section.lines() {
        match (inside, line.trim()) {
            (false, "```sh") => inside = true,
            (true, "```") => inside = false,
            (true, l) if !l.is_empty() => out.push(l.to_string()),
            _ => {}
        }
    }
    assert!(!out.is_empty(), "runbook {title:?} has no commands");
    out
}

/// Box-level commands a runbook may show that only a real box runs (the packaging test's
/// systemd box runs the install; these are the others).
const BOX_ONLY: &[&str] = &[
    "scp ",
    "ssh ",
    "docker ",
    "df ",
    "sudo systemctl ",
    "sudo rm ",
];

/// Runs one runbook line on `w`: the agent's commands through the binary (as the agent's user
/// is the test's own user here), the grant staging as the install kit does it.
pub(crate) fn run_line<B: monky_testkit::bao::BaoPeer + 'static>(
    w: &World<B>,
    line: &str,
    subst: &[(&str, String)],
) -> Option<Run> {
    let mut line = line.to_string();
    for (from, to) in subst {
        line = line.replace(from, to);
    }
    line = line.replace(
        "/var/lib/monky-deployd",
        &w.state_dir().display().to_string(),
    );
    if line.starts_with("sudo install ") && line.ends_with("/etc/monky-deployd/bootstrap.jwt") {
        w.stage_grant();
        return None;
    }
    let args = line
        .strip_prefix("sudo -u monky-deployd monky-deployd ")
        .or_else(|| line.strip_prefix("monky-deployd "));
    match args {
        Some(args) => {
            let args: Vec<&str> = args.split_whitespace().collect();
            Some(w.run(&args))
        }
        None => {
            assert!(
                BOX_ONLY.iter().any(|p| line.starts_with(p)),
                "a runbook line this test does not know how to run: {line:?}"
            );
            None
        }
    }
}

#[test]
fn rotate_the_token() {
    let w = World::new();
    w.applied();
    let old = std::fs::read_to_string(w.state_dir().join("bao.token")).unwrap();
    let mut runs = Vec::new();
    for line in commands("Rotate the token") {
        if let Some(run) = run_line(&w, &line, &[]) {
            runs.push((line, run));
        }
    }
    for (line, run) in &runs {
        assert_eq!(run.code(), 0, "{line}: {}{}", run.stdout(), run.stderr());
    }
    let new = std::fs::read_to_string(w.state_dir().join("bao.token")).unwrap();
    assert_ne!(old.trim(), new.trim(), "the token was not rotated");
    assert!(!w.bootstrap_path().exists(), "the grant was not used");
    // The next tick works with the new token.
    w.tick().ok();
}

#[test]
fn roll_back() {
    let w = World::new();
    let mut old = TestBundle::default();
    old.meta["allow_rollback"] = json!(true);
    w.stage_grant();
    let old_sha = w.publish(&old);
    w.tick().ok();
    w.publish(&TestBundle::tagged("2"));
    w.tick().ok();
    w.tenancy.set_desired(ENV, Desired::sha(old_sha.clone()));
    for line in commands("Roll back") {
        if let Some(run) = run_line(&w, &line, &[]) {
            run.ok();
        }
    }
    w.assert_current(&old_sha);
    assert_eq!(w.last_report().result, ReportResult::Applied);
}

#[test]
fn read_a_failed_releases_logs() {
    let w = World::new();
    w.applied();
    // An unhealthy release (its logs kept before the fallback) ...
    w.stub("UNHEALTHY_IF", "web:bad");
    let bad = w.publish(&TestBundle::tagged("bad"));
    w.tick().expect(1);
    // ... and a refused one (kept as a tar for `bundle check`).
    let mut refused = TestBundle::tagged("refused");
    refused.meta["renderer"] = json!("helm");
    let refused_sha = w.publish(&refused);
    w.tick().expect(1);
    assert!(
        w.env_dir()
            .join("failed")
            .join(format!("{refused_sha}.tar"))
            .exists()
    );
    let subst = [
        ("7a10c3e", bad[..7].to_string()),
        ("<sha>", refused_sha.clone()),
    ];
    let mut saw_logs = false;
    let mut saw_check = false;
    for line in commands("Read a failed release's logs") {
        let Some(run) = run_line(&w, &line, &subst) else {
            continue;
        };
        if line.contains(" bundle check ") {
            // The kept bundle is refused again, for the same reason, by the same checks.
            run.expect(1);
            assert!(
                run.stdout().contains("RENDERER_REFUSED"),
                "{}",
                run.stdout()
            );
            saw_check = true;
        } else {
            run.ok();
            assert!(
                run.stdout().contains("--- compose logs ---"),
                "{}",
                run.stdout()
            );
            assert!(run.stdout().contains(&bad), "{}", run.stdout());
            saw_logs = true;
        }
    }
    assert!(saw_logs && saw_check);
}

/// Moving a box: the old env retired in tenancy, then the runbook's lines as written: the
/// timer is the box's, the token's removal runs on the test box, and the new env's install.sh
/// line runs as a dry run in a folder laid out as the runbook's (`release/`, the grant), whose
/// effects (the config it writes, the grant it stages, the one tick it runs) are then played on
/// the test box. The first tick logs in with the new env's grant and applies its release.
#[test]
fn move_a_box_to_another_env() {
    const NEW: &str = "env-qa-03";
    let w = World::new();
    w.applied();
    w.tenancy.set_desired(ENV, Desired::down(false));
    w.tick().ok();
    assert_eq!(w.last_report().result, ReportResult::Down);
    // The new env: its secrets, its release.
    w.bao.put_secret(NEW, "gemini_api_key", GEMINI);
    w.bao.put_secret(NEW, "pg_password", PGPASS);
    let mut bundle = TestBundle::default();
    for v in [&mut bundle.manifest, &mut bundle.meta] {
        *v = serde_json::from_str(&v.to_string().replace(ENV, NEW)).unwrap();
    }
    let sha = bundle.sha();
    w.tenancy.publish_bundle(NEW, &sha, bundle.tar());
    w.tenancy.set_desired(NEW, Desired::sha(sha.clone()));

    let mut installed = false;
    for line in commands("Move a box to another env") {
        if line.starts_with("sudo rm ") {
            let rm = line.strip_prefix("sudo ").unwrap().replace(
                "/var/lib/monky-deployd",
                &w.state_dir().display().to_string(),
            );
            let out = std::process::Command::new("sh")
                .args(["-c", &rm])
                .output()
                .unwrap();
            assert!(out.status.success(), "{rm}: {out:?}");
        } else if line.starts_with("sudo bash install.sh ") {
            install_as_dry_run(&w, &line, NEW);
            installed = true;
        } else {
            assert!(run_line(&w, &line, &[]).is_none(), "{line}");
        }
    }
    assert!(installed, "the runbook runs install.sh");
    let report = w.tenancy.reports(NEW).pop().expect("the new env's report");
    assert_eq!(report.result, ReportResult::Applied, "{report:?}");
    assert_eq!(report.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert!(
        w.bao.live_tokens_for_env(NEW) > 0,
        "logged in with the new env's grant"
    );
    // The stored token is the new env's: doctor's lookup-self finds no other env in it.
    let doctor: serde_json::Value =
        serde_json::from_str(&w.run(&["doctor", "--json"]).stdout()).unwrap();
    let token = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "token")
        .unwrap();
    assert_eq!(token["verdict"], "ok", "{token:#}");
    // The runbook ends with a green doctor: no check fails.
    for check in doctor["checks"].as_array().unwrap() {
        assert_ne!(check["verdict"], "fail", "{check:#}");
    }
    assert_eq!(w.state()["env_id"], NEW);
    assert!(!w.bootstrap_path().exists(), "the grant was used");
}

/// Runs the runbook's install.sh `line` with `--dry-run` in a folder holding `release/` (a
/// package and its .sha256) and the grant under the line's name, then plays what it printed on
/// `w`: the config's `env_id` (which must be `env`), the staged grant, the one tick.
fn install_as_dry_run(w: &World, line: &str, env: &str) {
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<&str> = line
        .strip_prefix("sudo bash install.sh ")
        .unwrap()
        .split_whitespace()
        .collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| *a == flag)
            .and_then(|i| args.get(i + 1))
            .unwrap_or_else(|| panic!("{flag} not in {line:?}"))
            .to_string()
    };
    let release = dir.path().join(value("--source"));
    std::fs::create_dir_all(&release).unwrap();
    let deb = "monky-deployd_0.2.0_amd64.deb";
    std::fs::write(release.join(deb), b"a package").unwrap();
    let sum = sha256_hex(b"a package");
    std::fs::write(
        release.join(format!("{deb}.sha256")),
        format!("{sum}  {deb}\n"),
    )
    .unwrap();
    let grant = w.tenancy.mint_grant(env);
    let grant = secrecy::ExposeSecret::expose_secret(&grant).to_string();
    std::fs::write(dir.path().join(value("--bootstrap-file")), &grant).unwrap();
    let out = std::process::Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../packaging/install.sh"
        ))
        .arg("--dry-run")
        .args(&args)
        .current_dir(dir.path())
        .env(
            "MONKY_DEPLOYD_DOCKER_DAEMON_JSON",
            dir.path().join("absent"),
        )
        .env_remove("MONKY_DEPLOYD_TOKEN")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{line}:\n{said}");
    assert!(!said.contains(&grant), "the grant printed:\n{said}");
    let config = crate::packaging::written_config(&said);
    assert_eq!(config.env_id, env, "{said}");
    assert!(
        said.contains("==> staging the bootstrap grant at /etc/monky-deployd/bootstrap.jwt"),
        "{said}"
    );
    assert!(said.contains("==> running one tick"), "{said}");
    // What it would do, on the test box.
    let text = std::fs::read_to_string(w.config_path())
        .unwrap()
        .replace(&format!("env_id: {ENV}"), &format!("env_id: {env}"));
    std::fs::write(w.config_path(), text).unwrap();
    std::fs::write(w.bootstrap_path(), &grant).unwrap();
    std::fs::set_permissions(
        w.bootstrap_path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    w.tick().ok();
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A docker Engine API on a unix socket that answers what the free-disk runbook asks (ping,
/// version, info with `root` as the data root, the image and build-cache prunes) and records
/// each request as `METHOD target`: the runbook's lines run with the real docker CLI against
/// it, which checks their flags and templates without pruning any real engine.
struct PruneEngine {
    socket: std::path::PathBuf,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl PruneEngine {
    fn start(dir: &std::path::Path, root: &std::path::Path) -> Self {
        let socket = dir.join("docker.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (log, root) = (seen.clone(), root.display().to_string());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (log, root) = (log.clone(), root.clone());
                std::thread::spawn(move || Self::serve(stream, &log, &root));
            }
        });
        Self { socket, seen }
    }

    fn serve(
        stream: std::os::unix::net::UnixStream,
        log: &std::sync::Mutex<Vec<String>>,
        root: &str,
    ) {
        use std::io::{BufRead, Read, Write};
        let mut out = stream.try_clone().unwrap();
        let mut reader = std::io::BufReader::new(stream);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let mut length = 0;
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                    break;
                }
                if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let mut words = line.split_whitespace();
            let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            log.lock().unwrap().push(format!("{method} {target}"));
            let path = target.split('?').next().unwrap_or("");
            // Without its `/v1.NN` prefix.
            let path = match path.strip_prefix("/v1.") {
                Some(rest) => rest.find('/').map_or(path, |at| &rest[at..]),
                None => path,
            };
            let (status, answer) = match (method, path) {
                (_, "/_ping") => ("200 OK", "OK".to_string()),
                ("GET", "/version") => (
                    "200 OK",
                    json!({"Version": "28.3.0", "ApiVersion": "1.47", "MinAPIVersion": "1.24",
                           "Os": "linux", "Arch": "amd64"})
                    .to_string(),
                ),
                ("GET", "/info") => (
                    "200 OK",
                    json!({"ID": "prune-engine", "ServerVersion": "28.3.0", "DockerRootDir": root,
                           "OperatingSystem": "stand-in", "OSType": "linux"})
                    .to_string(),
                ),
                ("POST", "/images/prune") => (
                    "200 OK",
                    json!({"ImagesDeleted": [{"Deleted": format!("sha256:{}", "ab".repeat(32))}],
                           "SpaceReclaimed": 1_073_741_824u64})
                    .to_string(),
                ),
                ("POST", "/build/prune") => (
                    "200 OK",
                    json!({"CachesDeleted": ["cache-1"], "SpaceReclaimed": 536_870_912u64})
                        .to_string(),
                ),
                _ => (
                    "404 Not Found",
                    json!({"message": "not in the stand-in"}).to_string(),
                ),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nApi-Version: 1.47\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n",
                if method == "HEAD" { 0 } else { answer.len() }
            );
            let sent = out.write_all(head.as_bytes()).and_then(|()| {
                if method == "HEAD" {
                    Ok(())
                } else {
                    out.write_all(answer.as_bytes())
                }
            });
            if sent.is_err() {
                return;
            }
        }
    }

    /// The requests so far, their query strings decoded.
    fn seen(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|r| {
                percent_encoding::percent_decode_str(r)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .collect()
    }
}

/// Freeing disk, as the runbook spells it, with the real docker CLI (the end-to-end setup's)
/// against a stand-in engine: every line runs and exits 0 (the prompts answered yes, as a
/// person does), the image prune asks for every unused image older than a week, the build
/// cache is pruned, and `df` is pointed at the data root the engine reports, the one
/// `DISK_INSUFFICIENT` and doctor's disk check measure.
#[test]
fn free_disk() {
    let Some(docker) = crate::e2e::real_docker_cli() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data-root");
    std::fs::create_dir_all(&root).unwrap();
    let engine = PruneEngine::start(dir.path(), &root);
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(&docker, bin.join("docker")).unwrap();
    std::fs::create_dir_all(dir.path().join("docker-config")).unwrap();
    let mut printed = String::new();
    for line in commands("Free disk") {
        assert!(BOX_ONLY.iter().any(|p| line.starts_with(p)), "{line}");
        let mut child = std::process::Command::new("bash")
            .args(["-c", &line])
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("DOCKER_HOST", format!("unix://{}", engine.socket.display()))
            .env("DOCKER_CONFIG", dir.path().join("docker-config"))
            // The classic builder's prune (`POST /build/prune`), not a buildx plugin's.
            .env("DOCKER_BUILDKIT", "0")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"y\n").unwrap();
        let out = child.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{line}:\n{said}\n{:?}", engine.seen());
        printed.push_str(&said);
    }
    let seen = engine.seen();
    let image_prune = seen
        .iter()
        .find(|r| r.starts_with("POST ") && r.contains("/images/prune"))
        .unwrap_or_else(|| panic!("no image prune: {seen:?}"));
    for filter in [r#""until":{"168h":true}"#, r#""dangling":{"false":true}"#] {
        assert!(
            image_prune.contains(filter),
            "{filter} not in {image_prune}"
        );
    }
    assert!(
        seen.iter()
            .any(|r| r.starts_with("POST ") && r.contains("/build/prune")),
        "{seen:?}"
    );
    assert!(printed.contains("Total reclaimed space"), "{printed}");
    // df printed the filesystem holding the data root the engine named.
    let df = std::process::Command::new("df")
        .arg("-h")
        .arg(&root)
        .output()
        .unwrap();
    let fs_line = String::from_utf8_lossy(&df.stdout)
        .lines()
        .last()
        .unwrap()
        .to_string();
    assert!(printed.contains(&fs_line), "{fs_line:?} not in {printed}");
}

#[test]
fn every_doctor_check_has_a_row_in_the_fail_table() {
    let w = World::new();
    w.applied();
    let run = w.run(&["doctor", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
    let table = DOC
        .split("\n### What each doctor FAIL means\n")
        .nth(1)
        .expect("the doctor table");
    for check in doc["checks"].as_array().unwrap() {
        let name = check["name"].as_str().unwrap();
        if matches!(name, "config" | "secrets") {
            // config never fails once doctor runs; secrets only warns
            continue;
        }
        assert!(
            table.contains(&format!("| `{name}` |")),
            "doctor's {name:?} check has no row in OPERATIONS.md"
        );
    }
}

#[test]
fn the_other_runbooks_show_only_commands_a_box_runs() {
    // Install, free disk and moving a box are box-level (install.sh, docker): every line is
    // one this suite knows to be such, or the agent's own.
    for title in [
        "Install from a build",
        "Free disk",
        "Move a box to another env",
    ] {
        for line in commands(title) {
            let known = BOX_ONLY.iter().any(|p| line.starts_with(p))
                || (line.starts_with("sudo bash ") && line.contains("install.sh "))
                || line.starts_with("sudo -u monky-deployd monky-deployd ");
            assert!(known, "{title}: {line:?}");
            // The page forbids a tick by hand as root, and so does every runbook.
            assert!(!line.contains("run --once --prune"), "{title}: {line:?}");
        }
    }
    // install.sh takes the folder `cargo xtask dist` fills, under the name it is copied to.
    let install = commands("Install from a build").join("\n");
    assert!(install.contains("target/dist-pkg"), "{install}");
    assert!(install.contains("--source ./release"), "{install}");
}
