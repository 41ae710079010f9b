//! One behaviour test per refusal code, each with its exact `CODE: names` text.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{minimal_files, outcome};
use monky_bundle::{
    Bundle, ComposePolicy, DEFAULT_DISK_FACTOR, DEFAULT_DISK_HEADROOM, Limits, MemberName, Refusal,
    RefusalCode, Sha, check_disk, check_env_complete, check_rollback, pack_tar,
};

fn shown(r: Result<(), Refusal>) -> String {
    match r {
        Ok(()) => "ok".to_owned(),
        Err(r) => r.to_string(),
    }
}

fn with(member: MemberName, content: &str) -> Vec<u8> {
    let mut files = minimal_files();
    files.insert(member, content.as_bytes().to_vec());
    pack_tar(&files)
}

const GIB: u64 = 1024 * 1024 * 1024;

#[test]
fn env_incomplete() {
    let check = |template: &str, provided: &[&str], expected: &str| {
        let provided: BTreeSet<String> = provided.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            shown(check_env_complete(template, &provided)),
            expected,
            "{template:?}"
        );
    };
    // The renderer's header comment (the env-qa-02 field bug) is not a reference.
    check(
        "# The on-box agent substitutes every ${VAR} from OpenBao.\nGEMINI_API_KEY=${GEMINI_API_KEY}\n",
        &["GEMINI_API_KEY"],
        "ok",
    );
    check(
        "GEMINI_API_KEY=${GEMINI_API_KEY}\nSEE_ADMIN_TOKEN=${SEE_ADMIN_TOKEN}\n",
        &["GEMINI_API_KEY"],
        "ENV_INCOMPLETE: unresolved: SEE_ADMIN_TOKEN",
    );
    check(
        "A=$ZED\nB=${ALPHA}\n",
        &[],
        "ENV_INCOMPLETE: unresolved: ALPHA, ZED",
    );
    check("A=${A:-x}\nB=${B-}\nC=$$C\n  # ${D}\n", &[], "ok");
    check("A=${A:-${B}}\n", &[], "ENV_INCOMPLETE: unresolved: B");
    check("A=${A:?required}\n", &[], "ENV_INCOMPLETE: unresolved: A");
}

#[test]
fn privileged_refused() {
    let yaml = "services:\n  web:\n    image: nginx\n    privileged: true\n    cap_add: [cap_sys_admin]\n  db:\n    image: postgres\n    pid: host\n";
    assert_eq!(
        shown(ComposePolicy::new("monky-env-qa-02").check_file(
            yaml,
            &|_| None,
            &Default::default()
        )),
        "PRIVILEGED_REFUSED: db: pid host, web: cap_add SYS_ADMIN, web: privileged"
    );
}

#[test]
fn rollback_refused() {
    let sha = |head: &str, fill: char| {
        let text = format!("{head}{}", fill.to_string().repeat(64 - head.len()));
        Sha::parse(&text).unwrap()
    };
    let history = [
        sha("aaaaaaaaaaaa", '1'),
        sha("bbbbbbbbbbbb", '2'),
        sha("cccccccccccc", '3'),
    ];
    let check = |sha: &Sha, allow: bool, expected: &str| {
        assert_eq!(
            shown(check_rollback(sha, &history, allow)),
            expected,
            "{sha:?}"
        );
    };
    check(
        &sha("aaaaaaaaaaaa", '1'),
        false,
        "ROLLBACK_REFUSED: aaaaaaaaaaaa, current cccccccccccc",
    );
    check(&sha("aaaaaaaaaaaa", '1'), true, "ok");
    check(&sha("cccccccccccc", '3'), false, "ok");
    check(&sha("dddddddddddd", '4'), false, "ok");
    assert_eq!(shown(check_rollback(&sha("e", 'e'), &[], false)), "ok");
}

#[test]
fn disk_insufficient() {
    let check = |free: u64, need: u64, expected: &str| {
        let got = check_disk(free, need, DEFAULT_DISK_FACTOR, DEFAULT_DISK_HEADROOM);
        assert_eq!(shown(got), expected, "free {free} need {need}");
    };
    check(
        GIB + GIB / 5,
        GIB,
        "DISK_INSUFFICIENT: need 3.5 GiB, free 1.2 GiB",
    );
    check(3 * GIB + GIB / 2, GIB, "ok");
    check(
        3 * GIB + GIB / 2 - 1,
        GIB,
        "DISK_INSUFFICIENT: need 3.5 GiB, free 3.5 GiB",
    );
    check(
        10 * 1024 * 1024,
        0,
        "DISK_INSUFFICIENT: need 2.0 GiB, free 10.0 MiB",
    );
    check(u64::MAX, u64::MAX, "ok");
    // A NaN factor does not wave a full disk through.
    assert_eq!(
        shown(check_disk(0, GIB, f64::NAN, 0)),
        "DISK_INSUFFICIENT: need 1.5 GiB, free 0 bytes"
    );
}

#[test]
fn renderer_refused() {
    assert_eq!(
        outcome(&with(
            MemberName::BUNDLE_JSON,
            r#"{"renderer":"helm","tier":"dev"}"#
        )),
        "RENDERER_REFUSED: helm"
    );
}

#[test]
fn manifest_value_refused() {
    let manifest = r#"{"vault_mode":"openbao","entries":[
        {"var":"GEMINI_API_KEY","path":"monky/e/see/g","kind":"supplied","version":2,"value":"AIzaSy-not-a-real-key"},
        {"var":"KEY","path":"monky/e/see/key","kind":"supplied","version":1}]}"#;
    let got = outcome(&with(MemberName::SECRETS_MANIFEST, manifest));
    assert_eq!(got, "MANIFEST_VALUE_REFUSED: GEMINI_API_KEY");
    assert!(!got.contains("AIza"));
}

#[test]
fn bundle_sha_mismatch() {
    let b = Bundle::parse(&pack_tar(&minimal_files()), &Limits::default()).expect("valid");
    let mut desired = [0u8; 32];
    desired[..6].copy_from_slice(&[0x7a, 0x10, 0xc0, 0xff, 0xee, 0x11]);
    let refusal = b.check_sha(&desired).expect_err("different sha");
    assert_eq!(refusal.code, RefusalCode::BundleShaMismatch);
    assert_eq!(
        refusal.to_string(),
        format!(
            "BUNDLE_SHA_MISMATCH: desired 7a10c0ffee11, content {}",
            b.sha().short()
        )
    );
    // The same refusal for a desired text that is no sha at all, named as printable.
    assert_eq!(
        b.sha_mismatch("7a10\u{1b}[31mc0ffee11deadbeef").to_string(),
        format!(
            "BUNDLE_SHA_MISMATCH: desired 7a10\\u{{1b}}[31mc0f, content {}",
            b.sha().short()
        )
    );
}

#[test]
fn bundle_invalid() {
    assert_eq!(
        outcome(&with(MemberName::BUNDLE_JSON, "{not json")),
        "BUNDLE_INVALID: bundle.json: invalid json at line 1 column 2"
    );
}

#[test]
fn bundle_too_large() {
    let mut files = minimal_files();
    files.insert(MemberName::ENV_EXAMPLE, vec![b'#'; 5 * 1024 * 1024]);
    let limits = Limits {
        max_member_bytes: 8 * 1024 * 1024,
        ..Limits::default()
    };
    let got = Bundle::parse(&pack_tar(&files), &limits).expect_err("too large");
    assert_eq!(got.code(), Some(RefusalCode::BundleTooLarge));
    assert_eq!(got.to_string(), "BUNDLE_TOO_LARGE: over 4194304 bytes");
}

#[test]
fn every_code_has_its_wire_string() {
    let codes = [
        (RefusalCode::EnvIncomplete, "ENV_INCOMPLETE"),
        (RefusalCode::PrivilegedRefused, "PRIVILEGED_REFUSED"),
        (RefusalCode::RollbackRefused, "ROLLBACK_REFUSED"),
        (RefusalCode::DiskInsufficient, "DISK_INSUFFICIENT"),
        (RefusalCode::RendererRefused, "RENDERER_REFUSED"),
        (RefusalCode::ManifestValueRefused, "MANIFEST_VALUE_REFUSED"),
        (RefusalCode::BundleShaMismatch, "BUNDLE_SHA_MISMATCH"),
        (RefusalCode::BundleInvalid, "BUNDLE_INVALID"),
        (RefusalCode::BundleTooLarge, "BUNDLE_TOO_LARGE"),
        (RefusalCode::EnvValueUnsafe, "ENV_VALUE_UNSAFE"),
    ];
    let map: BTreeMap<RefusalCode, &str> = codes.into_iter().collect();
    assert_eq!(map.len(), 10);
    for (code, text) in map {
        assert_eq!(code.as_str(), text);
        assert_eq!(code.to_string(), text);
    }
}
