//! Properties of decoding tenancy's answers: whatever status and body come back, the client does
//! not panic and does not misread. A valid answer decodes to what was sent; anything else is a
//! classified error that keeps the status and tenancy's code and never quotes the bearer.

use std::time::Duration;

use monky_agent_proto::{
    Action, CheckinInterval, CheckinResponse, Client, ErrorEnvelope, ErrorKind, LeaseResponse, Sha,
    VaultInfo, is_retired_lease_shape,
};
use monky_testkit::tenancy::{Endpoint, FakeTenancy, Fault, checkin_request};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

const BEARER: &str = "hvs.decode-props-bearer-0123456789";

fn text() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9/._-]{0,20}", "\\PC{0,20}", any::<String>()]
}

fn checkin_response() -> impl Strategy<Value = CheckinResponse> {
    let vault = (
        prop::option::of(text()),
        prop::option::of(text()),
        prop::option::of(text()),
        prop::option::of(text()),
        prop::option::of(text()),
    )
        .prop_map(|(addr, mount, prefix, auth_mount, auth_role)| VaultInfo {
            addr,
            mount,
            prefix,
            auth_mount,
            auth_role,
        });
    let sha = || "[0-9a-f]{64}".prop_map(|s| Sha::parse(&s).unwrap());
    let action = prop_oneof![
        (sha(), text()).prop_map(|(sha, bundle_url)| Action::Apply { sha, bundle_url }),
        prop::option::of(sha()).prop_map(|desired| Action::None { desired }),
        (any::<bool>(), prop::option::of(sha())).prop_map(|(purge_volumes, desired)| {
            Action::Down {
                purge_volumes,
                desired,
            }
        }),
    ];
    (
        prop_oneof![3 => Just("env-a".to_string()), 1 => text()],
        action,
        prop::option::of(any::<u64>().prop_map(CheckinInterval::from_secs)),
        prop::option::of(vault),
    )
        .prop_map(|(env_id, action, interval, vault)| CheckinResponse {
            env_id,
            action,
            checkin_interval_s: interval,
            vault,
        })
}

/// Any JSON value, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        text().prop_map(Value::from),
        prop::sample::select(vec!["apply", "none", "down", "reboot", "APPLY", ""])
            .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    prop::sample::select(vec![
                        "env_id",
                        "desired_sha",
                        "action",
                        "purge_volumes",
                        "bundle_url",
                        "checkin_interval_s",
                        "vault",
                        "code",
                        "detail",
                        "login_jwt",
                        "wrapping_token",
                        "role_id",
                    ])
                    .prop_map(str::to_string),
                    text(),
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Bodies tenancy, a proxy in front of it, or a broken deployment might send.
fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => checkin_response().prop_map(|r| serde_json::to_string(&r).unwrap()),
        2 => (text(), text()).prop_map(|(code, detail)| json!({"code": code, "detail": detail}).to_string()),
        2 => json_value().prop_map(|v| v.to_string()),
        1 => checkin_response().prop_flat_map(|r| {
            // A valid answer with one key's value swapped for anything.
            let v = serde_json::to_value(&r).unwrap();
            let keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            (Just(v), prop::sample::select(keys), json_value()).prop_map(|(mut v, k, x)| {
                v[&k] = x;
                v.to_string()
            })
        }),
        1 => any::<String>(),
        1 => Just(String::new()),
    ]
}

fn status() -> impl Strategy<Value = u16> {
    prop_oneof![
        3 => Just(200u16),
        4 => prop::sample::select(vec![201u16, 202, 203, 206, 400, 401, 403, 404, 409, 422, 429, 500, 502, 503, 504]),
        // No 1xx (an interim answer, not a reply) and no 3xx (a redirect with no Location).
        2 => 400u16..600,
    ]
}

#[test]
fn any_checkin_answer_is_decoded_or_classified() {
    let tenancy = FakeTenancy::builder().start();
    let client = Client::builder(tenancy.url())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let bearer = SecretString::from(BEARER);
    let req = checkin_request("env-a");
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    runner
        .run(&(status(), body()), |(status, body)| {
            tenancy.set_fault(
                Endpoint::Checkin,
                Fault::Status {
                    status,
                    body: body.clone(),
                },
            );
            let answer = client.checkin(&bearer, &req);
            // An answer for another env than the request's is as invalid as a malformed one.
            let sent = serde_json::from_str::<CheckinResponse>(&body)
                .ok()
                .filter(|r| r.env_id == req.env_id);
            match answer {
                Ok(resp) => {
                    prop_assert!((200..300).contains(&status), "{status} decoded");
                    prop_assert_eq!(Some(resp), sent);
                }
                Err(e) => {
                    let shown = format!("{e} {e:?}");
                    prop_assert!(!shown.contains(BEARER), "{shown}");
                    if (200..300).contains(&status) {
                        prop_assert!(sent.is_none(), "a valid answer was refused: {e}");
                        if serde_json::from_str::<Value>(&body).is_ok() {
                            prop_assert_eq!(e.code().map(|c| c.as_str()), Some("CHECKIN_INVALID"));
                        }
                    } else {
                        prop_assert_eq!(e.status(), Some(status));
                        let envelope = serde_json::from_str::<Value>(&body).ok();
                        if let Some(code) = envelope.as_ref().and_then(|v| v["code"].as_str()) {
                            prop_assert_eq!(e.code().map(|c| c.as_str()), Some(code));
                        }
                        if status == 429 || status >= 500 {
                            prop_assert_eq!(e.kind(), ErrorKind::Temporary);
                        }
                        if status == 401 && envelope.is_some() {
                            prop_assert_eq!(e.kind(), ErrorKind::Unauthenticated);
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn checkin_answers_round_trip(resp in checkin_response()) {
        let text = serde_json::to_string(&resp).unwrap();
        prop_assert_eq!(serde_json::from_str::<CheckinResponse>(&text).unwrap(), resp);
    }

    #[test]
    fn any_json_decodes_or_is_refused_without_panic(v in json_value()) {
        let text = v.to_string();
        let _ = serde_json::from_str::<CheckinResponse>(&text);
        let _ = serde_json::from_str::<ErrorEnvelope>(&text);
        if let Ok(lease) = serde_json::from_str::<LeaseResponse>(&text) {
            // The grant never shows in a debug print of the lease.
            let jwt = lease.login_jwt.expose_secret().to_string();
            let placeholder = format!("{:?}", SecretString::from(""));
            let shown = format!("{:?}", lease.login_jwt);
            if !placeholder.contains(&jwt) {
                prop_assert!(!shown.contains(&jwt), "{}", shown);
            }
        }
        // Either retired key marks the AppRole shape; nothing else does.
        let retired = v.as_object().is_some_and(|o| o.contains_key("wrapping_token") || o.contains_key("role_id"));
        prop_assert_eq!(is_retired_lease_shape(&v), retired);
    }

    #[test]
    fn an_unknown_action_is_an_error_not_a_default(action in "[a-zA-Z]{0,8}") {
        let mut v = serde_json::to_value(CheckinResponse {
            env_id: "e".into(),
            action: Action::None { desired: Some(Sha::parse(&"ab".repeat(32)).unwrap()) },
            checkin_interval_s: None,
            vault: None,
        })
        .unwrap();
        v["action"] = Value::from(action.clone());
        let known = ["apply", "none", "down"].contains(&action.as_str());
        prop_assert_eq!(serde_json::from_value::<CheckinResponse>(v).is_ok(), known);
    }
}
