//! The redactor: the one filter every way out of the agent goes through.
//!
//! Logs, the report's `log_tail` and `detail`, `status`, state.json's `last_error`, the error
//! printed by `main` and a panic message are all passed through [`redact`]. It masks every value
//! the agent has read from OpenBao (registered with [`register`] the moment it is read, in its
//! plain, JSON-escaped, per-line, `.env` and URL-encoded forms), OpenBao token shapes, JWTs, bearer headers and
//! registry auth strings.

use std::sync::{OnceLock, RwLock, TryLockError};

use base64::Engine as _;
use regex::Regex;

/// Bytes a URL component keeps as they are (RFC 3986 "unreserved"); the rest is `%XX`.
const URL_COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// What a masked value becomes.
pub const MASK: &str = "***";

/// Values shorter than this are not masked on their own: masking every "on" or "1" in a log would
/// hide the log without protecting anything a guess would not find. The same holds for each line
/// of a multi-line value: a line shorter than this survives when the lines are printed apart.
pub const MIN_VALUE_LEN: usize = 4;

/// A masking pattern, compiled the first time a text could match it: compiling all of them
/// cost a heartbeat most of its CPU, and most log lines contain none of their literals.
struct Pattern {
    re: &'static str,
    with: &'static str,
    /// Text one of which every match contains, ASCII case-insensitively. Non-ASCII text always
    /// runs the regex: its case folding reaches beyond ASCII (`ſ` is `s`, `K` is `k`).
    needles: &'static [&'static str],
    compiled: OnceLock<Regex>,
}

impl Pattern {
    const fn new(re: &'static str, with: &'static str, needles: &'static [&'static str]) -> Self {
        Pattern {
            re,
            with,
            needles,
            compiled: OnceLock::new(),
        }
    }

    /// Whether `text` could match, without compiling anything.
    fn may_match(&self, text: &str) -> bool {
        !text.is_ascii()
            || self
                .needles
                .iter()
                .any(|n| contains_ignore_ascii_case(text.as_bytes(), n.as_bytes()))
    }

    fn regex(&self) -> &Regex {
        self.compiled
            .get_or_init(|| Regex::new(self.re).expect("static redaction pattern"))
    }
}

fn contains_ignore_ascii_case(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

static PATTERNS: [Pattern; 7] = [
    // Bearer and vault-token headers, whatever follows.
    Pattern::new(
        r"(?i)(authorization:\s*bearer\s+)[^\s,;]+",
        "${1}***",
        &["authorization"],
    ),
    Pattern::new(
        r"(?i)(x-vault-token:\s*)[^\s,;]+",
        "${1}***",
        &["x-vault-token"],
    ),
    Pattern::new(
        r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}",
        "${1}***",
        &["bearer"],
    ),
    // JWTs: three base64url parts, the first a JSON header.
    Pattern::new(
        r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*",
        MASK,
        &["eyJ"],
    ),
    // OpenBao/Vault token shapes: legacy `s.` + 24, and the prefixed forms.
    Pattern::new(
        r"\b(?:hv[sbr]|[sbr])\.[A-Za-z0-9_-]{20,}",
        MASK,
        &["s.", "b.", "r."],
    ),
    // Docker config auth strings and basic-auth headers.
    Pattern::new(
        r#"(?i)("auth"\s*:\s*")[A-Za-z0-9+/=]+"#,
        "${1}***",
        &["\"auth\""],
    ),
    Pattern::new(r"(?i)(\bbasic\s+)[A-Za-z0-9+/=]{8,}", "${1}***", &["basic"]),
];

/// Registered values and the masking built on them. The process has one, behind the free
/// functions; tests build their own so that what one registers cannot mask another's text.
#[derive(Default)]
struct Redactor {
    values: RwLock<Vec<String>>,
}

impl Redactor {
    fn register(&self, value: &str) {
        let mut forms = vec![value.to_string()];
        // The escapes of the JSON writers a value meets on its way out: serde_json (the agent's
        // own reports), ASCII-only (Python's default, tenancy and its tooling) and HTML-safe
        // (Go's default, the docker CLI and compose).
        for (ascii, html) in [(false, false), (true, false), (false, true), (true, true)] {
            forms.push(json_escape(value, ascii, html));
        }
        forms.extend(value.lines().map(|l| l.trim().to_string()));
        // As `.env` holds it: compose quotes lines of that file in its errors.
        forms.extend(monky_bundle::env_spellings(value));
        // As a URL carries it (a database URL in an application's log): percent-encoded, every
        // byte but the unreserved ones, and form-encoded.
        forms.push(percent_encoding::utf8_percent_encode(value, URL_COMPONENT).to_string());
        forms.push(url::form_urlencoded::byte_serialize(value.as_bytes()).collect());
        let mut guard = self.values.write().unwrap_or_else(|p| p.into_inner());
        for form in forms {
            if form.len() >= MIN_VALUE_LEN && !guard.contains(&form) {
                guard.push(form);
            }
        }
        // Longest first, so a value that contains another is masked whole.
        guard.sort_by_key(|v| std::cmp::Reverse(v.len()));
    }

    fn register_basic_auth(&self, user: &str, password: &str) {
        self.register(password);
        let engine = base64::engine::general_purpose::STANDARD;
        self.register(&engine.encode(format!("{user}:{password}")));
    }

    fn redact(&self, text: &str) -> String {
        let values = self.values.read().unwrap_or_else(|p| p.into_inner());
        redact_with(&values, text)
    }

    /// As [`Redactor::redact`], but `None` instead of waiting for a registration in progress.
    fn try_redact(&self, text: &str) -> Option<String> {
        match self.values.try_read() {
            Ok(values) => Some(redact_with(&values, text)),
            Err(TryLockError::Poisoned(p)) => Some(redact_with(&p.into_inner(), text)),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

fn redact_with(values: &[String], text: &str) -> String {
    let mut out = mask_values(text.to_string(), values);
    for p in &PATTERNS {
        if p.may_match(&out) && p.regex().is_match(&out) {
            out = p.regex().replace_all(&out, p.with).into_owned();
        }
    }
    // A pattern's mask next to the remains of a value can spell the value again.
    mask_values(out, values)
}

/// Replaces every registered value until none is left: a mask next to the text around it can
/// spell a value again (`****` masked once is `***` + `*`), and every pass shortens the text, as
/// no registered form is shorter than the mask.
fn mask_values(mut out: String, values: &[String]) -> String {
    loop {
        let mut changed = false;
        for v in values {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), MASK);
                changed = true;
            }
        }
        if !changed {
            return out;
        }
    }
}

/// `value` as the inside of a JSON string: the mandatory escapes, plus every non-ASCII
/// character as `\uXXXX` (`ascii`) and `<`, `>`, `&`, U+2028 and U+2029 as `\uXXXX` (`html`).
fn json_escape(value: &str, ascii: bool, html: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' '
                || (ascii && !(' '..='~').contains(&c))
                || (html && matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}')) =>
            {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out
}

fn global() -> &'static Redactor {
    static GLOBAL: OnceLock<Redactor> = OnceLock::new();
    GLOBAL.get_or_init(Redactor::default)
}

/// Remembers a secret value so that every later output masks it.
///
/// The JSON-escaped forms and each line of a multi-line value are remembered too, so the value
/// does not survive being embedded in a JSON body or printed one line at a time.
pub fn register(value: &str) {
    global().register(value);
}

/// Remembers a registry credential: the password, and the base64 `user:password` docker stores.
pub fn register_basic_auth(user: &str, password: &str) {
    global().register_basic_auth(user, password);
}

/// Masks everything secret in `text`.
pub fn redact(text: &str) -> String {
    global().redact(text)
}

/// Masks everything secret in `text` without waiting: `None` while a value is being registered.
/// For the panic hook, which may run on the thread that holds the registration lock.
pub fn try_redact(text: &str) -> Option<String> {
    global().try_redact(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: &str) {
        assert_eq!(redact(input), expected, "input: {input}");
    }

    #[test]
    fn token_shapes_are_masked_without_registration() {
        check("token s.AbCdEfGhIjKlMnOpQrStUvWx ok", "token *** ok");
        check("hvs.CAESIJ7abcdefghijklmnopqrstuv", "***");
        check(
            "Authorization: Bearer hvs.whatever-value",
            "Authorization: Bearer ***",
        );
        check(
            "jwt eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln end",
            "jwt *** end",
        );
        check(
            r#"{"auths":{"r":{"auth":"dXNlcjpwYXNz"}}}"#,
            r#"{"auths":{"r":{"auth":"***"}}}"#,
        );
        check("s.short is fine", "s.short is fine");
    }

    #[test]
    fn registered_values_are_masked_in_every_form() {
        register("multi\nline-secret-value");
        register("quote\"d-secret");
        register_basic_auth("robot", "registry-pass");
        check("x multi\nline-secret-value y", "x *** y");
        check("wrapped: line-secret-value", "wrapped: ***");
        check(r#"{"v":"quote\"d-secret"}"#, r#"{"v":"***"}"#);
        check("cm9ib3Q6cmVnaXN0cnktcGFzcw==", "***");
        check("pw registry-pass", "pw ***");
    }

    #[test]
    fn env_file_spellings_are_masked() {
        let r = Redactor::default();
        r.register("pa$s 'x' #1");
        // compose quoting a line of .env in an error, however the agent wrote the value there
        assert_eq!(
            r.redact(r#"line 3: unexpected character in "pa$$s 'x' #1""#),
            r#"line 3: unexpected character in "***""#
        );
        assert_eq!(r.redact(r"V='pa$s \'x\' #1'"), "V='***'");
    }

    #[test]
    fn url_encoded_spellings_are_masked() {
        let r = Redactor::default();
        r.register("p@ss w/rd:1");
        assert_eq!(
            r.redact("connect postgres://app:p%40ss%20w%2Frd%3A1@db/app failed"),
            "connect postgres://app:***@db/app failed"
        );
        assert_eq!(r.redact("body pw=p%40ss+w%2Frd%3A1&x=1"), "body pw=***&x=1");
    }

    #[test]
    fn json_escapes_match_the_writers_out_there() {
        // Python's json.dumps and Go's encoding/json, printed by the real tools.
        let v = "pä\"ss\\wörd\u{2028}😀\u{7f}\u{1}<&>\u{8}\u{c}\t";
        assert_eq!(
            json_escape(v, true, false),
            r#"p\u00e4\"ss\\w\u00f6rd\u2028\ud83d\ude00\u007f\u0001<&>\b\f\t"#
        );
        assert_eq!(
            json_escape(v, false, true),
            "pä\\\"ss\\\\wörd\\u2028😀\u{7f}\\u0001\\u003c\\u0026\\u003e\\b\\f\\t"
        );
        let serde = serde_json::to_string(v).unwrap();
        assert_eq!(json_escape(v, false, false), serde[1..serde.len() - 1]);
    }

    #[test]
    fn a_mask_cannot_spell_a_value_again() {
        let r = Redactor::default();
        r.register("****");
        assert_eq!(r.redact("*****"), "***");
        r.register("r ***");
        assert!(!r.redact("Bearer abcdefghr ***").contains("r ***"));
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        /// Secret values: printable text, quotes, backslashes, control characters, non-ASCII
        /// and the mask's own `*`, never shorter than the redactor masks.
        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-zA-Z0-9+/=_.:@*-]{4,40}",
                "[ -~]{4,40}",
                r#"(\PC|["\\\x00-\x1f\x7f<>&\x{2028}\x{2029}*]){4,30}"#,
            ]
            .prop_filter("masked length", |v| v.len() >= MIN_VALUE_LEN)
        }

        /// Text around a value: anything, including other secrets' shapes and stray masks.
        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<String>(),
                "[ -~\n]{0,60}",
                Just("Authorization: Bearer ".to_string()),
                Just("web-1  | ".to_string()),
                Just("***".to_string()),
            ]
        }

        /// What Python's `json.dumps` (ensure_ascii) writes inside the quotes, built here from
        /// UTF-16 units so it is not the redactor's own escaper.
        fn python_json(v: &str) -> String {
            let mut out = String::new();
            for unit in v.encode_utf16() {
                match char::from_u32(u32::from(unit)) {
                    Some('"') => out.push_str("\\\""),
                    Some('\\') => out.push_str("\\\\"),
                    Some('\n') => out.push_str("\\n"),
                    Some('\r') => out.push_str("\\r"),
                    Some('\t') => out.push_str("\\t"),
                    Some('\u{8}') => out.push_str("\\b"),
                    Some('\u{c}') => out.push_str("\\f"),
                    Some(c @ ' '..='~') => out.push(c),
                    _ => out.push_str(&format!("\\u{unit:04x}")),
                }
            }
            out
        }

        /// Go's `json.Marshal`: serde_json's escapes plus `<`, `>`, `&`, U+2028 and U+2029.
        fn go_json(v: &str) -> String {
            let s = serde_json::to_string(v).unwrap();
            s[1..s.len() - 1]
                .replace('<', "\\u003c")
                .replace('>', "\\u003e")
                .replace('&', "\\u0026")
                .replace('\u{2028}', "\\u2028")
                .replace('\u{2029}', "\\u2029")
        }

        fn json(v: &str) -> String {
            let s = serde_json::to_string(v).unwrap();
            s[1..s.len() - 1].to_string()
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

            #[test]
            fn a_value_embedded_anywhere_never_survives(
                v in value(), others in prop::collection::vec(value(), 0..3),
                pre in text(), post in text(),
            ) {
                let r = Redactor::default();
                for o in &others {
                    r.register(o);
                }
                r.register(&v);
                let out = r.redact(&format!("{pre}{v}{post}"));
                prop_assert!(!out.contains(&v), "{out:?}");
            }

            #[test]
            fn every_json_spelling_is_masked(v in value(), pre in text(), post in text()) {
                let r = Redactor::default();
                r.register(&v);
                for form in [json(&v), python_json(&v), go_json(&v)] {
                    let out = r.redact(&format!("{pre}\"{form}\"{post}"));
                    prop_assert!(!out.contains(&form), "{form:?} in {out:?}");
                    prop_assert!(!out.contains(&v));
                }
            }

            #[test]
            fn lines_of_a_multi_line_value_never_survive_apart(
                lines in prop::collection::vec("[ -~]{0,3}[!-~]{4,20}[ -~]{0,3}", 2..6),
                crlf in any::<bool>(),
                prefix in prop_oneof![Just("web-1  | "), Just(""), Just("INFO "), Just("\"")],
                pre in text(),
            ) {
                let v = lines.join(if crlf { "\r\n" } else { "\n" });
                let r = Redactor::default();
                r.register(&v);
                // The lines as a container or a log prints them: one at a time, each behind
                // its own prefix, in any order.
                let mut printed: Vec<String> = lines.iter().map(|l| format!("{prefix}{l}")).collect();
                printed.reverse();
                let out = r.redact(&format!("{pre}\n{}\n", printed.join("\n")));
                for l in &lines {
                    prop_assert!(!out.contains(l.trim()), "{:?} in {out:?}", l.trim());
                }
            }

            #[test]
            fn basic_auth_never_survives(
                user in "[a-z$]{1,12}", password in value(), pre in text(), post in text(),
            ) {
                let r = Redactor::default();
                r.register_basic_auth(&user, &password);
                let b64 = base64::engine::general_purpose::STANDARD
                    .encode(format!("{user}:{password}"));
                for embedded in [
                    b64.clone(),
                    format!("{{\"auths\":{{\"r\":{{\"auth\":\"{b64}\"}}}}}}"),
                    format!("Authorization: Basic {b64}"),
                    format!("{user}:{password}"),
                ] {
                    let out = r.redact(&format!("{pre}{embedded}{post}"));
                    prop_assert!(!out.contains(&b64), "{out:?}");
                    prop_assert!(!out.contains(&password), "{out:?}");
                }
            }

            #[test]
            fn text_without_secrets_passes_unchanged(text in "[a-zA-Z ,.:\n]{0,200}") {
                // Nothing registered and no token shape: the redactor must not eat the log.
                prop_assert_eq!(Redactor::default().redact(&text), text);
            }
        }
    }

    mod lazy_patterns {
        use super::super::*;
        use proptest::prelude::*;

        #[test]
        fn the_lines_of_a_heartbeat_and_an_apply_compile_no_pattern() {
            for line in [
                " INFO checkin: action=none desired=f40e77c5067a applied=f40e77c5067a\n",
                " INFO heartbeat: 3 container(s) healthy\n",
                " INFO checkin: action=apply desired=916a6fee03c7 applied=68121375a6e0\n",
                " INFO read 2 secret(s): GEMINI_API_KEY, POSTGRES_PASSWORD\n",
                " INFO compose up -d --remove-orphans\n",
                " INFO applied 916a6fee03c7 (1 container(s) healthy)\n",
            ] {
                let hits: Vec<&str> = PATTERNS
                    .iter()
                    .filter(|p| p.may_match(line))
                    .map(|p| p.re)
                    .collect();
                assert!(hits.is_empty(), "{line:?} would compile {hits:?}");
            }
        }

        #[test]
        fn every_shape_still_meets_its_pattern() {
            for (p, text) in PATTERNS.iter().zip([
                "AUTHORIZATION: bearer abc",
                "X-Vault-Token: hvs.x",
                "with Bearer abcdefgh12",
                "eyJhbGciOi.eyJzdWIi.sig",
                "token s.abcdefghijklmnopqrstuvwx",
                r#"{"Auth": "dXNlcjpwYXNz"}"#,
                "BASIC dXNlcjpwYXNz",
            ]) {
                assert!(p.may_match(text) && p.regex().is_match(text), "{}", p.re);
                assert_ne!(redact_with(&[], text), text);
            }
        }

        /// Text near the patterns' shapes: their literals in any case, separators, token
        /// characters, and non-ASCII letters that fold to ASCII ones.
        fn near_shapes() -> impl Strategy<Value = String> {
            let piece = prop_oneof![
                Just("authorization:".to_string()),
                Just("Bearer".to_string()),
                Just("x-vault-token:".to_string()),
                Just("eyJ".to_string()),
                Just("\"auth\"".to_string()),
                Just("basic".to_string()),
                Just("hvs.".to_string()),
                Just("hvr.".to_string()),
                Just(" s.".to_string()),
                Just(" b.".to_string()),
                Just(" r.".to_string()),
                "[A-Za-z0-9_-]{20,24}",
                Just("\u{17f}".to_string()),
                Just("\u{212a}".to_string()),
                "[A-Za-z0-9._~+/=: \"-]{0,30}",
            ];
            prop::collection::vec(piece, 0..6).prop_map(|v| v.concat())
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

            /// Skipping a pattern never changes what the redactor writes.
            #[test]
            fn a_skipped_pattern_could_not_have_matched(t in near_shapes()) {
                for p in &PATTERNS {
                    prop_assert!(p.may_match(&t) || !p.regex().is_match(&t), "{} on {t:?}", p.re);
                }
            }
        }
    }
}
