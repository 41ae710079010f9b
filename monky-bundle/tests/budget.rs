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
