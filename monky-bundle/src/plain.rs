//! The compose file compose runs: the agent's own parse, written back as plain text.
//!
//! Two YAML parsers read one file differently where YAML leaves room (go-yaml breaks lines at
//! U+0085, U+2028 and U+2029, saphyr does not; comments, block scalars, documents, tags). So
//! compose never reads the bundle's own file: it reads this one, which holds exactly what the
//! agent judged, in a shape with no room left: one JSON document (which is YAML), no comments,
//! no anchors, every string double-quoted, and only printable ASCII, every other character
//! written as an escape both parsers decode alike (`\uXXXX`, and `\UXXXXXXXX` beyond U+FFFF).

use std::fmt::Write as _;

use serde_json::Value;

use crate::refusal::Refusal;

/// The name of the file the agent writes next to a release's compose file and hands to compose
/// instead of it: not a bundle member, so no bundle can carry or replace it.
pub const PLAIN_COMPOSE_FILE: &str = ".monky-compose.yaml";

/// `compose_yaml` as the agent parses it, written back as one plain-ASCII JSON document (see
/// the module doc); the parse's refusal when it does not parse.
///
/// ```
/// let plain = monky_bundle::plain_compose(
///     "services:\n  web: # note\u{2028}    env_file: /etc/os-release\n    image: nginx\n",
/// )
/// .unwrap();
/// assert_eq!(plain, r#"{"services":{"web":{"image":"nginx"}}}"#);
/// assert!(monky_bundle::plain_compose("a: \"caf\u{e9} \u{1f600}\"\n").unwrap().contains(r"caf\u00e9 \U0001f600"));
/// ```
pub fn plain_compose(compose_yaml: &str) -> Result<String, Refusal> {
    let doc = crate::checks::parse_compose(compose_yaml)?;
    Ok(plain_json(&doc))
}

/// `value` as compact JSON with every character outside printable ASCII escaped.
#[must_use]
pub fn plain_json(value: &Value) -> String {
    let json = value.to_string();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            ' '..='~' => out.push(c),
            // Inside a string (serde_json escaped the control characters already): YAML's and
            // JSON's escape, read alike by go-yaml and saphyr.
            c if u32::from(c) <= 0xFFFF => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_file_reads_back_as_what_was_judged_and_holds_only_printable_ascii() {
        for yaml in [
            "services:\n  web:\n    image: nginx\n    environment:\n      A: \"x\\u2028y\"\n",
            "x-a: &a {image: nginx}\nservices:\n  web: {<<: *a, command: [\"sh\", \"-c\", \"echo \u{85}ok\"]}\n",
            "services:\n  web:\n    image: nginx\n    labels: {k: \"\u{1f600}\u{feff}\\t\\\"q\\\"\"}\n",
            "services:\n  web:\n    image: \"n\u{e9}\"\n    entrypoint: |\n      line one\n      line two\n",
        ] {
            let judged = crate::checks::parse_compose(yaml).unwrap();
            let plain = plain_compose(yaml).unwrap();
            assert!(plain.bytes().all(|b| (b' '..=b'~').contains(&b)), "{plain}");
            assert!(!plain.contains('#') || plain.contains("\"#"), "{plain}");
            assert_eq!(
                crate::checks::parse_compose(&plain).unwrap(),
                judged,
                "{plain}"
            );
        }
    }
}
