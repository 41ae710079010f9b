//! The client against `FakeTenancy`: happy paths, every failure class, mapping and limits.

use std::net::TcpListener;
use std::time::Duration;

use monky_agent_proto::Sha;
use monky_agent_proto::{
    Action, ActionKind, CheckinRequest, Client, Error, ErrorCode, ErrorKind, ReportRequest,
    ReportResult,
};
use monky_testkit::raw::{RawBody, RawPeer};
use monky_testkit::tenancy::{self, Desired, Endpoint, FakeTenancy, Fault, call, lease_request};
use secrecy::{ExposeSecret, SecretString};

const ENV: &str = "env-qa-02";
const SHA: &str = "7a107a107a107a107a107a107a107a107a107a107a107a107a107a107a107a10";
/// A sha the host runs that is not the desired one.
const OLDER: &str = "3f9c3f9c3f9c3f9c3f9c3f9c3f9c3f9c3f9c3f9c3f9c3f9c3f9c3f9c3f9c3f9c";

fn report_request(env_id: &str, detail: Option<&str>) -> ReportRequest {
    let result = if detail.is_some() {
        ReportResult::Failed
    } else {
        ReportResult::Applied
    };
    ReportRequest {
        sha: Some(Sha::parse(SHA).unwrap()),
        log_tail: "INFO applied".into(),
        detail: detail.map(Into::into),
        ..tenancy::report_request(env_id, result)
    }
}

/// The sample checkin of `env_id`, having applied `applied_sha`.
fn checkin_request(env_id: &str, applied_sha: Option<&str>) -> CheckinRequest {
    CheckinRequest {
        applied_sha: applied_sha.map(|s| Sha::parse(s).unwrap()),
        ..tenancy::checkin_request(env_id)
    }
}

/// Assert the classification and that nothing of the bearer leaks into the error's text.
fn assert_error(
    err: &Error,
    bearer: &SecretString,
    kind: ErrorKind,
    status: Option<u16>,
    code: Option<&str>,
) {
    assert_eq!(err.kind(), kind, "{err}");
    assert_eq!(err.status(), status, "{err}");
    assert_eq!(err.code().map(ErrorCode::as_str), code, "{err}");
    let mut text = format!("{err} {err:?}");
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        text.push_str(&format!(" {s} {s:?}"));
        source = s.source();
    }
    assert!(
        !text.contains(bearer.expose_secret()),
        "bearer leaked: {text}"
    );
}

#[test]
fn happy_path_through_all_four_calls() {
    let fake = FakeTenancy::builder().start();
    let client = fake.client();
    let bearer = fake.issue_token(ENV);
    fake.set_desired(ENV, Desired::sha(SHA));
    fake.publish_bundle(ENV, SHA, b"tar bytes".to_vec());

    let resp = client
        .checkin(&bearer, &checkin_request(ENV, Some(OLDER)))
        .unwrap();
    let Action::Apply { sha, bundle_url } = resp.action.clone() else {
        panic!("{resp:?} is no apply");
    };
    assert_eq!(sha.as_str(), SHA);
    assert_eq!(resp.checkin_interval_s.map(|i| i.as_secs()), Some(60));
    let vault = resp.vault.clone().unwrap();
    assert_eq!(vault.prefix.as_deref(), Some("env-qa-02/see"));
    assert_eq!(vault.auth_mount.as_deref(), Some("jwt-tenancy"));

    let bundle = client.bundle(&bearer, &bundle_url).unwrap();
    assert_eq!(bundle.bytes, b"tar bytes");
    assert_eq!(bundle.header_sha.as_deref(), Some(SHA));

    let converged = client
        .checkin(&bearer, &checkin_request(ENV, Some(SHA)))
        .unwrap();
    assert_eq!(converged.action.kind(), ActionKind::None);

    let lease = client.lease(&bearer, &lease_request(ENV)).unwrap();
    assert_eq!(
        (lease.mount.as_str(), lease.role.as_str(), lease.ttl_s),
        ("jwt-tenancy", "see-env", 3600)
    );
    assert_eq!(lease.login_jwt.expose_secret().split('.').count(), 3);
    assert_eq!(fake.lease_count(ENV), 1);

    client
        .report(&bearer, &report_request(ENV, Some("ENV_INCOMPLETE: X")))
        .unwrap();
    let reports = fake.reports(ENV);
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].detail.as_deref(), Some("ENV_INCOMPLETE: X"));

    let requests = fake.requests();
    assert_eq!(requests.len(), 5);
    assert!(
        requests
            .iter()
            .all(|r| r.had_bearer && r.status == Some(200))
    );
    let report_body = requests[4].body.as_ref().unwrap();
    assert_eq!(report_body["result"], "failed");
}

#[test]
fn retire_answers_down_with_purge() {
    let fake = FakeTenancy::builder().start();
    let bearer = fake.issue_token(ENV);
    fake.set_desired(ENV, Desired::down(true));
    let resp = fake
        .client()
        .checkin(&bearer, &checkin_request(ENV, Some(SHA)))
        .unwrap();
    assert_eq!(
        resp.action,
        Action::Down {
            purge_volumes: true,
            desired: None
        }
    );
}

#[test]
fn connect_to_keeps_the_tenancy_name_and_port_in_host() {
    let fake = FakeTenancy::builder().start();
    let bearer = fake.issue_token(ENV);
    fake.set_desired(ENV, Desired::sha(SHA));
    fake.publish_bundle(ENV, SHA, vec![1, 2, 3]);
    let client = Client::builder("http://monky.tenancy.deploy:443".parse().unwrap())
        .connect_to(fake.addr())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let resp = client
        .checkin(&bearer, &checkin_request(ENV, None))
        .unwrap();
    let Action::Apply { bundle_url, .. } = &resp.action else {
        panic!("{resp:?} is no apply");
    };
    let bundle = client.bundle(&bearer, bundle_url).unwrap();
    assert_eq!(bundle.bytes, vec![1, 2, 3]);
    // An absolute bundle URL on the configured origin is followed through the mapping too.
    client
        .bundle(
            &bearer,
            &format!("http://monky.tenancy.deploy:443/v1/agent/bundle/env-qa-02/{SHA}"),
        )
        .unwrap();
    let hosts: Vec<_> = fake.requests().into_iter().map(|r| r.host).collect();
    assert_eq!(hosts, vec![Some("monky.tenancy.deploy:443".to_owned()); 3]);
}

#[test]
fn each_fault_is_classified() {
    struct Case {
        endpoint: Endpoint,
        fault: Fault,
        kind: ErrorKind,
        status: Option<u16>,
        code: Option<&'static str>,
        retry_after: Option<u64>,
    }
    let case = |endpoint, fault, kind, status, code| Case {
        endpoint,
        fault,
        kind,
        status,
        code,
        retry_after: None,
    };
    let json_status = |status: u16, code: &str| Fault::Status {
        status,
        body: format!(r#"{{"code": "{code}", "detail": "injected"}}"#),
    };
    let cases = [
        case(
            Endpoint::Checkin,
            json_status(500, "INTERNAL"),
            ErrorKind::Temporary,
            Some(500),
            Some("INTERNAL"),
        ),
        case(
            Endpoint::Report,
            json_status(503, "MAINTENANCE"),
            ErrorKind::Temporary,
            Some(503),
            Some("MAINTENANCE"),
        ),
        case(
            Endpoint::Checkin,
            Fault::Status {
                status: 502,
                body: "<html>bad gateway</html>".into(),
            },
            ErrorKind::Temporary,
            Some(502),
            None,
        ),
        case(
            Endpoint::Checkin,
            Fault::Garbage,
            ErrorKind::Temporary,
            Some(200),
            None,
        ),
        case(
            Endpoint::Lease,
            Fault::Garbage,
            ErrorKind::Temporary,
            Some(200),
            None,
        ),
        case(
            Endpoint::Report,
            Fault::Garbage,
            ErrorKind::Temporary,
            Some(200),
            None,
        ),
        case(
            Endpoint::Checkin,
            Fault::DropConnection,
            ErrorKind::Temporary,
            None,
            None,
        ),
        case(
            Endpoint::Bundle,
            Fault::DropConnection,
            ErrorKind::Temporary,
            None,
            None,
        ),
        Case {
            retry_after: Some(7),
            ..case(
                Endpoint::Checkin,
                Fault::RetryAfter(7),
                ErrorKind::Temporary,
                Some(429),
                Some("RATE_LIMITED"),
            )
        },
        Case {
            retry_after: Some(90),
            ..case(
                Endpoint::Lease,
                Fault::RetryAfter(90),
                ErrorKind::Temporary,
                Some(429),
                Some("LEASE_RATE_LIMITED"),
            )
        },
        case(
            Endpoint::Checkin,
            json_status(401, "AGENT_UNAUTHENTICATED"),
            ErrorKind::Unauthenticated,
            Some(401),
            Some("AGENT_UNAUTHENTICATED"),
        ),
        case(
            Endpoint::Report,
            Fault::Status {
                status: 401,
                body: "{}".into(),
            },
            ErrorKind::Unauthenticated,
            Some(401),
            None,
        ),
        // A 401 page that is not JSON did not come from tenancy: temporary, the token is kept.
        case(
            Endpoint::Checkin,
            Fault::Status {
                status: 401,
                body: "denied".into(),
            },
            ErrorKind::Temporary,
            Some(401),
            None,
        ),
        case(
            Endpoint::Checkin,
            json_status(403, "AGENT_ENV_MISMATCH"),
            ErrorKind::EnvMismatch,
            Some(403),
            Some("AGENT_ENV_MISMATCH"),
        ),
        case(
            Endpoint::Checkin,
            json_status(403, "FORBIDDEN"),
            ErrorKind::Refused,
            Some(403),
            Some("FORBIDDEN"),
        ),
        case(
            Endpoint::Report,
            json_status(422, "REQUEST_INVALID"),
            ErrorKind::Refused,
            Some(422),
            Some("REQUEST_INVALID"),
        ),
        case(
            Endpoint::Checkin,
            Fault::Status {
                status: 200,
                body: r#"{"env_id": "e", "action": "reboot"}"#.into(),
            },
            ErrorKind::Refused,
            Some(200),
            Some("CHECKIN_INVALID"),
        ),
        case(
            Endpoint::Lease,
            Fault::AppRoleLease,
            ErrorKind::Refused,
            None,
            Some("LEASE_SHAPE"),
        ),
    ];
    let fake = FakeTenancy::builder().start();
    let client = fake.client();
    let bearer = fake.issue_token(ENV);
    for (i, c) in cases.into_iter().enumerate() {
        fake.set_fault_times(c.endpoint, c.fault.clone(), Some(1));
        let err =
            call(&client, &bearer, c.endpoint, ENV).expect_err(&format!("case {i}: {:?}", c.fault));
        assert_error(&err, &bearer, c.kind, c.status, c.code);
        assert_eq!(
            err.retry_after(),
            c.retry_after.map(Duration::from_secs),
            "case {i}"
        );
    }
    // Every fault was used up once: the same calls now succeed (the bundle one still 404s).
    fake.publish_bundle(ENV, "abc", vec![0]);
    for endpoint in [
        Endpoint::Checkin,
        Endpoint::Bundle,
        Endpoint::Lease,
        Endpoint::Report,
    ] {
        call(&client, &bearer, endpoint, ENV).unwrap();
    }
}

#[test]
fn status_error_keeps_detail() {
    let fake = FakeTenancy::builder().start();
    let bearer = fake.issue_token(ENV);
    fake.set_fault(
        Endpoint::Checkin,
        Fault::Status {
            status: 409,
            body: r#"{"code": "X", "detail": "why not"}"#.into(),
        },
    );
    let err = call(&fake.client(), &bearer, Endpoint::Checkin, ENV).unwrap_err();
    assert_eq!(err.detail(), Some("why not"));
    assert_eq!(err.code(), Some(&ErrorCode::Other("X".into())));
    // `set_fault` is "always": a second call fails the same way.
    assert_eq!(
        call(&fake.client(), &bearer, Endpoint::Checkin, ENV)
            .unwrap_err()
            .status(),
        Some(409)
    );
    fake.clear_faults();
    call(&fake.client(), &bearer, Endpoint::Checkin, ENV).unwrap();
}

#[test]
fn tenancy_checks_are_classified() {
    let fake = FakeTenancy::builder().start();
    let client = fake.client();
    let bearer = fake.issue_token(ENV);

    let unknown = SecretString::from("s.not-a-token-anyone-issued".to_owned());
    let err = call(&client, &unknown, Endpoint::Checkin, ENV).unwrap_err();
    assert_error(
        &err,
        &unknown,
        ErrorKind::Unauthenticated,
        Some(401),
        Some("AGENT_UNAUTHENTICATED"),
    );

    let err = call(&client, &bearer, Endpoint::Report, "env-other").unwrap_err();
    assert_error(
        &err,
        &bearer,
        ErrorKind::EnvMismatch,
        Some(403),
        Some("AGENT_ENV_MISMATCH"),
    );
    let err = client
        .bundle(&bearer, "/v1/agent/bundle/env-other/abc")
        .unwrap_err();
    assert_error(
        &err,
        &bearer,
        ErrorKind::EnvMismatch,
        Some(403),
        Some("AGENT_ENV_MISMATCH"),
    );

    let err = call(&client, &bearer, Endpoint::Bundle, ENV).unwrap_err();
    assert_error(
        &err,
        &bearer,
        ErrorKind::Refused,
        Some(404),
        Some("BUNDLE_NOT_FOUND"),
    );

    fake.supersede(ENV);
    for endpoint in [Endpoint::Checkin, Endpoint::Lease] {
        let err = call(&client, &bearer, endpoint, ENV).unwrap_err();
        assert_error(
            &err,
            &bearer,
            ErrorKind::Unauthenticated,
            Some(401),
            Some("AGENT_UNAUTHENTICATED"),
        );
    }
}

#[test]
fn timeouts_are_temporary() {
    let fake = FakeTenancy::builder().start();
    let bearer = fake.issue_token(ENV);
    let client = Client::builder(fake.url())
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    fake.set_fault_times(
        Endpoint::Checkin,
        Fault::Delay(Duration::from_secs(3)),
        Some(1),
    );
    let started = std::time::Instant::now();
    let err = call(&client, &bearer, Endpoint::Checkin, ENV).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_error(&err, &bearer, ErrorKind::Temporary, None, None);
    assert!(err.is_timeout(), "{err:?}");
    // A delay shorter than the deadline is only slow.
    fake.set_fault_times(
        Endpoint::Checkin,
        Fault::Delay(Duration::from_millis(50)),
        Some(1),
    );
    call(&client, &bearer, Endpoint::Checkin, ENV).unwrap();
}

#[test]
fn nobody_listening_is_temporary() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::builder(format!("http://127.0.0.1:{port}/").parse().unwrap())
        .build()
        .unwrap();
    let bearer = SecretString::from("s.AAAAAAAAAAAAAAAAAAAAAAAA".to_owned());
    let err = call(&client, &bearer, Endpoint::Checkin, ENV).unwrap_err();
    assert_error(&err, &bearer, ErrorKind::Temporary, None, None);
}

#[test]
fn bundle_size_limit_from_content_length() {
    let fake = FakeTenancy::builder().start();
    let bearer = fake.issue_token(ENV);
    fake.publish_bundle(ENV, "big", vec![0; 4097]);
    fake.publish_bundle(ENV, "fits", vec![0; 4096]);
    let client = Client::builder(fake.url())
        .max_bundle_bytes(4096)
        .build()
        .unwrap();
    let err = client
        .bundle(&bearer, "/v1/agent/bundle/env-qa-02/big")
        .unwrap_err();
    assert_error(
        &err,
        &bearer,
        ErrorKind::Refused,
        None,
        Some("BUNDLE_TOO_LARGE"),
    );
    assert!(matches!(err, Error::BundleTooLarge { limit: 4096, .. }));
    assert_eq!(
        client
            .bundle(&bearer, "/v1/agent/bundle/env-qa-02/fits")
            .unwrap()
            .bytes
            .len(),
        4096
    );
}

#[test]
fn bundle_size_limit_is_enforced_while_streaming() {
    // 1 GiB offered without a Content-Length; the client stops right after its 1 MiB limit.
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\nX-Bundle-Sha256: abc\r\nTransfer-Encoding: chunked\r\n\r\n";
    let peer = RawPeer::start(head, RawBody::Chunked { chunks: 16 * 1024 });
    let client = Client::builder(peer.url())
        .max_bundle_bytes(1024 * 1024)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let bearer = SecretString::from("s.BBBBBBBBBBBBBBBBBBBBBBBB".to_owned());
    let started = std::time::Instant::now();
    let err = client
        .bundle(&bearer, "/v1/agent/bundle/e/abc")
        .unwrap_err();
    assert_error(
        &err,
        &bearer,
        ErrorKind::Refused,
        None,
        Some("BUNDLE_TOO_LARGE"),
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    // The same stream within the limit is read whole, and X-Bundle-Sha256 is taken.
    let peer = RawPeer::start(head, RawBody::Chunked { chunks: 2 });
    let client = Client::builder(peer.url()).build().unwrap();
    let download = client.bundle(&bearer, "/v1/agent/bundle/e/abc").unwrap();
    assert_eq!(download.bytes.len(), 128 * 1024);
    assert_eq!(download.header_sha.as_deref(), Some("abc"));
}

#[test]
fn redirects_are_not_followed() {
    let fake = FakeTenancy::builder().start();
    let bearer = fake.issue_token(ENV);
    let head = format!(
        "HTTP/1.1 307 Temporary Redirect\r\nLocation: {}v1/agent/checkin\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n",
        fake.url()
    );
    let peer = RawPeer::start(head, RawBody::Whole(b"{}".to_vec()));
    let client = Client::builder(peer.url()).build().unwrap();
    let err = call(&client, &bearer, Endpoint::Checkin, ENV).unwrap_err();
    assert_error(&err, &bearer, ErrorKind::Refused, Some(307), None);
    assert!(fake.requests().is_empty());
}

#[test]
fn bundle_urls_off_tenancy_are_refused_before_any_request() {
    let fake = FakeTenancy::builder().start();
    let bearer = fake.issue_token(ENV);
    let client = fake.client();
    for url in [
        "http://evil.test/v1/agent/bundle/env-qa-02/abc",
        "//evil.test/x",
        "https://127.0.0.1:1/x",
    ] {
        let err = client.bundle(&bearer, url).unwrap_err();
        assert!(matches!(err, Error::BundleUrl { .. }), "{url}: {err}");
        assert_error(&err, &bearer, ErrorKind::Refused, None, None);
    }
    assert!(fake.requests().is_empty());
}

/// Tenancy's certificate outside its dates by this machine's clock is told apart from other
/// TLS failures (the agent's next step is the clock), with which way it missed.
#[test]
fn a_certificate_outside_its_dates_is_named() {
    use monky_agent_proto::CertificateTime;
    use monky_testkit::bao::FakeBao;
    use monky_testkit::pki::Pki;
    for (from, until, problem) in [
        (2090, 2099, Some(CertificateTime::NotYetValid)),
        (2001, 2002, Some(CertificateTime::Expired)),
        (1975, 4096, None),
    ] {
        // Any TLS server does: the handshake is what is tested.
        let pki = Pki::valid_in_years(&["tenancy.example.test"], from, until);
        let server = FakeBao::builder()
            .tls(
                pki.cert_pem.clone().into_bytes(),
                pki.key_pem.clone().into_bytes(),
            )
            .start();
        let client = Client::builder("https://tenancy.example.test:8443".parse().unwrap())
            .connect_to(server.addr())
            .ca_bundle_pem(pki.ca_bytes())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let err = client
            .report(
                &SecretString::from("s.certificatetime0000000"),
                &report_request("env-c", None),
            )
            .unwrap_err();
        assert_eq!(err.certificate_time(), problem, "{err:?}");
        if problem.is_some() {
            assert_eq!(err.kind(), ErrorKind::Temporary);
        }
    }
}
