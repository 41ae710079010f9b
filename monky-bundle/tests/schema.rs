//! The JSON Schemas of the bundle's own documents (`docs/schema/secrets-manifest.json`,
//! `docs/schema/bundle-meta.json`) and the agent's parsers agree: every example in
//! `tests/data/schema/<document>/good/` is accepted by both, every one in `bad/` is refused by
//! both. The original agent's example manifest is among the good ones.

use std::path::{Path, PathBuf};

use monky_bundle::{BundleMeta, Manifest};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn schema(name: &str) -> Value {
    let path = root().join("../docs/schema").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The examples of `dir`, by file name.
fn examples(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Checks every example of `document` against `schema_file` and `parse`; returns how many
/// good and bad ones there were.
fn check(
    document: &str,
    schema_file: &str,
    parse: impl Fn(&[u8]) -> Result<(), String>,
) -> (usize, usize) {
    let validator = jsonschema::validator_for(&schema(schema_file)).unwrap();
    let mut counts = (0, 0);
    for (verdict, good) in [("good", true), ("bad", false)] {
        let dir = root()
            .join("tests/data/schema")
            .join(document)
            .join(verdict);
        for (name, bytes) in examples(&dir) {
            let json: Value = serde_json::from_slice(&bytes).unwrap();
            let errors: Vec<String> = validator
                .iter_errors(&json)
                .map(|e| e.to_string())
                .collect();
            let parsed = parse(&bytes);
            assert_eq!(
                errors.is_empty(),
                good,
                "{document}/{verdict}/{name}: the schema says {errors:?}"
            );
            assert_eq!(
                parsed.is_ok(),
                good,
                "{document}/{verdict}/{name}: the parser says {parsed:?}"
            );
            if good {
                counts.0 += 1;
            } else {
                counts.1 += 1;
            }
        }
    }
    counts
}

#[test]
fn the_manifest_schema_and_parser_agree_on_every_example() {
    let (good, bad) = check("manifest", "secrets-manifest.json", |b| {
        Manifest::parse(b).map(drop).map_err(|r| r.to_string())
    });
    assert!(good >= 5 && bad >= 15, "{good} good, {bad} bad");
    // The original's example is one of the good ones, parsed as the original read it.
    let original =
        std::fs::read(root().join("tests/data/schema/manifest/good/original.json")).unwrap();
    let m = Manifest::parse(&original).unwrap();
    assert_eq!(m.vault_mode, "openbao");
    let entries: Vec<(&str, &str, Option<u64>)> = m
        .entries
        .iter()
        .map(|e| (e.var.as_str(), e.kind.as_str(), e.version))
        .collect();
    assert_eq!(
        entries,
        [
            ("GEMINI_API_KEY", "supplied", Some(2)),
            ("POSTGRES_PASSWORD", "generated", Some(1)),
            ("SEE_ADMIN_TOKEN", "generated", Some(1)),
        ]
    );
}

#[test]
fn the_manifest_schema_refuses_every_value_key_in_any_case() {
    let validator = jsonschema::validator_for(&schema("secrets-manifest.json")).unwrap();
    for key in Manifest::VALUE_KEYS {
        for spelled in [key.to_string(), key.to_uppercase()] {
            let entry = serde_json::json!({"entries": [{"var": "A", "path": "monky/e/see/a", spelled.clone(): "x"}]});
            let top = serde_json::json!({"entries": [], spelled.clone(): "x"});
            for doc in [entry, top] {
                assert!(!validator.is_valid(&doc), "{doc}");
                assert!(
                    Manifest::parse(doc.to_string().as_bytes()).is_err(),
                    "{doc}"
                );
            }
        }
    }
}

#[test]
fn the_bundle_json_schema_and_parser_agree_on_every_example() {
    let (good, bad) = check("bundle", "bundle-meta.json", |b| {
        BundleMeta::parse(b).map(drop).map_err(|r| r.to_string())
    });
    assert!(good >= 4 && bad >= 10, "{good} good, {bad} bad");
    // Every field the original lists is described, and the ones the agent honours are typed.
    let s = schema("bundle-meta.json");
    for field in [
        "env_id",
        "tier",
        "site",
        "bundle",
        "target",
        "target_class",
        "address",
        "pull",
        "renderer",
        "images_policy",
        "secrets_provider",
        "agent",
        "files",
    ] {
        assert!(s["properties"][field]["description"].is_string(), "{field}");
    }
    for honoured in ["allow_privileged", "allow_rollback", "disk_need_bytes"] {
        assert!(s["properties"][honoured]["type"].is_array(), "{honoured}");
        assert!(
            s["properties"]["agent"]["properties"][honoured]["type"].is_array(),
            "agent.{honoured}"
        );
    }
}
