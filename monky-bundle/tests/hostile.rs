//! Hostile and malformed archives: each is refused with a fixed code and a message naming the
//! member, and nothing is ever unpacked.

mod common;

use common::{gzip_bomb, minimal_files, minimal_tar, outcome, outcome_with, tar_with};
use monky_bundle::testkit::{pax_record, raw_entry, raw_header};
use monky_bundle::{Limits, MemberName};

/// A minimal valid bundle plus one extra raw entry, expected to be refused as `expected`.
fn check(extra: Vec<u8>, expected: &str) {
    let bytes = tar_with(&minimal_files(), &[extra]);
    assert_eq!(outcome(&bytes), expected);
}

fn file(name: &[u8]) -> Vec<u8> {
    raw_entry(name, b'0', b"x", b"")
}

/// Member names refused for their spelling: traversal, absolute, not normalised, unknown, not
/// UTF-8. A name is refused as written, never normalised into an accepted one.
const BAD_NAMES: &[(&[u8], &str)] = &[
    (b"../x", "BUNDLE_INVALID: ../x: parent traversal"),
    (b"a/../../x", "BUNDLE_INVALID: a/../../x: parent traversal"),
    (b"./../x", "BUNDLE_INVALID: ./../x: parent traversal"),
    (
        b"../docker-compose.yml",
        "BUNDLE_INVALID: ../docker-compose.yml: parent traversal",
    ),
    (b"/etc/passwd", "BUNDLE_INVALID: /etc/passwd: absolute path"),
    (
        b"//etc/passwd",
        "BUNDLE_INVALID: //etc/passwd: absolute path",
    ),
    (
        b"./.env.example",
        "BUNDLE_INVALID: ./.env.example: not a plain name (. segment)",
    ),
    (
        b".env.example/",
        "BUNDLE_INVALID: .env.example/: not a plain name (empty segment)",
    ),
    (
        b"notes.txt",
        "BUNDLE_INVALID: notes.txt: not a bundle member name",
    ),
    (
        b"conf/app.yml",
        "BUNDLE_INVALID: conf/app.yml: not a bundle member name",
    ),
    (
        b"\xff\xfe.yml",
        "BUNDLE_INVALID: \\u{fffd}\\u{fffd}.yml: name is not utf-8",
    ),
];

#[test]
fn names_are_refused_for_their_spelling() {
    for (name, expected) in BAD_NAMES {
        check(file(name), expected);
    }
}

/// An entry that is not a regular file: name, type flag, data, link target, refusal.
type NotFile = (
    &'static [u8],
    u8,
    &'static [u8],
    &'static [u8],
    &'static str,
);

const NOT_FILES: &[NotFile] = &[
    (
        b".env.example",
        b'2',
        b"",
        b"/etc/shadow",
        "BUNDLE_INVALID: .env.example: symlink",
    ),
    (
        b".env.example",
        b'1',
        b"",
        b"bundle.json",
        "BUNDLE_INVALID: .env.example: hardlink",
    ),
    (
        b".env.example",
        b'3',
        b"",
        b"",
        "BUNDLE_INVALID: .env.example: character device",
    ),
    (
        b".env.example",
        b'4',
        b"",
        b"",
        "BUNDLE_INVALID: .env.example: block device",
    ),
    (
        b".env.example",
        b'6',
        b"",
        b"",
        "BUNDLE_INVALID: .env.example: fifo",
    ),
    (b"data/", b'5', b"", b"", "BUNDLE_INVALID: data/: directory"),
    (
        b"data",
        b'5',
        b"junk",
        b"",
        "BUNDLE_INVALID: data: directory",
    ),
    (
        b".env.example",
        b'7',
        b"x",
        b"",
        "BUNDLE_INVALID: .env.example: contiguous file",
    ),
    (
        b".env.example",
        b'Z',
        b"x",
        b"",
        "BUNDLE_INVALID: .env.example: unsupported entry type 'Z'",
    ),
];

#[test]
fn only_regular_files() {
    for (name, kind, data, link, expected) in NOT_FILES {
        check(raw_entry(name, *kind, data, link), expected);
    }
}

#[test]
fn duplicates_are_refused() {
    check(
        file(b"bundle.json"),
        "BUNDLE_INVALID: bundle.json: duplicate member",
    );
}

#[test]
fn pax_records_are_honoured_and_checked() {
    // A local PAX header renames the next member: the name that counts is the PAX one.
    let pax = pax_record("path", "../escape");
    let mut extra = raw_entry(b"PaxHeader", b'x', pax.as_bytes(), b"");
    extra.extend(file(b".env.example"));
    check(extra, "BUNDLE_INVALID: ../escape: parent traversal");

    // A global header that tries to set the path of later members is refused outright.
    let pax = pax_record("path", ".env.example");
    check(
        raw_entry(b"GlobalHead", b'g', pax.as_bytes(), b""),
        "BUNDLE_INVALID: pax global header sets path",
    );

    // A harmless global header (what Python writes with pax_headers=) is accepted.
    let pax = pax_record("comment", "hello");
    let bytes = tar_with(
        &minimal_files(),
        &[raw_entry(b"GlobalHead", b'g', pax.as_bytes(), b"")],
    );
    assert!(outcome(&bytes).starts_with("ok "), "{}", outcome(&bytes));
}

#[test]
fn structural_damage() {
    // A member whose data is cut off by the end of the input.
    let mut bytes = Vec::new();
    for (name, content) in minimal_files() {
        bytes.extend(raw_entry(name.as_str().as_bytes(), b'0', &content, b""));
    }
    bytes.extend_from_slice(&raw_header(b".env.example", b"", b'0', 4000, b""));
    bytes.extend_from_slice(&[b'x'; 100]);
    assert_eq!(
        outcome(&bytes),
        "BUNDLE_INVALID: .env.example: truncated member"
    );

    // A header whose checksum does not add up.
    let mut bytes = minimal_tar();
    bytes[0] ^= 0x20;
    assert_eq!(
        outcome(&bytes),
        "BUNDLE_INVALID: tar: archive header checksum mismatch"
    );

    // Not a tar at all.
    assert_eq!(
        outcome(b"this is not a tar archive"),
        "BUNDLE_INVALID: tar: failed to read entire block"
    );
    assert_eq!(outcome(b""), "BUNDLE_INVALID: missing docker-compose.yml");
    assert_eq!(
        outcome(&[0x1f, 0x8b, 1, 2, 3]),
        "BUNDLE_INVALID: gzip: corrupt stream"
    );
}

#[test]
fn required_members() {
    let check_without = |drop: MemberName, expected: &str| {
        let mut files = minimal_files();
        files.remove(&drop);
        assert_eq!(outcome(&monky_bundle::pack_tar(&files)), expected);
    };
    for required in [
        MemberName::DOCKER_COMPOSE_YML,
        MemberName::ENV_TEMPLATE,
        MemberName::SECRETS_MANIFEST,
        MemberName::BUNDLE_JSON,
    ] {
        check_without(
            required,
            &format!("BUNDLE_INVALID: missing {}", required.as_str()),
        );
    }

    let mut both = minimal_files();
    both.insert(MemberName::COMPOSE_YAML, b"services: {}\n".to_vec());
    assert_eq!(
        outcome(&monky_bundle::pack_tar(&both)),
        "BUNDLE_INVALID: both docker-compose.yml and compose.yaml present"
    );

    let mut alt = minimal_files();
    let compose = alt
        .remove(&MemberName::DOCKER_COMPOSE_YML)
        .unwrap_or_default();
    alt.insert(MemberName::COMPOSE_YAML, compose);
    let b = monky_bundle::Bundle::parse(&monky_bundle::pack_tar(&alt), &Limits::default())
        .expect("compose.yaml alone is fine");
    assert_eq!(b.compose_file_name(), "compose.yaml");

    let mut binary = minimal_files();
    binary.insert(MemberName::ENV_EXAMPLE, vec![0xff, 0xfe]);
    assert_eq!(
        outcome(&monky_bundle::pack_tar(&binary)),
        "BUNDLE_INVALID: .env.example: not utf-8 text"
    );
}

#[test]
fn size_limits() {
    let limit = Limits::default().max_bytes as usize;

    // Padding after the end-of-archive blocks still counts towards the stream size:
    // exactly at the limit is accepted, one byte more is not.
    let mut at_limit = minimal_tar();
    at_limit.resize(limit, 0);
    assert!(outcome(&at_limit).starts_with("ok "));
    let mut over = at_limit.clone();
    over.push(0);
    assert_eq!(outcome(&over), "BUNDLE_TOO_LARGE: over 4194304 bytes");

    // The same limit applies to the decompressed size of a gzip bundle.
    let gz = |bytes: &[u8]| {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).expect("gzip");
        e.finish().expect("gzip")
    };
    assert!(outcome(&gz(&at_limit)).starts_with("ok "));
    assert_eq!(
        outcome(&gz(&over)),
        "BUNDLE_TOO_LARGE: decompressed over 4194304 bytes"
    );

    // One member over the per-member limit.
    let big = vec![b'#'; Limits::default().max_member_bytes as usize + 1];
    check(
        raw_entry(b".env.example", b'0', &big, b""),
        "BUNDLE_TOO_LARGE: .env.example: over 2097152 bytes",
    );

    // Too many entries (global headers count, so they cannot be used to stall the reader).
    let pax = pax_record("comment", "x");
    let many: Vec<Vec<u8>> = (0..70)
        .map(|_| raw_entry(b"GlobalHead", b'g', pax.as_bytes(), b""))
        .collect();
    assert_eq!(
        outcome(&tar_with(&minimal_files(), &many)),
        "BUNDLE_TOO_LARGE: more than 64 members"
    );

    // Custom limits are honoured.
    let small = Limits {
        max_bytes: 1024,
        ..Limits::default()
    };
    assert_eq!(
        outcome_with(&minimal_tar(), &small),
        "BUNDLE_TOO_LARGE: over 1024 bytes"
    );
}

#[test]
fn gzip_bomb_stops_at_the_limit() {
    // 64 MiB of zeros in about 64 KiB, with no gzip trailer: a reader that inflated it all
    // before judging the size would report a corrupt stream instead.
    let bomb = gzip_bomb(64);
    assert!(bomb.len() < 200 * 1024, "bomb is {} bytes", bomb.len());
    assert_eq!(
        outcome(&bomb),
        "BUNDLE_TOO_LARGE: decompressed over 4194304 bytes"
    );
}
