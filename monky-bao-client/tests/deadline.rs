//! A peer's numbers: no TTL OpenBao states can overflow what the agent computes from it. (Its
//! pace, a body trickled past the call's total deadline, is `tests/hardening.rs`'s
//! `total_deadline`.)

use std::net::SocketAddr;
use std::time::Duration;

use monky_bao_client::{BaoClient, MAX_TTL, Token};
use monky_testkit::raw::RawPeer;
use secrecy::SecretString;
use url::Url;

fn client(addr: SocketAddr, timeout: Duration) -> BaoClient {
    BaoClient::builder(Url::parse(&format!("http://{addr}")).unwrap())
        .timeout(timeout)
        .build()
        .unwrap()
}

fn token() -> Token {
    Token::new("s.AAAAAAAAAAAAAAAAAAAAAAAA".into())
}

#[test]
fn ttls_of_u64_max_are_clamped_to_a_year() {
    let max = u64::MAX;
    let login = RawPeer::json(
        "200 OK",
        &format!(
            r#"{{"auth":{{"client_token":"s.BBBBBBBBBBBBBBBBBBBBBBBB","lease_duration":{max},"renewable":true}}}}"#
        ),
    );
    let jwt = SecretString::from("a.b.c".to_owned());
    let got = client(login.addr(), Duration::from_secs(5))
        .login_jwt("jwt-tenancy", "see-env", &jwt)
        .unwrap();
    assert_eq!(got.ttl, MAX_TTL);

    let renew = RawPeer::json(
        "200 OK",
        &format!(r#"{{"auth":{{"client_token":"","lease_duration":{max},"renewable":true}}}}"#),
    );
    let got = client(renew.addr(), Duration::from_secs(5))
        .renew_self(&token(), None)
        .unwrap();
    assert_eq!(got.ttl, MAX_TTL);

    let lookup = RawPeer::json(
        "200 OK",
        &format!(r#"{{"data":{{"ttl":{max},"creation_ttl":{max},"explicit_max_ttl":{max}}}}}"#),
    );
    let got = client(lookup.addr(), Duration::from_secs(5))
        .lookup_self(&token())
        .unwrap();
    assert_eq!(
        (got.ttl, got.creation_ttl, got.explicit_max_ttl),
        (MAX_TTL, MAX_TTL, MAX_TTL)
    );
}
