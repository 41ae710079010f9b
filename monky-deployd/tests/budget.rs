//! A fair share of a shared box and no ordinary backend refused: a benign corpus of
//! real-world-shaped backends (tests/data/benign) that every check accepts and a tick applies;
//! hostile cases of the budget and name classes, each refused by `bundle check`, by a real tick
//! and by compose's own model; every finding of a bundle at once, host access first; the
//! box-local waivers; and `bundle check` failing where the tick fails.

use std::path::Path;

use monky_agent_proto::ReportResult;

use crate::policy::{bundle_check, docker, write_dir};
use crate::util::*;

const PROJECT: &str = "monky-env-qa-02";

fn benign() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/benign");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

/// A tick of `b` with compose's real `config` behind the stub.
fn tick_of(w: &World, docker: &Path, b: &TestBundle) -> Run {
    w.clear_stub();
    w.stub("REAL_COMPOSE", docker.to_str().unwrap());
    w.publish(b);
    // Past tenancy's checkin rate bucket and the failed release's backoff.
    w.tenancy
        .advance_clock(std::time::Duration::from_secs(3600 * 2));
    w.tick()
}

#[test]
fn the_benign_corpus_passes_every_check_and_applies() {
    let Some(docker) = docker() else { return };
    let corpus = benign();
    assert!(corpus.len() >= 30, "{} benign backends", corpus.len());
    let w = World::new();
    w.stage_grant();
    let mut supplied = 0;
    for (name, yaml) in &corpus {
        let b = TestBundle {
            compose: yaml.clone(),
            ..TestBundle::default()
        };
        // The check before the lease, on its own.
        let secrets = [
            "GEMINI_API_KEY".to_string(),
            "POSTGRES_PASSWORD".to_string(),
        ]
        .into();
        let verdict = monky_bundle::ComposePolicy::new(PROJECT).findings_file(
            yaml,
            &|n| (n == "LOG_LEVEL").then(|| "info".to_string()),
            &secrets,
        );
        assert!(verdict.is_empty(), "{name}: {verdict:?}");
        // bundle check: the file and compose's real model, with placeholder secrets.
        let run = bundle_check(&w, &docker, &format!("benign/{name}"), &b);
        assert_eq!(run.code(), 0, "{name}:\n{}{}", run.stdout(), run.stderr());
        assert!(
            !run.stderr().contains("not checked"),
            "{name}: {}",
            run.stderr()
        );
        // A tick judges compose's real model (with the supplied pids limit) and applies it.
        let calls_before = w.docker_calls().len();
        tick_of(&w, &docker, &b).ok();
        assert_report(&w.last_report(), ReportResult::Applied, None);
        let calls = w.docker_calls();
        let up = calls[calls_before.min(calls.len())..]
            .iter()
            .find(|c| c.contains(" up"))
            .unwrap_or_else(|| panic!("{name}: no up in {calls:#?}"));
        if up.contains(monky_bundle::budget::OVERRIDE_FILE) {
            supplied += 1;
        }
    }
    // Most real files set no pids limit: the box's default was supplied to them on `up`.
    assert!(supplied > 0, "no up carried the budget override");
}

/// One hostile case of the budget or name classes.
struct Case {
    name: &'static str,
    /// Lines under `services.web`, or a whole file when it has a `services:` line.
    compose: &'static str,
    code: &'static str,
    names: &'static str,
}

const fn case(
    name: &'static str,
    compose: &'static str,
    code: &'static str,
    names: &'static str,
) -> Case {
    Case {
        name,
        compose,
        code,
        names,
    }
}

const BE: &str = "BUDGET_EXCEEDED";
const NC: &str = "BUNDLE_NONCONFORMING";

#[rustfmt::skip]
const HOSTILE: &[Case] = &[
    case("fork-bomb-unlimited", "pids_limit: -1", BE, "web: pids_limit -1 (unlimited) over budget.max_pids 4096"),
    case("pids-huge", "pids_limit: 100000", BE, "web: pids_limit 100000 over budget.max_pids 4096"),
    case("pids-deploy-zero", "deploy: {resources: {limits: {pids: 0}}}", BE, "web: deploy.resources.limits.pids 0 (unlimited) over budget.max_pids 4096"),
    case("scale-thousands", "scale: 1000", BE, "web: scale 1000 over budget.max_replicas 10"),
    case("replicas-thousands", "deploy: {replicas: 5000}", BE, "web: deploy.replicas 5000 over budget.max_replicas 10"),
    case("port-ssh", "ports: [\"22:22\"]", BE, "web: ports 22 below budget.min_published_port 1024"),
    case("port-https", "ports: [\"443:8443\"]", BE, "web: ports 443 below budget.min_published_port 1024"),
    case("port-ip-bound-ssh", "ports: [\"127.0.0.1:22:2222\"]", BE, "web: ports 22 below budget.min_published_port 1024"),
    case("port-udp-dns", "ports: [\"53:53/udp\"]", BE, "web: ports 53 below budget.min_published_port 1024"),
    case("port-openbao", "ports: [\"8200:8200\"]", BE, "web: ports 8200 takes 8200, in budget.reserved_ports"),
    case("port-proxy-tenancy", "ports: [{target: 80, published: \"18443\"}]", BE, "web: ports 18443 takes 18443, in budget.reserved_ports"),
    case("port-range-over-proxy", "ports: [\"18150-18249:80\"]", BE, "web: ports 18150-18249 takes 18200, in budget.reserved_ports"),
    case("port-range-ten-thousand", "ports: [\"10000-20000:80\"]", BE, "web: ports 10000-20000 is 10001 ports, over budget.max_port_range 100"),
    case("shm-64g", "shm_size: 64g", BE, "web: shm_size 64 GiB over budget.max_shm_size 1 GiB"),
    case("tmpfs-8g", "tmpfs: [\"/run:size=8g\"]", BE, "web: tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-mount-8g", "volumes:\n  - type: tmpfs\n    target: /scratch\n    tmpfs: {size: 8g}", BE, "web: volumes tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-volume-8g", "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes: [mem:/m]\nvolumes:\n  mem:\n    driver_opts: {type: tmpfs, device: tmpfs, o: size=8g}\n", BE, "volumes.mem: driver_opts size 8 GiB over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-volume-last-size", "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes: [mem:/m]\nvolumes:\n  mem:\n    driver_opts: {type: tmpfs, device: tmpfs, o: \"size=1m,size=8g\"}\n", BE, "volumes.mem: driver_opts size 8 GiB over budget.max_tmpfs_size 1 GiB"),
    case("memory-above-host", "mem_limit: 64t", BE, "web: mem_limit 64 TiB over budget.max_memory"),
    case("cpus-above-host", "cpus: 512", BE, "web: cpus 512 over budget.max_cpus"),
    case("cpu-shares-max", "cpu_shares: 262144", BE, "web: cpu_shares 262144 over budget.max_cpu_shares 1024"),
    case("stop-grace-1000h", "stop_grace_period: 1000h", BE, "web: stop_grace_period 3600000s over budget.max_stop_grace_period 300s"),
    case("healthcheck-1ms-restart-always", "restart: always\nhealthcheck: {test: [CMD, \"true\"], interval: 1ms}", BE, "web: healthcheck.interval 1ms under budget.min_healthcheck_interval 1s"),
    case("healthcheck-1ms-no-restart", "healthcheck: {test: [CMD, \"true\"], interval: 1ms}", BE, "web: healthcheck.interval 1ms under budget.min_healthcheck_interval 1s"),
    case("healthcheck-start-interval-on-failure", "restart: on-failure\nhealthcheck: {test: [CMD, \"true\"], start_interval: 10ms}", BE, "web: healthcheck.start_interval 10ms under budget.min_healthcheck_interval 1s"),
    case("logs-unbounded", "logging: {driver: json-file}", BE, "web: logging json-file without max-size (set it up to budget.max_log_size 100 MiB)"),
    case("logs-10g", "logging: {driver: json-file, options: {max-size: 10g}}", BE, "web: logging max-size 10 GiB over budget.max_log_size 100 MiB"),
    case("logs-size-exponent", "logging: {driver: json-file, options: {max-size: \"1e3g\"}}", BE, "web: logging max-size 1e3g is not a size the budget reads (write it as 10m, up to budget.max_log_size 100 MiB)"),
    case("container-name-unprefixed", "container_name: postgres", NC, "web: container_name postgres (accepted: monky-env-qa-02-postgres)"),
    case("volume-name-unprefixed", "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes: [pg:/pg]\nvolumes:\n  pg:\n    name: pgdata\n", NC, "volumes.pg: name pgdata (accepted: monky-env-qa-02_pgdata)"),
    case("network-name-unprefixed", "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    networks: [edge]\nnetworks:\n  edge:\n    name: edge\n", NC, "networks.edge: name edge (accepted: monky-env-qa-02_edge)"),
];

fn compose_of(c: &Case) -> String {
    if c.compose.lines().any(|l| l.starts_with("services:")) {
        return c.compose.to_string();
    }
    let mut out = String::from("services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n");
    for line in c.compose.lines() {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// compose's own model of the case, judged with the budget (and the host's memory and CPUs).
fn model_verdict(w: &World, docker: &Path, c: &Case, b: &TestBundle) -> String {
    let dir = w.path(&format!("model/{}", c.name));
    write_dir(&dir, b);
    std::fs::write(dir.join(".env"), "").unwrap();
    let d = monky_compose::Docker::builder(docker)
        .docker_config(w.path("model-docker-config"))
        .build()
        .unwrap();
    let project = d.compose(
        PROJECT,
        &dir,
        &dir.join("docker-compose.yml"),
        &dir.join(".env"),
    );
    let budget = monky_bundle::Budget {
        max_memory: Some(64 << 30),
        max_cpus: Some(64.0),
        ..monky_bundle::Budget::default()
    };
    match project.config_json() {
        Err(e) => format!("COMPOSE_CONFIG_FAILED {e}"),
        Ok(model) => match monky_bundle::ComposePolicy::new(PROJECT)
            .budget(budget)
            .pids_supplied(true)
            .findings_model(model, &b.compose, &dir, &|p| std::fs::read_link(p).ok())
            .first()
        {
            None => "ok".into(),
            Some(r) => r.to_string(),
        },
    }
}

#[test]
fn budget_and_name_cases_are_refused_by_check_tick_and_model() {
    let Some(docker) = docker() else { return };
    assert!(HOSTILE.len() >= 20, "{} cases", HOSTILE.len());
    let w = World::new();
    w.stage_grant();
    for c in HOSTILE {
        let b = TestBundle {
            compose: compose_of(c),
            ..TestBundle::default()
        };
        let run = bundle_check(&w, &docker, &format!("hostile/{}", c.name), &b);
        assert_eq!(
            run.code(),
            1,
            "{}: {}{}",
            c.name,
            run.stdout(),
            run.stderr()
        );
        let want = format!("FAIL {}: ", c.code);
        assert!(
            run.stdout()
                .lines()
                .any(|l| l.starts_with(&want) && l.contains(c.names)),
            "{}: wanted {want}...{} in\n{}",
            c.name,
            c.names,
            run.stdout()
        );

        let calls_before = w.docker_calls().len();
        tick_of(&w, &docker, &b).expect(1);
        let r = w.last_report();
        assert_eq!(r.result, ReportResult::Failed, "{}", c.name);
        let detail = r.detail.clone().unwrap_or_default();
        assert!(
            detail.starts_with(&format!("{}: ", c.code)) && detail.contains(c.names),
            "{}: {detail}",
            c.name
        );
        let calls = w.docker_calls();
        assert!(
            !calls[calls_before.min(calls.len())..]
                .iter()
                .any(|call| call.contains(" pull") || call.contains(" up")),
            "{}: {calls:#?}",
            c.name
        );

        // compose's own model shows it too (the host limits stand in for a big box).
        let verdict = model_verdict(&w, &docker, c, &b);
        if !c.name.ends_with("above-host") {
            assert!(
                verdict.starts_with(&format!("{}: ", c.code)),
                "{}: compose's model gave {verdict}",
                c.name
            );
        }
    }
}

#[test]
fn every_finding_is_reported_at_once_host_access_first() {
    let w = World::new();
    w.stage_grant();
    let b = TestBundle {
        compose: "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    container_name: web\n    pids_limit: -1\n    volumes: [\"/var/run/docker.sock:/var/run/docker.sock:z\"]\n    frobnicate: 1\n".into(),
        ..TestBundle::default()
    };
    w.publish(&b);
    w.tick().expect(1);
    let r = w.last_report();
    let detail = r.detail.unwrap_or_default();
    let order: Vec<usize> = [
        "PRIVILEGED_REFUSED: web: volumes /var/run/docker.sock (a host path;",
        "BUNDLE_INVALID: web: unknown key frobnicate",
        "BUNDLE_NONCONFORMING: web: container_name web (accepted: monky-env-qa-02-web)",
        "BUDGET_EXCEEDED: web: pids_limit -1 (unlimited)",
    ]
    .iter()
    .map(|part| {
        detail
            .find(part)
            .unwrap_or_else(|| panic!("{part:?} missing from {detail}"))
    })
    .collect();
    assert!(order.windows(2).all(|p| p[0] < p[1]), "{detail}");
    // The socket is named, not the relabel option.
    assert!(!detail.contains("relabels"), "{detail}");
    let dir = w.path("all-at-once");
    write_dir(&dir, &b);
    let run = w.run(&["bundle", "check", dir.to_str().unwrap(), "--env", ENV]);
    run.expect(1);
    let out = run.stdout();
    let fails: Vec<&str> = out.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert!(fails.len() >= 4, "{out}");
    assert!(
        fails[0].starts_with("FAIL PRIVILEGED_REFUSED: "),
        "{fails:?}"
    );
}

#[test]
fn the_name_waiver_never_waives_host_access_and_a_budget_key_widens_the_budget() {
    let w = World::new();
    w.stage_grant();
    w.config_extra(
        "allow_unprefixed_names: true\nbudget:\n  max_pids: 100000\n  min_published_port: 80\n",
    );
    let names_only = TestBundle {
        compose: "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    container_name: web\n    pids_limit: 50000\n    ports: [\"80:80\"]\n".into(),
        ..TestBundle::default()
    };
    w.publish(&names_only);
    w.tick().ok();
    assert_report(&w.last_report(), ReportResult::Applied, None);

    let with_socket = TestBundle {
        compose: "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:2\n    container_name: web\n    volumes: [\"/var/run/docker.sock:/s\"]\n".into(),
        ..TestBundle::default()
    };
    w.publish(&with_socket);
    w.tenancy
        .advance_clock(std::time::Duration::from_secs(3600));
    w.tick().expect(1);
    let r = w.last_report();
    assert_report(&r, ReportResult::Failed, Some("PRIVILEGED_REFUSED: "));
    assert!(
        !r.detail
            .unwrap_or_default()
            .contains("BUNDLE_NONCONFORMING")
    );
}

#[test]
fn a_bad_budget_key_names_itself() {
    let w = World::new();
    w.config_extra("budget:\n  max_shm_size: lots\n");
    let run = w.run(&["status"]);
    assert_eq!(run.code(), 78, "{}{}", run.stdout(), run.stderr());
    assert!(
        run.stderr()
            .contains("budget.max_shm_size: \"lots\" is not a size"),
        "{}",
        run.stderr()
    );
}

#[test]
fn bundle_check_fails_where_the_tick_fails_and_notes_what_a_secret_could_change() {
    let Some(docker) = docker() else { return };
    let w = World::new();
    // compose cannot build the model: the check fails, as the tick would.
    let broken = TestBundle {
        compose:
            "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    depends_on: [nowhere]\n"
                .into(),
        ..TestBundle::default()
    };
    let run = bundle_check(&w, &docker, "broken", &broken);
    assert_eq!(run.code(), 1, "{}{}", run.stdout(), run.stderr());
    assert!(
        run.stdout().contains("FAIL COMPOSE_CONFIG_FAILED: "),
        "{}",
        run.stdout()
    );
    // A required secret gets a placeholder, so the model builds as it does with the real one.
    let required = TestBundle {
        compose: "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    environment:\n      PW: ${POSTGRES_PASSWORD:?required}\n".into(),
        ..TestBundle::default()
    };
    let run = bundle_check(&w, &docker, "required", &required);
    assert_eq!(run.code(), 0, "{}{}", run.stdout(), run.stderr());
    // A finding whose value comes from a secret is named by it, and noted as one a real secret
    // could change; the placeholder's value is never printed.
    let from_secret = TestBundle {
        compose: "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    container_name: ${POSTGRES_PASSWORD}\n".into(),
        ..TestBundle::default()
    };
    let run = bundle_check(&w, &docker, "from-secret", &from_secret);
    assert_eq!(run.code(), 1, "{}{}", run.stdout(), run.stderr());
    assert!(
        run.stdout()
            .contains("FAIL BUNDLE_NONCONFORMING: web: container_name from ${POSTGRES_PASSWORD}"),
        "{}",
        run.stdout()
    );
    assert!(
        run.stdout().contains(
            "note: judged with placeholder secrets; a real secret could still change the findings that name ${POSTGRES_PASSWORD}"
        ),
        "{}",
        run.stdout()
    );
}
