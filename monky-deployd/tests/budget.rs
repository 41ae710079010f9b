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
    // The env's address (bundle.json's) and a subdomain the box's admin allows for routing.
    w.config_extra("allowed_route_hosts: [\"*.qa-02.example.com\"]\n");
    w.stage_grant();
    let mut supplied = 0;
    for (name, yaml) in &corpus {
        let mut b = TestBundle {
            compose: yaml.clone(),
            ..TestBundle::default()
        };
        b.meta["address"] = serde_json::json!("qa-02.example.com");
        // The check before the lease, on its own.
        let secrets = [
            "GEMINI_API_KEY".to_string(),
            "POSTGRES_PASSWORD".to_string(),
        ]
        .into();
        let verdict = monky_bundle::ComposePolicy::new(PROJECT)
            .route_hosts(["qa-02.example.com", "*.qa-02.example.com"])
            .findings_file(
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
    case("logs-json-file-files", "logging: {driver: json-file, options: {max-file: \"1000\"}}", BE, "web: logging max-file 1000 over budget.max_log_files 10"),
    case("logs-10g", "logging: {driver: json-file, options: {max-size: 10g}}", BE, "web: logging max-size 10 GiB over budget.max_log_size 100 MiB"),
    case("logs-size-exponent", "logging: {driver: json-file, options: {max-size: \"1e3g\"}}", BE, "web: logging max-size 1e3g is not a size the budget reads (write it as 10m, up to budget.max_log_size 100 MiB)"),
    // Totals per project (scale and replicas counted; the tick's budget is the host's memory).
    case("project-pids-8x4096", "services:\n  a: {image: 127.0.0.1:5000/monky/web:1, pids_limit: 4096}\n  b: {image: 127.0.0.1:5000/monky/web:1, pids_limit: 4096}\n  c: {image: 127.0.0.1:5000/monky/web:1, pids_limit: 4096}\n  d: {image: 127.0.0.1:5000/monky/web:1, pids_limit: 4096}\n  e: {image: 127.0.0.1:5000/monky/web:1, pids_limit: 4096}\n  f: {image: 127.0.0.1:5000/monky/web:1, pids_limit: 4096}\n  g: {image: 127.0.0.1:5000/monky/web:1, pids_limit: 4096}\n  h: {image: 127.0.0.1:5000/monky/web:1, pids_limit: 4096}\n", BE, "project: pids limits 32768 over budget.max_project_pids 16384"),
    case("project-pids-scaled", "pids_limit: 4000\nscale: 5", BE, "project: pids limits 20000 over budget.max_project_pids 16384"),
    case("project-pids-replicas-leave-too-little", "services:\n  big: {image: 127.0.0.1:5000/monky/web:1, pids_limit: 4000, deploy: {replicas: 4}}\n  web: {image: 127.0.0.1:5000/monky/web:1, deploy: {replicas: 8}}\n", BE, "project: pids limits 16000 and 8 container(s) without one, each at least 128, over budget.max_project_pids 16384"),
    case("project-containers", "services:\n  a: {image: 127.0.0.1:5000/monky/web:1, scale: 10}\n  b: {image: 127.0.0.1:5000/monky/web:1, scale: 10}\n  c: {image: 127.0.0.1:5000/monky/web:1, scale: 10}\n  d: {image: 127.0.0.1:5000/monky/web:1, scale: 10}\n  e: {image: 127.0.0.1:5000/monky/web:1, scale: 10}\n  f: {image: 127.0.0.1:5000/monky/web:1, scale: 10}\n  g: {image: 127.0.0.1:5000/monky/web:1, deploy: {replicas: 1}}\n", BE, "project: containers 61 over budget.max_project_containers 60"),
    case("project-ports-ranges", "services:\n  a: {image: 127.0.0.1:5000/monky/web:1, ports: [\"20000-20099:80\"]}\n  b: {image: 127.0.0.1:5000/monky/web:1, ports: [\"20100-20199:80\"]}\n  c: {image: 127.0.0.1:5000/monky/web:1, ports: [\"20200-20299:80\"]}\n", BE, "project: published ports 300 over budget.max_project_ports 200"),
    case("project-ports-ephemeral", "deploy: {replicas: 10}\nports: [\"127.0.0.1::80\", \"81\", \"3000-3018\"]", BE, "project: published ports 210 over budget.max_project_ports 200"),
    case("project-tmpfs-40x1g-one-container", "tmpfs: [\"/t0:size=1g\", \"/t1:size=1g\", \"/t2:size=1g\", \"/t3:size=1g\", \"/t4:size=1g\", \"/t5:size=1g\", \"/t6:size=1g\", \"/t7:size=1g\", \"/t8:size=1g\", \"/t9:size=1g\", \"/t10:size=1g\", \"/t11:size=1g\", \"/t12:size=1g\", \"/t13:size=1g\", \"/t14:size=1g\", \"/t15:size=1g\", \"/t16:size=1g\", \"/t17:size=1g\", \"/t18:size=1g\", \"/t19:size=1g\", \"/t20:size=1g\", \"/t21:size=1g\", \"/t22:size=1g\", \"/t23:size=1g\", \"/t24:size=1g\", \"/t25:size=1g\", \"/t26:size=1g\", \"/t27:size=1g\", \"/t28:size=1g\", \"/t29:size=1g\", \"/t30:size=1g\", \"/t31:size=1g\", \"/t32:size=1g\", \"/t33:size=1g\", \"/t34:size=1g\", \"/t35:size=1g\", \"/t36:size=1g\", \"/t37:size=1g\", \"/t38:size=1g\", \"/t39:size=1g\"]", BE, "project: tmpfs and shm 40 GiB over budget.max_project_tmpfs"),
    case("project-shm-scaled", "services:\n  a: {image: 127.0.0.1:5000/monky/web:1, shm_size: 1g, scale: 10}\n  b: {image: 127.0.0.1:5000/monky/web:1, shm_size: 1g, scale: 10}\n  c: {image: 127.0.0.1:5000/monky/web:1, shm_size: 1g, scale: 10}\n  d: {image: 127.0.0.1:5000/monky/web:1, shm_size: 1g, scale: 10}\n", BE, "project: tmpfs and shm 40 GiB over budget.max_project_tmpfs"),
    case("project-memory-above-host", "services:\n  a: {image: 127.0.0.1:5000/monky/web:1, mem_limit: 20g}\n  b: {image: 127.0.0.1:5000/monky/web:1, mem_limit: 20g}\n  c: {image: 127.0.0.1:5000/monky/web:1, mem_limit: 20g}\n", BE, "project: memory limits 60 GiB over budget.max_project_memory"),
    // Every logging shape: options without a driver or with an empty one run the daemon's
    // default driver with the bundle's options over daemon.json's; journald has no bound.
    case("logs-options-without-driver", "logging: {options: {max-size: 1t, max-file: \"1000\"}}", BE, "web: logging max-size 1 TiB over budget.max_log_size 100 MiB"),
    case("logs-options-without-driver-files", "logging: {options: {max-size: 10m, max-file: \"1000\"}}", BE, "web: logging max-file 1000 over budget.max_log_files 10"),
    case("logs-empty-driver", "logging: {driver: \"\", options: {max-size: 1t}}", BE, "web: logging max-size 1 TiB over budget.max_log_size 100 MiB"),
    case("logs-no-driver-exponent", "logging: {options: {max-size: \"1e3g\"}}", BE, "web: logging max-size 1e3g is not a size the budget reads"),
    case("logs-local-max-file-unreadable", "logging: {driver: local, options: {max-file: \"1e3\"}}", BE, "web: logging max-file 1e3 is not a count the budget reads"),
    // Sizes as the kernel reads tmpfs options; what the budget cannot read is refused.
    case("tmpfs-exbibyte", "tmpfs: [\"/run:size=1e\"]", BE, "web: tmpfs 1 EiB over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-hex", "tmpfs: [\"/run:size=0x200000000\"]", BE, "web: tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-octal", "tmpfs: [\"/run:size=010g\"]", BE, "web: tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-size-zero-unlimited", "tmpfs: [\"/run:size=0\"]", BE, "web: tmpfs size=0 (unlimited) over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-nr-blocks-after-size", "tmpfs: [\"/run:size=64m,nr_blocks=268435456\"]", BE, "web: tmpfs nr_blocks=268435456 is a size in pages the budget does not read"),
    case("tmpfs-nr-inodes-unlimited", "tmpfs: [\"/run:size=64m,nr_inodes=0\"]", BE, "web: tmpfs nr_inodes=0 (unlimited) over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-percent", "tmpfs: [\"/run:size=400%\"]", BE, "GiB over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-fraction", "tmpfs: [\"/run:size=1.5g\"]", BE, "web: tmpfs size=1.5g is not a size the kernel reads as the budget does"),
    case("tmpfs-volume-exbibyte", "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes: [mem:/m]\nvolumes:\n  mem:\n    driver_opts: {type: tmpfs, device: tmpfs, o: size=1e}\n", BE, "volumes.mem: driver_opts size 1 EiB over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-volume-hex", "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes: [mem:/m]\nvolumes:\n  mem:\n    driver_opts: {type: tmpfs, device: tmpfs, o: \"size=0x200000000\"}\n", BE, "volumes.mem: driver_opts size 8 GiB over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-exbibyte-upper-case", "tmpfs: /run:size=1E", BE, "web: tmpfs 1 EiB over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-hex-upper-case", "tmpfs: [\"/run:size=0X40000001\"]", BE, "web: tmpfs 1.0 GiB over budget.max_tmpfs_size 1 GiB"),
    case("tmpfs-pebibyte-last-size", "tmpfs: [\"/run:size=64m,mode=1777,size=1p\"]", BE, "web: tmpfs 1 PiB over budget.max_tmpfs_size 1 GiB"),
    // Limits the kernel counts per host uid apply up to their keys; unlimited is refused.
    case("ulimit-nproc-huge", "ulimits: {nproc: 1000000}", BE, "web: ulimits nproc 1000000 over budget.max_ulimit_nproc 65536"),
    case("ulimit-nproc-soft-hard", "ulimits: {nproc: {soft: 60, hard: 100000}}", BE, "web: ulimits nproc 60/100000 over budget.max_ulimit_nproc 65536"),
    case("ulimit-nproc-unlimited-upper-case", "ulimits: {NPROC: -1}", BE, "web: ulimits NPROC -1 is unlimited or not a count this check can read"),
    case("ulimit-sigpending", "ulimits: {sigpending: 10000000}", BE, "web: ulimits sigpending 10000000 over budget.max_ulimit_sigpending 65536"),
    case("ulimit-msgqueue", "ulimits: {msgqueue: 1073741824}", BE, "web: ulimits msgqueue 1073741824 over budget.max_ulimit_msgqueue 8388608"),
    case("container-name-unprefixed", "container_name: postgres", NC, "web: container_name postgres (accepted: monky-env-qa-02-postgres)"),
    case("volume-name-unprefixed", "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes: [pg:/pg]\nvolumes:\n  pg:\n    name: pgdata\n", NC, "volumes.pg: name pgdata (accepted: monky-env-qa-02_pgdata)"),
    // The default names of a longer project (`monky-env-qa-02-b`, `monky-env-qa-02_b`) that
    // may arrive later.
    case("container-name-of-a-longer-project", "container_name: monky-env-qa-02-b-web-1", NC, "web: container_name monky-env-qa-02-b-web-1 (accepted: monky-env-qa-02-b-web)"),
    case("container-name-of-a-longer-projects-one-off", "container_name: monky-env-qa-02-b-web-run-0123456789ab", NC, "web: container_name monky-env-qa-02-b-web-run-0123456789ab (accepted: monky-env-qa-02-b-web)"),
    case("volume-name-of-a-longer-project", "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes: [pg:/pg]\nvolumes:\n  pg:\n    name: monky-env-qa-02_b_pgdata\n", NC, "volumes.pg: name monky-env-qa-02_b_pgdata (accepted: monky-env-qa-02_b-pgdata)"),
    case("network-name-of-a-longer-project", "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    networks: [edge]\nnetworks:\n  edge:\n    name: monky-env-qa-02_b_default\n", NC, "networks.edge: name monky-env-qa-02_b_default (accepted: monky-env-qa-02_b-default)"),
    // Routing labels a reverse proxy on the box acts on: another env's host, or no host at all.
    case("route-traefik-other-envs-host", "labels:\n  traefik.http.routers.x.rule: \"Host(`other-env.example.com`)\"\n  traefik.http.routers.x.priority: \"100000\"", NC, "web: labels traefik.http.routers.x.rule names other-env.example.com, not this env's own address (the box's admin may allow it with allowed_route_hosts: [other-env.example.com])"),
    case("route-traefik-catch-all", "labels: [\"traefik.http.routers.x.rule=PathPrefix(`/`)\"]", NC, "web: labels traefik.http.routers.x.rule cannot be judged: it does not limit the router to named hosts (the box's admin may allow any host for this env with allowed_route_hosts: [\"*\"])"),
    case("route-traefik-host-regexp", "labels:\n  traefik.http.routers.x.rule: \"HostRegexp(`.+\\\\.example\\\\.com`)\"", NC, "web: labels traefik.http.routers.x.rule cannot be judged"),
    case("route-traefik-tcp-any-sni", "labels:\n  traefik.tcp.routers.x.rule: \"HostSNI(`*`)\"", NC, "web: labels traefik.tcp.routers.x.rule cannot be judged"),
    case("route-caddy-other-envs-host", "labels:\n  caddy: other-env.example.com\n  caddy.reverse_proxy: \"{{upstreams 80}}\"", NC, "web: labels caddy names other-env.example.com"),
    case("route-caddy-any-host", "labels:\n  caddy_0: \":80\"", NC, "web: labels caddy_0 cannot be judged: an address without a host serves every host"),
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
    assert!(HOSTILE.len() >= 50, "{} cases", HOSTILE.len());
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
        "allow_unprefixed_names: true\nbudget:\n  max_pids: 100000\n  max_project_pids: 100000\n  min_published_port: 80\n",
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
fn a_box_that_keeps_its_journal_refuses_journald_logging() {
    let w = World::new();
    w.stage_grant();
    w.config_extra("budget:\n  allow_journald: false\n");
    let b = TestBundle {
        compose: "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    logging: {driver: journald}\n".into(),
        ..TestBundle::default()
    };
    w.publish(&b);
    w.tick().expect(1);
    let r = w.last_report();
    assert_report(&r, ReportResult::Failed, Some("BUDGET_EXCEEDED: "));
    assert!(
        r.detail.unwrap_or_default().contains(
            "web: logging driver journald writes to the host's journal, shared with the host and every env, which no budget bounds (allowed by budget.allow_journald)"
        )
    );
    assert!(
        !w.docker_calls()
            .iter()
            .any(|c| c.contains(" pull") || c.contains(" up"))
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

/// Every shape the override supplies to, merged by compose's real `config` as the tick merges
/// it: the model shows the supplied limits and driver, keeps the bundle's own options, and
/// passes the budget with the override in force.
#[test]
fn compose_merges_the_override_into_a_model_the_budget_passes() {
    let Some(docker) = docker() else { return };
    let w = World::new();
    let image = "127.0.0.1:5000/monky/web:1";
    let compose = format!(
        "services:\n  bare: {{image: {image}}}\n  empty-driver: {{image: {image}, logging: {{driver: \"\", options: {{max-size: 5m, tag: t}}}}}}\n  options-only: {{image: {image}, logging: {{options: {{max-file: \"2\"}}}}}}\n  deploy-limits: {{image: {image}, deploy: {{resources: {{limits: {{cpus: \"0.5\"}}}}}}}}\n  zero-memory: {{image: {image}, mem_limit: 0}}\n  child: {{image: {image}, extends: {{service: deploy-limits}}}}\n  own: {{image: {image}, pids_limit: 100, mem_limit: 64m, logging: {{driver: local}}}}\n"
    );
    let dir = w.path("merge");
    write_dir(
        &dir,
        &TestBundle {
            compose: compose.clone(),
            ..TestBundle::default()
        },
    );
    std::fs::write(dir.join(".env"), "").unwrap();
    let budget = monky_bundle::Budget {
        max_memory: Some(64 << 30),
        ..monky_bundle::Budget::default()
    };
    let over = dir.join(monky_bundle::budget::OVERRIDE_FILE);
    std::fs::write(&over, budget.budget_override_for(&compose).unwrap()).unwrap();
    let d = monky_compose::Docker::builder(&docker)
        .docker_config(w.path("merge-docker-config"))
        .build()
        .unwrap();
    let model = d
        .compose(
            PROJECT,
            &dir,
            &dir.join("docker-compose.yml"),
            &dir.join(".env"),
        )
        .with_override(&over)
        .config_json()
        .expect("compose reads the override");
    let svc = |name: &str| model["services"][name].clone();
    let gib2 = serde_json::json!("2147483648");
    for name in ["bare", "empty-driver", "options-only", "zero-memory"] {
        assert_eq!(svc(name)["mem_limit"], gib2, "{name}: {}", svc(name));
        assert_eq!(svc(name)["pids_limit"], 1024, "{name}");
        assert_eq!(svc(name)["logging"]["driver"], "json-file", "{name}");
    }
    for name in ["deploy-limits", "child"] {
        let limits = &svc(name)["deploy"]["resources"]["limits"];
        assert_eq!(limits["pids"], 1024, "{name}: {}", svc(name));
        assert_eq!(limits["memory"], gib2, "{name}");
    }
    assert_eq!(
        svc("empty-driver")["logging"]["options"],
        serde_json::json!({"max-size": "5m", "tag": "t", "max-file": "3"})
    );
    assert_eq!(
        svc("options-only")["logging"]["options"],
        serde_json::json!({"max-size": "10485760", "max-file": "2"})
    );
    assert_eq!(svc("own")["logging"]["driver"], "local");
    assert_eq!(svc("own")["pids_limit"], 100);
    let findings = monky_bundle::ComposePolicy::new(PROJECT)
        .budget(budget)
        .pids_supplied(true)
        .findings_model(model, &compose, &dir, &|p| std::fs::read_link(p).ok());
    assert!(findings.is_empty(), "{findings:?}");
}

/// redis with `--requirepass ${POSTGRES_PASSWORD}` (a secret) on its command line: refused on a
/// box that did not say otherwise, with a fix that removes the exposure (never `$${NAME}`);
/// applied on a box whose admin set `allow_secrets_on_command_lines` (its `/proc` is hidepid).
#[test]
fn a_secret_on_a_command_line_is_the_box_admins_to_waive() {
    let redis = TestBundle {
        compose: "services:\n  redis:\n    image: 127.0.0.1:5000/library/redis:7\n    env_file: .env\n    command: redis-server --requirepass ${POSTGRES_PASSWORD}\n".into(),
        ..TestBundle::default()
    };
    let w = World::new();
    w.stage_grant();
    w.publish(&redis);
    w.tick().expect(1);
    let r = w.last_report();
    assert_report(
        &r,
        ReportResult::Failed,
        Some("SECRET_ON_COMMAND_LINE: redis: command uses ${POSTGRES_PASSWORD}"),
    );
    let detail = r.detail.unwrap_or_default();
    assert!(
        detail.contains("allow_secrets_on_command_lines"),
        "{detail}"
    );
    assert!(
        !detail.contains("$${"),
        "a fix that keeps the secret in argv: {detail}"
    );

    let waived = World::new();
    waived.stage_grant();
    waived.config_extra("allow_secrets_on_command_lines: true\n");
    waived.publish(&redis);
    waived.tick().ok();
    assert_report(&waived.last_report(), ReportResult::Applied, None);
}
