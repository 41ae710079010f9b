//! Shared helpers for the behaviour tests: fixture files, raw tars (from the `testkit`
//! writer, which can express what `tar::Builder` refuses to write), and a gzip bomb.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use monky_bundle::testkit::raw_entry;
use monky_bundle::{Bundle, Limits, MemberName, pack_tar};

/// The protocol sha of the files in `tests/data/bundle/`, computed with Python's hashlib by
/// `tests/data/make_python_fixtures.py`.
pub const FIXTURE_SHA: &str = "0f8aaf12b428d72402833198594f6b9629fde7ef8929b09c90ebe8fef450a23c";

pub fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

pub fn read(name: &str) -> Vec<u8> {
    std::fs::read(data(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

/// The fixture bundle's members, read from `tests/data/bundle/`.
pub fn fixture_files() -> BTreeMap<MemberName, Vec<u8>> {
    MemberName::all()
        .map(|n| (n, std::fs::read(data(&format!("bundle/{}", n.as_str())))))
        .filter_map(|(n, r)| r.ok().map(|c| (n, c)))
        .collect()
}

/// A minimal valid bundle's members.
pub fn minimal_files() -> BTreeMap<MemberName, Vec<u8>> {
    BTreeMap::from([
        (MemberName::DOCKER_COMPOSE_YML, b"services:\n  web:\n    image: nginx\n".to_vec()),
        (MemberName::ENV_TEMPLATE, b"KEY=${KEY}\n".to_vec()),
        (
            MemberName::SECRETS_MANIFEST,
            br#"{"vault_mode":"openbao","entries":[{"var":"KEY","path":"monky/e/see/key","kind":"supplied","version":1}]}"#.to_vec(),
        ),
        (MemberName::BUNDLE_JSON, br#"{"env_id":"e","tier":"dev","renderer":"compose"}"#.to_vec()),
    ])
}

/// Parses with default limits and renders the outcome as one comparable line:
/// `ok <sha>` or the refusal's display.
pub fn outcome(bytes: &[u8]) -> String {
    outcome_with(bytes, &Limits::default())
}

pub fn outcome_with(bytes: &[u8], limits: &Limits) -> String {
    match Bundle::parse(bytes, limits) {
        Ok(b) => format!("ok {}", b.sha()),
        Err(e) => e.to_string(),
    }
}

/// The valid members as raw entries, followed by `extra`, then the end-of-archive blocks.
pub fn tar_with(files: &BTreeMap<MemberName, Vec<u8>>, extra: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, content) in files {
        out.extend(raw_entry(name.as_str().as_bytes(), b'0', content, b""));
    }
    for e in extra {
        out.extend_from_slice(e);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// `pack_tar` of the minimal bundle.
pub fn minimal_tar() -> Vec<u8> {
    pack_tar(&minimal_files())
}

/// A gzip stream that inflates to `mib` MiB of zeros and is cut off before its trailer: only
/// a reader that stops at the limit sees "too large"; one that inflates everything first hits
/// the missing trailer and calls it corrupt.
pub fn gzip_bomb(mib: usize) -> Vec<u8> {
    use flate2::{Compress, Compression, FlushCompress};
    let zeros = vec![0u8; 1 << 20];
    let mut deflate = Compress::new(Compression::best(), false);
    let mut chunk = Vec::with_capacity(1 << 16);
    deflate
        .compress_vec(&zeros, &mut chunk, FlushCompress::Sync)
        .expect("deflate zeros");
    assert_eq!(
        deflate.total_in(),
        1 << 20,
        "the whole MiB went into one chunk"
    );
    // gzip header: magic, deflate, no flags, mtime 0, no extra flags, unknown OS.
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    for _ in 0..mib {
        out.extend_from_slice(&chunk);
    }
    out
}
