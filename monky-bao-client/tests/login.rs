//! JWT login against the fake's `jwt-tenancy`/`see-env` role, and token upkeep: lookup, renew
//! (capped at the max TTL), revoke, expiry, and the error forms of each.

mod common;

use std::time::Duration;

use common::{Setup, assert_hidden, unix_now};
use monky_bao_client::{BaoClient, Error, ErrorKind, Token, TokenShape};
use monky_testkit::bao::{FakeBao, Fault};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

const DAY: u64 = 24 * 3600;

#[test]
fn login_maps_the_grant_into_token_metadata() {
    let s = Setup::start();
    let claims = s.issuer.claims("env-qa-02");
    let login = s
        .client
        .login_jwt("jwt-tenancy", "see-env", &s.issuer.sign(&claims))
        .unwrap();
    let token = login.token.expose_secret();
    assert_eq!(login.token.shape(), TokenShape::Service);
    assert_eq!(token.len(), 26, "s. + 24 base62");
    assert!(token[2..].chars().all(|c| c.is_ascii_alphanumeric()));
    assert_eq!(login.ttl, Duration::from_secs(DAY));
    assert!(login.renewable);
    assert_eq!(login.policies, ["see-env"]);
    assert_eq!(login.token_type, "service");
    assert_eq!(login.accessor.len(), 24);
    assert_eq!(login.metadata["env_id"], "env-qa-02");
    assert_eq!(login.metadata["grant_jti"], claims["jti"].as_str().unwrap());
    assert_eq!(login.metadata["role"], "see-env");
    assert!(
        !format!("{login:?}").contains(token),
        "Login's Debug hides the token"
    );

    let info = s.client.lookup_self(&login.token).unwrap();
    assert!(info.ttl <= Duration::from_secs(DAY) && info.ttl >= Duration::from_secs(DAY - 10));
    assert_eq!(info.creation_ttl, Duration::from_secs(DAY));
    assert_eq!(info.explicit_max_ttl, Duration::ZERO);
    assert!((info.creation_time as i64 - unix_now()).abs() < 10);
    assert!(
        info.expire_time
            .as_deref()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert_eq!(info.meta, login.metadata);
    assert_eq!(info.accessor, login.accessor);
    assert_eq!(info.entity_id, login.entity_id);
    assert_eq!(info.policies, ["see-env"]);
    assert_eq!(info.token_type, "service");

    // Tenancy's view of the bearer, with the root token.
    let seen = s
        .client
        .lookup_token(&s.root(), &SecretString::from(token.to_owned()))
        .unwrap();
    assert_eq!(seen.meta["env_id"], "env-qa-02");
    assert_eq!(seen.meta["grant_jti"], login.metadata["grant_jti"]);
}

#[test]
fn one_entity_per_env_and_no_jti_replay_state() {
    let s = Setup::start();
    let grant = s.issuer.grant("env-a");
    let first = s
        .client
        .login_jwt("jwt-tenancy", "see-env", &grant)
        .unwrap();
    let again = s
        .client
        .login_jwt("jwt-tenancy", "see-env", &grant)
        .unwrap();
    assert_ne!(first.token.expose_secret(), again.token.expose_secret());
    assert_eq!(first.entity_id, again.entity_id);
    let other = s
        .client
        .login_jwt("jwt-tenancy", "see-env", &s.issuer.grant("env-b"))
        .unwrap();
    assert_ne!(first.entity_id, other.entity_id);
    assert_eq!(s.bao.live_tokens_for_env("env-a"), 2);
}

/// Logs in with `jwt` and expects OpenBao's 400 with exactly `expected` as its only error.
fn check_rejected(s: &Setup, role: &str, jwt: &SecretString, expected: &str) {
    let err = s.client.login_jwt("jwt-tenancy", role, jwt).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LoginRejected, "{err}");
    assert_eq!(err.status(), Some(400));
    assert_eq!(err.errors(), [expected]);
    assert!(matches!(err, Error::LoginRejected { .. }));
    assert_hidden(&err, jwt.expose_secret());
}

#[test]
fn login_rejections_carry_openbaos_text() {
    let s = Setup::start();
    let with = |patch: Value| {
        let mut claims = s.issuer.claims("env-a");
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                claims.as_object_mut().unwrap().remove(k);
            } else {
                claims[k] = v.clone();
            }
        }
        s.issuer.sign(&claims)
    };
    check_rejected(
        &s,
        "see-env",
        &s.issuer.sign_forged(&s.issuer.claims("env-a")),
        "error validating token: error verifying token signature: failed to verify id token \
         signature",
    );
    check_rejected(
        &s,
        "see-env",
        &with(json!({"aud": "openbao-other"})),
        "error validating token: invalid audience (aud) claim: audience claim does not match \
         any expected audience",
    );
    check_rejected(
        &s,
        "see-env",
        &with(json!({"aud": null})),
        "error validating token: invalid audience (aud) claim: audience claim does not match \
         any expected audience",
    );
    check_rejected(
        &s,
        "see-env",
        &with(json!({"exp": unix_now() - 120})),
        "error validating token: invalid expiration time (exp) claim: token is expired",
    );
    check_rejected(
        &s,
        "see-env",
        &with(json!({"kind": "bootstrap"})),
        "error validating claims: claim \"kind\" does not match any associated bound claim values",
    );
    check_rejected(
        &s,
        "see-env",
        &with(json!({"kind": null})),
        "error validating claims: claim \"kind\" is missing",
    );
    check_rejected(
        &s,
        "see-env",
        &with(json!({"env_id": null})),
        "claim \"env_id\" not found in token",
    );
    check_rejected(
        &s,
        "other-role",
        &s.issuer.grant("env-a"),
        "role \"other-role\" could not be found",
    );
    check_rejected(
        &s,
        "see-env",
        &SecretString::from("not-a-jwt".to_owned()),
        "error validating token: malformed token",
    );
    assert_eq!(s.bao.live_tokens_for_env("env-a"), 0);
}

#[test]
fn audience_list_and_exp_leeway_accepted() {
    let s = Setup::start();
    let mut claims = s.issuer.claims("env-a");
    claims["aud"] = json!(["someone-else", "openbao-see-env"]);
    claims["exp"] = json!(unix_now() - 30); // inside the 60 s leeway
    let login = s
        .client
        .login_jwt("jwt-tenancy", "see-env", &s.issuer.sign(&claims));
    assert!(login.is_ok(), "{login:?}");
}

#[test]
fn grant_expires_by_the_fakes_clock() {
    let s = Setup::start();
    let grant = s.issuer.grant("env-a"); // exp in one hour
    s.bao.advance_clock(Duration::from_secs(3600 + 61));
    let err = s
        .client
        .login_jwt("jwt-tenancy", "see-env", &grant)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LoginRejected);
    assert!(err.errors()[0].ends_with("token is expired"), "{err}");
}

#[test]
fn jwks_cached_and_refetched_on_unknown_kid() {
    let s = Setup::start();
    s.login("env-a");
    s.login("env-a");
    assert_eq!(s.issuer.fetches(), 1, "cached after the first login");
    s.issuer.rotate("key-2");
    s.login("env-a");
    assert_eq!(s.issuer.fetches(), 2, "refetched for the unknown kid");
    s.login("env-a");
    assert_eq!(s.issuer.fetches(), 2);
    assert_eq!(s.bao.jwks_fetches(), 2);
}

#[test]
fn renew_extends_and_is_capped_by_the_max_ttl() {
    let s = Setup::start();
    let token = s.login("env-a");

    let renewal = s
        .client
        .renew_self(&token, Some(Duration::from_secs(3600)))
        .unwrap();
    assert_eq!(renewal.ttl, Duration::from_secs(3600));
    assert!(renewal.warnings.is_empty());
    assert!(renewal.renewable);
    let ttl = s.client.lookup_self(&token).unwrap().ttl;
    assert!(ttl <= Duration::from_secs(3600) && ttl > Duration::from_secs(3590));

    // No increment: the role's TTL.
    let renewal = s.client.renew_self(&token, None).unwrap();
    assert_eq!(renewal.ttl, Duration::from_secs(DAY));

    // Renewed every 23 h, the token lives until its 30 day max; 7 h before it, a 24 h
    // renewal is capped with OpenBao's warning.
    for _ in 0..30 {
        s.bao.advance_clock(Duration::from_secs(23 * 3600));
        let renewal = s.client.renew_self(&token, None).unwrap();
        assert_eq!(renewal.ttl, Duration::from_secs(DAY));
        assert!(renewal.warnings.is_empty());
    }
    s.bao.advance_clock(Duration::from_secs(23 * 3600)); // 713 h of 720 h
    let renewal = s
        .client
        .renew_self(&token, Some(Duration::from_secs(DAY)))
        .unwrap();
    let seven_hours = Duration::from_secs(7 * 3600);
    assert!(
        renewal.ttl <= seven_hours && renewal.ttl > seven_hours - Duration::from_secs(10),
        "{renewal:?}"
    );
    assert_eq!(renewal.warnings.len(), 1, "{renewal:?}");
    let warning = &renewal.warnings[0];
    let max = warning
        .strip_prefix("TTL of \"24h0m0s\" exceeded the effective max_ttl of \"")
        .and_then(|w| w.strip_suffix("\"; TTL value is capped accordingly"))
        .unwrap_or_else(|| panic!("{warning}"));
    assert!(max == "7h0m0s" || max.starts_with("6h59m"), "{warning}");

    // Past the max TTL the token is gone.
    s.bao.advance_clock(seven_hours + Duration::from_secs(1));
    let err = s.client.renew_self(&token, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    assert_eq!(err.errors(), ["permission denied"]);
}

#[test]
fn revoked_token_is_refused() {
    // A policy that grants revoke-self (the deployment's does not).
    let s = Setup::with(|b| b.revoke_self_allowed(true));
    let token = s.login("env-a");
    s.client.revoke_self(&token).unwrap();
    assert_eq!(s.bao.live_tokens_for_env("env-a"), 0);
    let err = s.client.lookup_self(&token).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    assert_eq!(err.status(), Some(403));
    assert_eq!(err.errors(), ["permission denied"]);
    assert!(matches!(
        err,
        Error::PermissionDenied {
            multi_error: false,
            ..
        }
    ));
    assert_hidden(&err, token.expose_secret());
    let root_view = s
        .client
        .lookup_token(
            &s.root(),
            &SecretString::from(token.expose_secret().to_owned()),
        )
        .unwrap_err();
    assert_eq!(root_view.errors(), ["bad token"]);
}

#[test]
fn expired_and_env_revoked_tokens_are_refused() {
    let s = Setup::start();
    let a = s.login("env-a");
    let b = s.login("env-b");
    assert_eq!(s.bao.revoke_tokens_for_env("env-b"), 1);
    let err = s.client.lookup_self(&b).unwrap_err();
    assert_eq!(err.errors(), ["permission denied"]);
    s.client.lookup_self(&a).unwrap();

    s.bao.advance_clock(Duration::from_secs(DAY + 1));
    let err = s.client.lookup_self(&a).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    assert_eq!(err.errors(), ["permission denied"]);
}

#[test]
fn revoke_self_denied_by_policy_is_the_acl_form() {
    let issuer = common::Issuer::start();
    let bao = FakeBao::builder()
        .jwks_url(issuer.jwks_url())
        .revoke_self_allowed(false)
        .start();
    let client = BaoClient::builder(bao.url()).build().unwrap();
    let token = client
        .login_jwt("jwt-tenancy", "see-env", &issuer.grant("env-a"))
        .unwrap()
        .token;
    let err = client.revoke_self(&token).unwrap_err();
    common::assert_acl_denied(&err);
    client.lookup_self(&token).unwrap();
}

#[test]
fn hvs_tokens_work_too() {
    let s = Setup::start();
    let value = "hvs.CAESIJ3xq0Zk2nXcQ8m1pR4sT6uV7wY9aB0cD1eF2gH3iJ4k";
    s.bao
        .insert_token(&SecretString::from(value.to_owned()), "env-a", "jti-1");
    let token = Token::new(value.to_owned());
    assert_eq!(token.shape(), TokenShape::Service);
    let info = s.client.lookup_self(&token).unwrap();
    assert_eq!(info.meta["grant_jti"], "jti-1");
}

#[test]
fn sealed_and_server_faults_are_temporary() {
    let s = Setup::start();
    let grant = s.issuer.grant("env-a");
    let login = || s.client.login_jwt("jwt-tenancy", "see-env", &grant);

    s.bao.set_fault("auth/jwt-tenancy/login", Fault::Sealed);
    let err = login().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Temporary);
    assert_eq!(err.status(), Some(503));
    assert_eq!(err.errors(), ["Vault is sealed"]);
    assert!(matches!(err, Error::Sealed { .. }), "{err}");
    assert_hidden(&err, grant.expose_secret());
    s.bao.clear_faults();

    let check = |status: u16, body: &str, errors: &[&str]| {
        s.bao.clear_faults();
        s.bao.set_fault(
            "/v1/auth/",
            Fault::Status {
                status,
                body: body.to_owned(),
            },
        );
        let err = login().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Temporary, "{status} {body}: {err}");
        assert_eq!(err.errors(), errors);
    };
    check(500, r#"{"errors":["internal error"]}"#, &["internal error"]);
    check(502, "<html>bad gateway</html>", &[]);
    check(
        429,
        r#"{"errors":["rate limit quota exceeded"]}"#,
        &["rate limit quota exceeded"],
    );
    check(200, "<html>captive portal</html>", &[]);
    s.bao.clear_faults();
    login().unwrap();
}

#[test]
fn json_of_the_wrong_shape_is_refused_without_quoting_it() {
    let s = Setup::start();
    let token = s.login("env-a");
    // A lookup answer whose `ttl` is the token itself: the decoder would quote it.
    s.bao.set_fault(
        "auth/token/lookup-self",
        Fault::Status {
            status: 200,
            body: json!({"data": {"ttl": token.expose_secret()}}).to_string(),
        },
    );
    let err = s.client.lookup_self(&token).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused);
    assert!(
        matches!(err, Error::UnexpectedBody { json: true, .. }),
        "{err}"
    );
    assert_hidden(&err, token.expose_secret());
}

#[test]
fn slow_openbao_times_out_as_temporary() {
    let s = Setup::start();
    let token = s.login("env-a");
    let client = BaoClient::builder(s.bao.url())
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    s.bao
        .set_fault("auth/token/", Fault::Delay(Duration::from_secs(2)));
    let err = client.lookup_self(&token).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Temporary);
    assert!(matches!(err, Error::Network { .. }), "{err}");
    assert_hidden(&err, token.expose_secret());
}

#[test]
fn nothing_listening_is_temporary() {
    let url = {
        let s = Setup::start();
        s.bao.url()
    }; // dropped: the port is closed now
    let client = BaoClient::builder(url).build().unwrap();
    let err = client
        .lookup_self(&Token::new("s.AAAAAAAAAAAAAAAAAAAAAAAA".into()))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Temporary, "{err}");
    assert_eq!(err.status(), None);
}

#[test]
fn requests_are_logged_with_the_root_ones_marked() {
    let s = Setup::start();
    let token = s.login("env-a");
    s.client.lookup_self(&token).unwrap();
    s.client
        .lookup_token(
            &s.root(),
            &SecretString::from(token.expose_secret().to_owned()),
        )
        .unwrap();
    let all: Vec<(String, String, bool)> = s
        .bao
        .requests()
        .into_iter()
        .map(|r| (r.method, r.path, r.by_root))
        .collect();
    assert_eq!(
        all,
        [
            ("POST".into(), "/v1/auth/jwt-tenancy/login".into(), false),
            ("GET".into(), "/v1/auth/token/lookup-self".into(), false),
            ("POST".into(), "/v1/auth/token/lookup".into(), true),
        ]
    );
    assert_eq!(s.bao.agent_requests().len(), 2);
}
