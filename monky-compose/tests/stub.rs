//! Behaviour of the compose driver against a recording stub `docker`: exact argument lists,
//! working directory, the child environment, compose discovery, output parsing, pull failure
//! messages and the timeout.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use monky_compose::{Container, Error, ErrorKind};
use support::{PROJECT, Stub, data, strings};

fn v(version: &str) -> Vec<(&'static str, String)> {
    vec![("COMPOSE_VERSION", version.to_owned())]
}

fn stub_with(settings: &[(&str, String)]) -> Stub {
    let s: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Stub::new(&s)
}

/// A stub of compose `version` whose `docker ps` answers with the canned `ps_files` in turn,
/// with `extra` settings.
fn polled(version: &str, ps_files: &[&str], extra: &[(&str, &str)]) -> Stub {
    let seq: Vec<String> = ps_files
        .iter()
        .map(|f| data(f).display().to_string())
        .collect();
    let mut settings = vec![
        ("COMPOSE_VERSION", version.to_owned()),
        ("DOCKER_PS_SEQ", seq.join(" ")),
    ];
    settings.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    stub_with(&settings)
}

/// `up` with a health wait of `wait` on the stub's project, expected to fail, and how long it
/// took.
fn up_failure(stub: &Stub, wait: Duration) -> (Error, Duration) {
    let started = Instant::now();
    let err = stub.compose(&stub.docker()).up(Some(wait)).unwrap_err();
    (err, started.elapsed())
}

/// Runs `op` on a fresh stub with compose `version` and checks the argv of the last call.
fn check_argv(version: &str, op: &dyn Fn(&monky_compose::Compose), expected_tail: &[&str]) {
    let stub = stub_with(&v(version));
    let docker = stub.docker();
    op(&stub.compose(&docker));
    let calls = stub.calls();
    let last = calls.last().expect("the stub was called");
    let mut expected = vec!["compose".to_owned()];
    expected.extend(stub.globals());
    expected.extend(strings(expected_tail));
    assert_eq!(last.args, expected, "compose {version}");
    assert_eq!(last.program, "docker");
    assert_eq!(
        last.cwd,
        stub.proj.canonicalize().unwrap(),
        "runs in the project dir"
    );
}

#[test]
fn project_commands_have_exact_argument_lists() {
    check_argv("2.30.3", &|c| c.pull().unwrap(), &["pull"]);
    check_argv(
        "2.30.3",
        &|c| c.up(None).unwrap(),
        &["up", "-d", "--remove-orphans"],
    );
    check_argv(
        "2.30.3",
        &|c| drop(c.ps().unwrap()),
        &["ps", "-a", "--format", "json"],
    );
    check_argv(
        "2.30.3",
        &|c| drop(c.logs_tail(200).unwrap()),
        &["logs", "--no-color", "--tail", "200"],
    );
    check_argv(
        "2.30.3",
        &|c| c.down(false).unwrap(),
        &["down", "--remove-orphans"],
    );
    check_argv(
        "2.30.3",
        &|c| c.down(true).unwrap(),
        &["down", "--remove-orphans", "-v"],
    );
    check_argv(
        "2.30.3",
        &|c| drop(c.config_json().unwrap()),
        &["--profile", "*", "config", "--format", "json"],
    );
}

/// The agent's readiness rule is its own on every compose version: compose's `up --wait`
/// (which 2.26 ends with "has no healthcheck configured" for a running worker whose
/// healthcheck is disabled) is never asked for, and the containers are polled after `up -d`.
#[test]
fn up_never_asks_compose_to_wait_and_polls_on_every_version() {
    for version in ["2.32.0", "2.26.1", "2.17.3", "2.17.2", "2.1.1", "2.0.1"] {
        let stub = polled(version, &["cli-ps-healthy.jsonl"], &[]);
        stub.compose(&stub.docker())
            .up(Some(Duration::from_secs(90)))
            .unwrap();
        let calls = stub.calls();
        let up = calls
            .iter()
            .find(|c| c.args.contains(&"up".to_owned()))
            .unwrap();
        let mut expected = vec!["compose".to_owned()];
        expected.extend(stub.globals());
        expected.extend(strings(&["up", "-d", "--remove-orphans"]));
        assert_eq!(up.args, expected, "compose {version}");
        assert!(
            calls
                .iter()
                .any(|c| c.args.first().map(String::as_str) == Some("ps")),
            "compose {version}: the containers were polled"
        );
    }
}

#[test]
fn old_compose_is_polled_for_health_after_up() {
    let stub = polled(
        "2.0.1",
        &["cli-ps-starting.jsonl", "cli-ps-healthy.jsonl"],
        &[],
    );
    let docker = stub
        .builder()
        .limits(monky_compose::CommandLimits {
            poll_interval: Duration::from_millis(50),
            ..Default::default()
        })
        .build()
        .unwrap();
    stub.compose(&docker)
        .up(Some(Duration::from_secs(10)))
        .unwrap();
    let calls = stub.calls();
    let up = calls
        .iter()
        .find(|c| c.args.contains(&"up".to_owned()))
        .unwrap();
    assert!(!up.args.contains(&"--wait".to_owned()), "{:?}", up.args);
    let polls: Vec<_> = calls
        .iter()
        .filter(|c| c.args.first().map(String::as_str) == Some("ps"))
        .collect();
    assert_eq!(polls.len(), 2, "starting, then healthy");
    assert_eq!(
        polls[0].args[..5],
        strings(&[
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            "label=com.docker.compose.project=monky-env-t"
        ])
    );
}

#[test]
fn old_compose_poll_fails_fast_on_unhealthy() {
    let stub = polled("2.0.1", &["cli-ps-unhealthy.jsonl"], &[]);
    let (err, took) = up_failure(&stub, Duration::from_secs(60));
    assert!(
        took < Duration::from_secs(10),
        "did not wait out the timeout"
    );
    assert_eq!(err.kind(), ErrorKind::Unhealthy);
    assert!(
        err.to_string()
            .contains("monky-env-t-web-1 running (unhealthy)"),
        "{err}"
    );
    // the one-off container is not part of the verdict
    assert!(!err.to_string().contains("web-run"), "{err}");
}

#[test]
fn a_start_that_hangs_is_bounded_by_ours() {
    // compose blocked in `up` (a one-shot that never completes, a dependency never healthy):
    // ended at the bound, the containers as they are then
    let stub = polled("2.10.2", &["cli-ps-starting.jsonl"], &[("HANG", "up")]);
    let (err, took) = up_failure(&stub, Duration::from_secs(1));
    assert!(took < Duration::from_secs(8));
    let Error::Unhealthy { containers, .. } = &err else {
        panic!("expected Unhealthy, got {err}");
    };
    assert_eq!(containers.len(), 2);
    assert!(
        err.to_string()
            .contains("monky-env-t-web-1 running (starting)"),
        "{err}"
    );
}

#[test]
fn children_get_the_agents_docker_config_and_nothing_of_home() {
    let stub = stub_with(&v("2.30.3"));
    let docker = stub.docker();
    stub.compose(&docker).pull().unwrap();
    docker.image_prune().unwrap();
    let allowed: BTreeSet<&str> = [
        "PATH",
        "DOCKER_HOST",
        "DOCKER_CONFIG",
        "COMPOSE_INTERACTIVE_NO_CLI",
        // bash adds these itself
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    ]
    .into();
    let calls = stub.calls();
    assert_eq!(calls.len(), 3, "version, pull, image prune");
    for call in calls {
        let keys: BTreeSet<&str> = call.env.keys().map(String::as_str).collect();
        let extra: Vec<&&str> = keys.difference(&allowed).collect();
        assert!(
            extra.is_empty(),
            "unexpected env for {:?}: {extra:?}",
            call.args
        );
        assert_eq!(call.env["DOCKER_CONFIG"], stub.cfg.display().to_string());
        assert_eq!(call.env["COMPOSE_INTERACTIVE_NO_CLI"], "1");
        assert_eq!(call.env["PATH"], stub.path_env());
        assert!(!call.env.contains_key("HOME"));
    }
}

const SECRET_VALUES: &[(&str, &str)] = &[
    ("VAULT_TOKEN", "s.Zq9YhR3kT2bN7vW1xC4mP8dA"),
    (
        "MONKY_BOOTSTRAP_GRANT",
        "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhZ2VudCJ9.c2ln",
    ),
    (
        "AWS_SECRET_ACCESS_KEY",
        "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY",
    ),
    ("REGISTRY_PASSWORD", "hunter2-registry-password"),
];

/// The agent's environment cannot be changed safely inside a multi-threaded test, so this test
/// runs itself again as a child process with secrets in its environment.
#[test]
fn secrets_in_the_agents_environment_never_reach_a_child() {
    const MARK: &str = "MONKY_COMPOSE_TEST_REEXEC_DIR";
    if let Some(dir) = std::env::var_os(MARK) {
        for (k, v) in SECRET_VALUES {
            assert_eq!(std::env::var(k).as_deref(), Ok(*v), "the parent set {k}");
        }
        let tmp = tempfile::Builder::new().tempdir_in(dir).unwrap();
        let stub = Stub::in_dir(tmp, &[("COMPOSE_VERSION", "2.30.3")]);
        let docker = stub.docker();
        let compose = stub.compose(&docker);
        compose.pull().unwrap();
        compose.up(Some(Duration::from_secs(5))).unwrap();
        compose.down(true).unwrap();
        let _ = stub.dir.keep();
        return;
    }
    let outer = tempfile::tempdir().unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "secrets_in_the_agents_environment_never_reach_a_child",
            "--test-threads=1",
        ])
        .env(MARK, outer.path())
        .envs(SECRET_VALUES.iter().copied())
        .env("HOME", outer.path())
        .output()
        .unwrap();
    assert!(
        child.status.success() && String::from_utf8_lossy(&child.stdout).contains("1 passed"),
        "the re-executed test failed:\n{}{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    let mut logs = String::new();
    for entry in std::fs::read_dir(outer.path()).unwrap() {
        let log = entry.unwrap().path().join("calls.log");
        logs.push_str(&std::fs::read_to_string(log).unwrap());
    }
    assert_eq!(
        logs.matches("@@CALL").count(),
        5,
        "version, pull, up, the readiness poll, down"
    );
    for (k, v) in SECRET_VALUES {
        assert!(!logs.contains(k), "{k} reached a child");
        assert!(!logs.contains(v), "the value of {k} reached a child");
    }
    assert!(
        !logs.contains("never-in-argv"),
        "the .env content reached argv or env"
    );
    assert!(!logs.contains("@@ENV HOME="), "HOME reached a child");
}

#[test]
fn ps_reads_the_array_and_the_line_shapes_alike() {
    let expected = vec![
        Container {
            name: "monky-env-t-db-1".into(),
            service: "db".into(),
            state: "running".into(),
            health: None,
            completed: false,
        },
        Container {
            name: "monky-env-t-migrate-1".into(),
            service: "migrate".into(),
            state: "exited".into(),
            health: None,
            completed: false,
        },
        Container {
            name: "monky-env-t-web-1".into(),
            service: "web".into(),
            state: "running".into(),
            health: Some("healthy".into()),
            completed: false,
        },
    ];
    for version in ["2.20.2", "2.30.3"] {
        let stub = stub_with(&v(version));
        let got = stub.compose(&stub.docker()).ps().unwrap();
        assert_eq!(got, expected, "compose {version}");
    }
}

#[test]
fn pull_failures_carry_the_registrys_own_words() {
    let check = |file: &str, exit: &str, must_contain: &str| {
        let stub = stub_with(&[
            ("COMPOSE_VERSION", "2.30.3".into()),
            ("PULL_OUTPUT", data(file).display().to_string()),
            ("PULL_EXIT", exit.into()),
        ]);
        let err = stub.compose(&stub.docker()).pull().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PullFailed, "{file}");
        let Error::PullFailed { message } = &err else {
            panic!("{file}: expected PullFailed, got {err}");
        };
        assert!(message.contains(must_contain), "{file}: {message}");
        assert!(
            !message.contains("Pulling"),
            "{file}: progress noise kept: {message}"
        );
        assert!(!message.contains("exit code"), "{file}: {message}");
        assert!(
            err.to_string().starts_with("compose pull failed: "),
            "{err}"
        );
    };
    // compose up to 2.32 exits 18, from 2.33 on 1: the text decides, not the code
    check("pull-no-basic-auth.txt", "18", "no basic auth credentials");
    check("pull-no-basic-auth.txt", "1", "no basic auth credentials");
    check("pull-manifest-unknown.txt", "1", "manifest unknown");
    check(
        "pull-unauthorized.txt",
        "18",
        "unauthorized to access repository: monky/web",
    );
    check(
        "pull-dns.txt",
        "1",
        "lookup harbor.example on 127.0.0.53:53: no such host",
    );
    check("pull-refused.txt", "18", "connect: connection refused");
}

#[test]
fn pull_without_output_still_says_what_happened() {
    let stub = stub_with(&[
        ("COMPOSE_VERSION", "2.30.3".into()),
        ("PULL_EXIT", "18".into()),
    ]);
    let err = stub.compose(&stub.docker()).pull().unwrap_err();
    assert_eq!(
        err.to_string(),
        "compose pull failed: exit code 18 and no output"
    );
}

#[test]
fn up_failure_carries_stderr_and_code() {
    let stub = stub_with(&[
        ("COMPOSE_VERSION", "2.30.3".into()),
        ("UP_OUTPUT", data("up-failure.txt").display().to_string()),
        ("UP_EXIT", "1".into()),
    ]);
    let err = stub
        .compose(&stub.docker())
        .up(Some(Duration::from_secs(30)))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CommandFailed);
    assert_eq!(err.exit_code(), Some(1));
    let text = err.to_string();
    assert!(text.contains("port is already allocated"), "{text}");
    assert!(
        text.contains("up -d --remove-orphans failed (exit code 1)"),
        "{text}"
    );
}

#[test]
fn config_json_parses_and_failures_never_quote_its_stdout() {
    let stub = stub_with(&v("2.30.3"));
    let model = stub.compose(&stub.docker()).config_json().unwrap();
    assert_eq!(model["services"]["web"]["cap_add"][0], "NET_BIND_SERVICE");

    let stub = stub_with(&[
        ("COMPOSE_VERSION", "2.30.3".into()),
        ("CONFIG_EXIT", "15".into()),
    ]);
    let err = stub.compose(&stub.docker()).config_json().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("undefined network backend"), "{text}");
    assert!(!text.contains("stub-interpolated-value"), "{text}");
}

#[test]
fn logs_tail_keeps_the_end_within_the_cap() {
    let stub = stub_with(&[
        ("COMPOSE_VERSION", "2.30.3".into()),
        ("LOGS_LINES", "200000".into()),
    ]);
    let docker = stub
        .builder()
        .limits(monky_compose::CommandLimits {
            max_output_bytes: 64 * 1024,
            ..Default::default()
        })
        .build()
        .unwrap();
    let logs = stub.compose(&docker).logs_tail(100).unwrap();
    assert!(logs.len() <= 2 * 64 * 1024, "{}", logs.len());
    assert!(
        logs.contains("web-1  | line 200000\n"),
        "the newest line is kept"
    );
    assert!(logs.ends_with("compose warning on stderr\n"));
}

#[test]
fn a_hanging_command_is_killed_at_the_timeout_with_its_children() {
    let stub = stub_with(&[
        ("COMPOSE_VERSION", "2.30.3".into()),
        ("HANG", "pull".into()),
    ]);
    let docker = stub
        .builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = stub.compose(&docker).pull().unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(
        err.to_string()
            .contains("timed out after 1s and was killed: hanging in pull"),
        "{err}"
    );
    let pid = std::fs::read_to_string(stub.bin.join("grandchild.pid")).unwrap();
    assert!(!alive(pid.trim()), "the stub's own child {pid} survived");
}

fn alive(pid: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        });
        if !alive || Instant::now() > deadline {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn compose_v1_is_refused_with_a_clear_message() {
    let stub = Stub::new(&[]);
    let v1 = stub.install(
        &stub.path_dir,
        "docker-compose",
        &[("STANDALONE_VERSION", "1.29.2")],
    );
    let err = stub.compose(&stub.docker()).pull().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Setup);
    assert_eq!(
        err.to_string(),
        format!(
            "compose v1 (1.29.2 at {}) is not supported: install the docker compose v2 plugin (docker-compose-plugin)",
            v1.display()
        )
    );
    assert!(
        !stub
            .calls()
            .iter()
            .any(|c| c.args.contains(&"pull".to_owned())),
        "v1 never runs a pull"
    );
}

#[test]
fn no_compose_at_all_says_where_it_looked() {
    let stub = Stub::new(&[]);
    let err = stub.compose(&stub.docker()).up(None).unwrap_err();
    let Error::ComposeNotFound { detail } = &err else {
        panic!("expected ComposeNotFound, got {err}");
    };
    assert!(
        detail.contains("compose version` failed: docker: 'compose' is not a docker command."),
        "{detail}"
    );
    assert!(
        detail.contains(&stub.plugin_dir.display().to_string()),
        "{detail}"
    );
    assert!(detail.contains(&stub.path_env()), "{detail}");
    assert!(
        err.to_string().starts_with("no docker compose v2 found: "),
        "{err}"
    );
}

#[test]
fn a_plugin_invisible_to_docker_is_run_standalone() {
    // the plugin sits where DOCKER_CONFIG hides it from the docker CLI (a user's
    // ~/.docker/cli-plugins); the driver runs it directly
    let stub = Stub::new(&[]);
    let plugin = stub.install(
        &stub.plugin_dir,
        "docker-compose",
        &[("STANDALONE_VERSION", "2.29.7")],
    );
    let docker = stub.docker();
    let info = docker.compose_info().unwrap();
    assert_eq!(
        (info.program.as_path(), info.plugin),
        (plugin.as_path(), false)
    );
    assert_eq!(info.version.to_string(), "2.29.7");
    stub.compose(&docker).down(false).unwrap();
    let calls = stub.calls();
    let down = calls.last().unwrap();
    assert_eq!(down.program, "docker-compose");
    let mut expected = stub.globals();
    expected.extend(strings(&["down", "--remove-orphans"]));
    assert_eq!(down.args, expected);
    assert_eq!(down.env["DOCKER_CONFIG"], stub.cfg.display().to_string());
}

#[test]
fn a_v2_binary_wins_over_a_v1_found_first() {
    let stub = Stub::new(&[]);
    stub.install(
        &stub.plugin_dir,
        "docker-compose",
        &[("STANDALONE_VERSION", "1.29.2")],
    );
    let v2 = stub.install(
        &stub.path_dir,
        "docker-compose",
        &[("STANDALONE_VERSION", "2.24.6")],
    );
    let info = stub.docker().compose_info().unwrap();
    assert_eq!(info.program, v2);
}

#[test]
fn compose_is_looked_up_once_per_driver() {
    let stub = stub_with(&v("2.30.3"));
    let docker = stub.docker();
    let compose = stub.compose(&docker);
    compose.pull().unwrap();
    compose.up(None).unwrap();
    compose.ps().unwrap();
    assert_eq!(stub.version_calls(), 1);
    assert_eq!(docker.facts().compose_version.as_deref(), Some("2.30.3"));
    assert_eq!(
        docker.known_compose().unwrap().version.to_string(),
        "2.30.3"
    );
    assert_eq!(stub.version_calls(), 1);
}

#[test]
fn known_compose_never_spawns() {
    let stub = Stub::new(&[]);
    let docker = stub.docker();
    assert_eq!(docker.known_compose(), None);
    assert!(stub.calls().is_empty());
    assert!(docker.compose_info().is_err());
    let after_lookup = stub.calls().len();
    assert_eq!(docker.known_compose(), None);
    assert_eq!(stub.calls().len(), after_lookup);
}

#[test]
fn a_saved_compose_hint_is_used_until_the_binary_changes() {
    let stub = stub_with(&v("2.30.3"));
    // where the docker CLI would find the plugin through the agent's DOCKER_CONFIG
    std::fs::create_dir_all(stub.cfg.join("cli-plugins")).unwrap();
    let plugin = stub.install(&stub.cfg.join("cli-plugins"), "docker-compose", &[]);
    let saved = stub.docker().compose_info().unwrap();
    assert!(saved.stamps.iter().any(|s| s.path == plugin), "{saved:?}");
    let json = serde_json::to_string(&saved).unwrap();
    assert_eq!(stub.version_calls(), 1);

    let hinted = stub
        .builder()
        .compose_hint(serde_json::from_str(&json).unwrap())
        .build()
        .unwrap();
    assert_eq!(hinted.facts().compose_version.as_deref(), Some("2.30.3"));
    stub.compose(&hinted).pull().unwrap();
    assert_eq!(
        stub.version_calls(),
        1,
        "a valid hint spawns no version call"
    );

    // the plugin was upgraded: the hint no longer matches
    std::fs::write(&plugin, "#!/bin/sh\n# upgraded\n").unwrap();
    let stale = stub.builder().compose_hint(saved).build().unwrap();
    stub.compose(&stale).pull().unwrap();
    assert_eq!(stub.version_calls(), 2);
}

#[test]
fn without_the_socket_containers_and_facts_come_from_the_cli() {
    let stub = polled(
        "2.30.3",
        &["cli-ps-healthy.jsonl"],
        &[
            ("SERVER_VERSION", "27.5.1"),
            ("DATA_ROOT", "/srv/docker-data"),
        ],
    );
    let docker = stub.docker();
    let containers = docker.containers(PROJECT).unwrap();
    let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["monky-env-t-db-1", "monky-env-t-web-1"],
        "one-off excluded"
    );
    assert!(containers.iter().all(Container::is_ready));
    let ps = stub.calls().pop().unwrap();
    assert_eq!(
        ps.args[..6],
        strings(&[
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            "label=com.docker.compose.project=monky-env-t",
            "--format"
        ])
    );

    let facts = docker.facts();
    assert_eq!(facts.docker_version.as_deref(), Some("27.5.1"));
    assert_eq!(
        facts.data_root.as_deref(),
        Some(std::path::Path::new("/srv/docker-data"))
    );
    assert_eq!(facts.compose_version.as_deref(), Some("2.30.3"));
    let before = stub.calls().len();
    let again = docker.facts();
    // Free space is measured anew on every call (other writers move it); the rest is cached.
    assert_eq!(
        (
            &again.docker_version,
            &again.compose_version,
            &again.data_root
        ),
        (
            &facts.docker_version,
            &facts.compose_version,
            &facts.data_root
        )
    );
    assert_eq!(again.free_bytes.is_some(), facts.free_bytes.is_some());
    assert_eq!(stub.calls().len(), before, "facts are cached");
}

#[test]
fn facts_survive_a_box_without_compose_or_daemon() {
    let stub = stub_with(&[("INFO_EXIT", "1".into())]);
    let docker = stub.docker();
    let facts = docker.facts();
    assert_eq!(facts.compose_version, None);
    assert_eq!(facts.docker_version, None);
    assert_eq!(facts.free_bytes, None);
    let before = stub.calls().len();
    docker.facts();
    // the failed compose lookup is remembered for facts; only `docker info` is retried
    assert_eq!(stub.calls().len(), before + 1);
}

#[test]
fn image_prune_argv() {
    let stub = stub_with(&v("2.30.3"));
    stub.docker().image_prune().unwrap();
    let calls = stub.calls();
    assert_eq!(calls.len(), 1, "no compose lookup for a prune");
    assert_eq!(calls[0].args, strings(&["image", "prune", "-f"]));
}

#[test]
fn remove_containers_is_one_rm_and_nothing_for_none() {
    let stub = stub_with(&v("2.30.3"));
    let docker = stub.docker();
    docker.remove_containers(&[]).unwrap();
    assert!(stub.calls().is_empty(), "nothing to remove is no call");
    docker
        .remove_containers(&strings(&["p-web-1", "p-x-1"]))
        .unwrap();
    let calls = stub.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].args, strings(&["rm", "-f", "p-web-1", "p-x-1"]));
    let down = stub_with(&[("DAEMON_DOWN", "1".to_owned())]);
    let err = down
        .docker()
        .remove_containers(&strings(&["p-web-1"]))
        .unwrap_err();
    assert!(err.to_string().contains("Cannot connect"), "{err}");
}
