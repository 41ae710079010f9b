//! What the OpenBao client adds to the hardened client it is built on: the checklist itself
//! (docs/architecture.md, "HTTP clients: the hardening checklist") runs once, in monky-http's
//! `tests/hardening.rs`; here, each of its refusals as this client words and classifies it,
//! and what the client does per call (the `Host` of a mapped peer, the call's deadline over the
//! body, its body cap, its default `User-Agent`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monky_bao_client::{
    BaoClient, BaoClientBuilder, ConnectionCheck, Error, ErrorKind, MAX_BODY_BYTES, Token,
};
use monky_testkit::bao::FakeBao;
use monky_testkit::pki::Pki;
use monky_testkit::raw::{RawBody, RawPeer};
use url::Url;

fn build(addr: &str) -> Result<BaoClient, Error> {
    BaoClient::builder(Url::parse(addr).unwrap()).build()
}

fn token() -> Token {
    Token::new("s.HARDENINGhardening012345".into())
}

/// A token lookup at `client`: the call every check makes.
fn lookup(client: &BaoClient) -> Result<(), Error> {
    client.lookup_self(&token()).map(drop)
}

/// Asserts that each address is refused when the client is built.
fn refused(addrs: &[&str]) {
    for addr in addrs {
        let err = build(addr).unwrap_err();
        assert!(
            matches!(err, Error::InvalidAddress { .. }),
            "{addr}: {err:?}"
        );
        assert_eq!(err.kind(), ErrorKind::Refused, "{addr}");
    }
}

/// A lookup at `peer` under `timeout`: its error, and how long it took.
fn timed_lookup(peer: &RawPeer, timeout: Duration) -> (Error, Duration) {
    let client = BaoClient::builder(peer.url())
        .timeout(timeout)
        .build()
        .unwrap();
    let started = Instant::now();
    let err = lookup(&client).unwrap_err();
    (err, started.elapsed())
}

/// The `User-Agent` a client from `builder` sends, lower case.
fn user_agent_sent(configure: impl FnOnce(BaoClientBuilder) -> BaoClientBuilder) -> String {
    let peer = lookup_answer();
    lookup(&configure(BaoClient::builder(peer.url())).build().unwrap()).unwrap();
    let head = peer.request_head().unwrap().to_lowercase();
    let line = head.lines().find(|l| l.starts_with("user-agent: "));
    line.unwrap_or_else(|| panic!("{head}"))["user-agent: ".len()..].to_owned()
}

/// What a recording check saw: each new connection's (local, peer) addresses.
type Seen = Arc<Mutex<Vec<(SocketAddr, SocketAddr)>>>;

/// A connection check that records what it saw and answers `verdict`.
fn recording_check(verdict: Result<(), &'static str>) -> (ConnectionCheck, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let check: ConnectionCheck = Arc::new(move |local, peer| {
        log.lock().unwrap().push((local, peer));
        verdict.map_err(Into::into)
    });
    (check, seen)
}

/// The request head `peer` read, once its connection is over (empty: nothing was sent).
fn head_when_closed(peer: &RawPeer) -> String {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(head) = peer.request_head() {
            return head;
        }
        assert!(Instant::now() < until, "the peer's connection never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A raw peer answering a token lookup.
fn lookup_answer() -> RawPeer {
    RawPeer::json("200 OK", r#"{"data":{"ttl":60}}"#)
}

#[test]
fn a_base_url_of_another_scheme_is_a_refused_error() {
    refused(&[
        "ftp://bao.test/",
        "unix:/run/bao.sock",
        "file:///etc/passwd",
    ]);
    for addr in ["http://bao.test/", "https://bao.test:8200/prefix"] {
        build(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    }
}

#[test]
fn a_base_url_with_credentials_is_a_refused_error() {
    refused(&[
        "http://u:p@bao.test/",
        "http://u@bao.test/",
        "https://:p@bao.test/",
    ]);
}

#[test]
fn its_errors_never_show_credentials() {
    let err = build("https://robot:s3cret-pw@bao.test:8200/").unwrap_err();
    let shown = format!("{err} {err:?} {err:#}");
    assert!(
        !shown.contains("s3cret-pw") && !shown.contains("robot"),
        "{shown}"
    );
    assert!(err.to_string().contains("bao.test:8200"), "{err}");
}

#[test]
fn a_base_url_with_a_query_is_a_refused_error() {
    refused(&["http://bao.test/?q=1", "http://bao.test/#top"]);
}

/// A TLS server for `bao.example.test` (the testkit OpenBao) and a client of it through
/// `connect_to` trusting `ca_pem` alone (the server's own CA without one).
fn tls_server_and_client(ca_pem: Option<&str>) -> (FakeBao, BaoClient) {
    let pki = Pki::for_host("bao.example.test");
    let server = FakeBao::builder()
        .tls(
            pki.cert_pem.clone().into_bytes(),
            pki.key_pem.clone().into_bytes(),
        )
        .start();
    let ca = ca_pem.map_or_else(|| pki.ca_bytes(), |pem| pem.as_bytes().to_vec());
    let client = BaoClient::builder(Url::parse("https://bao.example.test:8200").unwrap())
        .connect_to(server.addr())
        .ca_bundle_pem(ca)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    (server, client)
}

#[test]
fn a_server_of_another_ca_is_a_temporary_error_without_a_status() {
    // Its own CA: the handshake succeeds and OpenBao's answer comes back (an unknown token).
    let (_server, client) = tls_server_and_client(None);
    let err = lookup(&client).unwrap_err();
    assert!(err.status().is_some(), "{err:?}");
    // Another CA: refused in the handshake, no answer.
    let other = Pki::new();
    let (_server, client) = tls_server_and_client(Some(&other.ca_pem));
    let err = lookup(&client).unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert_eq!((err.status(), err.kind()), (None, ErrorKind::Temporary));
}

#[test]
fn a_ca_bundle_without_a_certificate_is_a_refused_error() {
    let broken = "-----BEGIN CERTIFICATE-----\n!!not base64!!\n-----END CERTIFICATE-----\n";
    for pem in ["", "not a certificate\n", broken] {
        let err = BaoClient::builder(Url::parse("https://bao.test/").unwrap())
            .ca_bundle_pem(pem.as_bytes().to_vec())
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::CaBundle { .. }), "{pem:?}: {err:?}");
        assert_eq!(err.kind(), ErrorKind::Refused);
    }
}

#[test]
fn connect_to_sends_each_call_with_the_configured_host() {
    let peer = lookup_answer();
    let client = BaoClient::builder(Url::parse("http://bao.example.test:8200").unwrap())
        .connect_to(peer.addr())
        .build()
        .unwrap();
    lookup(&client).unwrap();
    let head = peer.request_head().unwrap().to_lowercase();
    assert!(
        head.starts_with("get /v1/auth/token/lookup-self "),
        "{head}"
    );
    assert!(
        head.contains("\r\nhost: bao.example.test:8200\r\n"),
        "{head}"
    );
}

#[test]
fn a_redirect_is_an_error_with_its_status() {
    let target = lookup_answer();
    let redirect = RawPeer::start(
        format!(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: {}v1/auth/token/lookup-self\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n",
            target.url()
        ),
        RawBody::Whole(Vec::new()),
    );
    let client = BaoClient::builder(redirect.url()).build().unwrap();
    let err = lookup(&client).unwrap_err();
    assert_eq!(err.status(), Some(307), "{err:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(target.request_head(), None, "the redirect was followed");
}

#[test]
fn a_body_trickled_past_the_deadline_is_a_temporary_error() {
    // 240 bytes at four a second against a two-second deadline: each read returns at once,
    // so only a deadline for the whole call ends it.
    let body = format!(r#"{{"data":{{"ttl":60,"pad":"{}"}}}}"#, "x".repeat(200));
    let peer = RawPeer::trickle_json(&body, Duration::from_millis(250));
    let (err, took) = timed_lookup(&peer, Duration::from_secs(2));
    assert_eq!(err.kind(), ErrorKind::Temporary, "{err:?}");
    assert!(
        matches!(err, Error::BodyRead { .. } | Error::Network { .. }),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(4), "{took:?}");
    std::thread::sleep(Duration::from_secs(1));
    let (sent, len) = (peer.body_bytes_sent(), body.len());
    assert!(sent < len / 4, "{sent} of {len}");
}

#[test]
fn a_body_past_the_cap_is_refused() {
    // A GiB offered without a length: the client stops at MAX_BODY_BYTES.
    let peer = RawPeer::endless_json();
    let (err, took) = timed_lookup(&peer, Duration::from_secs(20));
    assert!(matches!(err, Error::UnexpectedBody { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&MAX_BODY_BYTES.to_string()),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(peer.body_bytes_sent() < 1024 * 1024 * 1024);
}

#[test]
fn the_default_user_agent_is_the_crates() {
    let default = concat!("monky-bao-client/", env!("CARGO_PKG_VERSION"));
    assert_eq!(user_agent_sent(|b| b), default);
    assert_eq!(
        user_agent_sent(|b| b.user_agent("probe/1".into())),
        "probe/1"
    );
}

#[test]
fn a_refused_connection_is_a_connection_check_error_with_the_refusal() {
    // Refused: the call fails with the check's own error and the peer reads no byte, so no
    // token.
    let peer = lookup_answer();
    let (check, seen) = recording_check(Err("served by a stranger"));
    let client = BaoClient::builder(peer.url())
        .connection_check(check)
        .build()
        .unwrap();
    let err = lookup(&client).unwrap_err();
    assert!(matches!(err, Error::ConnectionCheck { .. }), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Refused);
    assert_eq!(
        err.check_refusal().map(ToString::to_string).as_deref(),
        Some("served by a stranger")
    );
    assert_eq!(head_when_closed(&peer), "", "the peer read a request");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].1, peer.addr());
}
