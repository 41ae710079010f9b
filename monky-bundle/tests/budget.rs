//! The box's budget and the YAML budget through the public API: production-sized anchors and
//! merges pass, a file over a YAML limit is refused naming the limit and the line where it was
//! hit, and the budget's findings come with their own code after the host-access ones.

use std::collections::BTreeSet;

use monky_bundle::{Budget, ComposePolicy};

const PROJECT: &str = "monky-env-qa-02";

fn verdict(p: &ComposePolicy, yaml: &str) -> Vec<String> {
    p.findings_file(yaml, &|_| None, &BTreeSet::new())
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// `services` services, each merging one anchor and a nested one: two merges per service.
fn merged(services: usize) -> String {
    let mut out = String::from(
        "x-common: &common\n  restart: unless-stopped\n  logging: {driver: json-file, options: {max-size: 10m}}\n  environment: &env\n    A: '1'\n    B: '2'\nservices:\n",
    );
    for i in 0..services {
        out.push_str(&format!(
            "  s{i}:\n    <<: *common\n    image: img{i}\n    environment:\n      <<: *env\n      X: '{i}'\n"
        ));
    }
    out
}

#[test]
fn production_sized_anchors_and_merges_pass() {
    // 70 services merging two anchors each: 140 merges of one anchor pair.
    let p = ComposePolicy::new(PROJECT).budget(Budget {
        max_services: 100,
        max_project_containers: 100,
        ..Budget::default()
    });
    assert_eq!(verdict(&p, &merged(70)), Vec::<String>::new());
}

#[test]
fn a_file_over_a_yaml_limit_names_the_limit_and_its_line() {
    let mut one = String::from("x-a: &a 1\nservices:\n  web:\n    image: x\n    labels:\n");
    for i in 0..1001 {
        one.push_str(&format!("      l{i}: *a\n"));
    }
    assert_eq!(
        verdict(&ComposePolicy::new(PROJECT), &one),
        [
            "BUNDLE_INVALID: compose file: yaml uses one anchor over its budget of 1000 times at line 1006 column 14"
        ]
    );
    let mut many = String::from(
        "x-a: &a 1\nx-b: &b 1\nx-c: &c 1\nservices:\n  web:\n    image: x\n    labels:\n",
    );
    for i in 0..2100 {
        let anchor = ["a", "b", "c"][i % 3];
        many.push_str(&format!("      l{i}: *{anchor}\n"));
    }
    let got = verdict(&ComposePolicy::new(PROJECT), &many);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with(
            "BUNDLE_INVALID: compose file: yaml over its budget of 2000 aliases at line 2008 "
        ),
        "{got:?}"
    );
}

#[test]
fn budget_findings_follow_host_access_and_names() {
    let yaml = "services:\n  web:\n    image: x\n    scale: 100\n    container_name: web\n    privileged: true\n";
    assert_eq!(
        verdict(&ComposePolicy::new(PROJECT), yaml),
        [
            "PRIVILEGED_REFUSED: web: privileged",
            "BUNDLE_NONCONFORMING: web: container_name web (accepted: monky-env-qa-02-web)",
            "BUDGET_EXCEEDED: web: scale 100 over budget.max_replicas 10, project: containers 100 over budget.max_project_containers 60",
        ]
    );
    // The box's admin raises the keys: the budget findings go, the others stay.
    let wide = ComposePolicy::new(PROJECT).budget(Budget {
        max_replicas: 100,
        max_project_containers: 100,
        ..Budget::default()
    });
    assert_eq!(verdict(&wide, yaml).len(), 2);
}

#[test]
fn a_value_from_a_secret_is_judged_on_the_model_only() {
    // Before the lease the secret reads as empty: nothing to judge, the model decides.
    let secrets = BTreeSet::from(["PIDS".to_string()]);
    let p = ComposePolicy::new(PROJECT);
    let yaml = "services:\n  web:\n    image: x\n    pids_limit: ${PIDS}\n";
    assert!(p.findings_file(yaml, &|_| None, &secrets).is_empty());
    let model = serde_json::json!({"services": {"web": {
        "image": "x",
        "pids_limit": -1,
        "mem_limit": "1073741824",
        "logging": {"driver": "json-file", "options": {"max-size": "10485760"}},
    }}});
    let got =
        p.pids_supplied(true)
            .findings_model(model, yaml, std::path::Path::new("/r"), &|_| None);
    assert_eq!(
        got.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["BUDGET_EXCEEDED: web: pids_limit from ${PIDS} over budget.max_pids 4096"]
    );
}

/// One compose file through the public API: the file check's findings, as the tick reports them.
fn check(yaml: &str, budget: Budget, want: &[&str]) {
    let p = ComposePolicy::new(PROJECT).budget(budget);
    assert_eq!(verdict(&p, yaml), want, "{yaml}");
}

#[test]
fn project_totals_logging_shapes_and_unreadable_sizes_through_the_policy() {
    let host = || Budget {
        max_memory: Some(16 << 30),
        ..Budget::default()
    };
    let svc = |body: &str| format!("services:\n  web:\n    image: x\n    {body}\n");
    for (yaml, want) in [
        (
            "services:\n  a: {image: x, pids_limit: 4096, scale: 2}\n  b: {image: x, pids_limit: 4096, scale: 2}\n  c: {image: x, pids_limit: 4096, scale: 2}\n  d: {image: x, pids_limit: 1, scale: 1}\n".to_string(),
            "BUDGET_EXCEEDED: project: pids limits 24577 over budget.max_project_pids 16384",
        ),
        (
            svc("scale: 10\n    ports: [\"127.0.0.1::80\", \"127.0.0.1::81\", \"3000-3019\"]"),
            "BUDGET_EXCEEDED: project: published ports 220 over budget.max_project_ports 200",
        ),
        (
            svc("scale: 10\n    shm_size: 1g"),
            "BUDGET_EXCEEDED: project: tmpfs and shm 10 GiB over budget.max_project_tmpfs 8 GiB",
        ),
        (
            svc("scale: 9\n    mem_limit: 2g"),
            "BUDGET_EXCEEDED: project: memory limits 18 GiB over budget.max_project_memory 16 GiB",
        ),
        (
            svc("logging: {options: {max-size: 1t, max-file: \"1000\"}}"),
            "BUDGET_EXCEEDED: web: logging max-size 1 TiB over budget.max_log_size 100 MiB, web: logging max-file 1000 over budget.max_log_files 10",
        ),
        (
            svc("logging: {driver: \"\", options: {max-size: \"0x1p30\"}}"),
            "BUDGET_EXCEEDED: web: logging max-size 0x1p30 is not a size the budget reads (write it as 10m, up to budget.max_log_size 100 MiB)",
        ),
        (
            svc("tmpfs: [\"/run:size=1e\"]"),
            "BUDGET_EXCEEDED: web: tmpfs 1 EiB over budget.max_tmpfs_size 1 GiB, project: tmpfs and shm 1 EiB over budget.max_project_tmpfs 8 GiB",
        ),
        (
            svc("tmpfs: [\"/run:size=64m,nr_blocks=1\"]"),
            "BUDGET_EXCEEDED: web: tmpfs nr_blocks=1 is a size in pages the budget does not read (write it as size=64m, up to budget.max_tmpfs_size 1 GiB)",
        ),
        (
            svc("ulimits: {nproc: 1000000}"),
            "BUDGET_EXCEEDED: web: ulimits nproc 1000000 over budget.max_ulimit_nproc 65536",
        ),
    ] {
        check(&yaml, host(), &[want]);
    }
    // An ordinary backend that sets none of it passes: the agent supplies the rest.
    check(
        "services:\n  web: {image: x, tmpfs: [/tmp], logging: {options: {max-size: 10m}}}\n  db: {image: y, shm_size: 256m}\n",
        host(),
        &[],
    );
    // A value from a variable is left to compose's model before the lease.
    let secrets = BTreeSet::from(["SIZE".to_string()]);
    let p = ComposePolicy::new(PROJECT);
    assert!(
        p.findings_file(&svc("shm_size: ${SIZE}"), &|_| None, &secrets)
            .is_empty()
    );
}
