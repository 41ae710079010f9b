//! The redactor: registered values never survive where its length rules say they are masked
//! (docs/OPERATIONS.md): a long one wherever the text puts it, a short one where it stands as a
//! value.
#![no_main]

use std::sync::Once;

use libfuzzer_sys::fuzz_target;
use monky_deployd::redact::{ANYWHERE_LEN, redact, register, register_basic_auth};

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
        if s.len() >= ANYWHERE_LEN {
            // Long enough to be masked wherever it stands, glued to the text's letters too.
            let out = redact(&format!("{pre}{s}{post}")).into_string();
            assert!(!out.contains(s), "{s:?} survived in {out:?}");
        } else {
            // Shorter values are masked where they stand as a value, not inside a word: here as
            // a quoted `.env` line. The text around it holds no line break, so a line that reads
            // `KEY="<secret>"` after redaction can only be this one, unmasked.
            let (pre, post) = (pre.replace('\n', " "), post.replace('\n', " "));
            let line = format!("\nKEY=\"{s}\"\n");
            let out = redact(&format!("{pre}{line}{post}")).into_string();
            assert!(!out.contains(&line), "{s:?} survived in {out:?}");
        }
    }
});
