//! TLS: a private CA bundle as the only trust root, and `connect_to` keeping the configured
//! host name for SNI and the certificate check while TCP goes to the fake's loopback port.

mod common;

use common::Issuer;
use monky_bao_client::{BaoClient, CertificateRefusal, CertificateTime, Error, ErrorKind};
use monky_testkit::bao::FakeBao;
use monky_testkit::pki::Pki;
use url::Url;

const HOST_URL: &str = "https://bao.example.test:8200";

fn tls_fake(issuer: &Issuer, pki: &Pki) -> FakeBao {
    FakeBao::builder()
        .jwks_url(issuer.jwks_url())
        .tls(
            pki.cert_pem.clone().into_bytes(),
            pki.key_pem.clone().into_bytes(),
        )
        .start()
}

fn client_for(bao: &FakeBao, ca_pem: &str) -> BaoClient {
    BaoClient::builder(Url::parse(HOST_URL).unwrap())
        .ca_bundle_pem(ca_pem.as_bytes().to_vec())
        .connect_to(bao.addr())
        .build()
        .unwrap()
}

#[test]
fn ca_bundle_and_mapped_address() {
    let issuer = Issuer::start();
    let pki = Pki::for_host("bao.example.test");
    let bao = tls_fake(&issuer, &pki);
    assert_eq!(bao.url().scheme(), "https");
    assert_ne!(bao.addr().port(), 8200);
    bao.put_secret("env-a", "pg", "over-tls");

    let client = client_for(&bao, &pki.ca_pem);
    let login = client
        .login_jwt("jwt-tenancy", "see-env", &issuer.grant("env-a"))
        .unwrap();
    let path = monky_bao_client::KvPath::parse("monky/env-a/see/pg", "monky", "env-a").unwrap();
    let value = client.read_kv(&login.token, &path, None).unwrap();
    assert_eq!(common::reveal(&value), "over-tls");
    assert_eq!(bao.requests().len(), 2);
}

#[test]
fn a_bundle_of_several_cas_is_accepted() {
    let issuer = Issuer::start();
    let pki = Pki::for_host("bao.example.test");
    let unrelated = Pki::for_host("bao.example.test");
    let bao = tls_fake(&issuer, &pki);
    let bundle = format!("{}{}", unrelated.ca_pem, pki.ca_pem);
    let client = client_for(&bao, &bundle);
    client
        .login_jwt("jwt-tenancy", "see-env", &issuer.grant("env-a"))
        .unwrap();
}

/// Connects with `client` and expects the certificate to be rejected, for `why`, before any
/// HTTP request.
fn check_rejected(bao: &FakeBao, client: &BaoClient, why: CertificateRefusal) {
    let issuer_less_grant = secrecy::SecretString::from("x.y.z".to_owned());
    let err = client
        .login_jwt("jwt-tenancy", "see-env", &issuer_less_grant)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Temporary, "{err}");
    assert!(
        matches!(err, Error::Tls { refusal, .. } if refusal == why),
        "{why:?}: {err:?}"
    );
    assert!(err.to_string().contains("certificate"), "{err}");
    assert!(err.to_string().contains(HOST_URL), "{err}");
    assert!(bao.requests().is_empty(), "no request got through");
}

#[test]
fn the_wrong_ca_fails() {
    let issuer = Issuer::start();
    let pki = Pki::for_host("bao.example.test");
    let other = Pki::for_host("bao.example.test");
    let bao = tls_fake(&issuer, &pki);
    check_rejected(
        &bao,
        &client_for(&bao, &other.ca_pem),
        CertificateRefusal::UnknownIssuer,
    );
}

#[test]
fn a_certificate_for_another_host_fails() {
    let issuer = Issuer::start();
    let pki = Pki::for_host("other.example.test");
    let bao = tls_fake(&issuer, &pki);
    check_rejected(
        &bao,
        &client_for(&bao, &pki.ca_pem),
        CertificateRefusal::WrongName,
    );
}

#[test]
fn without_the_bundle_the_private_ca_is_not_trusted() {
    let issuer = Issuer::start();
    let pki = Pki::for_host("bao.example.test");
    let bao = tls_fake(&issuer, &pki);
    let client = BaoClient::builder(Url::parse(HOST_URL).unwrap())
        .connect_to(bao.addr())
        .build()
        .unwrap();
    check_rejected(&bao, &client, CertificateRefusal::UnknownIssuer);
}

/// A certificate outside its validity period by this machine's clock is its own kind, which
/// names the direction, not a temporary failure: waiting fixes neither the clock nor it.
#[test]
fn a_certificate_not_yet_valid_or_expired_is_a_certificate_time_error() {
    let issuer = Issuer::start();
    for (from, until, problem) in [
        (2090, 2099, CertificateTime::NotYetValid),
        (2001, 2002, CertificateTime::Expired),
    ] {
        let pki = Pki::valid_in_years(&["bao.example.test"], from, until);
        let bao = tls_fake(&issuer, &pki);
        let err = client_for(&bao, &pki.ca_pem)
            .lookup_self(&monky_bao_client::Token::new(
                "s.certificatetime0000000".into(),
            ))
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CertificateTime, "{err:?}");
        assert_eq!(err.certificate_time(), Some(problem), "{err:?}");
        assert!(
            err.to_string()
                .contains(&format!("is {problem} by this machine's clock")),
            "{err}"
        );
    }
}
