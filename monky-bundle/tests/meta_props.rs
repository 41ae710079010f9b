//! Properties of `secrets.manifest.json` and `bundle.json` parsing: arbitrary input never panics,
//! a valid manifest reads back entry for entry, a value anywhere is refused without being quoted,
//! and `bundle.json`'s flags mean exactly what its two spellings say.

use monky_bundle::{BundleMeta, Manifest, RefusalCode};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn var() -> impl Strategy<Value = String> {
    "[A-Z_][A-Z0-9_]{0,15}"
}

/// One valid entry: (var, path, kind, version, registry-auth).
type Entry = (String, String, String, Option<u64>, bool);

fn entries() -> impl Strategy<Value = Vec<Entry>> {
    prop::collection::vec(
        (
            var(),
            "[a-z0-9/_.-]{1,40}",
            "[a-z]{0,10}",
            prop::option::of(any::<u64>()),
            prop::bool::weighted(0.2),
        ),
        0..8,
    )
    .prop_map(|mut v| {
        // Env vars are unique; registry credentials may repeat a name (they become no variable).
        let mut seen = std::collections::BTreeSet::new();
        v.retain(|e| e.4 || seen.insert(e.0.clone()));
        v
    })
}

fn manifest_json(entries: &[Entry]) -> Value {
    let list: Vec<Value> = entries
        .iter()
        .map(|(var, path, kind, version, registry)| {
            let mut e = json!({"var": var, "path": path, "kind": kind, "version": version});
            if *registry {
                e["use"] = json!("registry-auth");
            }
            e
        })
        .collect();
    json!({"vault_mode": "openbao", "entries": list})
}

/// A key spelled in any case.
fn cased(key: &'static str) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<bool>(), key.len()).prop_map(move |upper| {
        key.chars()
            .zip(upper)
            .map(|(c, u)| if u { c.to_ascii_uppercase() } else { c })
            .collect()
    })
}

fn value_key() -> impl Strategy<Value = String> {
    prop::sample::select(Manifest::VALUE_KEYS.to_vec()).prop_flat_map(cased)
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    prop::sample::select(vec![
                        "var",
                        "path",
                        "kind",
                        "version",
                        "use",
                        "entries",
                        "vault_mode",
                        "renderer",
                        "agent",
                        "disk",
                        "need_bytes",
                        "disk_need_bytes",
                        "allow_privileged",
                        "allow_rollback",
                        "tier",
                        "value",
                    ])
                    .prop_map(str::to_string),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = Manifest::parse(&bytes);
        let _ = BundleMeta::parse(&bytes);
    }

    #[test]
    fn arbitrary_json_never_panics(v in json_value(), entries in prop::collection::vec(json_value(), 0..4)) {
        let text = v.to_string();
        let _ = Manifest::parse(text.as_bytes());
        let _ = BundleMeta::parse(text.as_bytes());
        let wrapped = json!({"entries": entries, "renderer": "compose", "agent": v}).to_string();
        let _ = Manifest::parse(wrapped.as_bytes());
        let _ = BundleMeta::parse(wrapped.as_bytes());
    }

    #[test]
    fn a_valid_manifest_reads_back_entry_for_entry(entries in entries()) {
        let text = manifest_json(&entries).to_string();
        let m = Manifest::parse(text.as_bytes()).expect("valid manifest");
        prop_assert_eq!(m.entries.len(), entries.len());
        for (got, (var, path, kind, version, registry)) in m.entries.iter().zip(&entries) {
            prop_assert_eq!(&got.var, var);
            prop_assert_eq!(&got.path, path);
            prop_assert_eq!(&got.kind, kind);
            prop_assert_eq!(got.version, *version);
            prop_assert_eq!(got.is_registry_auth(), *registry);
        }
        prop_assert_eq!(m.env_entries().count() + m.registry_entries().count(), entries.len());
    }

    #[test]
    fn a_value_anywhere_is_refused_and_never_quoted(
        entries in entries().prop_filter("at least one entry", |e| !e.is_empty()),
        at in any::<prop::sample::Index>(),
        key in value_key(),
        secret in "[a-zA-Z0-9!@#%^&*()+=]{12,40}",
        top in any::<bool>(),
    ) {
        let mut v = manifest_json(&entries);
        let n = at.index(entries.len());
        if top {
            v[key.as_str()] = json!(secret);
        } else {
            v["entries"][n][key.as_str()] = json!(secret);
        }
        let refusal = Manifest::parse(v.to_string().as_bytes()).expect_err("a value is refused");
        prop_assert_eq!(refusal.code, RefusalCode::ManifestValueRefused);
        let expected = if top { "(top level)".to_string() } else { entries[n].0.clone() };
        prop_assert!(refusal.names.contains(&expected), "{:?}", refusal.names);
        prop_assert!(!refusal.to_string().contains(&secret), "{}", refusal);
    }

    #[test]
    fn bundle_json_flags_mean_what_either_spelling_says(
        top in prop::option::of(any::<bool>()),
        nested in prop::option::of(any::<bool>()),
        need_top in prop::option::of(any::<u32>()),
        need_agent in prop::option::of(any::<u32>()),
        need_disk in prop::option::of(any::<u32>()),
        tier in prop::sample::select(vec!["prod", "Prod", "qa", "dev", ""]),
    ) {
        let mut v = json!({"renderer": "compose", "tier": tier, "agent": {}, "disk": {}});
        if let Some(b) = top {
            v["allow_privileged"] = json!(b);
            v["allow_rollback"] = json!(!b);
        }
        if let Some(b) = nested {
            v["agent"]["allow_privileged"] = json!(b);
            v["agent"]["allow_rollback"] = json!(!b);
        }
        if let Some(n) = need_top {
            v["disk_need_bytes"] = json!(n);
        }
        if let Some(n) = need_agent {
            v["agent"]["disk_need_bytes"] = json!(n);
        }
        if let Some(n) = need_disk {
            v["disk"]["need_bytes"] = json!(f64::from(n));
        }
        let m = BundleMeta::parse(v.to_string().as_bytes()).expect("valid bundle.json");
        prop_assert_eq!(m.allow_privileged, top == Some(true) || nested == Some(true));
        prop_assert_eq!(m.allow_rollback, top == Some(false) || nested == Some(false));
        prop_assert_eq!(m.disk_need_bytes, need_top.or(need_agent).or(need_disk).map(u64::from));
        prop_assert_eq!(m.is_prod(), tier == "prod");
    }

    #[test]
    fn another_renderer_is_refused_and_named_briefly(renderer in any::<String>()) {
        let v = json!({"renderer": renderer});
        match BundleMeta::parse(v.to_string().as_bytes()) {
            Ok(m) => prop_assert_eq!(renderer.as_str(), "compose", "{:?}", m),
            Err(r) => {
                prop_assert_eq!(r.code, RefusalCode::RendererRefused);
                // A hostile renderer string cannot flood a report or inject lines.
                let shown = r.to_string();
                // "RENDERER_REFUSED: ", 40 characters escaped at most to `\\u{10ffff}`, "...".
                prop_assert!(shown.len() <= 18 + 40 * 10 + 3, "{}", shown);
                prop_assert!(!shown.contains('\n'), "{}", shown);
            }
        }
    }
}
