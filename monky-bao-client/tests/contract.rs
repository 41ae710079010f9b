//! The contract between `BaoClient` and OpenBao, one suite run twice: against `FakeBao` and
//! against a real OpenBao server set up as the deployment is (`RealBao`). Every assertion holds
//! for both, so a divergence of the fake from OpenBao fails here.
//!
//! The real half needs the `bao` binary that `cargo xtask setup` installs. It fails when the
//! binary is missing; `monky_testkit::bao::real_skipped` says when it is skipped.

mod common;

use std::time::Duration;

use common::{Setup, assert_hidden, unix_now};
use monky_bao_client::{Absence, BaoClient, Error, ErrorKind, KvPath, Token};
use monky_testkit::bao::{BaoPeer, FakeBao};
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;

const DAY: u64 = 86_400;

/// One peer, fake or real, with its issuer and a client of it: the crate's one set-up.
type Peer = Setup<Box<dyn BaoPeer>>;

/// What the suite asks of either peer, beside the set-up's own `login` and `root`.
impl Peer {
    fn login_with(&self, jwt: &SecretString) -> monky_bao_client::Result<monky_bao_client::Login> {
        self.client.login_jwt("jwt-tenancy", "see-env", jwt)
    }

    fn read(
        &self,
        token: &Token,
        env_id: &str,
        name: &str,
        version: Option<u64>,
    ) -> monky_bao_client::Result<String> {
        let path = KvPath::parse(&format!("monky/{env_id}/see/{name}"), "monky", env_id).unwrap();
        self.client
            .read_kv(token, &path, version)
            .map(|v| v.expose_secret().to_owned())
    }

    /// Logs in with `jwt` and expects a 400 login rejection whose only error is `expected`.
    #[track_caller]
    fn check_rejected(&self, role: &str, jwt: &SecretString, expected: &str) {
        let err = self.client.login_jwt("jwt-tenancy", role, jwt).unwrap_err();
        let kind = self.bao.kind();
        assert_eq!(err.kind(), ErrorKind::LoginRejected, "{kind}: {err}");
        assert_eq!(err.status(), Some(400), "{kind}");
        assert_eq!(err.errors(), [expected], "{kind}");
        assert_hidden(&err, jwt.expose_secret());
    }
}

/// Runs each scenario as `fake::<name>` and `real::<name>`.
macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod fake {
            $(#[test]
            fn $name() {
                super::$name(&super::Setup::start().boxed());
            })*
        }
        mod real {
            $(#[test]
            fn $name() {
                if let Some(peer) = super::Setup::real().map(super::Setup::boxed) {
                    super::$name(&peer);
                }
            })*
        }
    };
}

contract!(
    login_maps_the_grant_into_the_token,
    pinned_and_latest_reads,
    a_missing_secret_or_version_is_not_found,
    deleted_and_destroyed_versions_are_told_apart,
    another_envs_path_is_denied_by_the_policy,
    lookup_self_and_tenancys_lookup,
    renew_self_grants_the_increment,
    revoke_self_is_denied_by_the_policy,
    an_operator_revoked_token_is_denied,
    a_sealed_server_is_temporary_and_unsealing_restores_it,
    an_expired_grant_is_rejected,
    a_grant_expired_within_the_leeway_is_accepted,
    a_foreign_grant_is_rejected,
    a_wrong_audience_or_kind_is_rejected,
    an_unknown_role_is_rejected,
    one_entity_per_env_and_no_replay_state,
    a_short_role_ttl_applies_to_new_logins,
    every_answer_carries_openbaos_date,
);

/// How far `date` is outside the moments `sent` and `received` (0 inside), whole seconds
/// allowed for `Date`'s resolution.
fn outside_the_call(d: &monky_bao_client::ServerDate) -> Duration {
    let early = d.sent.duration_since(d.date).unwrap_or_default();
    let late = d.date.duration_since(d.received).unwrap_or_default();
    early.saturating_sub(Duration::from_secs(1)).max(late)
}

/// OpenBao (Go's net/http) dates every answer, refusals included, by its clock: the agent reads
/// the box's clock against it without a request of its own.
fn every_answer_carries_openbaos_date(p: &Peer) {
    let fresh = BaoClient::builder(p.bao.url()).build().unwrap();
    assert_eq!(fresh.server_date(), None, "no answer yet");
    let token = p.login("env-a");
    let first = p
        .client
        .server_date()
        .expect("the login's answer has a Date");
    assert_eq!(outside_the_call(&first), Duration::ZERO, "{first:?}");
    // A refusal is dated too (doctor's lookup without a token).
    let refused = fresh.lookup_self(&Token::new(String::new())).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::PermissionDenied, "{refused}");
    let d = fresh.server_date().expect("a 403 has a Date");
    assert_eq!(outside_the_call(&d), Duration::ZERO, "{d:?}");
    p.client.lookup_self(&token).unwrap();
    let later = p.client.server_date().unwrap();
    assert!(later.received >= first.received, "{later:?} {first:?}");
}

/// The fake's `Date` follows its settable clock, as its tokens' expiry does, so a test can set
/// OpenBao's clock apart from the box's.
#[test]
fn the_fakes_date_follows_its_clock() {
    let peer = Setup::start();
    peer.login("env-a");
    let before = peer.client.server_date().unwrap();
    let fake = FakeBao::builder().jwks_url(peer.issuer.jwks_url()).start();
    fake.advance_clock(Duration::from_secs(3 * DAY));
    let client = BaoClient::builder(fake.url()).build().unwrap();
    client.lookup_self(&Token::new(String::new())).unwrap_err();
    let d = client.server_date().unwrap();
    let ahead = d.date.duration_since(d.received).unwrap();
    assert!(
        ahead >= Duration::from_secs(3 * DAY - 5) && ahead <= Duration::from_secs(3 * DAY + 1),
        "{ahead:?}"
    );
    assert_eq!(outside_the_call(&before), Duration::ZERO, "{before:?}");
}

fn login_maps_the_grant_into_the_token(p: &Peer) {
    let claims = p.issuer.claims("env-qa-02");
    let login = p.login_with(&p.issuer.sign(&claims)).unwrap();
    assert_eq!(login.ttl, Duration::from_secs(DAY));
    assert!(login.renewable);
    assert_eq!(login.policies, ["see-env"]);
    assert_eq!(login.token_type, "service");
    assert!(!login.accessor.is_empty());
    assert!(!login.entity_id.is_empty());
    assert_eq!(login.metadata["env_id"], "env-qa-02");
    assert_eq!(login.metadata["grant_jti"], claims["jti"].as_str().unwrap());
    assert_eq!(login.metadata["role"], "see-env");
    assert_eq!(login.metadata.len(), 3, "{:?}", login.metadata);
}

fn pinned_and_latest_reads(p: &Peer) {
    assert_eq!(p.bao.put_secret("env-a", "pg", "first"), 1);
    assert_eq!(p.bao.put_secret("env-a", "pg", "second"), 2);
    let token = p.login("env-a");
    assert_eq!(p.read(&token, "env-a", "pg", Some(1)).unwrap(), "first");
    assert_eq!(p.read(&token, "env-a", "pg", Some(2)).unwrap(), "second");
    assert_eq!(p.read(&token, "env-a", "pg", None).unwrap(), "second");
    // A document without `value` is a missing value, not an empty one.
    p.bao
        .put_document("env-a", "odd", json!({"password": "not-value"}));
    let err = p.read(&token, "env-a", "odd", None).unwrap_err();
    assert!(matches!(err, Error::MissingValue { .. }), "{err}");
}

fn a_missing_secret_or_version_is_not_found(p: &Peer) {
    p.bao.put_secret("env-a", "pg", "first");
    let token = p.login("env-a");
    for (name, version) in [
        ("nothing-here", None),
        ("nothing-here", Some(1)),
        ("pg", Some(7)),
    ] {
        let err = p.read(&token, "env-a", name, version).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound, "{}: {err}", p.bao.kind());
        assert_eq!(err.status(), Some(404));
        assert_eq!(err.absence(), Some(&Absence::Missing), "{err}");
        assert!(err.errors().is_empty(), "{:?}", err.errors());
    }
}

fn deleted_and_destroyed_versions_are_told_apart(p: &Peer) {
    for v in ["one", "two", "three"] {
        p.bao.put_secret("env-a", "pg", v);
    }
    assert!(p.bao.delete_version("env-a", "pg", 1));
    assert!(p.bao.destroy_version("env-a", "pg", 2));
    let token = p.login("env-a");
    let deleted = p.read(&token, "env-a", "pg", Some(1)).unwrap_err();
    assert!(
        matches!(deleted.absence(), Some(Absence::Deleted { .. })),
        "{}: {deleted}",
        p.bao.kind()
    );
    let destroyed = p.read(&token, "env-a", "pg", Some(2)).unwrap_err();
    assert_eq!(
        destroyed.absence(),
        Some(&Absence::Destroyed),
        "{destroyed}"
    );
    assert_eq!(p.read(&token, "env-a", "pg", None).unwrap(), "three");
}

fn another_envs_path_is_denied_by_the_policy(p: &Peer) {
    p.bao.put_secret("env-b", "pg", "b's secret");
    let token = p.login("env-a");
    // KvPath refuses another env locally; parsed for env-b, the request goes out and the
    // server's policy must be what refuses it.
    let err = p.read(&token, "env-b", "pg", None).unwrap_err();
    denied_by_policy(p, &err);
    // The root token reads it: the denial is the policy's, not a missing secret.
    assert_eq!(
        p.read(&p.root(), "env-b", "pg", None).unwrap(),
        "b's secret"
    );
}

fn lookup_self_and_tenancys_lookup(p: &Peer) {
    let claims = p.issuer.claims("env-a");
    let login = p.login_with(&p.issuer.sign(&claims)).unwrap();
    let info = p.client.lookup_self(&login.token).unwrap();
    assert!(info.ttl <= Duration::from_secs(DAY) && info.ttl >= Duration::from_secs(DAY - 30));
    assert_eq!(info.creation_ttl, Duration::from_secs(DAY));
    assert_eq!(info.explicit_max_ttl, Duration::ZERO);
    assert!((info.creation_time as i64 - unix_now()).abs() < 30);
    assert!(
        info.expire_time
            .as_deref()
            .is_some_and(|t| t.ends_with('Z')),
        "{info:?}"
    );
    assert_eq!(info.meta, login.metadata);
    assert_eq!(info.accessor, login.accessor);
    assert_eq!(info.entity_id, login.entity_id);
    assert_eq!(info.policies, ["see-env"]);
    assert_eq!(info.token_type, "service");
    assert!(info.renewable);

    // Tenancy's check of the bearer, with its own (here the root) token.
    let bearer = SecretString::from(login.token.expose_secret().to_owned());
    let seen = p.client.lookup_token(&p.root(), &bearer).unwrap();
    assert_eq!(seen.meta["env_id"], "env-a");
    assert_eq!(seen.meta["grant_jti"], claims["jti"].as_str().unwrap());
    // The agent's token may not look up others.
    let err = p.client.lookup_token(&login.token, &bearer).unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::PermissionDenied,
        "{}: {err}",
        p.bao.kind()
    );
}

fn renew_self_grants_the_increment(p: &Peer) {
    let token = p.login("env-a");
    let renewal = p
        .client
        .renew_self(&token, Some(Duration::from_secs(3600)))
        .unwrap();
    assert_eq!(renewal.ttl, Duration::from_secs(3600), "{}", p.bao.kind());
    assert!(renewal.renewable);
    let info = p.client.lookup_self(&token).unwrap();
    assert!(info.ttl <= Duration::from_secs(3600) && info.ttl >= Duration::from_secs(3500));
    // Without an increment: the role's TTL again.
    let renewal = p.client.renew_self(&token, None).unwrap();
    assert_eq!(renewal.ttl, Duration::from_secs(DAY), "{}", p.bao.kind());
}

fn revoke_self_is_denied_by_the_policy(p: &Peer) {
    let token = p.login("env-a");
    let err = p.client.revoke_self(&token).unwrap_err();
    denied_by_policy(p, &err);
    // The token lives on.
    p.client.lookup_self(&token).unwrap();
}

fn an_operator_revoked_token_is_denied(p: &Peer) {
    let token = p.login("env-a");
    let other = p.login("env-b");
    assert_eq!(p.bao.live_tokens_for_env("env-a"), 1);
    assert_eq!(p.bao.revoke_tokens_for_env("env-a"), 1);
    assert_eq!(p.bao.live_tokens_for_env("env-a"), 0);
    let err = p.client.lookup_self(&token).unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::PermissionDenied,
        "{}: {err}",
        p.bao.kind()
    );
    // An unknown token is the plain form, not the policy's multi-error form.
    assert!(
        matches!(
            err,
            Error::PermissionDenied {
                multi_error: false,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.errors(), ["permission denied"]);
    let bearer = SecretString::from(token.expose_secret().to_owned());
    let err = p.client.lookup_token(&p.root(), &bearer).unwrap_err();
    assert_eq!(err.status(), Some(403), "{}: {err}", p.bao.kind());
    assert_eq!(err.errors(), ["bad token"], "{}", p.bao.kind());
    p.client.lookup_self(&other).unwrap();
}

fn a_sealed_server_is_temporary_and_unsealing_restores_it(p: &Peer) {
    p.bao.put_secret("env-a", "pg", "v");
    let token = p.login("env-a");
    p.bao.seal();
    let err = p.read(&token, "env-a", "pg", None).unwrap_err();
    assert!(
        matches!(err, Error::Sealed { .. }),
        "{}: {err:?}",
        p.bao.kind()
    );
    assert_eq!(err.kind(), ErrorKind::Temporary);
    assert_eq!(err.status(), Some(503));
    let err = p.login_with(&p.issuer.grant("env-a")).unwrap_err();
    assert!(
        matches!(err, Error::Sealed { .. }),
        "{}: {err:?}",
        p.bao.kind()
    );
    let err = p.client.lookup_self(&token).unwrap_err();
    assert!(
        matches!(err, Error::Sealed { .. }),
        "{}: {err:?}",
        p.bao.kind()
    );
    p.bao.unseal();
    // Tokens and secrets survive a seal.
    assert_eq!(p.read(&token, "env-a", "pg", None).unwrap(), "v");
}

fn an_expired_grant_is_rejected(p: &Peer) {
    let mut claims = p.issuer.claims("env-a");
    claims["exp"] = json!(unix_now() - 3600);
    p.check_rejected(
        "see-env",
        &p.issuer.sign(&claims),
        "error validating token: invalid expiration time (exp) claim: token is expired",
    );
}

fn a_grant_expired_within_the_leeway_is_accepted(p: &Peer) {
    // The role keeps OpenBao's default clock-skew leeway of 60 s past `exp`, and no more.
    let mut claims = p.issuer.claims("env-a");
    claims["exp"] = json!(unix_now() - 30);
    p.login_with(&p.issuer.sign(&claims))
        .unwrap_or_else(|e| panic!("{}: {e}", p.bao.kind()));
    claims["exp"] = json!(unix_now() - 90);
    p.check_rejected(
        "see-env",
        &p.issuer.sign(&claims),
        "error validating token: invalid expiration time (exp) claim: token is expired",
    );
}

fn a_foreign_grant_is_rejected(p: &Peer) {
    let claims = p.issuer.claims("env-a");
    p.check_rejected(
        "see-env",
        &p.issuer.sign_forged(&claims),
        "error validating token: error verifying token signature: failed to verify id token signature",
    );
}

fn a_wrong_audience_or_kind_is_rejected(p: &Peer) {
    let mut claims = p.issuer.claims("env-a");
    claims["aud"] = json!("someone-else");
    p.check_rejected(
        "see-env",
        &p.issuer.sign(&claims),
        "error validating token: invalid audience (aud) claim: audience claim does not match any expected audience",
    );
    let mut claims = p.issuer.claims("env-a");
    claims["kind"] = json!("bootstrap");
    p.check_rejected(
        "see-env",
        &p.issuer.sign(&claims),
        "error validating claims: claim \"kind\" does not match any associated bound claim values",
    );
    let mut claims = p.issuer.claims("env-a");
    claims.as_object_mut().unwrap().remove("kind");
    p.check_rejected(
        "see-env",
        &p.issuer.sign(&claims),
        "error validating claims: claim \"kind\" is missing",
    );
    let mut claims = p.issuer.claims("env-a");
    claims.as_object_mut().unwrap().remove("env_id");
    p.check_rejected(
        "see-env",
        &p.issuer.sign(&claims),
        "claim \"env_id\" not found in token",
    );
}

fn an_unknown_role_is_rejected(p: &Peer) {
    p.check_rejected(
        "see-everything",
        &p.issuer.grant("env-a"),
        "role \"see-everything\" could not be found",
    );
}

fn one_entity_per_env_and_no_replay_state(p: &Peer) {
    let grant = p.issuer.grant("env-a");
    let first = p.login_with(&grant).unwrap();
    let again = p.login_with(&grant).unwrap();
    assert_ne!(first.token.expose_secret(), again.token.expose_secret());
    assert_eq!(first.entity_id, again.entity_id, "{}", p.bao.kind());
    let other = p.login_with(&p.issuer.grant("env-b")).unwrap();
    assert_ne!(first.entity_id, other.entity_id);
    assert_eq!(p.bao.live_tokens_for_env("env-a"), 2);
}

fn a_short_role_ttl_applies_to_new_logins(p: &Peer) {
    p.bao.set_token_ttl(Duration::from_secs(600));
    let login = p.login_with(&p.issuer.grant("env-a")).unwrap();
    assert_eq!(login.ttl, Duration::from_secs(600), "{}", p.bao.kind());
    let renewal = p.client.renew_self(&login.token, None).unwrap();
    assert_eq!(renewal.ttl, Duration::from_secs(600), "{}", p.bao.kind());
}

/// The error OpenBao gives when its ACL policy refuses a request (the multi-error form),
/// with which peer said it.
fn denied_by_policy(p: &Peer, err: &Error) {
    assert_eq!(
        err.kind(),
        ErrorKind::PermissionDenied,
        "{}: {err}",
        p.bao.kind()
    );
    common::assert_acl_denied(err);
}
