//! A peer's pace and numbers: every call ends at its total deadline however slowly OpenBao
//! sends, and no TTL OpenBao states can overflow what the agent computes from it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use monky_bao_client::{BaoClient, Error, ErrorKind, MAX_TTL, Token};
use secrecy::SecretString;
use url::Url;

/// A one-request raw HTTP server on 127.0.0.1: sends `head`, then `body` one byte every
/// `pace`, counting the bytes the client took before it went away.
fn trickle_server(head: String, body: Vec<u8>, pace: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&sent);
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut buf = [0u8; 8192];
        let _ = stream.read(&mut buf);
        if stream.write_all(head.as_bytes()).is_err() {
            return;
        }
        for byte in body {
            std::thread::sleep(pace);
            if stream
                .write_all(&[byte])
                .and_then(|()| stream.flush())
                .is_err()
            {
                return;
            }
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    (addr, sent)
}

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
fn a_body_trickled_a_byte_at_a_time_is_cut_at_the_total_deadline() {
    // 240 bytes at four a second: a minute of answer, against a two-second deadline. Each
    // read returns well within any per-read timeout, so only a total deadline ends it.
    let body = format!(r#"{{"data":{{"ttl":60,"pad":"{}"}}}}"#, "x".repeat(200)).into_bytes();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let len = body.len();
    let (addr, sent) = trickle_server(head, body, Duration::from_millis(250));
    let err = client(addr, Duration::from_secs(2))
        .lookup_self(&token())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Temporary, "{err}");
    assert!(
        matches!(err, Error::BodyRead { .. } | Error::Network { .. }),
        "{err:?}"
    );
    // The client hung up long before the body was through: the server's next writes fail.
    std::thread::sleep(Duration::from_secs(1));
    let taken = sent.load(Ordering::SeqCst);
    assert!(taken < len / 4, "{taken} of {len} bytes read");
}

/// A raw server answering one request with a 200 and `body`, at once.
fn answer_once(body: &str) -> SocketAddr {
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut buf = [0u8; 8192];
        let _ = stream.read(&mut buf);
        let _ = stream.write_all(head.as_bytes());
    });
    addr
}

#[test]
fn ttls_of_u64_max_are_clamped_to_a_year() {
    let max = u64::MAX;
    let login = answer_once(&format!(
        r#"{{"auth":{{"client_token":"s.BBBBBBBBBBBBBBBBBBBBBBBB","lease_duration":{max},"renewable":true}}}}"#
    ));
    let jwt = SecretString::from("a.b.c".to_owned());
    let got = client(login, Duration::from_secs(5))
        .login_jwt("jwt-tenancy", "see-env", &jwt)
        .unwrap();
    assert_eq!(got.ttl, MAX_TTL);

    let renew = answer_once(&format!(
        r#"{{"auth":{{"client_token":"","lease_duration":{max},"renewable":true}}}}"#
    ));
    let got = client(renew, Duration::from_secs(5))
        .renew_self(&token(), None)
        .unwrap();
    assert_eq!(got.ttl, MAX_TTL);

    let lookup = answer_once(&format!(
        r#"{{"data":{{"ttl":{max},"creation_ttl":{max},"explicit_max_ttl":{max}}}}}"#
    ));
    let got = client(lookup, Duration::from_secs(5))
        .lookup_self(&token())
        .unwrap();
    assert_eq!(
        (got.ttl, got.creation_ttl, got.explicit_max_ttl),
        (MAX_TTL, MAX_TTL, MAX_TTL)
    );
}
