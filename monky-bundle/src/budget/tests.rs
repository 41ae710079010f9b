//! Unit tests of the budget: the grammars, each key family's findings, the totals and the
//! supplied override.

use super::*;

#[test]
fn default_matches_the_documented_numbers() {
    let b = Budget::default();
    assert_eq!(
        (b.max_pids, b.default_pids, b.max_replicas),
        (4096, 1024, 10)
    );
    assert_eq!((b.max_services, b.max_networks), (40, 6));
    assert_eq!(b.min_published_port, 1024);
    assert_eq!(b.reserved_ports, [22, 8200, 8201, 18200, 18443]);
    assert_eq!(b.max_port_range, 100);
    assert_eq!((b.max_shm_size, b.max_tmpfs_size), (GIB, GIB));
    assert_eq!((b.max_memory, b.max_cpus), (None, None));
    assert_eq!(b.max_stop_grace_period, Duration::from_secs(300));
    assert_eq!(b.min_healthcheck_interval, Duration::from_secs(1));
    assert_eq!((b.max_log_size, b.max_log_files), (100 * MIB, 10));
}

#[test]
fn sizes_read_as_docker_reads_them() {
    for (text, want) in [
        ("1024", Some(1024)),
        ("1g", Some(GIB)),
        ("1G", Some(GIB)),
        ("1gb", Some(GIB)),
        ("1GiB", Some(GIB)),
        ("1.5g", Some(GIB + GIB / 2)),
        ("64m", Some(64 * MIB)),
        ("100 kb", Some(100 * KIB)),
        ("512b", Some(512)),
        ("1073741824", Some(GIB)),
        ("", None),
        ("g", None),
        ("-1g", None),
        ("1x", None),
        ("1gbb", None),
        (".5g", None),
    ] {
        assert_eq!(parse_size(text), want, "{text:?}");
    }
}

#[test]
fn durations_read_as_compose_reads_them() {
    for (text, want) in [
        ("1m30s", Some(90_000)),
        ("1h", Some(3_600_000)),
        ("1000h", Some(3_600_000_000)),
        ("1.5s", Some(1500)),
        ("500ms", Some(500)),
        ("1ms", Some(1)),
        ("0", Some(0)),
        ("10", None),
        ("1d", None),
        ("-1s", None),
        ("", None),
    ] {
        assert_eq!(
            parse_duration(text).map(|d| d.as_millis() as u64),
            want,
            "{text:?}"
        );
    }
}

#[test]
fn published_ports_of_the_short_syntax() {
    for (spec, want) in [
        ("8080:80", Some("8080")),
        ("8080:80/udp", Some("8080")),
        ("127.0.0.1:9000-9002:9000-9002", Some("9000-9002")),
        ("[::1]:8081:81", Some("8081")),
        ("127.0.0.1::80", Some("")),
        ("80", None),
        ("3000-3005", None),
    ] {
        assert_eq!(short_published(spec).as_deref(), want, "{spec}");
    }
    assert_eq!(port_range("10000-20000"), Some((10000, 20000)));
    assert_eq!(port_range(""), None);
}

fn judge(yaml: &str, budget: &Budget) -> Vec<String> {
    let doc = crate::checks::parse_compose(yaml).unwrap();
    budget.findings(&doc, &doc, false, false)
}

#[test]
fn each_limit_names_its_key_value_and_limit() {
    let b = Budget {
        max_memory: Some(4 * GIB),
        max_cpus: Some(2.0),
        ..Budget::default()
    };
    for (body, want) in [
        (
            "pids_limit: -1",
            "web: pids_limit -1 (unlimited) over budget.max_pids 4096",
        ),
        (
            "pids_limit: 100000",
            "web: pids_limit 100000 over budget.max_pids 4096",
        ),
        ("scale: 1000", "web: scale 1000 over budget.max_replicas 10"),
        (
            "deploy: {replicas: 5000}",
            "web: deploy.replicas 5000 over budget.max_replicas 10",
        ),
        (
            "ports: [\"22:22\"]",
            "web: ports 22 below budget.min_published_port 1024",
        ),
        (
            "ports: [\"8200:8200\"]",
            "web: ports 8200 takes 8200, in budget.reserved_ports",
        ),
        (
            "ports: [\"10000-20000:80\"]",
            "web: ports 10000-20000 is 10001 ports, over budget.max_port_range 100",
        ),
        (
            "shm_size: 64g",
            "web: shm_size 64 GiB over budget.max_shm_size 1 GiB",
        ),
        (
            "tmpfs: [\"/run:size=8g\"]",
            "web: tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB",
        ),
        (
            "tmpfs: [\"/run:size=1m,size=8g\"]",
            "web: tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB",
        ),
        (
            "mem_limit: 64g",
            "web: mem_limit 64 GiB over budget.max_memory 4 GiB",
        ),
        ("cpus: 16", "web: cpus 16 over budget.max_cpus 2"),
        (
            "cpu_shares: 262144",
            "web: cpu_shares 262144 over budget.max_cpu_shares 1024",
        ),
        (
            "stop_grace_period: 1000h",
            "web: stop_grace_period 3600000s over budget.max_stop_grace_period 300s",
        ),
        (
            "restart: always\n    healthcheck: {test: [CMD, \"true\"], interval: 1ms}",
            "web: healthcheck.interval 1ms under budget.min_healthcheck_interval 1s",
        ),
        (
            "logging: {driver: local, options: {max-size: 10g}}",
            "web: logging max-size 10 GiB over budget.max_log_size 100 MiB",
        ),
    ] {
        let yaml = format!("services:\n  web:\n    image: x\n    {body}\n");
        let own: Vec<String> = judge(&yaml, &b)
            .into_iter()
            .filter(|f| !f.starts_with("project: "))
            .collect();
        assert_eq!(own, [want], "{body}");
    }
}

#[test]
fn json_file_without_max_size_gets_the_boxs_and_keeps_its_own_options() {
    let b = Budget::default();
    let yaml = "services:\n  web:\n    image: x\n    logging: {driver: json-file, options: {max-file: \"2\", tag: web}}\n  api:\n    image: x\n    logging: {driver: json-file, options: {max-size: 5m}}\n";
    assert!(
        judge(yaml, &b).iter().all(|f| !f.contains("logging")),
        "{:?}",
        judge(yaml, &b)
    );
    let over: Value = serde_json::from_str(&b.budget_override_for(yaml).unwrap()).unwrap();
    assert_eq!(
        over["services"]["web"]["logging"],
        serde_json::json!({"driver": "json-file", "options": {"max-size": "10485760", "max-file": "2", "tag": "web"}})
    );
    assert!(over["services"]["api"].get("logging").is_none(), "{over}");
}

#[test]
fn sizes_read_as_the_kernel_reads_tmpfs_options() {
    use KernelSize::{Bytes, Percent};
    for (text, want) in [
        ("64m", Some(Bytes(64 * MIB))),
        ("64M", Some(Bytes(64 * MIB))),
        ("1e", Some(Bytes(1 << 60))),
        ("1E", Some(Bytes(1 << 60))),
        ("1p", Some(Bytes(1 << 50))),
        ("1t", Some(Bytes(1 << 40))),
        ("0x40000000", Some(Bytes(GIB))),
        ("0X1e", Some(Bytes(30))),
        ("0x1g", Some(Bytes(GIB))),
        ("010m", Some(Bytes(8 * MIB))),
        ("0", Some(Bytes(0))),
        ("", Some(Bytes(0))),
        ("k", Some(Bytes(0))),
        ("50%", Some(Percent(50))),
        ("1k%", Some(Percent(1024))),
        ("1.5g", None),
        ("08", None),
        ("0x", None),
        ("1gb", None),
        ("1g ", None),
        ("-1", None),
        ("20000000000000000000", None),
        ("16e", None),
        ("50%%", None),
    ] {
        assert_eq!(parse_kernel_size(text), want, "{text:?}");
    }
}

#[test]
fn a_value_the_budget_cannot_read_is_refused_never_skipped() {
    let b = Budget {
        max_memory: Some(16 * GIB),
        ..Budget::default()
    };
    for (body, want) in [
        (
            "tmpfs: [\"/run:size=1e\"]",
            "web: tmpfs 1 EiB over budget.max_tmpfs_size 1 GiB",
        ),
        (
            "tmpfs: [\"/run:size=0x40000001\"]",
            "web: tmpfs 1.0 GiB over budget.max_tmpfs_size 1 GiB",
        ),
        (
            "tmpfs: [\"/run:size=010g\"]",
            "web: tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB",
        ),
        (
            "tmpfs: [\"/run:size=0\"]",
            "web: tmpfs size=0 (unlimited) over budget.max_tmpfs_size 1 GiB",
        ),
        (
            "tmpfs: [\"/run:size=1.5g\"]",
            "web: tmpfs size=1.5g is not a size the kernel reads as the budget does (write it as size=64m, up to budget.max_tmpfs_size 1 GiB)",
        ),
        (
            "tmpfs: [\"/run:size=64m,nr_blocks=268435456\"]",
            "web: tmpfs nr_blocks=268435456 is a size in pages the budget does not read (write it as size=64m, up to budget.max_tmpfs_size 1 GiB)",
        ),
        (
            "tmpfs: [\"/run:size=64m,nr_inodes=0\"]",
            "web: tmpfs nr_inodes=0 (unlimited) over budget.max_tmpfs_size 1 GiB (one inode per 4 KiB: 262144)",
        ),
        (
            "tmpfs: [\"/run:size=64m,nr_inodes=1e\"]",
            "web: tmpfs nr_inodes=1e over budget.max_tmpfs_size 1 GiB (one inode per 4 KiB: 262144)",
        ),
        (
            "tmpfs: [\"/run:nr_inodes=1x\"]",
            "web: tmpfs nr_inodes=1x is not a count the kernel reads as the budget does (up to 262144, one inode per 4 KiB of budget.max_tmpfs_size 1 GiB)",
        ),
        (
            "tmpfs: [\"/run:size=50%\"]",
            "web: tmpfs 8 GiB over budget.max_tmpfs_size 1 GiB",
        ),
        (
            "tmpfs: /run:size=1k%",
            "web: tmpfs 163.8 GiB over budget.max_tmpfs_size 1 GiB",
        ),
        (
            "volumes:\n  - type: tmpfs\n    target: /s\n    tmpfs: {size: 1e3g}",
            "web: volumes tmpfs.size 1e3g is not a size the budget reads (write it as 64m, up to budget.max_tmpfs_size 1 GiB)",
        ),
        (
            "shm_size: 1e3g",
            "web: shm_size 1e3g is not a size the budget reads (write it as 64m, up to budget.max_shm_size 1 GiB)",
        ),
        (
            "shm_size: 0x1p40",
            "web: shm_size 0x1p40 is not a size the budget reads (write it as 64m, up to budget.max_shm_size 1 GiB)",
        ),
        (
            "mem_limit: 1e3g",
            "web: mem_limit 1e3g is not a size the budget reads (write it as 512m)",
        ),
        (
            "deploy: {resources: {limits: {memory: Inf}}}",
            "web: deploy.resources.limits.memory Inf is not a size the budget reads (write it as 512m)",
        ),
        (
            "pids_limit: lots",
            "web: pids_limit lots is not a count the budget reads (write it as 512, up to budget.max_pids 4096)",
        ),
        (
            "scale: many",
            "web: scale many is not a count the budget reads (up to budget.max_replicas 10)",
        ),
        (
            "stop_grace_period: forever",
            "web: stop_grace_period forever is not a duration the budget reads (write it as 30s or 1m30s)",
        ),
        (
            "healthcheck: {interval: 1d}",
            "web: healthcheck.interval 1d is not a duration the budget reads (write it as 30s or 1m30s)",
        ),
        (
            "logging: {driver: local, options: {max-file: \"1e3\"}}",
            "web: logging max-file 1e3 is not a count the budget reads (write it as \"3\", up to budget.max_log_files 10)",
        ),
    ] {
        let yaml = format!(
            "services:\n  web:\n    image: x\n    {}\n",
            body.replace('\n', "\n    ")
        );
        let own: Vec<String> = judge(&yaml, &b)
            .into_iter()
            .filter(|f| !f.starts_with("project: "))
            .collect();
        assert_eq!(own, [want], "{body}");
    }
    // A tmpfs volume's `o` is read as the kernel reads it too.
    let yaml = "services:\n  web: {image: x, volumes: [\"m:/m\"]}\nvolumes:\n  m: {driver_opts: {type: tmpfs, device: tmpfs, o: \"size=1e\"}}\n";
    assert!(judge(yaml, &b).contains(
        &"volumes.m: driver_opts size 1 EiB over budget.max_tmpfs_size 1 GiB".to_string()
    ));
    // A percent size without the host's memory cannot be judged: refused.
    let yaml = "services:\n  web:\n    image: x\n    tmpfs: [\"/run:size=50%\"]\n";
    assert_eq!(
        judge(yaml, &Budget::default()),
        [
            "web: tmpfs size=50% is a share of the host's memory, which the budget does not know (write it as size=64m, up to budget.max_tmpfs_size 1 GiB)"
        ]
    );
}

#[test]
fn every_logging_shape_is_bounded() {
    let b = Budget::default();
    for (body, want) in [
        // Options without a driver, or with an empty one: the daemon's default driver with
        // the bundle's options over daemon.json's. The agent supplies json-file and judges
        // the options as json-file reads them.
        (
            "logging: {options: {max-size: 1t, max-file: \"1000\"}}",
            &[
                "web: logging max-size 1 TiB over budget.max_log_size 100 MiB",
                "web: logging max-file 1000 over budget.max_log_files 10",
            ][..],
        ),
        (
            "logging: {driver: \"\", options: {max-size: 1t}}",
            &["web: logging max-size 1 TiB over budget.max_log_size 100 MiB"],
        ),
        (
            "logging: {options: {max-size: \"1e3g\"}}",
            &[
                "web: logging max-size 1e3g is not a size the budget reads (write it as 10m, up to budget.max_log_size 100 MiB)",
            ],
        ),
        (
            "logging: {options: {max-file: many}}",
            &[
                "web: logging max-file many is not a count the budget reads (write it as \"3\", up to budget.max_log_files 10)",
            ],
        ),
        (
            "logging: {driver: json-file, options: {max-size: 10m, max-file: x}}",
            &[
                "web: logging max-file x is not a count the budget reads (write it as \"3\", up to budget.max_log_files 10)",
            ],
        ),
        // Nothing said: the box's defaults are supplied.
        ("logging: {options: {max-size: 10m}}", &[]),
        ("logging: {driver: \"\"}", &[]),
        ("logging: {driver: none}", &[]),
        ("restart: always", &[]),
    ] {
        let yaml = format!("services:\n  web:\n    image: x\n    {body}\n");
        assert_eq!(judge(&yaml, &b), want, "{body}");
    }
    let journald = "services:\n  web:\n    image: x\n    logging: {driver: journald}\n";
    assert_eq!(judge(journald, &b), Vec::<String>::new());
    let closed = Budget {
        allow_journald: false,
        ..Budget::default()
    };
    assert_eq!(
        judge(journald, &closed),
        [
            "web: logging driver journald writes to the host's journal, shared with the host and every env, which no budget bounds (allowed by budget.allow_journald)"
        ]
    );
}

#[test]
fn on_the_model_every_service_shows_the_supplied_limits_and_driver() {
    let doc = crate::checks::parse_compose(
        "services:\n  bare: {image: x}\n  set: {image: x, pids_limit: 100, mem_limit: 1073741824, logging: {driver: json-file, options: {max-size: 10m}}}\n",
    )
    .unwrap();
    assert_eq!(
        Budget::default().findings(&doc, &doc, true, true),
        [
            "bare: no pids limit (set pids_limit up to budget.max_pids 4096)",
            "bare: no memory limit (set mem_limit)",
            "bare: logging names no driver (the box's json-file with max-size 10 MiB was not supplied)",
        ]
    );
}

#[test]
fn ulimits_counted_per_host_uid_apply_up_to_their_keys() {
    // An elasticsearch-like service: applies as asked.
    for body in [
        "ulimits: {nproc: 4096, nofile: {soft: 65535, hard: 65535}, memlock: {soft: -1, hard: -1}}",
        "ulimits: {\" NPROC\": {soft: 10, hard: 20}}",
        "ulimits: {sigpending: 100}",
        "ulimits: {msgqueue: \"819200\"}",
    ] {
        let yaml = format!("services:\n  es:\n    image: x\n    mem_limit: 1g\n    {body}\n");
        assert_eq!(
            judge(&yaml, &Budget::default()),
            Vec::<String>::new(),
            "{body}"
        );
    }
    for (body, want) in [
        (
            "ulimits: {nproc: 100000}",
            "web: ulimits nproc 100000 over budget.max_ulimit_nproc 65536",
        ),
        (
            "ulimits: {nproc: {soft: 10, hard: 70000}}",
            "web: ulimits nproc 10/70000 over budget.max_ulimit_nproc 65536",
        ),
        (
            "ulimits: {nproc: -1}",
            "web: ulimits nproc -1 is unlimited or not a count this check can read: name a number, up to budget.max_ulimit_nproc 65536",
        ),
        (
            "ulimits: {msgqueue: 1e9}",
            "web: ulimits msgqueue 1000000000.0 is unlimited or not a count this check can read: name a number, up to budget.max_ulimit_msgqueue 8388608",
        ),
    ] {
        let yaml = format!("services:\n  web:\n    image: x\n    {body}\n");
        assert_eq!(judge(&yaml, &Budget::default()), [want], "{body}");
    }
    // The box's waiver: a higher key.
    let raised = Budget {
        max_ulimit_nproc: 200_000,
        ..Budget::default()
    };
    let yaml = "services:\n  web:\n    image: x\n    ulimits: {nproc: 100000}\n";
    assert_eq!(judge(yaml, &raised), Vec::<String>::new());
    let nofile =
        "services:\n  web:\n    image: x\n    ulimits: {nofile: {soft: 4096, hard: 4096}}\n";
    assert_eq!(judge(nofile, &Budget::default()), Vec::<String>::new());
}

#[test]
fn each_project_total_names_its_key_value_and_limit() {
    let b = Budget {
        max_memory: Some(16 * GIB),
        ..Budget::default()
    };
    let many = |n: usize, body: &str| {
        let mut y = String::from("services:\n");
        for i in 0..n {
            y.push_str(&format!("  s{i}:\n    image: x\n    {body}\n"));
        }
        y
    };
    for (yaml, want) in [
        (
            many(7, "scale: 9"),
            "project: containers 63 over budget.max_project_containers 60",
        ),
        (
            many(3, "ports: [\"10000-10099:80\"]"),
            "project: published ports 300 over budget.max_project_ports 200",
        ),
        (
            many(
                3,
                "deploy: {replicas: 10}\n    ports: [\"127.0.0.1::80\", {target: 81}, \"3000-3004\"]",
            ),
            "project: published ports 210 over budget.max_project_ports 200",
        ),
        (
            many(30, "tmpfs: [\"/t:size=1g\"]"),
            "project: tmpfs and shm 30 GiB over budget.max_project_tmpfs 8 GiB",
        ),
        (
            many(9, "shm_size: 1g"),
            "project: tmpfs and shm 9 GiB over budget.max_project_tmpfs 8 GiB",
        ),
        (
            many(8, "pids_limit: 4096"),
            "project: pids limits 32768 over budget.max_project_pids 16384",
        ),
        (
            many(4, "pids_limit: 4000\n    scale: 2"),
            "project: pids limits 32000 over budget.max_project_pids 16384",
        ),
        (
            many(30, "mem_limit: 1g"),
            "project: memory limits 30 GiB over budget.max_project_memory 16 GiB",
        ),
    ] {
        let totals: Vec<String> = judge(&yaml, &b)
            .into_iter()
            .filter(|f| f.starts_with("project: "))
            .collect();
        assert_eq!(totals, [want], "{yaml}");
    }
    // A top-level tmpfs volume counts once; the project's own keys widen the totals.
    let wide = Budget {
        max_project_containers: 100,
        max_project_tmpfs: Some(64 * GIB),
        max_project_pids: 40000,
        max_project_memory: Some(64 * GIB),
        ..b.clone()
    };
    assert_eq!(
        judge(&many(8, "pids_limit: 4096\n    mem_limit: 4g"), &wide),
        Vec::<String>::new()
    );
}

#[test]
fn ordinary_values_pass() {
    let yaml = "services:\n  web:\n    image: x\n    pids_limit: 512\n    scale: 2\n    ports: [\"8080:80\", \"127.0.0.1:5432:5432\", \"3000\", \"[::1]:9090:9090/udp\"]\n    shm_size: 256m\n    tmpfs: [/tmp, \"/run:size=64m,mode=1777\"]\n    stop_grace_period: 1m30s\n    restart: always\n    healthcheck: {test: [CMD, \"true\"], interval: 10s, start_interval: 1s}\n    logging: {driver: json-file, options: {max-size: 10m, max-file: \"3\"}}\n  worker:\n    image: x\n    logging: {driver: local}\n    healthcheck: {interval: 2s}\nnetworks: {a: {}, b: {}, c: {external: true}}\n";
    assert_eq!(judge(yaml, &Budget::default()), Vec::<String>::new());
}

#[test]
fn project_counts() {
    let mut yaml = String::from("services:\n");
    for n in 0..41 {
        yaml.push_str(&format!("  s{n}:\n    image: x\n"));
    }
    yaml.push_str("networks:\n");
    for n in 0..7 {
        yaml.push_str(&format!("  n{n}: {{}}\n"));
    }
    assert_eq!(
        judge(&yaml, &Budget::default()),
        [
            "services 41 over budget.max_services 40",
            "networks 7 over budget.max_networks 6"
        ]
    );
}

fn override_of(yaml: &str, b: &Budget) -> Option<Value> {
    b.budget_override_for(yaml)
        .map(|t| serde_json::from_str(&t).unwrap())
}

#[test]
fn the_override_supplies_pids_memory_and_logging_where_the_service_says_nothing() {
    let yaml = "services:\n  a: {image: x, pids_limit: 10, mem_limit: 1g, logging: {driver: local}}\n  b: {image: x, extends: {service: a}}\n  c: {image: x, deploy: {resources: {limits: {pids: 5, memory: 0}}}, logging: {driver: \"\", options: {max-file: \"2\"}}}\n  d: {image: x, logging: {options: {max-size: 1m}}}\n  e: {image: x, deploy: {resources: {limits: {cpus: \"1\"}}}, logging: {driver: none}}\n";
    let log = |opts: Value| serde_json::json!({"driver": "json-file", "options": opts});
    assert_eq!(
        override_of(yaml, &Budget::default()).unwrap(),
        serde_json::json!({"services": {
            "c": {"deploy": {"resources": {"limits": {"memory": "2147483648"}}},
                  "logging": log(serde_json::json!({"max-file": "2", "max-size": "10485760"}))},
            "d": {"pids_limit": 1024, "mem_limit": "2147483648",
                  "logging": log(serde_json::json!({"max-file": "3", "max-size": "1m"}))},
            "e": {"deploy": {"resources": {"limits": {"pids": 1024, "memory": "2147483648"}}}},
        }})
    );
    let only =
        "services:\n  a: {image: x, pids_limit: 10, mem_limit: 1g, logging: {driver: local}}\n";
    assert_eq!(override_of(only, &Budget::default()), None);
}

#[test]
fn the_supplied_limits_shrink_to_the_projects_share() {
    // 19 containers without limits and 8 GiB for the project: 431 MiB and 862 pids each.
    let mut yaml = String::from("services:\n");
    for n in 0..19 {
        yaml.push_str(&format!(
            "  s{n}: {{image: x, logging: {{driver: local}}}}\n"
        ));
    }
    let b = Budget {
        max_memory: Some(8 * GIB),
        ..Budget::default()
    };
    let o = override_of(&yaml, &b).unwrap();
    assert_eq!(o["services"]["s0"]["pids_limit"], 16384 / 19);
    assert_eq!(o["services"]["s0"]["mem_limit"], (8 * GIB / 19).to_string());
    assert_eq!(judge(&yaml, &b), Vec::<String>::new());
    // With one container asking for 7.5 GiB, the rest would get too little: refused.
    yaml.push_str(
        "  big: {image: x, mem_limit: 7680m, pids_limit: 100, logging: {driver: local}}\n",
    );
    assert_eq!(
        judge(&yaml, &b),
        [
            "project: memory limits 7.5 GiB and 19 container(s) without one, each at least 256 MiB, over budget.max_project_memory 8 GiB"
        ]
    );
}
