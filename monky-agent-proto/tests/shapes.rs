//! Peers' values are shapes, not strings: a checkin or lease answer becomes the crate's types
//! (a 64-hex sha, a clamped interval, the request's env) or is refused with its code, and no
//! number a peer sends can make the client panic or wait for ages.

use std::time::{Duration, SystemTime};

use monky_agent_proto::{Client, Error, ErrorKind, MAX_TTL};
use monky_testkit::raw::{RawBody, RawPeer};
use monky_testkit::tenancy::{Endpoint, FakeTenancy, Fault, checkin_request, lease_request};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

const ENV: &str = "env-qa-02";
const SHA: &str = "7a107a107a107a107a107a107a107a107a107a107a107a107a107a107a107a10";

struct Peer {
    fake: FakeTenancy,
    client: Client,
    bearer: SecretString,
}

fn peer() -> Peer {
    let fake = FakeTenancy::builder().start();
    let client = fake.client();
    let bearer = fake.issue_token(ENV);
    Peer {
        fake,
        client,
        bearer,
    }
}

impl Peer {
    /// The checkin answer to a 200 with `body`.
    fn checkin(&self, body: &Value) -> Result<monky_agent_proto::CheckinResponse, Error> {
        self.fake.set_fault(
            Endpoint::Checkin,
            Fault::Status {
                status: 200,
                body: body.to_string(),
            },
        );
        self.client.checkin(&self.bearer, &checkin_request(ENV))
    }

    fn lease(&self, body: &Value) -> Result<monky_agent_proto::LeaseResponse, Error> {
        self.fake.set_fault(
            Endpoint::Lease,
            Fault::Status {
                status: 200,
                body: body.to_string(),
            },
        );
        self.client.lease(&self.bearer, &lease_request(ENV))
    }
}

#[track_caller]
fn assert_invalid(result: Result<impl std::fmt::Debug, Error>, code: &str, what: &str) -> Error {
    let err = result.expect_err(what);
    assert_eq!(err.kind(), ErrorKind::Refused, "{what}: {err}");
    assert_eq!(err.code().map(|c| c.as_str()), Some(code), "{what}: {err}");
    assert!(err.to_string().starts_with(code), "{what}: {err}");
    err
}

#[test]
fn a_desired_sha_that_is_not_64_lowercase_hex_is_checkin_invalid() {
    let p = peer();
    let multibyte_at_12 = format!("{}é{}", &SHA[..12], &SHA[14..]);
    let bad = [
        format!(" {SHA}"),
        format!("{SHA} "),
        format!("{SHA}\n"),
        format!("\u{3000}{SHA}"),
        format!("{SHA}\u{3000}"),
        multibyte_at_12,
        SHA.to_uppercase(),
        SHA[..63].to_string(),
        format!("{SHA}0"),
        format!("../{}", &SHA[3..]),
        String::new(),
    ];
    for sha in &bad {
        let body = json!({"env_id": ENV, "desired_sha": sha, "action": "apply"});
        assert_invalid(p.checkin(&body), "CHECKIN_INVALID", &format!("{sha:?}"));
    }
    let number = json!({"env_id": ENV, "desired_sha": 7, "action": "apply"});
    assert_invalid(p.checkin(&number), "CHECKIN_INVALID", "a number");

    let good = json!({"env_id": ENV, "desired_sha": SHA, "action": "apply"});
    let resp = p.checkin(&good).unwrap();
    let sha = resp.desired_sha().cloned().unwrap();
    assert_eq!((sha.as_str(), sha.short()), (SHA, &SHA[..12]));
    let none = json!({"env_id": ENV, "desired_sha": null, "action": "none"});
    assert_eq!(p.checkin(&none).unwrap().desired_sha(), None);
}

#[test]
fn an_apply_without_a_sha_is_checkin_invalid() {
    let p = peer();
    for body in [
        json!({"env_id": ENV, "action": "apply", "bundle_url": "/v1/agent/bundle/x"}),
        json!({"env_id": ENV, "desired_sha": null, "action": "apply"}),
    ] {
        let err = assert_invalid(p.checkin(&body), "CHECKIN_INVALID", &body.to_string());
        assert!(
            err.to_string().contains("action apply without desired_sha"),
            "{err}"
        );
    }
    // Without a sha, `none` and `down` are still answers.
    for action in ["none", "down"] {
        let body = json!({"env_id": ENV, "action": action});
        assert_eq!(p.checkin(&body).unwrap().action.as_str(), action);
    }
}

#[test]
fn checkin_intervals_are_clamped_to_a_second_and_an_hour() {
    let p = peer();
    let check = |interval: Value, expected: u64| {
        let body = json!({"env_id": ENV, "action": "none", "checkin_interval_s": interval});
        let resp = p.checkin(&body).unwrap_or_else(|e| panic!("{body}: {e}"));
        let got = resp.checkin_interval_s.map(|i| i.get());
        assert_eq!(got, Some(Duration::from_secs(expected)), "{body}");
    };
    check(json!(u64::MAX), 3600);
    check(json!(1_000_000_000_000u64), 3600);
    check(json!(1e30), 3600);
    check(json!(3601), 3600);
    check(json!(60), 60);
    check(json!(1), 1);
    check(json!(0), 1);
    check(json!(-5), 1);
    check(json!(-1e30), 1);
    check(json!(2.5), 2);
    let body = json!({"env_id": ENV, "action": "none", "checkin_interval_s": "60"});
    assert_invalid(p.checkin(&body), "CHECKIN_INVALID", "a string interval");
}

#[test]
fn retry_after_in_seconds_is_clamped_to_an_hour() {
    let p = peer();
    for (sent, expected) in [(u64::MAX, 3600), (1_000_000_000_000, 3600), (7, 7)] {
        p.fake
            .set_fault_times(Endpoint::Checkin, Fault::RetryAfter(sent), Some(1));
        let err = p
            .client
            .checkin(&p.bearer, &checkin_request(ENV))
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Temporary, "{sent}");
        assert_eq!(
            err.retry_after(),
            Some(Duration::from_secs(expected)),
            "{sent}"
        );
    }
}

#[test]
fn retry_after_as_an_http_date_is_honoured_and_clamped() {
    let check = |at: SystemTime, lo: u64, hi: u64| {
        let date = httpdate::fmt_http_date(at);
        let body = r#"{"code": "RATE_LIMITED", "detail": "slow down"}"#;
        let head = format!(
            "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n\
             Retry-After: {date}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let peer = RawPeer::start(head, RawBody::Whole(body.as_bytes().to_vec()));
        let client = Client::builder(peer.url())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let bearer = SecretString::from("s.BBBBBBBBBBBBBBBBBBBBBBBB".to_owned());
        let err = client.checkin(&bearer, &checkin_request(ENV)).unwrap_err();
        let wait = err.retry_after().expect(&date).as_secs();
        assert!((lo..=hi).contains(&wait), "{date}: {wait}");
    };
    let now = SystemTime::now();
    check(now + Duration::from_secs(90), 85, 90);
    check(now + Duration::from_secs(400 * 24 * 3600), 3600, 3600);
    check(now - Duration::from_secs(90), 0, 0);
}

#[test]
fn an_answer_for_another_env_is_refused() {
    let p = peer();
    for env in ["env-other", "", "env-qa-02 ", "ENV-QA-02"] {
        let body = json!({"env_id": env, "desired_sha": SHA, "action": "apply"});
        let err = assert_invalid(p.checkin(&body), "CHECKIN_INVALID", env);
        assert!(err.to_string().contains("env_id"), "{err}");
    }
    let jwt = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln";
    let lease = |env: &str, ttl: Value| {
        json!({"env_id": env, "login_jwt": jwt, "ttl_s": ttl, "mount": "jwt-tenancy",
               "role": "see-env", "addr": null})
    };
    let err = assert_invalid(
        p.lease(&lease("env-other", json!(3600))),
        "LEASE_INVALID",
        "a foreign lease",
    );
    assert!(!format!("{err} {err:?}").contains(jwt), "{err:?}");
    let ok = p.lease(&lease(ENV, json!(3600))).unwrap();
    assert_eq!(ok.login_jwt.expose_secret(), jwt);
}

#[test]
fn a_lease_ttl_of_u64_max_is_clamped() {
    let p = peer();
    let body = json!({"env_id": ENV, "login_jwt": "a.b.c", "ttl_s": u64::MAX,
                      "mount": "jwt-tenancy", "role": "see-env", "addr": null});
    let lease = p.lease(&body).unwrap();
    assert_eq!(lease.ttl(), MAX_TTL);
    let body = json!({"env_id": ENV, "login_jwt": "a.b.c", "ttl_s": -1,
                      "mount": "jwt-tenancy", "role": "see-env", "addr": null});
    assert_invalid(p.lease(&body), "LEASE_INVALID", "a negative ttl");
}
