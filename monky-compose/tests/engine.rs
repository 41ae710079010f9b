//! The Engine API reader against a small fake daemon on a unix socket, and against the real
//! engine at /var/run/docker.sock (required unless MONKY_NO_DOCKER=1).

mod support;

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use monky_compose::testkit::FakeEngine;
use monky_compose::{Container, Docker, Engine, ErrorKind};
use support::{PROJECT, Stub};

/// A fake daemon answering each path of `routes` with its canned status and body.
fn fake_engine(routes: &[(&str, u16, &str)]) -> FakeEngine {
    routes
        .iter()
        .fold(FakeEngine::builder(), |b, (path, status, body)| {
            b.route(path, *status, *body)
        })
        .start_in_temp_dir()
        .unwrap()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

const CONTAINERS: &str = r#"[
 {"Id":"a1","Names":["/monky-env-t-web-1"],"Image":"web:1","State":"running","Status":"Up 2 minutes (healthy)",
  "Labels":{"com.docker.compose.project":"monky-env-t","com.docker.compose.service":"web","com.docker.compose.oneoff":"False"}},
 {"Id":"b2","Names":["/monky-env-t-worker-1"],"Image":"web:1","State":"running","Status":"Up 4 seconds (health: starting)",
  "Labels":{"com.docker.compose.project":"monky-env-t","com.docker.compose.service":"worker","com.docker.compose.oneoff":"False"}},
 {"Id":"c3","Names":["/monky-env-t-web-run-8c1d2e"],"Image":"web:1","State":"exited","Status":"Exited (0) 1 minute ago",
  "Labels":{"com.docker.compose.project":"monky-env-t","com.docker.compose.service":"web","com.docker.compose.oneoff":"True"}},
 {"Id":"d4","Names":["/monky-env-t-db-1"],"Image":"postgres:16","State":"exited","Status":"Exited (137) 5 seconds ago",
  "Labels":{"com.docker.compose.project":"monky-env-t","com.docker.compose.service":"db"}}
]"#;

fn info_body(root: &Path) -> String {
    serde_json::json!({
        "ID": "X", "Containers": 4, "ServerVersion": "28.3.0",
        "DockerRootDir": root, "Driver": "overlay2", "OperatingSystem": "Debian GNU/Linux 12"
    })
    .to_string()
}

#[test]
fn containers_come_from_an_unversioned_filtered_list() {
    let fake = fake_engine(&[("/containers/json", 200, CONTAINERS)]);
    let got = fake.engine().containers(PROJECT).unwrap();
    let c = |name: &str, service: &str, state: &str, health: Option<&str>| Container {
        name: name.into(),
        service: service.into(),
        state: state.into(),
        health: health.map(str::to_owned),
        completed: false,
    };
    assert_eq!(
        got,
        vec![
            c("monky-env-t-db-1", "db", "exited", None),
            c("monky-env-t-web-1", "web", "running", Some("healthy")),
            c(
                "monky-env-t-worker-1",
                "worker",
                "running",
                Some("starting")
            ),
        ]
    );
    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    let (path, query) = requests[0].split_once('?').unwrap();
    assert_eq!(path, "GET /containers/json");
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (percent_decode(k), percent_decode(v))
        })
        .collect();
    pairs.sort();
    assert_eq!(pairs[0], ("all".to_owned(), "1".to_owned()));
    assert_eq!(pairs[1].0, "filters");
    let filters: serde_json::Value = serde_json::from_str(&pairs[1].1).unwrap();
    assert_eq!(
        filters,
        serde_json::json!({"label": ["com.docker.compose.project=monky-env-t"]})
    );
}

#[test]
fn a_heartbeat_spawns_no_process_and_asks_info_once() {
    let root = tempfile::tempdir().unwrap();
    let info = info_body(root.path());
    let fake = fake_engine(&[("/containers/json", 200, CONTAINERS), ("/info", 200, &info)]);
    let stub = Stub::new(&[("COMPOSE_VERSION", "2.32.0")]);
    let docker = stub.builder().engine(fake.engine()).build().unwrap();

    // warm-up: the one compose lookup
    let facts = docker.facts();
    assert_eq!(facts.docker_version.as_deref(), Some("28.3.0"));
    assert_eq!(facts.compose_version.as_deref(), Some("2.32.0"));
    assert_eq!(facts.data_root.as_deref(), Some(root.path()));
    assert!(facts.free_bytes.unwrap() > 0);
    let spawned = stub.calls().len();
    assert_eq!(spawned, 1, "only `docker compose version`");

    for _ in 0..3 {
        let again = docker.facts();
        assert_eq!(again.docker_version, facts.docker_version);
        assert_eq!(docker.containers(PROJECT).unwrap().len(), 3);
    }
    assert_eq!(stub.calls().len(), spawned, "heartbeats spawned a process");
    let infos = fake
        .requests()
        .iter()
        .filter(|r| r.starts_with("GET /info"))
        .count();
    assert_eq!(infos, 1, "/info is cached");

    // the next run of the agent, handed the saved compose info, spawns nothing at all
    std::fs::create_dir_all(stub.cfg.join("cli-plugins")).unwrap();
    stub.install(&stub.cfg.join("cli-plugins"), "docker-compose", &[]);
    let saved = stub
        .builder()
        .engine(fake.engine())
        .build()
        .unwrap()
        .compose_info()
        .unwrap();
    let before = stub.calls().len();
    let next_run = stub
        .builder()
        .engine(fake.engine())
        .compose_hint(saved)
        .build()
        .unwrap();
    assert_eq!(next_run.facts().compose_version.as_deref(), Some("2.32.0"));
    next_run.containers(PROJECT).unwrap();
    assert_eq!(stub.calls().len(), before);

    // ... and, handed the saved daemon facts, asks no /info while the daemon's answers name
    // their version
    let infos = || {
        fake.requests()
            .iter()
            .filter(|r| r.starts_with("GET /info"))
            .count()
    };
    let asked = infos();
    let saved_engine = docker.known_engine().expect("the daemon's facts, fetched");
    let hinted = stub
        .builder()
        .engine(fake.engine())
        .engine_hint(saved_engine.clone())
        .build()
        .unwrap();
    assert_eq!(hinted.containers(PROJECT).unwrap().len(), 3);
    let facts = hinted.facts();
    assert_eq!(facts.docker_version.as_deref(), Some("28.3.0"));
    assert_eq!(facts.data_root.as_deref(), Some(root.path()));
    assert_eq!(hinted.known_engine(), Some(saved_engine.clone()));
    assert_eq!(infos(), asked, "the saved facts held");
    // a hint of another version is not taken: the daemon is asked
    let mut older = saved_engine;
    older.server_version = "27.0.0".into();
    let stale = stub
        .builder()
        .engine(fake.engine())
        .engine_hint(older)
        .build()
        .unwrap();
    stale.containers(PROJECT).unwrap();
    assert_eq!(stale.facts().docker_version.as_deref(), Some("28.3.0"));
    assert_eq!(infos(), asked + 1);
}

#[test]
fn an_error_status_keeps_the_daemons_message() {
    let fake = fake_engine(&[(
        "/containers/json",
        500,
        r#"{"message":"invalid filter 'labl'"}"#,
    )]);
    let err = fake.engine().containers(PROJECT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert_eq!(
        err.to_string(),
        "docker engine answered 500 for /containers/json: invalid filter 'labl'"
    );
}

#[test]
fn garbage_is_a_parse_error() {
    let fake = fake_engine(&[("/info", 200, "<html>proxy</html>")]);
    let err = fake.engine().info().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert!(
        err.to_string()
            .starts_with("cannot parse the output of engine /info"),
        "{err}"
    );
}

#[test]
fn a_dead_socket_is_unavailable_so_callers_fall_back() {
    let dir = tempfile::tempdir().unwrap();
    // missing socket file
    let err = Engine::unix(dir.path().join("none.sock"))
        .containers(PROJECT)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::EngineUnavailable, "{err}");
    assert!(err.to_string().contains("no such socket"), "{err}");
    // a socket file nobody listens on any more: connection refused
    let path = dir.path().join("stale.sock");
    drop(UnixListener::bind(&path).unwrap());
    let err = Engine::unix(&path).info().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::EngineUnavailable, "{err}");
    assert!(err.to_string().contains("refused"), "{err}");
}

#[test]
fn a_hung_daemon_times_out_without_a_cli_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hung.sock");
    // connections queue in the backlog; nobody ever answers
    let _listener = UnixListener::bind(&path).unwrap();
    let stub = Stub::new(&[("COMPOSE_VERSION", "2.32.0")]);
    let docker = stub
        .builder()
        .engine(Engine::unix(&path).with_timeout(Duration::from_millis(300)))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = docker.containers(PROJECT).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(err, monky_compose::Error::EngineRequest { .. }),
        "{err}"
    );
    assert!(
        stub.calls().is_empty(),
        "the CLI would hang on the same daemon"
    );
}

// ---- the real engine ---------------------------------------------------------------------------

const REAL_SOCKET: &str = "/var/run/docker.sock";
const IMAGE: &str = "monky-compose-test/rootfs:1";

/// The real engine, or `None` when MONKY_NO_DOCKER=1 says this machine has none.
fn real_engine() -> Option<PathBuf> {
    if Path::new(REAL_SOCKET).exists() {
        return Some(PathBuf::from(REAL_SOCKET));
    }
    if std::env::var("MONKY_NO_DOCKER").as_deref() == Ok("1") {
        eprintln!("MONKY_NO_DOCKER=1: skipping the real-engine test");
        return None;
    }
    panic!(
        "no docker engine at {REAL_SOCKET}: start dockerd (the real-engine tests need it) or set MONKY_NO_DOCKER=1 to skip them"
    );
}

fn docker_cli(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("the docker CLI runs");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A tiny image made from this machine's /bin/sh and sleep with their libraries (no registry
/// is reachable here), imported once per test run.
fn test_image() -> &'static str {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let root = tempfile::tempdir().unwrap();
        for bin in ["/bin/sh", "/bin/sleep"] {
            let ldd = Command::new("ldd").arg(bin).output().unwrap();
            let libs = String::from_utf8_lossy(&ldd.stdout).into_owned();
            let mut files = vec![bin.to_owned()];
            for line in libs.lines() {
                let path = match line.split_once("=>") {
                    Some((_, rest)) => rest.split_whitespace().next(),
                    None => line.split_whitespace().next(),
                };
                if let Some(p) = path.filter(|p| p.starts_with('/')) {
                    files.push(p.to_owned());
                }
            }
            for f in files {
                let dest = root.path().join(f.trim_start_matches('/'));
                std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
                std::fs::copy(&f, &dest).unwrap();
            }
        }
        let mut tar = Command::new("tar")
            .args(["-C"])
            .arg(root.path())
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let import = Command::new("docker")
            .args(["import", "-", IMAGE])
            .stdin(tar.stdout.take().unwrap())
            .output()
            .unwrap();
        assert!(tar.wait().unwrap().success());
        assert!(
            import.status.success(),
            "docker import: {}",
            String::from_utf8_lossy(&import.stderr)
        );
    });
    IMAGE
}

/// Removes a test project's containers when dropped.
struct Project(String);

impl Project {
    fn new(tag: &str) -> Project {
        Project(format!("monkytest{}{tag}", std::process::id()))
    }

    fn run(&self, name: &str, service: &str, oneoff: bool, extra: &[&str], cmd: &[&str]) {
        let mut args = vec![
            "run".to_owned(),
            "-d".into(),
            "--name".into(),
            format!("{}-{name}", self.0),
            "--label".into(),
            format!("com.docker.compose.project={}", self.0),
            "--label".into(),
            format!("com.docker.compose.service={service}"),
            "--label".into(),
            format!(
                "com.docker.compose.oneoff={}",
                if oneoff { "True" } else { "False" }
            ),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args.push(test_image().to_owned());
        args.extend(cmd.iter().map(|s| (*s).to_owned()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        docker_cli(&refs);
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let ids = Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label=com.docker.compose.project={}", self.0))
            .output();
        if let Ok(ids) = ids {
            let ids = String::from_utf8_lossy(&ids.stdout).into_owned();
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let _ = Command::new("docker").args(["rm", "-f"]).args(ids).output();
            }
        }
    }
}

#[test]
fn real_engine_facts_match_the_cli() {
    let Some(socket) = real_engine() else { return };
    let engine = Engine::unix(&socket);
    let info = engine.info().unwrap();
    assert_eq!(
        info.server_version,
        docker_cli(&["version", "--format", "{{.Server.Version}}"])
    );
    assert_eq!(
        info.docker_root_dir,
        PathBuf::from(docker_cli(&["info", "--format", "{{.DockerRootDir}}"]))
    );
    let cfg = tempfile::tempdir().unwrap();
    let docker = Docker::builder("docker")
        .docker_config(cfg.path())
        .engine(Engine::unix(&socket))
        .build()
        .unwrap();
    let facts = docker.facts();
    assert_eq!(
        facts.docker_version.as_deref(),
        Some(info.server_version.as_str())
    );
    assert_eq!(
        facts.data_root.as_deref(),
        Some(info.docker_root_dir.as_path())
    );
    assert!(facts.free_bytes.unwrap() > 0);
    // compose v2 may or may not be installed on this machine; v1 must never be reported
    match docker.compose_info() {
        Ok(found) => assert!(found.version.major >= 2, "{found:?}"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::Setup, "{e}"),
    }
}

#[test]
fn real_engine_reports_states_and_health_of_a_project() {
    let Some(socket) = real_engine() else { return };
    let project = Project::new("states");
    let other = Project::new("other");
    let health = |cmd: &'static str| -> [&'static str; 8] {
        [
            "--health-cmd",
            cmd,
            "--health-interval",
            "1s",
            "--health-retries",
            "1",
            "--health-timeout",
            "5s",
        ]
    };
    project.run(
        "web-1",
        "web",
        false,
        &health("exit 0"),
        &["/bin/sleep", "300"],
    );
    project.run(
        "bad-1",
        "bad",
        false,
        &health("exit 1"),
        &["/bin/sleep", "300"],
    );
    project.run("db-1", "db", false, &[], &["/bin/sleep", "300"]);
    project.run("job-1", "job", false, &[], &["/bin/sh", "-c", "exit 3"]);
    project.run("web-run-1", "web", true, &[], &["/bin/sleep", "300"]);
    other.run("web-1", "web", false, &[], &["/bin/sleep", "300"]);

    let engine = Engine::unix(&socket);
    let p = &project.0;
    let expected = vec![
        Container {
            name: format!("{p}-bad-1"),
            service: "bad".into(),
            state: "running".into(),
            health: Some("unhealthy".into()),
            completed: false,
        },
        Container {
            name: format!("{p}-db-1"),
            service: "db".into(),
            state: "running".into(),
            health: None,
            completed: false,
        },
        Container {
            name: format!("{p}-job-1"),
            service: "job".into(),
            state: "exited".into(),
            health: None,
            completed: false,
        },
        Container {
            name: format!("{p}-web-1"),
            service: "web".into(),
            state: "running".into(),
            health: Some("healthy".into()),
            completed: false,
        },
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = engine.containers(p).unwrap();
    while got != expected && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(300));
        got = engine.containers(p).unwrap();
    }
    assert_eq!(got, expected);

    // the CLI fallback (engine unreachable) sees the same, through the real docker CLI
    let cfg = tempfile::tempdir().unwrap();
    let docker = Docker::builder("docker")
        .docker_config(cfg.path())
        .engine(Engine::unix(cfg.path().join("no.sock")))
        .build()
        .unwrap();
    assert_eq!(docker.containers(p).unwrap(), expected);

    // and an unknown project is empty, not an error
    assert_eq!(engine.containers(&format!("{p}-nothing")).unwrap(), vec![]);
}

/// A one-shot that exited 0 is done, not down, when compose's rule or the engine's says it will
/// not run again: another service waits for it with `service_completed_successfully`, or its
/// restart policy is `no`. Under `always`, or with a non-zero exit, it is down.
#[test]
fn a_completed_one_shot_is_done_and_a_stopped_service_is_not() {
    let row = |id: &str, service: &str, status: &str, depends_on: &str| {
        format!(
            r#"{{"Id":"{id}","Names":["/p-{service}-1"],"State":"exited","Status":"{status}",
               "Labels":{{"com.docker.compose.project":"p","com.docker.compose.service":"{service}",
                          "com.docker.compose.depends_on":"{depends_on}"}}}}"#
        )
    };
    let web = r#"{"Id":"w","Names":["/p-web-1"],"State":"running","Status":"Up 1 minute",
        "Labels":{"com.docker.compose.project":"p","com.docker.compose.service":"web",
                  "com.docker.compose.depends_on":"migrate:service_completed_successfully:false,db:service_healthy:false"}}"#;
    let list = format!(
        "[{web},{},{},{},{}]",
        row("m", "migrate", "Exited (0) 1 minute ago", ""),
        row("s", "seed", "Exited (0) 1 minute ago", ""),
        row("c", "cache", "Exited (0) 1 minute ago", ""),
        row("f", "failed", "Exited (3) 1 minute ago", ""),
    );
    let policy = |name: &str| {
        format!(r#"{{"State":{{}},"HostConfig":{{"RestartPolicy":{{"Name":"{name}"}}}}}}"#)
    };
    let (no, always) = (policy("no"), policy("always"));
    let fake = fake_engine(&[
        ("/containers/json", 200, &list),
        ("/containers/s/json", 200, &no),
        ("/containers/c/json", 200, &always),
        ("/containers/f/json", 200, &no),
    ]);
    let got: Vec<(String, bool, bool)> = fake
        .engine()
        .containers("p")
        .unwrap()
        .into_iter()
        .map(|c| (c.service.clone(), c.completed, c.is_ready()))
        .collect();
    assert_eq!(
        got,
        [
            ("cache".to_string(), false, false),
            ("failed".to_string(), false, false),
            ("migrate".to_string(), true, true),
            ("seed".to_string(), true, true),
            ("web".to_string(), false, true),
        ]
    );
    // The migration is waited for by the label alone: no inspect of it.
    assert!(
        !fake
            .requests()
            .iter()
            .any(|r| r.contains("/containers/m/json")),
        "{:?}",
        fake.requests()
    );
}

/// Every port a running container publishes, with its host address, as `docker port` says:
/// what the agent asks when it cannot see the process behind a root-owned peer listener.
#[test]
fn published_ports_are_the_engines_own() {
    let Some(socket) = real_engine() else { return };
    let project = Project::new("published");
    project.run(
        "web-1",
        "web",
        false,
        &["-p", "127.0.0.1::8080", "-p", "8081"],
        &["/bin/sleep", "300"],
    );
    let name = format!("{}-web-1", project.0);
    let engine = Engine::for_docker_host(Some(&format!("unix://{}", socket.display())));
    let published = engine.published_ports().unwrap();
    for (private, ip) in [("8080/tcp", "127.0.0.1"), ("8081/tcp", "0.0.0.0")] {
        let said = docker_cli(&["port", &name, private]);
        let port: u16 = said
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{ip}:")))
            .unwrap_or_else(|| panic!("{said}"))
            .parse()
            .unwrap();
        assert!(
            published.contains(&(ip.to_owned(), port)),
            "{ip}:{port} not in {published:?}"
        );
    }
}

/// An image's `USER` and its own `/etc/passwd`, read as the runtime would resolve the user:
/// the passwd comes from a container created and never started, which is gone afterwards.
#[test]
fn an_images_user_and_passwd_are_its_own() {
    let Some(socket) = real_engine() else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("passwd"),
        "root:x:0:0::/:/bin/sh\napp:x:65534:65534::/:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("Dockerfile"),
        "FROM scratch\nCOPY passwd /etc/passwd\nUSER app\n",
    )
    .unwrap();
    let tag = format!("monkytest{}-user:1", std::process::id());
    docker_cli(&["build", "-q", "-t", &tag, dir.path().to_str().unwrap()]);
    let bare = format!("monkytest{}-bare:1", std::process::id());
    std::fs::write(
        dir.path().join("Dockerfile"),
        "FROM scratch\nCOPY Dockerfile /x\n",
    )
    .unwrap();
    docker_cli(&["build", "-q", "-t", &bare, dir.path().to_str().unwrap()]);
    let engine = Engine::unix(&socket);
    let before = docker_cli(&["ps", "-aq", "--filter", "label=io.monky.deployd.probe"]);

    assert_eq!(engine.image_user(&tag).unwrap().as_deref(), Some("app"));
    let passwd = engine
        .image_passwd(&tag)
        .unwrap()
        .expect("the image's passwd");
    assert!(passwd.contains("app:x:65534:"), "{passwd}");
    assert_eq!(engine.image_user(&bare).unwrap(), None);
    assert_eq!(engine.image_passwd(&bare).unwrap(), None);
    // The probe containers are gone.
    assert_eq!(
        docker_cli(&["ps", "-aq", "--filter", "label=io.monky.deployd.probe"]),
        before
    );
    docker_cli(&["rmi", &tag, &bare]);
}

/// What runs of a container: its main process and its environment, whose values `Debug`
/// never shows; a stopped container has no process; a stop is the engine's own, a container
/// stopped already no error; an id that would address another endpoint is refused unsent.
#[test]
fn running_gives_the_main_process_and_the_environment_and_stop_stops() {
    let fake = fake_engine(&[
        (
            "/containers/a1/json",
            200,
            r#"{"State":{"Running":true,"Pid":4242},"Config":{"Env":["PW=s3cret-value","MODE=prod"]}}"#,
        ),
        (
            "/containers/b2/json",
            200,
            r#"{"State":{"Running":false,"Pid":0},"Config":{"Env":null}}"#,
        ),
        ("/containers/a1/stop", 204, ""),
        ("/containers/b2/stop", 304, ""),
    ]);
    let engine = Engine::unix(fake.socket());
    let a1 = engine.running("a1").unwrap();
    assert_eq!(a1.pid, Some(4242));
    assert_eq!(a1.env, ["PW=s3cret-value", "MODE=prod"]);
    let shown = format!("{a1:?}");
    assert!(shown.contains("PW") && !shown.contains("s3cret"), "{shown}");
    let b2 = engine.running("b2").unwrap();
    assert_eq!((b2.pid, b2.env.len()), (None, 0));
    engine.stop("a1", Duration::from_secs(2)).unwrap();
    engine.stop("b2", Duration::from_secs(2)).unwrap();
    assert!(
        fake.requests()
            .iter()
            .any(|r| r == "POST /containers/a1/stop?t=2"),
        "{:?}",
        fake.requests()
    );
    let before = fake.requests().len();
    assert!(engine.running("../info").is_err());
    assert!(engine.stop("a1?x", Duration::ZERO).is_err());
    assert_eq!(fake.requests().len(), before, "sent");
}

/// The engine's `top` gives each process of a container with its four uids, read from the
/// columns asked for; its arguments stay out of `Debug`, and columns other than those asked
/// are refused rather than read.
#[test]
fn top_gives_each_process_with_its_four_uids_and_hides_the_arguments() {
    let fake = fake_engine(&[
        (
            "/containers/a1/top",
            200,
            r#"{"Processes":[["20163","0","0","0","0","/bin/sh -c exec server --pw s3cret-value"],["20240","65534","65534","65534","65534","server --pw s3cret-value"]],"Titles":["PID","RUID","EUID","SUID","FSUID","COMMAND"]}"#,
        ),
        (
            "/containers/b2/top",
            200,
            r#"{"Processes":[["1","root","/bin/sh"]],"Titles":["PID","USER","COMMAND"]}"#,
        ),
    ]);
    let engine = Engine::unix(fake.socket());
    let top = engine.top("a1").unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!((top[1].pid, top[1].uids), (20240, [65534; 4]));
    assert_eq!(top[1].args, "server --pw s3cret-value");
    let shown = format!("{top:?}");
    assert!(
        shown.contains("20240") && !shown.contains("s3cret"),
        "{shown}"
    );
    assert!(
        fake.requests().iter().any(|r| r
            == "GET /containers/a1/top?ps_args=-ww+-o+pid%2Cruid%2Ceuid%2Csuid%2Cfsuid%2Cargs"
            || r == "GET /containers/a1/top?ps_args=-ww%20-o%20pid%2Cruid%2Ceuid%2Csuid%2Cfsuid%2Cargs"),
        "{:?}",
        fake.requests()
    );
    let e = engine.top("b2").unwrap_err().to_string();
    assert!(e.contains("columns") && !e.contains("/bin/sh\""), "{e}");
}
