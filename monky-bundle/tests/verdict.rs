//! The offline verdict through the public API: every check in its order, the KV paths, and the
//! compose file that cannot be read told apart by type.

mod common;

use common::minimal_files;
use monky_bundle::{Bundle, ComposePolicy, Limits, MemberName, RefusalCode, Verdict, pack_tar};

/// The minimal bundle (env `e`) with `compose`, `template` and the manifest `entries` (JSON)
/// in place, judged for env `e` under mount `monky`.
fn verdict(compose: &str, template: &str, entries: &str) -> Verdict {
    let mut files = minimal_files();
    files.insert(MemberName::DOCKER_COMPOSE_YML, compose.as_bytes().to_vec());
    files.insert(MemberName::ENV_TEMPLATE, template.as_bytes().to_vec());
    files.insert(
        MemberName::SECRETS_MANIFEST,
        format!(r#"{{"vault_mode":"openbao","entries":{entries}}}"#).into_bytes(),
    );
    let bundle = Bundle::parse(&pack_tar(&files), &Limits::default()).unwrap();
    Verdict::offline(&bundle, "e", "monky", &ComposePolicy::new("monky-e"))
}

fn entry(var: &str, path: &str) -> String {
    format!(r#"{{"var":"{var}","path":"{path}","kind":"supplied","version":1}}"#)
}

fn shown(v: &Verdict) -> Vec<String> {
    v.refusals().iter().map(ToString::to_string).collect()
}

#[test]
fn a_clean_bundle_passes_with_its_paths_in_manifest_order() {
    let entries = format!(
        "[{},{}]",
        entry("B", "monky/e/see/b"),
        entry("A", "monky/data/e/see/a")
    );
    let v = verdict(
        "services:\n  web:\n    image: nginx\n    environment:\n      B: ${B}\n",
        "A=${A}\nB=${B}\n",
        &entries,
    );
    assert_eq!(shown(&v), Vec::<String>::new());
    assert!(v.compose_unreadable().is_none());
    let paths: Vec<String> = v.entries().iter().map(|e| e.path.api_path()).collect();
    assert_eq!(paths, ["monky/data/e/see/b", "monky/data/e/see/a"]);
}

#[test]
fn every_check_refuses_in_order_with_its_code() {
    let entries = format!(
        "[{},{},{}]",
        entry("OTHER", "monky/f/see/x"),
        entry("PASS", "monky/e/see/pass"),
        r#"{"path":"monky/e/ops/y","kind":"supplied","version":1,"use":"registry-auth"}"#
    );
    let v = verdict(
        "services:\n  redis:\n    image: r\n    privileged: true\n    command: redis-server --requirepass ${PASS}\n",
        "PASS=${PASS}\nMISSING=${NOT_PROVIDED}\n",
        &entries,
    );
    let codes: Vec<RefusalCode> = v.refusals().iter().map(|r| r.code).collect();
    assert_eq!(
        codes,
        [
            RefusalCode::ManifestPathRefused,
            RefusalCode::EnvIncomplete,
            RefusalCode::PrivilegedRefused,
            RefusalCode::SecretOnCommandLine,
        ]
    );
    let text = shown(&v);
    // An entry without a variable is named by its path.
    assert_eq!(
        text[0],
        "MANIFEST_PATH_REFUSED: outside monky/data/e/see/: OTHER, monky/e/ops/y"
    );
    assert_eq!(text[1], "ENV_INCOMPLETE: unresolved: NOT_PROVIDED");
    assert!(
        text[2].starts_with("PRIVILEGED_REFUSED: redis: privileged"),
        "{}",
        text[2]
    );
    assert!(
        text[3].starts_with("SECRET_ON_COMMAND_LINE: redis: command uses ${PASS}"),
        "{}",
        text[3]
    );
    assert_eq!(
        v.entries()
            .iter()
            .map(|e| e.path.name())
            .collect::<Vec<_>>(),
        ["pass"]
    );
    assert!(v.compose_unreadable().is_none());
}

#[test]
fn the_bundles_own_allow_privileged_replaces_the_boxs() {
    let mut files = minimal_files();
    files.insert(
        MemberName::DOCKER_COMPOSE_YML,
        b"services:\n  web:\n    image: nginx\n    privileged: true\n".to_vec(),
    );
    let mut refused = |meta: &str| {
        files.insert(MemberName::BUNDLE_JSON, meta.as_bytes().to_vec());
        let b = Bundle::parse(&pack_tar(&files), &Limits::default()).unwrap();
        let v = Verdict::offline(&b, "e", "monky", &ComposePolicy::new("monky-e"));
        v.refusals().iter().map(|r| r.code).collect::<Vec<_>>()
    };
    assert_eq!(
        refused(r#"{"env_id":"e","tier":"dev","renderer":"compose"}"#),
        [RefusalCode::PrivilegedRefused]
    );
    assert_eq!(
        refused(r#"{"env_id":"e","tier":"dev","renderer":"compose","allow_privileged":true}"#),
        []
    );
}

#[test]
fn a_compose_file_that_cannot_be_read_is_told_apart_by_type() {
    let key = format!("[{}]", entry("KEY", "monky/e/see/key"));
    // (compose file, unreadable?)
    let cases = [
        ("services: [\n", true),
        ("- just\n- a list\n", true),
        ("services:\n  web:\n    image: nginx\n", false),
    ];
    for (compose, unreadable) in cases {
        let v = verdict(compose, "KEY=${KEY}\n", &key);
        assert_eq!(
            v.compose_unreadable().is_some(),
            unreadable,
            "{compose:?}: {:?}",
            shown(&v)
        );
        if let Some(r) = v.compose_unreadable() {
            assert_eq!(r.code, RefusalCode::BundleInvalid);
            assert!(v.refusals().contains(r));
        }
    }
    // A finding that reads like the refusal of an unreadable file (`BUNDLE_INVALID: compose
    // file: ...`) is a finding on a file that was read.
    let v = verdict(
        "services:\n  'compose file':\n    image: nginx\n    bogus_key: 1\n",
        "KEY=${KEY}\n",
        &key,
    );
    let text = shown(&v);
    assert!(
        text.iter()
            .any(|t| t.starts_with("BUNDLE_INVALID: compose file: ")),
        "{text:?}"
    );
    assert!(v.compose_unreadable().is_none(), "{text:?}");
}
