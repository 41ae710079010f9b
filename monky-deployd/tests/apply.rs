//! The apply branch: first apply from a bootstrap grant, heartbeats, new bundles, every refusal.

use std::os::unix::fs::PermissionsExt;

use monky_agent_proto::ReportResult;
use serde_json::json;

use crate::util::*;

#[test]
fn first_apply_from_a_bootstrap_grant() {
    let w = World::new();
    w.stage_grant();
    let sha = w.publish(&TestBundle::default().with_registry_auth());
    w.tick().ok();

    // The grant is consumed, the token stored privately, one lease swapped it out.
    assert!(!w.bootstrap_path().exists());
    let token = w.state_dir().join("bao.token");
    assert_eq!(
        std::fs::metadata(&token).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(w.tenancy.lease_count(ENV), 1);
    assert_eq!(w.state()["token"]["source"], "lease");

    // The release: complete, current points at it, .env 0600 with the pinned versions.
    w.assert_current(&sha);
    let env = w.env_dir().join("current/.env");
    assert_eq!(
        std::fs::metadata(&env).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let text = std::fs::read_to_string(&env).unwrap();
    assert!(text.contains(&format!("GEMINI_API_KEY={GEMINI}")), "{text}");
    assert!(
        text.contains(&format!("POSTGRES_PASSWORD={PGPASS}")),
        "latest version: {text}"
    );
    assert!(
        !text.contains("REGISTRY"),
        "the registry credential is not an env var: {text}"
    );
    for f in [
        "docker-compose.yml",
        ".env.template",
        "secrets.manifest.json",
        "bundle.json",
    ] {
        assert!(w.env_dir().join("current").join(f).is_file(), "{f}");
    }

    // The registry credential went to the agent's own docker dir, at rest: its registry is on
    // this box, so the docker CLI's config.json held it for the pull only.
    assert!(!w.state_dir().join("docker/config.json").exists());
    let cfg = w.state_dir().join("docker/credential.json");
    assert_eq!(
        std::fs::metadata(&cfg).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(cfg.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    assert!(doc["auths"][&w.registry()]["auth"].is_string(), "{doc}");
    assert!(doc.get("credsStore").is_none());

    // Compose ran with that config, in the release, in order.
    let calls = w.docker_calls();
    let subs: Vec<&str> = calls
        .iter()
        .filter_map(|c| compose_sub(c))
        .filter(|s| *s != "version")
        .collect();
    // compose's model is judged once, on the staged release before pull; renamed into a fresh
    // `releases/<sha>`, the same files are not judged again.
    assert_eq!(subs, ["config", "pull", "up"], "{calls:#?}");
    let log = w.docker_log();
    assert!(
        log.contains(&format!(
            "@@ENV DOCKER_CONFIG={}",
            w.state_dir().join("docker").display()
        )),
        "{log}"
    );

    // The secrets were read at the pinned version, and the report says applied.
    let reads: Vec<String> = w
        .bao
        .agent_requests()
        .iter()
        .filter(|r| r.path.contains("/data/"))
        .map(|r| format!("{}?{}", r.path, r.query.clone().unwrap_or_default()))
        .collect();
    assert!(
        reads.iter().any(|r| r.contains("gemini_api_key?version=1")),
        "{reads:?}"
    );
    let r = w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert_eq!(r.containers.len(), 1);
    assert_eq!(r.containers[0].health.as_deref(), Some("healthy"));
    assert!(
        r.log_tail.contains("checkin: action=apply"),
        "{}",
        r.log_tail
    );
    assert_eq!(w.state()["applied_sha"], json!(sha));
}

/// The compose subcommand of a recorded `docker compose ...` call.
pub fn compose_sub(call: &str) -> Option<&str> {
    let mut words = call.split_whitespace();
    if words.next()? != "compose" {
        return None;
    }
    let mut skip = false;
    for w in words {
        if skip {
            skip = false;
        } else if matches!(
            w,
            "-p" | "-f" | "--env-file" | "--project-directory" | "--ansi" | "--profile"
        ) {
            skip = true;
        } else if !w.starts_with('-') {
            return Some(w);
        }
    }
    None
}

/// The request-count regression check (counts, never times): what each kind of tick costs the
/// peers. A heartbeat is exactly two tenancy requests and nothing else; an apply leases once at
/// most (the first swaps the bootstrap token, later ones reuse the lease token).
#[test]
fn request_counts_of_a_first_apply_a_heartbeat_and_a_second_apply() {
    let w = World::new();
    // What each tick added: tenancy paths, the agent's OpenBao paths, docker calls.
    let costs = |w: &World, tick: &dyn Fn()| {
        let (t, b, d) = (
            w.requests().len(),
            w.bao.agent_requests().len(),
            w.docker_calls().len(),
        );
        tick();
        let path = |p: &str| p.split('?').next().unwrap_or_default().to_string();
        // The agent's own calls: OpenBao fetching tenancy's JWKS is not the agent's cost.
        let tenancy: Vec<String> = w.requests()[t..]
            .iter()
            .filter(|r| r.path.starts_with("/v1/agent/"))
            .map(|r| path(&r.path))
            .collect();
        let bao: Vec<String> = w.bao.agent_requests()[b..]
            .iter()
            .map(|r| path(&r.path))
            .collect();
        (tenancy, bao, w.docker_calls().len() - d)
    };
    let kv = |name: &str| format!("/v1/monky/data/{ENV}/see/{name}");

    let (tenancy, bao, _) = costs(&w, &|| {
        w.applied();
    });
    assert_eq!(
        tenancy,
        [
            "/v1/agent/checkin".to_string(),
            format!("/v1/agent/bundle/{ENV}/{}", TestBundle::default().sha()),
            "/v1/agent/lease".into(),
            "/v1/agent/report".into()
        ]
    );
    assert_eq!(w.tenancy.lease_count(ENV), 1);
    assert_eq!(
        bao,
        [
            "/v1/auth/jwt-tenancy/login".to_string(),
            "/v1/auth/jwt-tenancy/login".into(),
            "/v1/auth/token/revoke-self".into(),
            kv("gemini_api_key"),
            kv("pg_password"),
        ],
        "bootstrap login, lease login, the bootstrap token revoked, two reads"
    );

    let engine = w.engine_requests().len();
    let (tenancy, bao, docker) = costs(&w, &|| {
        w.tick().ok();
    });
    assert_eq!(tenancy, ["/v1/agent/checkin", "/v1/agent/report"]);
    assert!(bao.is_empty(), "no OpenBao request on a heartbeat: {bao:?}");
    assert_eq!(docker, 0, "a heartbeat spawns no docker process");
    let asked = &w.engine_requests()[engine..];
    assert!(
        !asked.is_empty() && !asked.iter().any(|r| r.starts_with("GET /info")),
        "a heartbeat asks the engine's /info only when the daemon names another version: \
         {asked:?}"
    );
    let r = w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(
        r.sha.as_ref().map(|s| s.as_str()),
        w.state()["applied_sha"].as_str()
    );

    let second = w.publish(&TestBundle::tagged("2"));
    let (tenancy, bao, _) = costs(&w, &|| {
        w.tick().ok();
    });
    assert_eq!(
        tenancy,
        [
            "/v1/agent/checkin".to_string(),
            format!("/v1/agent/bundle/{ENV}/{second}"),
            "/v1/agent/report".into()
        ],
        "no lease: the lease token is reused"
    );
    assert_eq!(w.tenancy.lease_count(ENV), 1);
    assert_eq!(
        bao,
        [
            "/v1/auth/token/lookup-self".to_string(),
            kv("gemini_api_key"),
            kv("pg_password"),
        ]
    );
}

#[test]
fn an_unhealthy_heartbeat_reports_failed() {
    let w = World::new();
    w.applied();
    let c = w.stub_dir().join("containers.json");
    let text = std::fs::read_to_string(&c)
        .unwrap()
        .replace("(healthy)", "(unhealthy)");
    std::fs::write(&c, text).unwrap();
    w.tick().expect(1);
    assert_report(&w.last_report(), ReportResult::Failed, Some("UNHEALTHY: "));
}

#[test]
fn a_new_bundle_moves_current_and_keeps_the_old_release() {
    let w = World::new();
    let first = w.applied();
    let second = w.publish(&TestBundle::tagged("2"));
    w.tick().ok();
    w.assert_current(&second);
    assert!(
        w.env_dir()
            .join("releases")
            .join(&first)
            .join(".env")
            .is_file()
    );
    assert_eq!(w.tenancy.lease_count(ENV), 1, "the lease token is reused");
    assert_report(&w.last_report(), ReportResult::Applied, None);
    assert_eq!(w.state()["applied_history"], json!([first, second]));
}

/// A refused bundle: exit 1, `failed` with the code, no lease, no secret read, no compose,
/// and the running release and its .env untouched.
fn check_refused(b: TestBundle, code: &str) {
    let w = World::new();
    let running = w.applied();
    let env_before = std::fs::read(w.env_dir().join("current/.env")).unwrap();
    let (leases, reads, calls) = (
        w.tenancy.lease_count(ENV),
        w.bao.agent_requests().len(),
        w.docker_calls().len(),
    );
    w.publish(&b);
    let run = w.tick();
    run.expect(1);
    let r = w.last_report();
    assert_report(&r, ReportResult::Failed, Some(&format!("{code}: ")));
    assert_eq!(w.tenancy.lease_count(ENV), leases, "{code}: no lease");
    assert_eq!(
        w.bao.agent_requests().len(),
        reads,
        "{code}: no OpenBao request"
    );
    assert_eq!(w.docker_calls().len(), calls, "{code}: no docker call");
    w.assert_current(&running);
    assert_eq!(
        std::fs::read(w.env_dir().join("current/.env")).unwrap(),
        env_before
    );
    assert_eq!(w.state()["applied_sha"], json!(running));
    assert!(w.state()["last_error"].as_str().unwrap().starts_with(code));
    run.says(&[code]);
}

#[test]
fn unresolved_variables_are_refused_by_name() {
    let mut b = TestBundle::default();
    b.env_template
        .push_str("SEE_ADMIN_TOKEN=${SEE_ADMIN_TOKEN}\n");
    check_refused(b, "ENV_INCOMPLETE");
}

#[test]
fn privileged_compose_is_refused() {
    for compose in [
        "services:\n  web:\n    image: x\n    privileged: true\n",
        "services:\n  web:\n    image: x\n    network_mode: host\n",
        "services:\n  web:\n    image: x\n    volumes: [\"/var/run/docker.sock:/var/run/docker.sock\"]\n",
        "services:\n  web:\n    image: x\n    cap_add: [\"${CAP:-sys_admin}\"]\n",
    ] {
        let b = TestBundle {
            compose: compose.into(),
            ..TestBundle::default()
        };
        check_refused(b, "PRIVILEGED_REFUSED");
    }
}

#[test]
fn allow_privileged_lets_it_through() {
    let w = World::new();
    w.stage_grant();
    let mut b = TestBundle {
        compose: "services:\n  web:\n    image: x\n    privileged: true\n".into(),
        ..TestBundle::default()
    };
    b.meta["agent"] = json!({"allow_privileged": true});
    w.publish(&b);
    w.tick().ok();
}

#[test]
fn another_envs_path_is_refused_before_any_read() {
    let mut b = TestBundle::default();
    b.manifest["entries"][0]["path"] = json!("monky/env-other/see/gemini_api_key");
    check_refused(b, "MANIFEST_PATH_REFUSED");
}

#[test]
fn a_manifest_value_is_refused() {
    let mut b = TestBundle::default();
    b.manifest["entries"][0]["value"] = json!("leaked");
    check_refused(b, "MANIFEST_VALUE_REFUSED");
}

#[test]
fn a_foreign_renderer_is_refused() {
    let mut b = TestBundle::default();
    b.meta["renderer"] = json!("helm");
    check_refused(b, "RENDERER_REFUSED");
}

#[test]
fn too_little_disk_is_refused() {
    let mut b = TestBundle::default();
    b.meta["disk_need_bytes"] = json!(1u64 << 60);
    check_refused(b, "DISK_INSUFFICIENT");
}

#[test]
fn a_sha_mismatch_is_refused() {
    let w = World::new();
    let running = w.applied();
    let b = TestBundle::tagged("evil");
    let claimed = TestBundle::tagged("claimed").sha();
    w.tenancy.publish_bundle(ENV, &claimed, b.tar());
    w.tenancy
        .set_desired(ENV, monky_testkit::tenancy::Desired::sha(claimed));
    w.tick().expect(1);
    assert_report(
        &w.last_report(),
        ReportResult::Failed,
        Some("BUNDLE_SHA_MISMATCH: "),
    );
    assert_eq!(w.state()["applied_sha"], json!(running));
    assert_eq!(w.tenancy.lease_count(ENV), 1);
}

#[test]
fn a_rollback_is_refused_unless_allowed() {
    let w = World::new();
    let first = w.applied();
    w.publish(&TestBundle::tagged("2"));
    w.tick().ok();
    w.tenancy
        .set_desired(ENV, monky_testkit::tenancy::Desired::sha(first.clone()));
    w.tick().expect(1);
    assert_report(
        &w.last_report(),
        ReportResult::Failed,
        Some("ROLLBACK_REFUSED: "),
    );

    let mut back = TestBundle::default();
    back.meta["allow_rollback"] = json!(true);
    w.publish(&back);
    w.tick().ok();
    assert_eq!(w.state()["applied_sha"], json!(back.sha()));
}

#[test]
fn a_pull_failure_carries_the_registry_message_and_keeps_the_old_env() {
    let w = World::new();
    let first = w.applied();
    let env_before = std::fs::read(w.env_dir().join(format!("releases/{first}/.env"))).unwrap();
    w.stub("PULL_FAIL", "Error response from daemon: Head \"http://127.0.0.1:5000/v2/monky/web/manifests/2\": no basic auth credentials");
    w.publish(&TestBundle::tagged("2"));
    w.tick().expect(1);
    let r = w.last_report();
    assert_report(&r, ReportResult::Failed, Some("COMPOSE_PULL_FAILED: "));
    assert!(
        r.detail
            .as_deref()
            .unwrap()
            .contains("no basic auth credentials"),
        "{r:?}"
    );
    assert_eq!(w.state()["applied_sha"], json!(first));
    assert_eq!(
        w.current_target().unwrap(),
        std::path::Path::new("releases").join(&first),
        "a failed pull moved current away from the running release"
    );
    assert_eq!(
        std::fs::read(w.env_dir().join(format!("releases/{first}/.env"))).unwrap(),
        env_before
    );
}

#[test]
fn an_unhealthy_apply_reports_failed_with_the_compose_logs() {
    let w = World::new();
    w.stage_grant();
    w.stub("HEALTH", "unhealthy");
    let logs = w.path("logs.txt");
    std::fs::write(&logs, "web-1  | healthcheck: connection refused\n").unwrap();
    w.stub("LOGS_FILE", logs.to_str().unwrap());
    w.publish(&TestBundle::default());
    w.tick().expect(1);
    let r = w.last_report();
    assert_report(&r, ReportResult::Failed, Some("UNHEALTHY: "));
    assert!(
        r.log_tail.contains("healthcheck: connection refused"),
        "{}\n{:#?}",
        r.log_tail,
        w.docker_calls()
    );
    assert!(w.state()["applied_sha"].is_null());

    // A retry of the same sha updates the existing `releases/<sha>` in place, whose other
    // entries the release's containers may have written: compose's model of it is judged again
    // before `current` names it.
    let before = w.docker_calls().len();
    w.run(&["run", "--once", "--force"]).expect(1);
    let calls = w.docker_calls();
    let subs: Vec<&str> = calls[before..]
        .iter()
        .filter_map(|c| compose_sub(c))
        .filter(|s| !matches!(*s, "version" | "logs"))
        .collect();
    assert_eq!(subs, ["config", "pull", "config", "up"], "{calls:#?}");
}

#[test]
fn a_comment_mentioning_a_variable_is_not_a_reference() {
    // The renderer's header says "substitutes every ${VAR}"; the default bundle carries it.
    let w = World::new();
    w.applied();
    assert_report(&w.last_report(), ReportResult::Applied, None);
}

#[test]
fn prune_keeps_the_newest_releases() {
    let w = World::new();
    w.config_extra("keep_releases: 2\n");
    w.applied();
    for tag in ["2", "3", "4"] {
        w.publish(&TestBundle::tagged(tag));
        w.run(&["run", "--once", "--prune"]).ok();
    }
    let n = std::fs::read_dir(w.env_dir().join("releases"))
        .unwrap()
        .count();
    assert_eq!(n, 2);
    assert!(
        w.docker_calls()
            .iter()
            .any(|c| c.starts_with("image prune"))
    );
}

#[test]
fn awkward_values_are_quoted_in_env_and_unwritable_ones_fail_before_staging() {
    let w = World::new();
    let first = w.applied();
    let first_env = w.env_dir().join(format!("releases/{first}/.env"));
    let env_before = std::fs::read(&first_env).unwrap();

    // A whole value with `$` and ` #` is written double-quoted, `$` doubled for compose.
    w.bao.put_secret(ENV, "pg_password", "pa$s #1");
    let quoted = w.publish(&TestBundle::tagged("2"));
    w.tick().ok();
    let env = std::fs::read_to_string(w.env_dir().join(format!("releases/{quoted}/.env"))).unwrap();
    assert!(env.contains("\nPOSTGRES_PASSWORD=\"pa$$s #1\"\n"), "{env}");
    assert_eq!(w.state()["applied_sha"], json!(quoted));

    // The same value inside an unquoted URL cannot be written: refused with the name and
    // line, after the read, before anything is staged; the running release stays.
    let mut url = TestBundle::tagged("3");
    url.env_template = url.env_template.replace(
        "POSTGRES_PASSWORD=${POSTGRES_PASSWORD}",
        "DATABASE_URL=postgres://app:${POSTGRES_PASSWORD}@db/app",
    );
    let bad = w.publish(&url);
    let calls = w.docker_calls().len();
    let run = w.tick();
    run.expect(1);
    let r = w.last_report();
    assert_report(
        &r,
        ReportResult::Failed,
        Some("ENV_VALUE_UNSAFE: POSTGRES_PASSWORD, .env.template line 3; "),
    );
    assert!(!format!("{r:?}").contains("pa$s"), "{r:?}");
    assert!(!run.stderr().contains("pa$s"), "{}", run.stderr());
    assert_eq!(w.docker_calls().len(), calls, "no docker call");
    assert!(!w.env_dir().join("releases").join(&bad).exists());
    w.assert_current(&quoted);
    assert_eq!(w.state()["applied_sha"], json!(quoted));
    assert_eq!(w.state()["failed_sha"], json!(bad));

    // It fails the same way next time (pinned versions): inside the backoff, no OpenBao read.
    let reads = w.bao.agent_requests().len();
    w.tick().expect(1);
    assert_eq!(
        w.bao.agent_requests().len(),
        reads,
        "no read inside the backoff"
    );
    assert!(
        w.last_report().detail.unwrap().contains("next attempt"),
        "waiting"
    );
    assert_eq!(
        std::fs::read(&first_env).unwrap(),
        env_before,
        "older releases untouched"
    );
}

/// What the box supplies to a service that leaves a limit open is named in the journal and so
/// in the report's log tail; a service that sets its own gets nothing supplied for it.
#[test]
fn the_defaults_the_box_supplies_are_named_in_the_report() {
    let w = World::new();
    w.stage_grant();
    let b = TestBundle {
        compose: "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    env_file: .env\n  \
                  worker:\n    image: 127.0.0.1:5000/monky/web:1\n    pids_limit: 64\n    mem_limit: 64m\n    \
                  logging: {driver: json-file, options: {max-size: 1m, max-file: \"2\"}}\n"
            .into(),
        ..TestBundle::default()
    };
    w.publish(&b);
    let run = w.tick();
    run.ok();
    let line = run
        .stderr()
        .lines()
        .find(|l| l.contains("supplied the box's defaults"))
        .unwrap_or_else(|| panic!("{}", run.stderr()))
        .to_owned();
    assert!(
        line.contains("web: ") && line.contains("pids_limit 1024") && line.contains("max-size"),
        "{line}"
    );
    assert!(!line.contains("worker"), "{line}");
    let r = w.last_report();
    assert!(
        r.log_tail.contains("supplied the box's defaults: web:"),
        "{}",
        r.log_tail
    );
}

/// A daemon that names another version on its answers (upgraded, or another one on the socket)
/// is asked its facts again: the checkin says the new version, state keeps it, and the
/// heartbeat after that asks no more.
#[test]
fn a_daemon_of_another_version_is_asked_its_facts_again() {
    let w = World::new();
    w.applied();
    let info = |version: &str| json!({"ServerVersion": version, "DockerRootDir": w.stub_dir()});
    w.set_engine_info(&info("28.4.1").to_string());
    let infos = |from: usize| {
        w.engine_requests()[from..]
            .iter()
            .filter(|r| r.starts_with("GET /info"))
            .count()
    };
    let n = w.engine_requests().len();
    w.tick().ok();
    assert_eq!(infos(n), 1, "{:?}", &w.engine_requests()[n..]);
    let checkin = w
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path == "/v1/agent/checkin")
        .and_then(|r| r.body)
        .expect("a checkin body");
    assert_eq!(checkin["host"]["docker"], "28.4.1");
    assert_eq!(w.state()["engine"]["ServerVersion"], "28.4.1");
    let n = w.engine_requests().len();
    w.tick().ok();
    assert_eq!(infos(n), 0, "{:?}", &w.engine_requests()[n..]);
}
