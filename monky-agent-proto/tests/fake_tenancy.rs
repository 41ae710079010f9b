//! `FakeTenancy` as a peer: grants and JWKS, tenancy's bearer checks against a fake OpenBao,
//! rate buckets on the settable clock, bundle headers and the request log.

use std::time::Duration;

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use monky_agent_proto::{Action, Client, ErrorKind};
use monky_bao_client::BaoClient;
use monky_testkit::bao::FakeBao;
use monky_testkit::peers::Peers;
use monky_testkit::pki::Pki;
use monky_testkit::tenancy::{
    self, Desired, Endpoint, FakeTenancy, Fault, GRANT_AUDIENCE, Rate, RateLimits, checkin_request,
    lease_request,
};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

const ENV: &str = "env-qa-02";
const SHA_7A10: &str = "7a107a107a107a107a107a107a107a107a107a107a107a107a107a107a107a10";

/// The HTTP status of a plain GET.
fn status_of(url: url::Url) -> u16 {
    http().get(url).send().unwrap().status().as_u16()
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
}

/// Call `endpoint` for `env_id`; `Ok(())` or the error's (kind, status, code).
fn call(
    client: &Client,
    bearer: &SecretString,
    endpoint: Endpoint,
    env_id: &str,
) -> Result<(), (ErrorKind, Option<u16>, Option<String>)> {
    tenancy::call(client, bearer, endpoint, env_id)
        .map_err(|e| (e.kind(), e.status(), e.code().map(ToString::to_string)))
}

fn decode_grant(fake: &FakeTenancy, jwt: &SecretString) -> Value {
    let jwks: JwkSet = http().get(fake.jwks_url()).send().unwrap().json().unwrap();
    let kid = jsonwebtoken::decode_header(jwt.expose_secret())
        .unwrap()
        .kid
        .unwrap();
    let jwk = jwks.find(&kid).expect("the grant's kid is in the jwks");
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&[GRANT_AUDIENCE]);
    validation.set_issuer(&[fake.issuer()]);
    validation.set_required_spec_claims(&["exp", "aud", "iss", "sub"]);
    jsonwebtoken::decode::<Value>(
        jwt.expose_secret(),
        &DecodingKey::from_jwk(jwk).unwrap(),
        &validation,
    )
    .unwrap()
    .claims
}

#[test]
fn jwks_verifies_a_minted_grant() {
    let fake = FakeTenancy::builder().start();
    let jwks: Value = http().get(fake.jwks_url()).send().unwrap().json().unwrap();
    let key = &jwks["keys"][0];
    assert_eq!(
        (key["kty"].as_str(), key["crv"].as_str()),
        (Some("EC"), Some("P-256"))
    );
    assert_eq!(
        (key["alg"].as_str(), key["use"].as_str()),
        (Some("ES256"), Some("sig"))
    );
    assert_eq!(key["kid"].as_str(), Some(fake.kid()));
    assert!(
        key.get("d").is_none(),
        "the private part must not be published"
    );

    let grant = fake.mint_grant(ENV);
    let claims = decode_grant(&fake, &grant);
    assert_eq!(claims["sub"], "agent:env-qa-02");
    assert_eq!(claims["env_id"], ENV);
    assert_eq!(claims["kind"], "deploy-grant");
    assert_eq!(
        claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
        3600
    );
    let jti = claims["jti"].as_str().unwrap().to_owned();
    assert_eq!(fake.current_grants(ENV), vec![jti.clone()]);

    // Every grant has its own jti; another fake's key does not verify this fake's grants.
    let second = decode_grant(&fake, &fake.mint_grant(ENV));
    assert_ne!(second["jti"].as_str().unwrap(), jti);
    let other = FakeTenancy::builder().start();
    let other_jwks: JwkSet = http().get(other.jwks_url()).send().unwrap().json().unwrap();
    let wrong_key = DecodingKey::from_jwk(&other_jwks.keys[0]).unwrap();
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&[GRANT_AUDIENCE]);
    assert!(jsonwebtoken::decode::<Value>(grant.expose_secret(), &wrong_key, &validation).is_err());
}

#[test]
fn rate_buckets_per_env_and_endpoint() {
    let fake = FakeTenancy::builder().start();
    let client = fake.client();
    let bearer = fake.issue_token(ENV);
    let other = fake.issue_token("env-other");
    fake.publish_bundle(ENV, "abc", vec![0]);
    fake.publish_bundle("env-other", "abc", vec![0]);
    // (endpoint, requests allowed, Retry-After of the next one, code)
    let cases = [
        (Endpoint::Checkin, 6, 10, "RATE_LIMITED"),
        (Endpoint::Bundle, 10, 6, "RATE_LIMITED"),
        (Endpoint::Report, 30, 2, "RATE_LIMITED"),
        (Endpoint::Lease, 5, 720, "LEASE_RATE_LIMITED"),
    ];
    for (endpoint, allowed, retry_after, code) in cases {
        for i in 0..allowed {
            call(&client, &bearer, endpoint, ENV)
                .unwrap_or_else(|e| panic!("{endpoint:?} #{i}: {e:?}"));
        }
        let (kind, status, got) = call(&client, &bearer, endpoint, ENV).unwrap_err();
        assert_eq!(
            (kind, status, got.as_deref()),
            (ErrorKind::Temporary, Some(429), Some(code))
        );
        let last = fake.requests().pop().unwrap();
        assert_eq!(last.status, Some(429));
        // The other env's bucket is untouched.
        call(&client, &other, endpoint, "env-other").unwrap();
        let retry = raw_retry_after(&fake, &bearer, endpoint);
        assert!(
            (retry_after - 1..=retry_after).contains(&retry),
            "{endpoint:?}: {retry}"
        );
        fake.advance_clock(Duration::from_secs(retry));
        call(&client, &bearer, endpoint, ENV).unwrap();
    }
    assert_eq!(fake.lease_count(ENV), 6);
    assert_eq!(fake.lease_count("env-other"), 1);
}

/// The Retry-After seconds of a rate-limited raw request, to check the header itself.
fn raw_retry_after(fake: &FakeTenancy, bearer: &SecretString, endpoint: Endpoint) -> u64 {
    let url = fake.url();
    let auth = format!("Bearer {}", bearer.expose_secret());
    let resp = match endpoint {
        Endpoint::Bundle => http().get(url.join("v1/agent/bundle/env-qa-02/abc").unwrap()),
        Endpoint::Checkin => http().post(url.join("v1/agent/checkin").unwrap()).json(&checkin_request(ENV)),
        Endpoint::Lease => http().post(url.join("v1/agent/lease").unwrap()).json(&serde_json::json!({"env_id": ENV})),
        Endpoint::Report | Endpoint::Jwks => http()
            .post(url.join("v1/agent/report").unwrap())
            .json(&serde_json::json!({"env_id": ENV, "sha": null, "result": "down", "log_tail": "", "containers": []})),
    }
    .header("Authorization", auth)
    .send()
    .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn limits_are_settable() {
    let fake = FakeTenancy::builder()
        .limits(RateLimits {
            lease: Rate::per_hour(1),
            ..RateLimits::default()
        })
        .start();
    let client = fake.client();
    let bearer = fake.issue_token(ENV);
    call(&client, &bearer, Endpoint::Lease, ENV).unwrap();
    assert_eq!(
        call(&client, &bearer, Endpoint::Lease, ENV).unwrap_err().1,
        Some(429)
    );
    fake.set_limits(RateLimits {
        checkin: Rate::per_minute(1),
        ..RateLimits::default()
    });
    call(&client, &bearer, Endpoint::Lease, ENV).unwrap();
    call(&client, &bearer, Endpoint::Checkin, ENV).unwrap();
    assert_eq!(
        call(&client, &bearer, Endpoint::Checkin, ENV)
            .unwrap_err()
            .1,
        Some(429)
    );
}

#[test]
fn bundle_headers_and_envelopes() {
    let fake = FakeTenancy::builder().start();
    let bearer = fake.issue_token(ENV);
    fake.publish_bundle(ENV, "7a10", b"tar".to_vec());
    let auth = format!("Bearer {}", bearer.expose_secret());
    let resp = http()
        .get(fake.url().join("v1/agent/bundle/env-qa-02/7a10").unwrap())
        .header("Authorization", &auth)
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let h = |name: &str| resp.headers()[name].to_str().unwrap().to_owned();
    assert_eq!(h("content-type"), "application/x-tar");
    assert_eq!(h("cache-control"), "no-store");
    assert_eq!(h("x-bundle-sha"), "7a10");
    assert_eq!(h("x-bundle-sha256"), "7a10");

    // Errors are {code, detail} JSON, also without a bearer and on unknown routes.
    let check = |resp: reqwest::blocking::Response, status: u16, code: &str| {
        assert_eq!(resp.status().as_u16(), status);
        let body: Value = resp.json().unwrap();
        assert_eq!(body["code"], code);
        assert!(body["detail"].is_string());
    };
    let url = |p: &str| fake.url().join(p).unwrap();
    check(
        http()
            .get(url("v1/agent/bundle/env-qa-02/nope"))
            .header("Authorization", &auth)
            .send()
            .unwrap(),
        404,
        "BUNDLE_NOT_FOUND",
    );
    check(
        http()
            .post(url("v1/agent/checkin"))
            .json(&checkin_request(ENV))
            .send()
            .unwrap(),
        401,
        "AGENT_UNAUTHENTICATED",
    );
    check(
        http().get(url("v1/agent/nothing")).send().unwrap(),
        404,
        "NOT_FOUND",
    );
    check(
        http()
            .post(url("v1/agent/report"))
            .header("Authorization", &auth)
            .json(&serde_json::json!({"env_id": ENV, "result": "maybe"}))
            .send()
            .unwrap(),
        422,
        "REQUEST_INVALID",
    );

    let recorded = fake.requests();
    let unauthenticated = &recorded[2];
    assert!(!unauthenticated.had_bearer);
    assert_eq!(unauthenticated.env_id.as_deref(), Some(ENV));
    assert_eq!(recorded[0].env_id.as_deref(), Some(ENV));
    assert!(!format!("{recorded:?}").contains(bearer.expose_secret()));
}

#[test]
fn checkin_follows_desired_state() {
    let fake = FakeTenancy::builder().start();
    let client = fake.client();
    let bearer = fake.issue_token(ENV);
    let checkin = |applied: Option<&str>| {
        let mut req = checkin_request(ENV);
        req.applied_sha = applied.map(|s| monky_agent_proto::Sha::parse(s).unwrap());
        client.checkin(&bearer, &req).unwrap()
    };
    let nothing = checkin(None);
    assert_eq!(
        (nothing.action.as_str(), nothing.desired_sha()),
        ("none", None)
    );
    fake.set_desired(
        ENV,
        Desired {
            checkin_interval_s: Some(15),
            ..Desired::sha(SHA_7A10)
        },
    );
    let apply = checkin(Some(&"3f9c".repeat(16)));
    let Action::Apply { bundle_url, .. } = &apply.action else {
        panic!("{apply:?} is no apply");
    };
    assert_eq!(
        bundle_url,
        &format!("/v1/agent/bundle/env-qa-02/{SHA_7A10}")
    );
    assert_eq!(apply.checkin_interval_s.map(|i| i.as_secs()), Some(15));
    assert_eq!(checkin(None).action.as_str(), "apply");
    assert_eq!(checkin(Some(SHA_7A10)).action.as_str(), "none");
    fake.set_desired(ENV, Desired::down(false));
    let down = checkin(Some(SHA_7A10));
    assert!(
        matches!(
            down.action,
            Action::Down {
                purge_volumes: false,
                ..
            }
        ),
        "{down:?}"
    );
}

/// Tenancy and OpenBao wired to each other the way they are in the mesh.
struct Pair {
    tenancy: FakeTenancy,
    bao: FakeBao,
    client: Client,
    bao_client: BaoClient,
}

fn pair(tls: Option<Pki>) -> Pair {
    let mut peers = Peers::builder();
    if let Some(pki) = &tls {
        peers = peers.tls(pki);
    }
    let Peers { tenancy, bao } = peers.fake();
    let mut builder = BaoClient::builder(bao.url());
    if let Some(pki) = tls {
        builder = builder.ca_bundle_pem(pki.ca_pem.into_bytes());
    }
    let bao_client = builder.build().unwrap();
    let client = Client::builder(tenancy.url())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    Pair {
        tenancy,
        bao,
        client,
        bao_client,
    }
}

impl Pair {
    /// Log in at OpenBao with a grant, as the agent does; the token becomes the bearer.
    fn login(&self, grant: &SecretString) -> SecretString {
        let login = self
            .bao_client
            .login_jwt("jwt-tenancy", "see-env", grant)
            .unwrap();
        assert_eq!(login.metadata.get("env_id").map(String::as_str), Some(ENV));
        SecretString::from(login.token.expose_secret().to_owned())
    }
}

#[test]
fn bearer_checked_against_openbao_end_to_end() {
    let p = pair(None);
    let first = p.login(&p.tenancy.mint_grant(ENV));
    p.client.checkin(&first, &checkin_request(ENV)).unwrap();
    let lookups: Vec<_> = p
        .bao
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/auth/token/lookup")
        .collect();
    assert!(
        !lookups.is_empty() && lookups.iter().all(|r| r.by_root),
        "{lookups:?}"
    );

    // Lease -> login -> a second token; both grants are current.
    let lease = p.client.lease(&first, &lease_request(ENV)).unwrap();
    assert_eq!(
        lease.addr.as_deref(),
        Some(p.bao.url().as_str().trim_end_matches('/'))
    );
    let second = p.login(&lease.login_jwt);
    assert_eq!(p.tenancy.current_grants(ENV).len(), 2);
    for bearer in [&first, &second] {
        call(&p.client, bearer, Endpoint::Report, ENV).unwrap();
    }

    // Env pinning: the token's meta.env_id is not the request's.
    assert_eq!(
        call(&p.client, &second, Endpoint::Checkin, "env-other").unwrap_err(),
        (
            ErrorKind::EnvMismatch,
            Some(403),
            Some("AGENT_ENV_MISMATCH".into())
        )
    );

    // Supersede (kit re-reveal): every token minted from the old grants is refused with 401.
    p.tenancy.supersede(ENV);
    for bearer in [&first, &second] {
        assert_eq!(
            call(&p.client, bearer, Endpoint::Checkin, ENV).unwrap_err(),
            (
                ErrorKind::Unauthenticated,
                Some(401),
                Some("AGENT_UNAUTHENTICATED".into())
            )
        );
    }
    // A fresh bootstrap grant works again; revoking its token at OpenBao makes it unknown.
    let third = p.login(&p.tenancy.mint_grant(ENV));
    call(&p.client, &third, Endpoint::Checkin, ENV).unwrap();
    assert!(p.bao.revoke_tokens_for_env(ENV) > 0);
    assert_eq!(
        call(&p.client, &third, Endpoint::Checkin, ENV)
            .unwrap_err()
            .1,
        Some(401)
    );
}

#[test]
fn openbao_over_tls_with_its_ca() {
    let pki = Pki::for_host("127.0.0.1");
    let p = pair(Some(pki));
    let bearer = p.login(&p.tenancy.mint_grant(ENV));
    p.client.checkin(&bearer, &checkin_request(ENV)).unwrap();
}

#[test]
fn builder_bao_and_openbao_down() {
    // The builder form, with a token OpenBao knows without a login.
    let issuer = FakeTenancy::builder().start();
    let bao = FakeBao::builder().jwks_url(issuer.jwks_url()).start();
    let tenancy = FakeTenancy::builder()
        .bao(bao.url(), None, bao.root_token())
        .start();
    let _ = tenancy.mint_grant(ENV);
    let jti = tenancy.current_grants(ENV).pop().unwrap();
    let bearer = SecretString::from("s.0123456789abcdefghijKLMN".to_owned());
    bao.insert_token(&bearer, ENV, &jti);
    let client = Client::builder(tenancy.url()).build().unwrap();
    call(&client, &bearer, Endpoint::Checkin, ENV).unwrap();

    // With OpenBao gone, tenancy cannot verify anything: a temporary failure, not a 401.
    drop(bao);
    let (kind, status, code) = call(&client, &bearer, Endpoint::Checkin, ENV).unwrap_err();
    assert_eq!(
        (kind, status, code.as_deref()),
        (ErrorKind::Temporary, Some(503), Some("OPENBAO_UNAVAILABLE"))
    );
}

#[test]
fn faults_are_counted_and_recorded() {
    let fake = FakeTenancy::builder().start();
    let client = fake.client();
    let bearer = fake.issue_token(ENV);
    fake.set_fault_times(
        Endpoint::Report,
        Fault::Status {
            status: 500,
            body: "{}".into(),
        },
        Some(2),
    );
    let statuses: Vec<_> = (0..3)
        .map(|_| {
            call(&client, &bearer, Endpoint::Report, ENV)
                .err()
                .and_then(|e| e.1)
        })
        .collect();
    assert_eq!(statuses, vec![Some(500), Some(500), None]);
    fake.set_fault(Endpoint::Checkin, Fault::DropConnection);
    assert!(call(&client, &bearer, Endpoint::Checkin, ENV).is_err());
    let last = fake.requests().pop().unwrap();
    assert_eq!(
        (last.endpoint, last.status),
        (Some(Endpoint::Checkin), None)
    );
    // Reports that failed by fault were not stored; the one that got through was.
    assert_eq!(fake.reports(ENV).len(), 1);
    // The JWKS endpoint takes faults too (for OpenBao-side tests).
    fake.set_fault_times(
        Endpoint::Jwks,
        Fault::Status {
            status: 503,
            body: "down".into(),
        },
        Some(1),
    );
    assert_eq!(status_of(fake.jwks_url()), 503);
    assert_eq!(status_of(fake.jwks_url()), 200);
}

#[test]
fn body_faults_cut_reset_and_flood_a_bundle_download() {
    let fake = FakeTenancy::builder().start();
    let client = fake.client();
    let bearer = fake.issue_token(ENV);
    let body: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    fake.publish_bundle(ENV, "7a10", body.clone());
    let url = "/v1/agent/bundle/env-qa-02/7a10";

    // fault, what the client makes of it (bytes read, or the error's kind), and a word its
    // error chain must carry (a cut is an early end of file, a reset is a reset).
    let check = |fault: Option<Fault>, expected: Result<usize, ErrorKind>, says: &str| {
        if let Some(f) = fault.clone() {
            fake.set_fault_times(Endpoint::Bundle, f, Some(1));
        }
        let started = std::time::Instant::now();
        let got = client
            .bundle(&bearer, url)
            .map(|d| d.bytes.len())
            .map_err(|e| {
                let mut chain = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    chain.push_str(&format!(": {s}"));
                    source = s.source();
                }
                assert!(chain.contains(says), "{fault:?}: {chain}");
                e.kind()
            });
        assert_eq!(got, expected, "{fault:?}");
        // A cut ends the exchange at once rather than leaving the client to its timeout.
        assert!(started.elapsed() < Duration::from_secs(4), "{fault:?}");
    };
    check(None, Ok(body.len()), "");
    check(
        Some(Fault::Truncate { keep: 1000 }),
        Err(ErrorKind::Temporary),
        "end of file",
    );
    check(
        Some(Fault::Reset { keep: 1000 }),
        Err(ErrorKind::Temporary),
        "reset",
    );
    check(
        Some(Fault::Truncate { keep: 0 }),
        Err(ErrorKind::Temporary),
        "EOF",
    );
    // The connection after a cut is a new one and works.
    check(None, Ok(body.len()), "");
    for chunked in [false, true] {
        check(
            Some(Fault::LargeBody {
                len: 100 * 1024 * 1024,
                chunked,
            }),
            Err(ErrorKind::Refused),
            "BUNDLE_TOO_LARGE",
        );
    }

    // Requests carry their arrival time, in order.
    let at: Vec<_> = fake.requests().iter().map(|r| r.at).collect();
    assert_eq!(at.len(), 7);
    let mut sorted = at.clone();
    sorted.sort();
    assert_eq!(at, sorted);
}
