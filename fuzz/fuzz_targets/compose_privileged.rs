//! The compose policy on a compose file: YAML with anchors, merge keys and interpolation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monky_bundle::{ComposePolicy, RefusalCode};

fuzz_target!(|data: &[u8]| {
    let Ok(yaml) = std::str::from_utf8(data) else {
        return;
    };
    let env = |name: &str| (name.len() % 2 == 0).then(|| "host".to_string());
    let policy = ComposePolicy::new("monky-fuzz");
    let secrets = std::collections::BTreeSet::from(["SECRET".to_string()]);
    for lookup in [
        &|_: &str| None as Option<String>,
        &env as &dyn Fn(&str) -> Option<String>,
    ] {
        if let Err(r) = policy.check_file(yaml, lookup, &secrets) {
            assert!(matches!(
                r.code,
                RefusalCode::PrivilegedRefused
                    | RefusalCode::BundleInvalid
                    | RefusalCode::BundleTooLarge
                    | RefusalCode::BundleNonconforming
                    | RefusalCode::BudgetExceeded
            ));
        }
    }
});
