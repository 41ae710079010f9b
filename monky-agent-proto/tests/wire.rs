//! Round trips of the protocol's literal JSON examples through the wire types.

use monky_agent_proto::{
    Action, CheckinRequest, CheckinResponse, ErrorCode, ErrorEnvelope, Hold, LeaseRequest,
    LeaseResponse, ReportRequest, ReportResult, is_retired_lease_shape,
};
use secrecy::ExposeSecret;
use serde::Serialize;
use serde::de::DeserializeOwned;

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The example without the whitespace between tokens, keys kept in their written order.
fn minified(text: &str) -> String {
    let (mut out, mut in_string, mut escaped) = (String::new(), false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_whitespace() {
            out.push(c);
        }
    }
    out
}

/// Parse the fixture, serialize it back and demand the very same bytes (modulo whitespace).
fn round_trip<T: Serialize + DeserializeOwned>(name: &str) -> T {
    let text = fixture(name);
    let parsed: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        serde_json::to_string(&parsed).unwrap(),
        minified(&text),
        "{name}"
    );
    parsed
}

#[test]
fn checkin_request_example_round_trips_byte_for_byte() {
    let req: CheckinRequest = round_trip("checkin_request.json");
    // The documented example elides the sha ("3f9c…"); a request carries all 64 digits.
    assert_eq!(
        req.applied_sha.as_ref().map(|s| s.short()),
        Some("3f9c2e1b8d7a")
    );
    assert_eq!(req.host.free_bytes, Some(61_234_567_890));
    assert_eq!(req.containers[0].health.as_deref(), Some("healthy"));

    let first: CheckinRequest = round_trip("checkin_request_first.json");
    assert_eq!(first.applied_sha, None);
    assert_eq!(first.host.docker, None);
    assert!(first.host.laptop_mode);
}

#[test]
fn checkin_response_example_round_trips() {
    let resp: CheckinResponse = round_trip("checkin_response.json");
    let Action::Apply { bundle_url, .. } = &resp.action else {
        panic!("{resp:?} is no apply");
    };
    assert_eq!(
        bundle_url,
        "/v1/agent/bundle/env-qa-02/7a10e5c2d9b84f3a1c6e0b7d2f9a4c8e1b5d3f7a9c2e4b6d8f0a1c3e5b7d9f2a"
    );
    // The protocol's example abbreviates the sha; the fixture spells it out, since a sha that
    // is not 64 lowercase hex digits does not decode.
    assert_eq!(resp.desired_sha().map(|s| s.short()), Some("7a10e5c2d9b8"));
    let vault = resp.vault.unwrap();
    assert_eq!(vault.mount.as_deref(), Some("monky"));
    assert_eq!(vault.auth_role.as_deref(), Some("see-env"));
}

#[test]
fn lease_shapes() {
    let req: LeaseRequest = round_trip("lease_request.json");
    assert_eq!(req.reason, "apply");
    // Tenancy's own AgentLease is just {env_id}; the fake must accept it.
    let bare: LeaseRequest = serde_json::from_str(&fixture("lease_request_tenancy.json")).unwrap();
    assert_eq!(bare.env_id, "env-qa-02");

    let resp: LeaseResponse = round_trip("lease_response.json");
    assert_eq!(resp.login_jwt.expose_secret(), "eyJ…");
    assert_eq!(
        resp.addr.as_deref(),
        Some("https://bao.cbs.tikali.net:8200")
    );

    let approle: serde_json::Value =
        serde_json::from_str(&fixture("lease_response_approle.json")).unwrap();
    assert!(is_retired_lease_shape(&approle));
    assert!(!is_retired_lease_shape(
        &serde_json::from_str(&fixture("lease_response.json")).unwrap()
    ));
}

#[test]
fn report_request_examples_round_trip_and_leave_out_an_absent_detail() {
    let failed: ReportRequest = round_trip("report_request.json");
    assert_eq!(failed.result, ReportResult::Applied);
    assert_eq!(
        failed.detail.as_deref(),
        Some("ENV_INCOMPLETE: unresolved: SEE_ADMIN_TOKEN")
    );

    let heartbeat: ReportRequest = round_trip("report_request_heartbeat.json");
    assert_eq!(heartbeat.detail, None);
    assert!(
        !serde_json::to_string(&heartbeat)
            .unwrap()
            .contains("detail")
    );
}

/// The hold is an optional field: absent from a body without one (so today's tenancy reads
/// the same bytes as before), present with one, and a body without it still decodes.
#[test]
fn the_hold_is_an_optional_field_of_checkin_and_report() {
    let heartbeat: ReportRequest = round_trip("report_request_heartbeat.json");
    assert_eq!(heartbeat.hold, None);
    assert!(!serde_json::to_string(&heartbeat).unwrap().contains("hold"));
    let held = ReportRequest {
        hold: Some(Hold {
            reason: Some("db restore".into()),
            since: 1_764_600_000,
            until: None,
        }),
        ..heartbeat
    };
    let v = serde_json::to_value(&held).unwrap();
    assert_eq!(
        v["hold"],
        serde_json::json!({"reason": "db restore", "since": 1_764_600_000u64})
    );
    assert_eq!(v["result"], "applied", "the result stays one tenancy knows");
    let back: ReportRequest = serde_json::from_value(v).unwrap();
    assert_eq!(back, held);

    let checkin: CheckinRequest = round_trip("checkin_request.json");
    assert_eq!(checkin.hold, None);
    assert!(!serde_json::to_string(&checkin).unwrap().contains("hold"));
}

#[test]
fn error_envelope_example_round_trips() {
    let env: ErrorEnvelope = round_trip("error_env_mismatch.json");
    assert_eq!(env.code, ErrorCode::AgentEnvMismatch);
}

#[test]
fn unknown_enum_values_are_errors() {
    let check = |text: &str| {
        let value = fixture("checkin_response.json").replace(r#""action": "apply""#, text);
        assert!(
            serde_json::from_str::<CheckinResponse>(&value).is_err(),
            "{text}"
        );
    };
    check(r#""action": "reboot""#);
    check(r#""action": "Apply""#);
    check(r#""action": null"#);
    let report = fixture("report_request.json").replace(r#""applied""#, r#""skipped""#);
    assert!(serde_json::from_str::<ReportRequest>(&report).is_err());
}

#[test]
fn unknown_response_fields_are_ignored() {
    let text = fixture("checkin_response.json").replacen('{', r#"{"future": {"a": [1, 2]}, "#, 1);
    let resp: CheckinResponse = serde_json::from_str(&text).unwrap();
    assert_eq!(resp.env_id, "env-qa-02");
    let lease = fixture("lease_response.json").replacen('{', r#"{"lease_id": "x", "#, 1);
    assert!(serde_json::from_str::<LeaseResponse>(&lease).is_ok());
}

mod prop {
    use monky_agent_proto::{ContainerStatus, ErrorCode, ReportRequest, ReportResult};
    use proptest::prelude::*;

    fn result() -> impl Strategy<Value = ReportResult> {
        prop_oneof![
            Just(ReportResult::Applied),
            Just(ReportResult::Failed),
            Just(ReportResult::Down)
        ]
    }

    proptest! {
        #[test]
        fn any_error_code_string_survives(code in "\\PC{0,40}") {
            let parsed = ErrorCode::from(code.as_str());
            prop_assert_eq!(parsed.as_str(), code.as_str());
            let back: ErrorCode = serde_json::from_str(&serde_json::to_string(&parsed).unwrap()).unwrap();
            prop_assert_eq!(back, parsed);
        }

        #[test]
        fn reports_round_trip(
            env_id in "[a-z0-9-]{1,20}",
            sha in proptest::option::of("[0-9a-f]{64}"),
            result in result(),
            log_tail in "\\PC{0,200}",
            detail in proptest::option::of("\\PC{0,60}"),
            health in proptest::option::of("[a-z]{0,10}"),
        ) {
            let report = ReportRequest {
                env_id,
                sha: sha.map(|s| monky_agent_proto::Sha::parse(&s).unwrap()),
                result,
                log_tail,
                containers: vec![ContainerStatus { name: "c".into(), state: "running".into(), health }],
                detail,
                hold: None,
            };
            let json = serde_json::to_string(&report).unwrap();
            prop_assert_eq!(json.contains("\"detail\""), report.detail.is_some());
            let back: ReportRequest = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(back, report);
        }
    }
}
