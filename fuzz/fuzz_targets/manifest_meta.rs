//! `secrets.manifest.json` and `bundle.json` parsing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monky_bundle::{BundleMeta, Manifest, RefusalCode};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::parse(data) {
        assert_eq!(
            m.env_entries().count() + m.registry_entries().count(),
            m.entries.len()
        );
        for e in m.env_entries() {
            assert!(!e.var.is_empty() && !e.path.is_empty());
        }
    }
    match BundleMeta::parse(data) {
        Ok(meta) => assert_eq!(meta.renderer, "compose"),
        Err(r) => assert!(matches!(
            r.code,
            RefusalCode::RendererRefused | RefusalCode::BundleInvalid
        )),
    }
});
