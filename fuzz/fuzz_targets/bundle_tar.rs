//! Bundle tar (or gzip tar) parsing, and everything an apply does with an accepted bundle
//! before it reads a secret.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use libfuzzer_sys::fuzz_target;
use monky_bundle::{Bundle, ComposePolicy, Limits, bundle_sha, check_env_complete, render_env};
use secrecy::SecretString;

fuzz_target!(|data: &[u8]| {
    // Small limits keep every iteration fast; the limits themselves are under test too.
    let limits = Limits {
        max_bytes: 256 * 1024,
        max_members: 16,
        max_member_bytes: 64 * 1024,
    };
    let Ok(b) = Bundle::parse(data, &limits) else {
        return;
    };
    // Accepted: the sha is over exactly the members it reports.
    assert_eq!(
        b.sha(),
        &bundle_sha(b.files().iter().map(|(n, c)| (n.as_str(), c.as_slice())))
    );
    let provided: BTreeSet<String> = b.manifest().env_entries().map(|e| e.var.clone()).collect();
    let _ = check_env_complete(b.env_template(), &provided);
    let _ =
        ComposePolicy::new("monky-fuzz").check_file(b.compose(), &|_| None, &Default::default());
    let values: BTreeMap<String, SecretString> = provided
        .iter()
        .map(|v| (v.clone(), SecretString::from("value")))
        .collect();
    let _ = render_env(b.env_template(), &values);
});
