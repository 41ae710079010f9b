//! The one escape for a peer's text before a person reads it: control characters, line and
//! paragraph separators, and the invisible formatting characters (bidi overrides, embeddings
//! and isolates, marks, zero-width characters, tags) become `\u{...}`, so a text can neither
//! break a line nor reorder or hide what a reader sees of it.

use std::borrow::Cow;

/// The invisible formatting characters (Unicode's general category Cf), as ranges: the bidi
/// controls (U+061C, U+200E/U+200F, U+202A–U+202E, U+2066–U+2069) among them.
const FORMAT: &[(char, char)] = &[
    ('\u{ad}', '\u{ad}'),
    ('\u{600}', '\u{605}'),
    ('\u{61c}', '\u{61c}'),
    ('\u{6dd}', '\u{6dd}'),
    ('\u{70f}', '\u{70f}'),
    ('\u{890}', '\u{891}'),
    ('\u{8e2}', '\u{8e2}'),
    ('\u{180e}', '\u{180e}'),
    ('\u{200b}', '\u{200f}'),
    ('\u{2028}', '\u{202e}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206f}'),
    ('\u{feff}', '\u{feff}'),
    ('\u{fff9}', '\u{fffb}'),
    ('\u{110bd}', '\u{110bd}'),
    ('\u{110cd}', '\u{110cd}'),
    ('\u{13430}', '\u{1343f}'),
    ('\u{1bca0}', '\u{1bca3}'),
    ('\u{1d173}', '\u{1d17a}'),
    ('\u{e0001}', '\u{e0001}'),
    ('\u{e0020}', '\u{e007f}'),
];

/// Whether `c` is escaped by [`escape`]: a control character other than a tab, a line or
/// paragraph separator, or an invisible formatting character. A line feed is left to the
/// caller (`keep_newlines`).
#[must_use]
pub fn hidden(c: char) -> bool {
    (c.is_control() && c != '\t') || FORMAT.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c))
}

/// `text` with every [`hidden`] character as `\u{...}` (`\n`, `\r` for those), the line feed
/// kept when `keep_newlines` says so: what a peer said, as a person may safely read it.
///
/// ```
/// use monky_vocab::text::escape;
/// assert_eq!(escape("ok\r INFO applied", false), "ok\\r INFO applied");
/// assert_eq!(escape("a\u{202e}txt.exe", false), "a\\u{202e}txt.exe");
/// assert_eq!(escape("a\nb\tc", true), "a\nb\tc");
/// assert_eq!(escape("café", false), "café");
/// ```
#[must_use]
pub fn escape(text: &str, keep_newlines: bool) -> Cow<'_, str> {
    let acts = |c: char| hidden(c) && !(keep_newlines && c == '\n');
    if !text.chars().any(acts) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if acts(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bidi_control_and_invisible_format_character_is_escaped() {
        let bidi = ['\u{61c}', '\u{200e}', '\u{200f}']
            .into_iter()
            .chain('\u{202a}'..='\u{202e}')
            .chain('\u{2066}'..='\u{2069}');
        for c in bidi.chain(['\u{200b}', '\u{feff}', '\u{2028}', '\u{e0041}', '\u{85}']) {
            let text = format!("a{c}b");
            assert_eq!(
                escape(&text, false),
                format!("a\\u{{{:x}}}b", u32::from(c)),
                "{:x}",
                u32::from(c)
            );
        }
    }

    #[test]
    fn printable_text_of_any_script_is_kept() {
        for text in [
            "plain",
            "tab\tstop",
            "ÿ über 日本語 עברית العربية",
            "emoji 🙂",
        ] {
            assert!(matches!(escape(text, false), Cow::Borrowed(_)), "{text}");
        }
    }
}
