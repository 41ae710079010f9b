//! The wire contract as data: the JSON Schemas in `docs/schema/` are generated from the wire
//! types (this test fails when they are stale; `MONKY_BLESS=1` rewrites them), and every body
//! the testkit tenancy answers, and every body the client sends, validates against them.

use std::path::PathBuf;

use monky_agent_proto::{Client, ReportRequest, ReportResult, schemas};
use monky_testkit::tenancy::{
    Desired, FakeTenancy, checkin_request, lease_request, report_request,
};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

fn schema_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/schema")
}

fn schema(name: &str) -> Value {
    schemas().into_iter().find(|(n, _)| *n == name).unwrap().1
}

#[track_caller]
fn assert_valid(name: &str, body: &Value) {
    let validator = jsonschema::validator_for(&schema(name)).unwrap();
    let errors: Vec<String> = validator.iter_errors(body).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{body} does not match {name}: {errors:?}"
    );
}

#[test]
fn committed_schemas_are_current() {
    let bless = std::env::var("MONKY_BLESS").is_ok_and(|v| v == "1");
    for (name, schema) in schemas() {
        let text = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        let path = schema_dir().join(name);
        if bless {
            std::fs::create_dir_all(schema_dir()).unwrap();
            std::fs::write(&path, &text).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            committed,
            text,
            "{} is stale: run MONKY_BLESS=1 cargo test -p monky-agent-proto --all-features --test schema",
            path.display()
        );
    }
}

#[test]
fn the_schemas_reject_what_the_types_reject() {
    assert_valid(
        "checkin-response.json",
        &json!({"env_id": "e", "desired_sha": null, "action": "none"}),
    );
    let bad = json!({"env_id": "e", "action": "reboot"});
    assert!(!jsonschema::is_valid(
        &schema("checkin-response.json"),
        &bad
    ));
    let bad =
        json!({"env_id": "e", "sha": "x", "result": "maybe", "log_tail": "", "containers": []});
    assert!(!jsonschema::is_valid(&schema("report-request.json"), &bad));
}

fn post(t: &FakeTenancy, bearer: Option<&SecretString>, path: &str, body: &Value) -> (u16, Value) {
    let http = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap();
    let mut req = http.post(t.url().join(path).unwrap()).json(body);
    if let Some(b) = bearer {
        req = req.bearer_auth(b.expose_secret());
    }
    let resp = req.send().unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().unwrap_or(Value::Null))
}

#[test]
fn every_tenancy_answer_and_every_client_request_validates() {
    let t = FakeTenancy::builder().start();
    let bearer = t.issue_token("env-s");
    t.set_desired("env-s", Desired::sha("ab".repeat(32)));
    let checkin = checkin_request("env-s");
    // Answers: checkin, lease, and the error envelope in its forms.
    let (status, body) = post(
        &t,
        Some(&bearer),
        "/v1/agent/checkin",
        &serde_json::to_value(&checkin).unwrap(),
    );
    assert_eq!(status, 200);
    assert_valid("checkin-response.json", &body);
    let (status, body) = post(
        &t,
        Some(&bearer),
        "/v1/agent/lease",
        &json!({"env_id": "env-s", "reason": "apply"}),
    );
    assert_eq!(status, 200);
    assert_valid("lease-response.json", &body);
    for (bearer, path, body, want) in [
        (None, "/v1/agent/checkin", json!({"env_id": "env-s"}), 401),
        (
            Some(&bearer),
            "/v1/agent/lease",
            json!({"env_id": "env-other"}),
            403,
        ),
        (
            Some(&bearer),
            "/v1/agent/checkin",
            json!({"nonsense": true}),
            422,
        ),
    ] {
        let (status, body) = post(&t, bearer, path, &body);
        assert_eq!(status, want, "{body}");
        assert_valid("error-envelope.json", &body);
    }

    // Requests: what the client really sends.
    let client = Client::builder(t.url()).build().unwrap();
    client.checkin(&bearer, &checkin).unwrap();
    client.lease(&bearer, &lease_request("env-s")).unwrap();
    let report = ReportRequest {
        sha: Some(monky_agent_proto::Sha::parse(&"ab".repeat(32)).unwrap()),
        log_tail: "x".into(),
        detail: Some("ENV_INCOMPLETE: unresolved: A".into()),
        ..report_request("env-s", ReportResult::Failed)
    };
    client.report(&bearer, &report).unwrap();
    let sent: Vec<(String, Value)> = t
        .requests()
        .into_iter()
        .filter(|r| r.status == Some(200))
        .filter_map(|r| Some((r.path.clone(), r.body?)))
        .collect();
    for (path, want) in [
        ("/v1/agent/checkin", "checkin-request.json"),
        ("/v1/agent/lease", "lease-request.json"),
        ("/v1/agent/report", "report-request.json"),
    ] {
        let bodies: Vec<&Value> = sent
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b)
            .collect();
        assert!(!bodies.is_empty(), "no {path} request recorded");
        for b in bodies {
            assert_valid(want, b);
        }
    }
}
