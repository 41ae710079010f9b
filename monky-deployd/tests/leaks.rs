//! Secrets that could leave without being logged: a docker child's argv and environment, the
//! agent's and its children's `/proc/<pid>/cmdline` and `environ` while a tick runs, and the
//! report's log tail when the container prints its environment in the shapes programs use.
//! (`redaction` greps every output for the plain values; the panic hook is a unit test.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine as _;
use monky_agent_proto::ReportResult;
use monky_testkit::tenancy::{Endpoint, Fault};
use serde_json::json;

use crate::apply::compose_sub;
use crate::util::*;

/// A multi-line value (a PEM key) and one that every JSON writer escapes differently.
const TLS_KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEF\nAASCBKcwggSjAgEAAoIBAQC7-leak\n-----END PRIVATE KEY-----";
const DB_PASSWORD: &str = "pässwört\"<&>\\leak-0005";

/// What the agent's children may have in their environment (bash adds `PWD`, `SHLVL`, `_`).
const CHILD_ENV: [&str; 7] = [
    "PATH",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "COMPOSE_INTERACTIVE_NO_CLI",
    "PWD",
    "SHLVL",
    "_",
];

/// Variables an operator's shell or a unit file might hand the agent: none may reach a child.
const AGENT_ENV: [(&str, &str); 5] = [
    ("VAULT_TOKEN", "hvs.agent-environment-leak-0001"),
    ("GEMINI_API_KEY", "agent-environment-leak-0002"),
    ("DOCKER_AUTH_CONFIG", "agent-environment-leak-0003"),
    ("AWS_SECRET_ACCESS_KEY", "agent-environment-leak-0004"),
    ("COMPOSE_PROJECT_NAME", "agent-environment-leak-0005"),
];

/// The default bundle plus the two odd secrets and the registry credential.
fn bundle(tag: &str) -> TestBundle {
    let mut b = TestBundle::tagged(tag).with_registry_auth();
    b.env_template
        .push_str("TLS_KEY=\"${TLS_KEY}\"\nDB_PASSWORD=${DB_PASSWORD}\n");
    let entries = b.manifest["entries"].as_array_mut().unwrap();
    for (var, name) in [("TLS_KEY", "tls_key"), ("DB_PASSWORD", "db_password")] {
        entries.push(json!({"var": var, "path": format!("monky/{ENV}/see/{name}"), "kind": "supplied", "version": null}));
    }
    b
}

fn world() -> World {
    let w = World::new();
    w.bao.put_secret(ENV, "tls_key", TLS_KEY);
    w.bao.put_secret(ENV, "db_password", DB_PASSWORD);
    w.stage_grant();
    w
}

/// Every secret the agent holds during a tick, in the forms that must never appear.
fn secrets(w: &World) -> Vec<String> {
    let mut out: Vec<String> = [GEMINI, PGPASS, REGISTRY_PASS, DB_PASSWORD]
        .iter()
        .map(|s| s.to_string())
        .collect();
    out.extend(TLS_KEY.lines().filter(|l| l.len() >= 4).map(str::to_string));
    out.push(base64::engine::general_purpose::STANDARD.encode(format!("robot:{REGISTRY_PASS}")));
    if let Ok(token) = std::fs::read_to_string(w.state_dir().join("bao.token")) {
        out.push(token.trim().to_string());
    }
    out.extend(AGENT_ENV.iter().map(|(_, v)| v.to_string()));
    out
}

#[track_caller]
fn assert_clean(what: &str, text: &str, secrets: &[String]) {
    for s in secrets {
        assert!(!text.contains(s.as_str()), "{what} holds {s:?}:\n{text}");
    }
    assert!(!text.contains("eyJ"), "{what} holds a JWT:\n{text}");
}

#[test]
fn docker_children_get_only_docker_config_and_the_env_file_path() {
    let w = world();
    let logs = w.path("logs.txt");
    std::fs::write(&logs, "web-1  | ready\n").unwrap();
    w.stub("LOGS_FILE", logs.to_str().unwrap());
    w.stub("HEALTH", "unhealthy");
    w.publish(&bundle("1"));
    let mut cmd = w.command(&["run", "--once"]);
    cmd.envs(AGENT_ENV);
    let run = Run(cmd.output().unwrap());
    run.expect(1);
    w.clear_stub();
    w.publish(&bundle("2"));
    let mut cmd = w.command(&["run", "--once", "--prune"]);
    cmd.envs(AGENT_ENV);
    Run(cmd.output().unwrap()).ok();

    let calls = w.docker_call_records();
    let lines: Vec<String> = calls.iter().map(|c| c.command_line()).collect();
    let subs: BTreeSet<&str> = lines
        .iter()
        .filter_map(|argv| compose_sub(argv).or_else(|| argv.split(' ').next()))
        .collect();
    for sub in ["config", "pull", "up", "logs", "image"] {
        assert!(subs.contains(sub), "no docker {sub} call: {subs:?}");
    }
    let secrets = secrets(&w);
    let docker_config = w.state_dir().join("docker");
    for (c, argv) in calls.iter().zip(&lines) {
        for a in &c.args {
            assert_clean(&format!("argv {argv}"), a, &secrets);
        }
        let names: Vec<&str> = c.env.keys().map(String::as_str).collect();
        for n in &names {
            assert!(CHILD_ENV.contains(n), "{n} reached {argv}: {names:?}");
        }
        assert_eq!(
            c.env.get("DOCKER_CONFIG").map(Path::new),
            Some(docker_config.as_path()),
            "{argv}"
        );
        for (k, v) in &c.env {
            assert_clean(&format!("env {k} of {argv}"), v, &secrets);
        }
        // Compose gets the secrets by file name only: the .env of the release it runs.
        if compose_sub(argv).is_some_and(|s| s != "version") {
            let at = c
                .args
                .iter()
                .position(|a| a == "--env-file")
                .unwrap_or_else(|| panic!("no --env-file: {argv}"));
            let path = Path::new(&c.args[at + 1]);
            assert_eq!(path.file_name().unwrap(), ".env", "{argv}");
            assert!(
                ["releases", "staging", "current"]
                    .iter()
                    .any(|d| path.starts_with(w.env_dir().join(d))),
                "{argv}"
            );
        }
    }
    assert!(calls.len() >= 6, "{lines:?}");
    assert!(w.current_target().is_some());
}

/// The processes whose parent chain leads to `root`, by `/proc/<pid>/stat`.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent: BTreeMap<u32, u32> = BTreeMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            parent.insert(pid, ppid);
        }
    }
    parent
        .keys()
        .copied()
        .filter(|pid| {
            let mut p = *pid;
            for _ in 0..64 {
                if p == root {
                    return true;
                }
                match parent.get(&p) {
                    Some(&pp) if pp != p => p = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

/// What `/proc` showed of one process: argv (NUL-separated) and environment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Seen {
    pid: u32,
    cmdline: String,
    environ: String,
}

#[test]
fn proc_shows_no_secret_of_the_agent_or_its_children_while_a_tick_runs() {
    let w = world();
    // Slow children and a slow report: the tick spends seconds holding every secret.
    let stub_env = w.stub_dir().join("stub.env");
    std::fs::write(&stub_env, "sleep 0.3\n").unwrap();
    w.tenancy
        .set_fault(Endpoint::Report, Fault::Delay(Duration::from_millis(1500)));
    w.publish(&bundle("1"));

    let mut cmd = w.command(&["run", "--once"]);
    cmd.envs(AGENT_ENV)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let root = child.id();
    // No core file can carry the secrets the tick holds (the agent and its docker children).
    let core_limit = || {
        let limits = std::fs::read_to_string(format!("/proc/{root}/limits")).unwrap_or_default();
        limits
            .lines()
            .find(|l| l.starts_with("Max core file size"))
            .map(|l| {
                l.split_whitespace()
                    .skip(4)
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
    };
    let started = std::time::Instant::now();
    while core_limit().as_deref() != Some("0 0") && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        core_limit().as_deref(),
        Some("0 0"),
        "the agent's core limit"
    );
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut seen = BTreeSet::new();
            while !done.load(Ordering::Relaxed) {
                for pid in descendants(root) {
                    let read = |f: &str| {
                        std::fs::read(format!("/proc/{pid}/{f}"))
                            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                            .unwrap_or_default()
                    };
                    let s = Seen {
                        pid,
                        cmdline: read("cmdline"),
                        environ: read("environ"),
                    };
                    if !s.cmdline.is_empty() {
                        seen.insert(s);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            seen
        })
    };
    let status = child.wait().unwrap();
    done.store(true, Ordering::Relaxed);
    let seen = sampler.join().unwrap();
    assert_eq!(status.code(), Some(0), "the tick applied");
    assert_eq!(w.last_report().result, ReportResult::Applied);

    // The sampler saw the agent and its docker children, many times over.
    assert!(
        seen.iter()
            .any(|s| s.pid == root && s.cmdline.contains("run --once")),
        "{seen:#?}"
    );
    assert!(
        seen.iter()
            .any(|s| s.cmdline.contains(" compose ") && s.cmdline.contains("--env-file")),
        "{seen:#?}"
    );
    assert!(seen.len() >= 4, "{seen:#?}");
    let mut secrets = secrets(&w);
    // The agent's own environment holds the test's decoys; only its children must not. A child
    // sampled between fork and exec is still a copy of the agent (its cmdline and environ are
    // the agent's): it is held to the agent's rule below.
    let agent_cmdline: BTreeSet<&str> = seen
        .iter()
        .filter(|s| s.pid == root)
        .map(|s| s.cmdline.as_str())
        .collect();
    let is_agent = |s: &Seen| s.pid == root || agent_cmdline.contains(s.cmdline.as_str());
    for s in &seen {
        assert_clean(&format!("cmdline of {}", s.pid), &s.cmdline, &secrets);
        if !is_agent(s) {
            assert_clean(&format!("environ of {}", s.pid), &s.environ, &secrets);
        }
    }
    secrets.truncate(secrets.len() - AGENT_ENV.len());
    for s in seen.iter().filter(|s| is_agent(s)) {
        assert_clean("the agent's environ", &s.environ, &secrets);
    }
}

/// What Python's `json.dumps` writes (ASCII only).
fn python_json(v: &str) -> String {
    let mut out = String::from('"');
    for unit in v.encode_utf16() {
        match char::from_u32(u32::from(unit)) {
            Some('"') => out.push_str("\\\""),
            Some('\\') => out.push_str("\\\\"),
            Some('\n') => out.push_str("\\n"),
            Some(c @ ' '..='~') => out.push(c),
            _ => out.push_str(&format!("\\u{unit:04x}")),
        }
    }
    out.push('"');
    out
}

/// What Go's `json.Marshal` writes (HTML-safe).
fn go_json(v: &str) -> String {
    serde_json::to_string(v)
        .unwrap()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

#[test]
fn a_container_printing_its_environment_leaks_nothing_into_the_report() {
    let w = world();
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("robot:{REGISTRY_PASS}"));
    // The container dumps its environment every way programs do, behind compose's prefix and
    // the erase-line escape compose 2.26 puts in front of every line.
    let mut dump = vec![
        format!("GEMINI_API_KEY={GEMINI}"),
        format!("DB_PASSWORD={DB_PASSWORD}"),
        format!("declare -x POSTGRES_PASSWORD=\"{PGPASS}\""),
        format!("{{\"DB_PASSWORD\": {}}}", python_json(DB_PASSWORD)),
        format!(
            "{{\"DB_PASSWORD\":{},\"TLS_KEY\":{}}}",
            go_json(DB_PASSWORD),
            go_json(TLS_KEY)
        ),
        format!("{{\"TLS_KEY\": {}}}", python_json(TLS_KEY)),
        format!("{{\"auths\":{{\"127.0.0.1:5000\":{{\"auth\":\"{b64}\"}}}}}}"),
        format!("login robot:{REGISTRY_PASS} ok"),
    ];
    // A multi-line value printed raw spans lines, each with its own prefix.
    dump.extend(format!("TLS_KEY={TLS_KEY}").lines().map(str::to_string));
    let logs: String = dump
        .iter()
        .map(|l| format!("\u{1b}[2Kweb-1  | {l}\n"))
        .collect();
    std::fs::write(w.path("logs.txt"), logs).unwrap();
    w.stub("LOGS_FILE", w.path("logs.txt").to_str().unwrap());
    w.stub("HEALTH", "unhealthy");
    w.publish(&bundle("1"));
    let run = w.tick();
    run.expect(1);

    let r = w.last_report();
    assert_eq!(r.result, ReportResult::Failed);
    let tail = &r.log_tail;
    assert!(tail.contains("--- compose logs ---"), "{tail}");
    // Every dumped line arrived, masked: the redactor hid values, not the log.
    assert!(tail.matches("web-1  | ").count() >= dump.len(), "{tail}");
    assert!(tail.contains("GEMINI_API_KEY=***"), "{tail}");
    let mut forms = secrets(&w);
    forms.extend([
        python_json(DB_PASSWORD),
        go_json(DB_PASSWORD),
        python_json(TLS_KEY),
        go_json(TLS_KEY),
    ]);
    // Inside the quotes: a form is a secret even where the dump's quoting differs.
    let inner: Vec<String> = forms
        .iter()
        .map(|f| f.trim_matches('"').to_string())
        .collect();
    forms.extend(inner);
    assert_clean("the report's log tail", tail, &forms);
    assert_clean("the report", &format!("{r:?}"), &forms);
    assert_clean("stderr", &run.stderr(), &forms);
    assert_clean(
        "state.json",
        &std::fs::read_to_string(w.state_dir().join("state.json")).unwrap(),
        &forms,
    );
}
