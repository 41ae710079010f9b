//! The hardened client against docs/architecture.md's "HTTP clients: the hardening checklist":
//! one case per line, named by its id, in the checklist's order, run once against the one
//! builder both peers' clients use. Each client's own `tests/hardening.rs` holds only what is
//! its own: how it words and classifies each of these refusals.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monky_http::Response;
use monky_http::{
    BaseRefusal, BuildError, ConnectionCheck, Mapping, ReadError, Settings, build_client,
    check_base, read_capped, without_credentials,
};
use monky_testkit::bao::FakeBao;
use monky_testkit::pki::Pki;
use monky_testkit::raw::{RawBody, RawPeer, with_proxy_env};
use url::Url;

monky_testkit::hardening_table![
    http_or_https,
    no_credentials_in_url,
    credentials_never_shown,
    no_query_or_fragment,
    ca_bundle_only_root,
    ca_bundle_refused_when_empty,
    connect_to_keeps_the_name,
    no_redirects,
    no_proxy_from_env,
    total_deadline,
    body_capped_while_reading,
    user_agent,
    connection_check,
];

/// Settings with a 10 s timeout and nothing else.
fn settings() -> Settings {
    Settings {
        timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        user_agent: "monky-http-test".to_owned(),
        ca_bundle_pem: None,
        mapping: None,
        connection_check: None,
    }
}

fn url(text: &str) -> Url {
    text.parse().unwrap()
}

/// A `GET` of `url` by a client of `base` built with `settings`, with `more` added to it.
fn get(
    base: &Url,
    settings: Settings,
    url: Url,
    more: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
) -> Result<Response, reqwest::Error> {
    let c = build_client(base, settings).unwrap();
    c.send(more(c.get(url)))
}

/// Asserts that `check_base` refuses each URL with `why`.
fn refused(urls: &[&str], why: BaseRefusal) {
    for text in urls {
        assert_eq!(check_base(&url(text)), Err(why), "{text}");
    }
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

/// The testkit OpenBao serving TLS for `bao.example.test`, and its test PKI.
fn tls_server() -> (FakeBao, Pki) {
    let pki = Pki::for_host("bao.example.test");
    let server = FakeBao::builder()
        .tls(
            pki.cert_pem.clone().into_bytes(),
            pki.key_pem.clone().into_bytes(),
        )
        .start();
    (server, pki)
}

/// Settings that map `bao.example.test:8200` to `server` and trust `ca` alone; the URL to ask.
fn mapped_to(server: &FakeBao, ca: Vec<u8>) -> (Settings, Url) {
    let base = url("https://bao.example.test:8200/");
    let mapping = Mapping::new(&base, server.addr()).unwrap();
    let wire = mapping.wire_url(&base.join("v1/sys/health").unwrap());
    let settings = Settings {
        ca_bundle_pem: Some(ca),
        mapping: Some(mapping),
        ..settings()
    };
    (settings, wire)
}

#[test]
fn http_or_https() {
    refused(
        &["ftp://t.test/", "unix:/run/x.sock", "file:///etc/passwd"],
        BaseRefusal::Scheme,
    );
    for base in ["http://t.test/", "https://t.test:8443/prefix"] {
        assert_eq!(check_base(&url(base)), Ok(()), "{base}");
    }
}

#[test]
fn no_credentials_in_url() {
    refused(
        &[
            "http://u:p@t.test/",
            "http://u@t.test/",
            "https://:p@t.test/",
        ],
        BaseRefusal::Credentials,
    );
}

#[test]
fn credentials_never_shown() {
    let shown = without_credentials(&url("http://robot:s3cret-pw@t.test:8081/b"));
    assert_eq!(shown, "http://t.test:8081/b");
}

#[test]
fn no_query_or_fragment() {
    refused(
        &["http://t.test/?q=1", "http://t.test/#top"],
        BaseRefusal::QueryOrFragment,
    );
}

#[test]
fn ca_bundle_only_root() {
    let base = url("https://bao.example.test:8200/");
    // Its own CA: the handshake succeeds and an HTTP answer comes back.
    let (server, pki) = tls_server();
    let (settings, wire) = mapped_to(&server, pki.ca_bytes());
    get(&base, settings, wire, |r| r).unwrap();
    // Another CA: refused in the handshake, no answer.
    let other = Pki::new();
    let (settings, wire) = mapped_to(&server, other.ca_pem.into_bytes());
    let err = get(&base, settings, wire, |r| r).unwrap_err();
    assert!(err.status().is_none() && err.is_connect(), "{err:?}");
}

#[test]
fn ca_bundle_refused_when_empty() {
    let broken = "-----BEGIN CERTIFICATE-----\n!!not base64!!\n-----END CERTIFICATE-----\n";
    for pem in ["", "not a certificate\n", broken] {
        let settings = Settings {
            ca_bundle_pem: Some(pem.as_bytes().to_vec()),
            ..settings()
        };
        let err = build_client(&url("https://t.test/"), settings).unwrap_err();
        assert!(
            matches!(err, BuildError::CaBundle { .. }),
            "{pem:?}: {err:?}"
        );
    }
}

#[test]
fn connect_to_keeps_the_name() {
    let peer = RawPeer::json("200 OK", "{}");
    let base = url("http://monky.tenancy.deploy:443/");
    let mapping = Mapping::new(&base, peer.addr()).unwrap();
    let (wire, host) = (mapping.wire_url(&base), mapping.host_header().to_owned());
    let settings = Settings {
        mapping: Some(mapping),
        ..settings()
    };
    get(&base, settings, wire, |r| {
        r.header(reqwest::header::HOST, host)
    })
    .unwrap();
    let head = peer.request_head().unwrap().to_lowercase();
    assert!(
        head.contains("\r\nhost: monky.tenancy.deploy:443\r\n"),
        "{head}"
    );
    // Over TLS, the certificate is checked against the name, not the mapped address.
    let (server, pki) = tls_server();
    let (settings, wire) = mapped_to(&server, pki.ca_bytes());
    let base = url("https://bao.example.test:8200/");
    get(&base, settings, wire, |r| r).unwrap();
}

#[test]
fn no_redirects() {
    let target = RawPeer::json("200 OK", "{}");
    let redirect = RawPeer::start(
        format!(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: {}\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n",
            target.url()
        ),
        RawBody::Whole(Vec::new()),
    );
    let answer = get(&redirect.url(), settings(), redirect.url(), |r| r).unwrap();
    assert_eq!(answer.status().as_u16(), 307);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(target.request_head(), None, "the redirect was followed");
}

#[test]
fn no_proxy_from_env() {
    with_proxy_env("no_proxy_from_env", || {
        let target = RawPeer::json("200 OK", "{}");
        let base = url("http://monky.tenancy.deploy:443/");
        let mapping = Mapping::new(&base, target.addr()).unwrap();
        let wire = mapping.wire_url(&base);
        let settings = Settings {
            mapping: Some(mapping),
            ..settings()
        };
        get(&base, settings, wire, |r| r).unwrap();
        assert!(target.request_head().is_some());
    });
}

/// What a capped read of a body gave.
type Read = Result<Option<Vec<u8>>, ReadError>;

/// A GET of `peer` under `timeout`, its body read by `read_capped` under the same deadline and
/// `limit`: what the read gave, and how long the call took.
fn capped_get(peer: &RawPeer, timeout: Duration, limit: u64) -> (Read, Duration) {
    let started = Instant::now();
    let settings = Settings {
        timeout,
        connect_timeout: timeout,
        ..settings()
    };
    let answer = get(&peer.url(), settings, peer.url(), |r| r).unwrap();
    let len = answer.content_length();
    let read = read_capped(answer, len, limit, started + timeout);
    (read, started.elapsed())
}

#[test]
fn total_deadline() {
    // 240 bytes at four a second against a two-second deadline: each read returns at once,
    // so only a deadline for the whole call ends it.
    let body = format!(r#"{{"pad":"{}"}}"#, "x".repeat(230));
    let peer = RawPeer::trickle_json(&body, Duration::from_millis(250));
    let (read, took) = capped_get(&peer, Duration::from_secs(2), 4096);
    assert!(read.is_err(), "{read:?}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    std::thread::sleep(Duration::from_secs(1));
    let (sent, len) = (peer.body_bytes_sent(), body.len());
    assert!(sent < len / 4, "{sent} of {len}");
}

#[test]
fn body_capped_while_reading() {
    // A GiB offered without a length: the read stops at its cap.
    let peer = RawPeer::endless_json();
    let (read, took) = capped_get(&peer, Duration::from_secs(20), 1024 * 1024);
    assert_eq!(read.unwrap(), None);
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(peer.body_bytes_sent() < 1024 * 1024 * 1024);
}

#[test]
fn user_agent() {
    let peer = RawPeer::json("200 OK", "{}");
    let settings = Settings {
        user_agent: "probe/1".to_owned(),
        ..settings()
    };
    get(&peer.url(), settings, peer.url(), |r| r).unwrap();
    let head = peer.request_head().unwrap().to_lowercase();
    assert!(head.contains("\r\nuser-agent: probe/1\r\n"), "{head}");
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

#[test]
fn connection_check() {
    // Refused: the call fails with the check's own error and the peer reads no byte.
    let peer = RawPeer::json("200 OK", "{}");
    let (check, seen) = recording_check(Err("served by a stranger"));
    let settings = Settings {
        connection_check: Some(check),
        ..settings()
    };
    let err = get(&peer.url(), settings, peer.url(), |r| {
        r.bearer_auth("s.HARDENINGhardening012345")
    })
    .unwrap_err();
    let refusal = monky_http::connect::refusal_in(&err).map(ToString::to_string);
    assert_eq!(refusal.as_deref(), Some("served by a stranger"), "{err:?}");
    assert_eq!(head_when_closed(&peer), "", "the peer read a request");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].1, peer.addr());
    assert!(seen[0].0.ip().is_loopback(), "{seen:?}");

    // Over TLS the check runs after the handshake and before the request: accepted, the call
    // goes through with the mapped address as the peer.
    let (server, pki) = tls_server();
    let (check, seen) = recording_check(Ok(()));
    let (settings, wire) = mapped_to(&server, pki.ca_bytes());
    let settings = Settings {
        connection_check: Some(check),
        ..settings
    };
    get(
        &url("https://bao.example.test:8200/"),
        settings,
        wire,
        |r| r,
    )
    .unwrap();
    assert_eq!(seen.lock().unwrap()[0].1, server.addr());
}
