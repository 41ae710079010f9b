//! The compose file compose runs: whatever the agent's parser reads from a compose file, the
//! plain rewrite is printable ASCII and reads back as exactly that, and rewriting it again
//! changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(yaml) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(plain) = monky_bundle::plain_compose(yaml) else {
        return;
    };
    assert!(plain.bytes().all(|b| (b' '..=b'~').contains(&b)), "{plain}");
    let again = monky_bundle::plain_compose(&plain).expect("the rewrite parses");
    assert_eq!(again, plain);
});
