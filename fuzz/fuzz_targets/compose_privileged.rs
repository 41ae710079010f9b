//! The compose file's privileged check: YAML with anchors, merge keys and interpolation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monky_bundle::{RefusalCode, check_privileged};

fuzz_target!(|data: &[u8]| {
    let Ok(yaml) = std::str::from_utf8(data) else {
        return;
    };
    let env = |name: &str| (name.len() % 2 == 0).then(|| "host".to_string());
    for lookup in [
        &|_: &str| None as Option<String>,
        &env as &dyn Fn(&str) -> Option<String>,
    ] {
        if let Err(r) = check_privileged(yaml, lookup) {
            assert!(matches!(
                r.code,
                RefusalCode::PrivilegedRefused | RefusalCode::BundleInvalid
            ));
        }
    }
});
