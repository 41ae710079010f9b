//! `.env.template` reference finding and rendering.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use libfuzzer_sys::fuzz_target;
use monky_bundle::{referenced_vars, render_env, unresolved_vars};
use secrecy::{ExposeSecret, SecretString};

fuzz_target!(|data: &[u8]| {
    let Ok(template) = std::str::from_utf8(data) else {
        return;
    };
    let referenced = referenced_vars(template);
    let missing = unresolved_vars(template, &BTreeSet::new());
    // Nothing is unresolved that is not referenced somewhere.
    assert!(missing.is_subset(&referenced), "{missing:?} {referenced:?}");
    // Values that contain references and dollars are inserted, never rescanned.
    let values: BTreeMap<String, SecretString> = referenced
        .iter()
        .map(|v| (v.clone(), SecretString::from("${NESTED}$$x")))
        .collect();
    let _ = render_env(template, &values);
    if !template.contains('$') {
        let out = render_env(template, &BTreeMap::new()).expect("nothing to write");
        assert_eq!(out.expose_secret(), template);
    }
});
