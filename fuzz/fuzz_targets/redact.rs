//! The redactor: registered values never survive, wherever the text puts them.
#![no_main]

use std::sync::Once;

use libfuzzer_sys::fuzz_target;
use monky_deployd::redact::{redact, register, register_basic_auth};

/// Secrets registered once: the redactor's list lives for the process, like the agent's.
const SECRETS: [&str; 5] = [
    "plain-Secret-0001",
    "multi\nline-Secret\n-----END KEY-----",
    "pässwört\"<&>\\x",
    "****",
    "r ***",
];

fuzz_target!(|data: &[u8]| {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        for s in SECRETS {
            register(s);
        }
        register_basic_auth("robot", "registry-Pass-0003");
    });
    let text = String::from_utf8_lossy(data);
    let _ = redact(&text);
    // The text, split at a point it chooses, with each secret in the middle.
    let at = text
        .char_indices()
        .map(|(i, _)| i)
        .nth(data.first().map_or(0, |b| usize::from(*b)))
        .unwrap_or(text.len());
    let (pre, post) = text.split_at(at);
    for s in SECRETS
        .iter()
        .chain(&["registry-Pass-0003", "cm9ib3Q6cmVnaXN0cnktUGFzcy0wMDAz"])
    {
        let out = redact(&format!("{pre}{s}{post}"));
        assert!(!out.contains(s), "{s:?} survived in {out:?}");
    }
});
