//! KV v2 reads through the client: latest and pinned versions, the 404 forms (missing,
//! deleted, destroyed), the policy's 403, and paths refused locally with no request sent.

mod common;

use common::{Setup, assert_hidden, reveal};
use monky_bao_client::{Absence, Error, ErrorKind, KvPath, PathRefusal};
use monky_testkit::bao::Fault;
use serde_json::json;

fn path(env: &str, name: &str) -> KvPath {
    KvPath::parse(&format!("monky/{env}/see/{name}"), "monky", env).unwrap()
}

#[test]
fn latest_and_pinned_versions() {
    let s = Setup::start();
    assert_eq!(s.bao.put_secret("env-a", "pg_password", "first"), 1);
    assert_eq!(s.bao.put_secret("env-a", "pg_password", "second"), 2);
    let token = s.login("env-a");
    let p = path("env-a", "pg_password");
    let read = |version| reveal(&s.client.read_kv(&token, &p, version).unwrap()).to_owned();
    assert_eq!(read(None), "second");
    assert_eq!(read(Some(1)), "first");
    assert_eq!(read(Some(2)), "second");
    assert_eq!(s.bao.put_secret("env-a", "pg_password", "third"), 3);
    assert_eq!(read(None), "third");
    assert_eq!(read(Some(2)), "second");

    let queries: Vec<Option<String>> = s
        .bao
        .agent_requests()
        .into_iter()
        .filter(|r| r.path == "/v1/monky/data/env-a/see/pg_password")
        .map(|r| r.query)
        .collect();
    assert_eq!(
        queries,
        [
            None,
            Some("version=1".into()),
            Some("version=2".into()),
            None,
            Some("version=2".into())
        ]
    );
}

#[test]
fn both_manifest_forms_read_the_same_secret() {
    let s = Setup::start();
    s.bao.put_secret("env-a", "admin_token", "t0ken-value");
    let token = s.login("env-a");
    for form in [
        "monky/env-a/see/admin_token",
        "monky/data/env-a/see/admin_token",
    ] {
        let p = KvPath::parse(form, "monky", "env-a").unwrap();
        let value = s.client.read_kv(&token, &p, None).unwrap();
        assert_eq!(reveal(&value), "t0ken-value", "{form}");
    }
}

/// Reads `name` of env-a at `version` with an env-a token and returns the error.
fn read_error(s: &Setup, name: &str, version: Option<u64>) -> Error {
    let token = s.login("env-a");
    s.client
        .read_kv(&token, &path("env-a", name), version)
        .unwrap_err()
}

#[test]
fn the_three_not_found_forms() {
    let s = Setup::start();
    s.bao.put_secret("env-a", "pg", "v1");
    s.bao.put_secret("env-a", "pg", "v2");
    s.bao.put_secret("env-a", "pg", "v3");
    assert!(s.bao.delete_version("env-a", "pg", 2));
    assert!(s.bao.destroy_version("env-a", "pg", 3));
    assert!(!s.bao.delete_version("env-a", "pg", 9));

    let check =
        |name: &str, version: Option<u64>, absence: &dyn Fn(&Absence) -> bool, text: &str| {
            let err = read_error(&s, name, version);
            assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
            assert_eq!(err.status(), Some(404));
            assert!(absence(err.absence().unwrap()), "{err:?}");
            assert!(err.to_string().contains(text), "{err} lacks {text}");
        };
    check(
        "nothing-here",
        None,
        &|a| *a == Absence::Missing,
        "not found",
    );
    check(
        "pg",
        Some(7),
        &|a| *a == Absence::Missing,
        "version 7 not found",
    );
    check(
        "pg",
        Some(2),
        &|a| matches!(a, Absence::Deleted { deletion_time } if deletion_time.ends_with('Z')),
        "version 2 was deleted at 20",
    );
    check(
        "pg",
        Some(3),
        &|a| *a == Absence::Destroyed,
        "version 3 was destroyed",
    );
    // The latest version is the destroyed one.
    check("pg", None, &|a| *a == Absence::Destroyed, "was destroyed");
    let token = s.login("env-a");
    let v1 = s
        .client
        .read_kv(&token, &path("env-a", "pg"), Some(1))
        .unwrap();
    assert_eq!(reveal(&v1), "v1");
}

#[test]
fn missing_path_is_an_empty_errors_list() {
    let s = Setup::start();
    let err = read_error(&s, "never-written", None);
    assert_eq!(err.errors(), Vec::<String>::new());
    assert!(matches!(err, Error::NotFound { .. }));
}

#[test]
fn a_document_without_value_is_refused() {
    let s = Setup::start();
    s.bao
        .put_document("env-a", "odd", json!({"password": "not-under-value"}));
    s.bao.put_document("env-a", "num", json!({"value": 42}));
    for name in ["odd", "num"] {
        let err = read_error(&s, name, None);
        assert_eq!(err.kind(), ErrorKind::Refused);
        assert!(matches!(err, Error::MissingValue { .. }), "{err}");
        assert!(!err.to_string().contains("not-under-value"));
    }
}

#[test]
fn policy_denies_another_envs_path_with_the_acl_form() {
    let s = Setup::start();
    s.bao.put_secret("env-b", "pg", "b-secret");
    let token = s.login("env-a");
    // A KvPath for env-b can only come from parsing with env-b as the caller; the fake's
    // policy must still refuse an env-a token.
    let err = s
        .client
        .read_kv(&token, &path("env-b", "pg"), None)
        .unwrap_err();
    common::assert_acl_denied(&err);
    assert_hidden(&err, token.expose_secret());
    assert_hidden(&err, "b-secret");

    // The root token reads anything.
    let value = s
        .client
        .read_kv(&s.root(), &path("env-b", "pg"), None)
        .unwrap();
    assert_eq!(reveal(&value), "b-secret");
}

#[test]
fn expired_token_reads_nothing() {
    let s = Setup::start();
    s.bao.put_secret("env-a", "pg", "v");
    let token = s.login("env-a");
    s.bao
        .advance_clock(std::time::Duration::from_secs(24 * 3600 + 1));
    let err = s
        .client
        .read_kv(&token, &path("env-a", "pg"), None)
        .unwrap_err();
    assert_eq!(err.errors(), ["permission denied"]);
    assert!(matches!(
        err,
        Error::PermissionDenied {
            multi_error: false,
            ..
        }
    ));
}

#[test]
fn another_envs_manifest_path_is_refused_before_any_request() {
    let s = Setup::start();
    s.bao.put_secret("env-b", "pg", "b-secret");
    let token = s.login("env-a");
    let sent_before = s.bao.requests().len();
    let check = |manifest_path: &str, reason: PathRefusal| {
        let err = KvPath::parse(manifest_path, "monky", "env-a")
            .map_err(Error::from)
            .and_then(|p| s.client.read_kv(&token, &p, None))
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Refused, "{manifest_path}");
        assert_eq!(err.path_refusal(), Some(reason), "{manifest_path}: {err}");
    };
    check("monky/env-b/see/pg", PathRefusal::OtherEnv);
    check("monky/data/env-b/see/pg", PathRefusal::OtherEnv);
    check(
        "monky/env-a/see/../../env-b/see/pg",
        PathRefusal::DotSegment,
    );
    check("monky/env-a/see/pg/extra", PathRefusal::ExtraSegments);
    check("monky/env-a/see/", PathRefusal::EmptySegment);
    check("secret/env-a/see/pg", PathRefusal::WrongMount);
    check("/monky/env-a/see/pg", PathRefusal::Absolute);
    assert_eq!(
        s.bao.requests().len(),
        sent_before,
        "no request for a refused path"
    );
}

#[test]
fn sealed_during_a_read_is_temporary() {
    let s = Setup::start();
    s.bao.put_secret("env-a", "pg", "v");
    let token = s.login("env-a");
    s.bao.set_fault("monky/data/", Fault::Sealed);
    let err = s
        .client
        .read_kv(&token, &path("env-a", "pg"), None)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Temporary);
    assert_eq!(err.errors(), ["Vault is sealed"]);
    // Login and token calls are not under the faulted prefix.
    s.client.lookup_self(&token).unwrap();
}

#[test]
fn an_endless_answer_is_refused_not_buffered() {
    let s = Setup::start();
    s.bao.put_secret("env-a", "big", "v");
    let token = s.login("env-a");
    let p = path("env-a", "big");
    let padding = "x".repeat(monky_bao_client::MAX_BODY_BYTES as usize);
    s.bao.set_fault(
        "/v1/monky/data/env-a/see/big",
        Fault::Status {
            status: 200,
            body: json!({"data": {"data": {"value": "v"}, "padding": padding}}).to_string(),
        },
    );
    let err = s.client.read_kv(&token, &p, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    assert!(
        matches!(&err, Error::UnexpectedBody { status: 200, json: true, detail, .. }
            if detail == "body over 4194304 bytes"),
        "{err:?}"
    );
    // Just under the limit, the same answer is read.
    let padding = "x".repeat(monky_bao_client::MAX_BODY_BYTES as usize - 100);
    s.bao.clear_faults();
    s.bao.set_fault(
        "/v1/monky/data/env-a/see/big",
        Fault::Status {
            status: 200,
            body: json!({"data": {"data": {"value": "v"}, "padding": padding}}).to_string(),
        },
    );
    assert_eq!(reveal(&s.client.read_kv(&token, &p, None).unwrap()), "v");
}
