//! Known bundles with fixed shas: Python-made (PAX) archives, and archives made with the `tar`
//! crate, must all parse to the same members and the same sha.

mod common;

use std::collections::BTreeMap;

use common::{FIXTURE_SHA, fixture_files, read};
use monky_bundle::{Bundle, Limits, MemberName, bundle_sha, pack_tar};

fn parse(bytes: &[u8]) -> Bundle {
    Bundle::parse(bytes, &Limits::default()).unwrap_or_else(|e| panic!("fixture refused: {e}"))
}

fn assert_is_fixture(b: &Bundle) {
    assert_eq!(b.sha().as_str(), FIXTURE_SHA);
    assert_eq!(b.files(), &fixture_files());
    assert_eq!(b.compose_file_name(), "docker-compose.yml");
    assert!(b.env_template().starts_with("# Rendered by monky-deploy"));
    assert!(b.env_example().is_some());
    let m = b.manifest();
    assert_eq!(m.vault_mode, "openbao");
    let env: Vec<&str> = m.env_entries().map(|e| e.var.as_str()).collect();
    assert_eq!(
        env,
        ["GEMINI_API_KEY", "POSTGRES_PASSWORD", "SEE_ADMIN_TOKEN"]
    );
    let reg: Vec<&str> = m.registry_entries().map(|e| e.path.as_str()).collect();
    assert_eq!(reg, ["monky/env-qa-02/see/harbor_pull"]);
    assert_eq!(m.entries[2].version, None);
    let meta = b.meta();
    assert_eq!(
        (meta.env_id.as_str(), meta.tier.as_str()),
        ("env-qa-02", "qa")
    );
    assert!(!meta.is_prod() && !meta.allow_privileged && !meta.allow_rollback);
    assert_eq!(meta.disk_need_bytes, Some(1_073_741_824));
    let mut desired = [0u8; 32];
    hex::decode_to_slice(FIXTURE_SHA, &mut desired).unwrap();
    b.check_sha(&desired).expect("sha matches");
    desired[31] ^= 1;
    b.check_sha(&desired)
        .expect_err("one bit off is another sha");
}

#[test]
fn python_pax_tar_parses_to_the_fixed_sha() {
    // Made by tests/data/make_python_fixtures.py: a PAX global header, and bundle.json named
    // only through a PAX `path` record.
    assert_is_fixture(&parse(&read("python-pax.tar")));
}

#[test]
fn python_pax_tar_gz_parses_to_the_same_sha() {
    assert_is_fixture(&parse(&read("python-pax.tar.gz")));
}

#[test]
fn pack_tar_output_is_stable_and_matches_the_committed_fixture() {
    // The committed rust-pack.tar pins the writer's bytes; regenerate it with
    // MONKY_BLESS=1 cargo test -p monky-bundle --test fixtures after an intended change.
    let packed = pack_tar(&fixture_files());
    let path = common::data("rust-pack.tar");
    if std::env::var_os("MONKY_BLESS").is_some() {
        std::fs::write(&path, &packed).expect("bless rust-pack.tar");
    }
    assert_eq!(packed, read("rust-pack.tar"), "pack_tar output changed");
    assert_is_fixture(&parse(&packed));
}

#[test]
fn tar_builder_with_pax_extensions_parses_to_the_same_sha() {
    // Built with the tar crate directly: every member carries a PAX extension header, and
    // docker-compose.yml's real name lives only in its PAX `path` record.
    let mut builder = tar::Builder::new(Vec::new());
    for (name, content) in fixture_files() {
        let mut pax: Vec<(&str, &[u8])> = vec![("comment", b"made by the tar crate")];
        let ustar_name = if name == MemberName::DOCKER_COMPOSE_YML {
            pax.push(("path", name.as_str().as_bytes()));
            "placeholder"
        } else {
            name.as_str()
        };
        builder.append_pax_extensions(pax).expect("pax header");
        let mut header = tar::Header::new_ustar();
        header.set_path(ustar_name).expect("ustar name");
        header.set_size(content.len() as u64);
        header.set_mode(0o600);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        builder.append(&header, content.as_slice()).expect("append");
    }
    let bytes = builder.into_inner().expect("finish");
    assert_is_fixture(&parse(&bytes));
}

#[test]
fn gzip_of_the_rust_tar_parses_to_the_same_sha() {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&read("rust-pack.tar")).expect("gzip");
    let bytes = gz.finish().expect("gzip");
    assert_is_fixture(&parse(&bytes));
}

#[test]
fn bundle_sha_matches_the_python_computation() {
    let files = fixture_files();
    assert_eq!(
        bundle_sha(files.iter().map(|(n, c)| (n.as_str(), c.as_slice()))).as_str(),
        FIXTURE_SHA
    );
    // Order of the input does not matter.
    let mut reversed: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_slice()))
        .collect();
    reversed.reverse();
    assert_eq!(bundle_sha(reversed).as_str(), FIXTURE_SHA);
}

#[test]
fn the_protocol_sha_of_a_tiny_set_is_fixed() {
    // sha256(b"a\x001\x00b\x002\x00"), computed independently with Python's hashlib.
    let files = BTreeMap::from([("b", b"2".as_slice()), ("a", b"1".as_slice())]);
    assert_eq!(
        bundle_sha(files).as_str(),
        "37664b19301f46515688d5a22cb9ee1852e0b6443e28c7f36340a13962f0c4f7"
    );
}
