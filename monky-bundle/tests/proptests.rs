//! Properties of `Bundle::parse`: arbitrary input never panics, and whatever is accepted hashes
//! the way `bundle_sha` says.

mod common;

use common::minimal_files;
use monky_bundle::testkit::{pax_record, raw_entry};
use monky_bundle::{Bundle, Limits, MemberName, bundle_sha, pack_tar};
use proptest::prelude::*;

fn small_limits() -> Limits {
    Limits {
        max_bytes: 64 * 1024,
        max_members: 16,
        max_member_bytes: 16 * 1024,
    }
}

/// Names from the known set, hostile spellings and junk.
fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(MemberName::all().map(|m| m.as_str()).collect::<Vec<_>>())
            .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::sample::select(vec!["../x", "/etc/passwd", "./bundle.json", "a/../../x", "", "data/"])
            .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..20),
    ]
}

fn entry() -> impl Strategy<Value = Vec<u8>> {
    (
        name(),
        prop::sample::select(vec![
            b'0', b'0', b'0', b'1', b'2', b'3', b'5', b'6', b'g', b'x',
        ]),
        prop::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(name, kind, content)| {
            let name: Vec<u8> = name.into_iter().filter(|b| *b != 0).take(100).collect();
            let content = if kind == b'g' || kind == b'x' {
                pax_record("comment", "x").into_bytes()
            } else {
                content
            };
            raw_entry(&name, kind, &content, b"")
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        let _ = Bundle::parse(&bytes, &small_limits());
    }

    #[test]
    fn arbitrary_gzip_prefixed_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let mut input = vec![0x1f, 0x8b];
        input.extend(bytes);
        let _ = Bundle::parse(&input, &small_limits());
    }

    #[test]
    fn mutated_valid_bundles_never_panic_and_accepted_ones_hash_right(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8)
    ) {
        let mut bytes = pack_tar(&minimal_files());
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if let Ok(b) = Bundle::parse(&bytes, &Limits::default()) {
            prop_assert_eq!(b.sha(), &bundle_sha(b.files().iter().map(|(n, c)| (n.as_str(), c.as_slice()))));
        }
    }

    #[test]
    fn random_archives_are_judged_consistently(entries in prop::collection::vec(entry(), 0..10)) {
        // A valid bundle followed by random entries: either refused, or accepted with a sha
        // over exactly the members it reports.
        let files = minimal_files();
        let mut bytes = Vec::new();
        for (name, content) in &files {
            bytes.extend(raw_entry(name.as_str().as_bytes(), b'0', content, b""));
        }
        for e in &entries {
            bytes.extend_from_slice(e);
        }
        bytes.extend_from_slice(&[0u8; 1024]);
        match Bundle::parse(&bytes, &Limits::default()) {
            Ok(b) => {
                prop_assert_eq!(b.sha(), &bundle_sha(b.files().iter().map(|(n, c)| (n.as_str(), c.as_slice()))));
                for (name, content) in &files {
                    prop_assert_eq!(b.files().get(name), Some(content));
                }
            }
            Err(e) => {
                prop_assert!(e.code().is_some());
            }
        }
    }

    #[test]
    fn pack_then_parse_round_trips(
        example in prop::option::of(prop::collection::vec(any::<char>(), 0..200).prop_map(|c| c.into_iter().collect::<String>())),
        compose_yaml in any::<bool>(),
    ) {
        let mut files = minimal_files();
        if compose_yaml {
            let c = files.remove(&MemberName::DOCKER_COMPOSE_YML).unwrap_or_default();
            files.insert(MemberName::COMPOSE_YAML, c);
        }
        if let Some(e) = example {
            files.insert(MemberName::ENV_EXAMPLE, e.into_bytes());
        }
        let b = Bundle::parse(&pack_tar(&files), &Limits::default()).expect("valid bundle");
        prop_assert_eq!(b.files(), &files);
        prop_assert_eq!(b.sha(), &bundle_sha(files.iter().map(|(n, c)| (n.as_str(), c.as_slice()))));
    }
}
