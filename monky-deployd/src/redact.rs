//! The redactor: the one filter every way out of the agent goes through.
//!
//! Its output is a type: [`Redacted`], text that only this module makes (its constructor is
//! private), so what leaves the process (the report's `log_tail` and `detail`, state.json's
//! `last_error`, a log line, compose's output kept as evidence) is built from a `Redacted` and
//! a text is redacted once on its way out rather than again at every step. Logs, `status`, the
//! error printed by `main` and a panic message go through [`redact`] too. It masks every value
//! the agent has read from OpenBao (registered with [`register`] the moment it is read, in its
//! plain, JSON-escaped, Go-quoted, per-line, `.env` and URL-encoded forms), OpenBao token
//! shapes, JWTs, bearer headers and registry auth strings.
//!
//! How much of a text a value masks depends on its length (see `Rule`): a value of
//! [`ANYWHERE_LEN`] bytes or more is masked wherever it occurs, even inside a longer word; a
//! shorter one only as a whole token, so a secret that happens to be part of a word does not
//! eat that word; and a short value that is a plain word (letters only) only where it stands as
//! a value (`KEY=value`, a URL, quotes), so a secret `compose` leaves `docker compose pull` alone.
//! Values shorter than `MIN_VALUE_LEN` are never masked; `doctor` names the secrets that fall
//! under the last two rules.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock, RwLock, TryLockError};

use base64::Engine as _;
use regex::Regex;

/// Bytes a URL component keeps as they are (RFC 3986 "unreserved"); the rest is `%XX`.
const URL_COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// What a masked value becomes.
pub(crate) const MASK: &str = "***";

/// Text the redactor has passed: only [`redact`] (and this module's joins and cuts of what it
/// produced) makes one. It is serialized as its plain string; read back (state.json's
/// `last_error`), it goes through the redactor again, so a value registered since is masked
/// and nothing outside this module turns a raw string into a `Redacted`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Redacted(String);

impl Redacted {
    /// The redacted text.
    #[must_use]
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The redacted text, owned (for a wire struct that holds a `String`).
    #[must_use]
    pub fn into_string(self) -> String {
        self.0
    }

    /// Appends `other`, on a line of its own: two redacted texts side by side stay redacted
    /// as long as no value is spelled across the seam, and a line break is a boundary for
    /// every rule (each line of a multi-line value is registered apart).
    pub(crate) fn push_lines(&mut self, other: &Redacted) {
        if !self.0.is_empty() && !self.0.ends_with('\n') {
            self.0.push('\n');
        }
        self.0.push_str(&other.0);
    }

    /// The last `max` bytes, cut at a line start where possible (see
    /// `tail_of`). A cut inside a line is redacted again: a value masked
    /// only as a whole token may stand alone once the text glued to it is cut off.
    #[must_use]
    pub(crate) fn tail(&self, max: usize) -> Redacted {
        let cut = tail_of(&self.0, max);
        let at_line_start =
            cut.len() == self.0.len() || self.0[..self.0.len() - cut.len()].ends_with('\n');
        if at_line_start {
            Redacted(cut)
        } else {
            redact(&cut)
        }
    }
}

impl std::fmt::Display for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Redacted {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| redact(&s))
    }
}

/// Values shorter than this (in bytes) are not masked on their own: masking every "on" or "1" in
/// a log would hide the log without protecting anything a guess would not find. The same holds
/// for each line of a multi-line value: a line shorter than this survives when the lines are
/// printed apart.
pub(crate) const MIN_VALUE_LEN: usize = 4;

/// Values (and each of their spellings) of at least this many bytes are masked wherever they
/// occur, also glued to other letters; no word of a log is that long by chance.
pub const ANYWHERE_LEN: usize = 12;

/// Where a registered spelling of a value is masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// [`ANYWHERE_LEN`] bytes or more: every occurrence.
    Anywhere,
    /// Shorter: an occurrence that is not glued to a letter or digit on either side. An escape
    /// just before it (`\n`, `\x41`, `\u00e4`, `%0A`) is a boundary, not a glued letter.
    Token,
    /// Shorter, and letters only: as [`Rule::Token`], and not where it stands between
    /// whitespace (or the text's ends) on both sides, which is a word of prose; `KEY=value`,
    /// `user:value@host` and `"value"` are masked.
    Value,
}

impl Rule {
    /// The rule a registered spelling `text` is masked by.
    #[must_use]
    pub(crate) fn of(text: &str) -> Rule {
        if text.len() >= ANYWHERE_LEN {
            Rule::Anywhere
        } else if text.chars().all(char::is_alphabetic) {
            Rule::Value
        } else {
            Rule::Token
        }
    }
}

/// A registered spelling and where it is masked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Form {
    text: String,
    rule: Rule,
}

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
    values: RwLock<Vec<Form>>,
    /// The releases (sha and `.env` digest) whose secrets are registered.
    releases: Mutex<HashSet<String>>,
}

impl Redactor {
    /// Registers the values `read` returns, unless `key` was registered before; `read` is not
    /// called then. Without a key, always.
    fn register_release(
        &self,
        key: Option<&str>,
        read: impl FnOnce() -> Vec<secrecy::SecretString>,
    ) {
        use secrecy::ExposeSecret as _;
        // Held while registering, so two threads never both read the same release.
        let mut done = self.releases.lock().unwrap_or_else(|p| p.into_inner());
        if key.is_some_and(|k| done.contains(k)) {
            return;
        }
        for value in read() {
            self.register(value.expose_secret());
        }
        if let Some(k) = key {
            done.insert(k.to_string());
        }
    }

    fn register(&self, value: &str) {
        let mut forms = vec![value.to_string()];
        // The escapes of the JSON writers a value meets on its way out: serde_json (the agent's
        // own reports), ASCII-only (Python's default, tenancy and its tooling) and HTML-safe
        // (Go's default, the docker CLI and compose).
        for (ascii, html) in [(false, false), (true, false), (false, true), (true, true)] {
            forms.push(json_escape(value, ascii, html));
        }
        // Go's quoting (`%q` and `%+q`), as docker compose prints a value it cannot use, and
        // every non-ASCII or unprintable byte as `\xNN`, as a byte-wise quoter does.
        forms.push(go_quote(value, false));
        forms.push(go_quote(value, true));
        forms.push(byte_escape(value));
        forms.extend(value.lines().map(|l| l.trim().to_string()));
        // As `.env` holds it: compose quotes lines of that file in its errors, the Go way too.
        for spelling in monky_bundle::env_spellings(value) {
            forms.push(go_quote(&spelling, false));
            forms.push(byte_escape(&spelling));
            forms.push(spelling);
        }
        // As a URL carries it (a database URL in an application's log): percent-encoded, every
        // byte but the unreserved ones, and form-encoded.
        forms.push(percent_encoding::utf8_percent_encode(value, URL_COMPONENT).to_string());
        forms.push(url::form_urlencoded::byte_serialize(value.as_bytes()).collect());
        self.insert(forms, Rule::of);
    }

    /// Adds `texts` (those long enough, once each), each masked by `rule_of` its text.
    fn insert(&self, texts: Vec<String>, rule_of: impl Fn(&str) -> Rule) {
        let mut guard = self.values.write().unwrap_or_else(|p| p.into_inner());
        for text in texts {
            if text.len() >= MIN_VALUE_LEN && !guard.iter().any(|f| f.text == text) {
                let rule = rule_of(&text);
                guard.push(Form { text, rule });
            }
        }
        // Longest first, so a value that contains another is masked whole.
        guard.sort_by_key(|f| std::cmp::Reverse(f.text.len()));
    }

    fn register_basic_auth(&self, user: &str, password: &str) {
        self.register(password);
        // The base64 of `user:password` is no word of prose even when it happens to be letters
        // only, so it is masked wherever it stands as a token, between spaces too.
        let engine = base64::engine::general_purpose::STANDARD;
        let encoded = engine.encode(format!("{user}:{password}"));
        self.insert(vec![encoded], |text| match Rule::of(text) {
            Rule::Value => Rule::Token,
            rule => rule,
        });
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

fn redact_with(values: &[Form], text: &str) -> String {
    let mut out = mask_values(text.to_string(), values);
    for p in &PATTERNS {
        if p.may_match(&out) && p.regex().is_match(&out) {
            out = p.regex().replace_all(&out, p.with).into_owned();
        }
    }
    // A pattern's mask next to the remains of a value can spell the value again.
    mask_values(out, values)
}

/// Replaces every registered value its rule allows until none is left: a mask next to the text
/// around it can spell a value again (`****` masked once is `***` + `*`), and every pass shortens
/// the text, as no registered form is shorter than the mask.
fn mask_values(mut out: String, values: &[Form]) -> String {
    loop {
        let mut changed = false;
        for form in values {
            if let Some(masked) = mask_form(&out, form) {
                out = masked;
                changed = true;
            }
        }
        if !changed {
            return out;
        }
    }
}

/// `text` with the occurrences of `form` its rule allows masked; `None` when there are none.
fn mask_form(text: &str, form: &Form) -> Option<String> {
    let needle = form.text.as_str();
    let mut found = text.match_indices(needle).peekable();
    found.peek()?;
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut changed = false;
    for (at, _) in found {
        // Occurrences can overlap (`aaaa` in `aaaaa`); one already masked ends past `at`.
        if at < copied {
            continue;
        }
        let end = at + needle.len();
        if masks_here(text, at, end, needle, form.rule) {
            out.push_str(&text[copied..at]);
            out.push_str(MASK);
            copied = end;
            changed = true;
        }
    }
    if !changed {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

/// Whether the occurrence `text[at..end]` of `needle` is masked under `rule`.
fn masks_here(text: &str, at: usize, end: usize, needle: &str, rule: Rule) -> bool {
    if rule == Rule::Anywhere {
        return true;
    }
    let before = text[..at].chars().next_back();
    let after = text[end..].chars().next();
    let glued = |edge: Option<char>, neighbour: Option<char>| {
        edge.is_some_and(char::is_alphanumeric) && neighbour.is_some_and(char::is_alphanumeric)
    };
    if glued(needle.chars().next(), before) && !ends_with_escape(&text[..at]) {
        return false;
    }
    if glued(needle.chars().next_back(), after) {
        return false;
    }
    if rule == Rule::Value {
        let prose = |c: Option<char>| c.is_none_or(char::is_whitespace);
        return !(prose(before) && prose(after));
    }
    true
}

/// Whether `text` ends with an escape sequence: a backslash escape of C, JSON or Go (`\n`,
/// `\x41`, `\u00e4`, `\U0001f600`) or a percent-encoded byte (`%0A`). The letters or digits
/// it ends with belong to the escape, not to a word the next text is glued to.
fn ends_with_escape(text: &str) -> bool {
    let b = text.as_bytes();
    let hex_tail = |n: usize, lead: &[u8]| {
        b.len() > n
            && b[b.len() - n..].iter().all(u8::is_ascii_hexdigit)
            && lead.contains(&b[b.len() - n - 1])
            && (lead == b"%" || (b.len() > n + 1 && b[b.len() - n - 2] == b'\\'))
    };
    let short = b.len() >= 2
        && b[b.len() - 2] == b'\\'
        && matches!(
            b[b.len() - 1],
            b'a' | b'b' | b'f' | b'n' | b'r' | b't' | b'v'
        );
    short || hex_tail(2, b"%") || hex_tail(2, b"x") || hex_tail(4, b"u") || hex_tail(8, b"U")
}

/// `value` as Go's `strconv.Quote` (`%q`) writes it inside the quotes, or with `ascii` as
/// `strconv.QuoteToASCII` (`%+q`): printable characters as they are, `\"` and `\\`, the C
/// escapes, `\xNN` below space and for DEL, `\uNNNN` or `\UNNNNNNNN` for the other characters
/// Go does not print (and, with `ascii`, for everything beyond ASCII).
fn go_quote(value: &str, ascii: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if go_printable(c) && (!ascii || c.is_ascii()) => out.push(c),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if c < ' ' || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if u32::from(c) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out
}

/// Go's `unicode.IsPrint`: letters, marks, numbers, punctuation, symbols and the ASCII space;
/// not other spaces (U+00A0, U+3000), separators, controls, format characters, private use
/// or unassigned code points.
fn go_printable(c: char) -> bool {
    use unicode_general_category::{GeneralCategory as G, get_general_category};
    c == ' '
        || !matches!(
            get_general_category(c),
            G::SpaceSeparator
                | G::LineSeparator
                | G::ParagraphSeparator
                | G::Control
                | G::Format
                | G::Surrogate
                | G::PrivateUse
                | G::Unassigned
        )
}

/// `value` with every byte outside printable ASCII as `\xNN` (and `\t`, `\n`, `\r`, `\"`,
/// `\\`), as a quoter that works on bytes prints it: `pä` is `p\xc3\xa4`.
fn byte_escape(value: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(value.len() + 8);
    for b in value.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b' '..=b'~' => out.push(char::from(b)),
            b => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out
}

/// Why a secret `value` is not masked everywhere, for `doctor` to say next to its name; `None`
/// when every occurrence of it is masked.
#[must_use]
pub(crate) fn weakness(value: &str) -> Option<&'static str> {
    if value.len() < MIN_VALUE_LEN {
        Some("shorter than 4 bytes: never masked in logs, reports or status")
    } else if value.len() >= ANYWHERE_LEN {
        None
    } else if Rule::of(value) == Rule::Value {
        Some(
            "a short plain word: masked only where it stands as a value (KEY=value, a URL, quotes), not as a word of text",
        )
    } else {
        Some("shorter than 12 bytes: masked only as a whole token, not inside a longer word")
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

/// Registers a release's secret values once per `key` (its sha and `.env` digest) in the
/// process: `read` (which reads them back from the release's `.env`) runs the first time a key
/// is seen, never again for it. With no key (nothing to tell two `.env`s apart), every time.
pub(crate) fn register_release(
    key: Option<&str>,
    read: impl FnOnce() -> Vec<secrecy::SecretString>,
) {
    global().register_release(key, read);
}

/// `text` with every control character a terminal or the journal would act on escaped, as
/// Rust writes it (`\r`, `\u{1b}`): C0 (CR included), DEL, C1, the Unicode line and
/// paragraph separators, and the bidi and other invisible formatting characters (U+202E would
/// reorder what a reader sees); the one escape, [`monky_vocab::text::escape`]. A tab stays; a line break stays only with `keep_newlines`. Peers'
/// text (tenancy's `detail`, OpenBao's and the registry's errors, compose's and the apps'
/// output) reaches the journal and the terminal only through the printers, and each printer
/// passes what it prints through here, so no peer can forge a line or move the cursor.
#[must_use]
pub(crate) fn escape_controls(text: &str, keep_newlines: bool) -> std::borrow::Cow<'_, str> {
    monky_vocab::text::escape(text, keep_newlines)
}

/// Masks everything secret in `text`: the one way to a [`Redacted`].
pub fn redact(text: &str) -> Redacted {
    Redacted(global().redact(text))
}

/// Masks everything secret in `text` without waiting: `None` while a value is being registered.
/// For the panic hook, which may run on the thread that holds the registration lock.
pub(crate) fn try_redact(text: &str) -> Option<String> {
    global().try_redact(text)
}

/// The last `max` bytes of `text`, cut at a line start where possible.
fn tail_of(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let cut = &text[start..];
    match cut.find('\n') {
        Some(i) if i + 1 < cut.len() => cut[i + 1..].to_string(),
        _ => cut.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_controls_escapes_what_a_terminal_acts_on() {
        assert_eq!(
            escape_controls("ok\r INFO applied", false),
            "ok\\r INFO applied"
        );
        assert_eq!(
            escape_controls("a\u{1b}[2Jb\tc\n", true),
            "a\\u{1b}[2Jb\tc\n"
        );
        assert_eq!(escape_controls("a\nb", false), "a\\nb");
        assert_eq!(
            escape_controls("\u{85}\u{2028}é", false),
            "\\u{85}\\u{2028}é"
        );
        assert_eq!(escape_controls("up\u{202e}nwod", false), "up\\u{202e}nwod");
    }

    #[test]
    fn tail_keeps_the_end_at_a_line_start() {
        assert_eq!(tail_of("a\nb\nc\n", 100), "a\nb\nc\n");
        assert_eq!(tail_of("first line\nsecond\nthird\n", 12), "third\n");
        let long = "é".repeat(50);
        assert!(tail_of(&long, 7).len() <= 7);
    }

    fn check(input: &str, expected: &str) {
        assert_eq!(redact(input).as_str(), expected, "input: {input}");
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
    fn redacted_text_stays_redacted_read_back_joined_and_cut() {
        register("read-back-secret-77");
        register("hunt3r77");
        // state.json read back: redacted again, so a value registered since is masked too.
        let r: Redacted = serde_json::from_str(r#""pw read-back-secret-77""#).unwrap();
        assert_eq!(r.as_str(), "pw ***");
        assert_eq!(serde_json::to_string(&r).unwrap(), r#""pw ***""#);
        // Glued to a letter, a short value is no token; cut away from it, it is one.
        let glued = redact("xhunt3r77");
        assert_eq!(glued.as_str(), "xhunt3r77");
        assert_eq!(glued.tail(8).as_str(), "***");
        // A cut at a line start keeps the text as it was.
        let mut lines = redact("first line\n");
        lines.push_lines(&redact("second hunt3r77"));
        assert_eq!(lines.as_str(), "first line\nsecond ***");
        assert_eq!(lines.tail(12).as_str(), "second ***");
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
    fn gos_quoting_of_an_env_line_is_masked() {
        let r = Redactor::default();
        r.register("pä$s 'x' #1");
        // compose quoting, the Go way, a value of .env as the agent wrote it there
        assert_eq!(
            r.redact(r#"unexpected character in "p\xc3\xa4$$s 'x' #1""#),
            r#"unexpected character in "***""#
        );
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
        r.register("@***@");
        assert!(
            !r.redact("x@eyJhbGciOi.eyJzdWIi.c2ln@y").contains("@***@"),
            "the JWT's mask spelled the value"
        );
    }

    #[test]
    fn go_quoting_matches_go() {
        // What Go's strconv.Quote and QuoteToASCII print for these, inside the quotes.
        let check = |value: &str, quote: &str, ascii: &str| {
            assert_eq!(go_quote(value, false), quote, "%q of {value:?}");
            assert_eq!(go_quote(value, true), ascii, "%+q of {value:?}");
        };
        check("plain", "plain", "plain");
        check(
            "pä\"ss\\wörd",
            r#"pä\"ss\\wörd"#,
            r#"p\u00e4\"ss\\w\u00f6rd"#,
        );
        check(
            "\u{7}\u{8}\u{c}\n\r\t\u{b}\u{1}\u{7f}",
            r"\a\b\f\n\r\t\v\x01\x7f",
            r"\a\b\f\n\r\t\v\x01\x7f",
        );
        // Spaces other than ASCII's, separators, format and private-use characters are escaped
        // even by %q; symbols beyond the BMP are printed by %q and escaped long by %+q.
        check(
            "\u{a0}\u{3000}\u{2028}\u{200b}\u{feff}\u{e000}",
            r"\u00a0\u3000\u2028\u200b\ufeff\ue000",
            r"\u00a0\u3000\u2028\u200b\ufeff\ue000",
        );
        check("😀\u{e0001}", "😀\\U000e0001", r"\U0001f600\U000e0001");
        assert_eq!(byte_escape("pä\tss\"\\"), r#"p\xc3\xa4\tss\"\\"#);
    }

    #[test]
    fn go_escaped_values_are_masked() {
        let r = Redactor::default();
        r.register("pässwörd\u{3000}1");
        for text in [
            // docker compose config on a value it cannot use, byte-wise and as Go quotes it
            r#"invalid interpolation: "p\xc3\xa4ssw\xc3\xb6rd\xe3\x80\x801" is not a bool"#,
            r#"value "pässwörd\u30001" rejected"#,
            r#"value "p\u00e4ssw\u00f6rd\u30001" rejected"#,
        ] {
            let out = r.redact(text);
            assert!(out.contains("\"***\""), "{text} -> {out}");
            assert!(!out.contains("ssw"), "{text} -> {out}");
        }
    }

    #[test]
    fn a_secret_equal_to_a_common_word_leaves_the_words_of_a_log_alone() {
        let r = Redactor::default();
        for word in ["docker", "compose", "pull", "pose", "dock"] {
            r.register(word);
        }
        let check = |text: &str, expected: &str| assert_eq!(r.redact(text), expected, "{text}");
        // Words of prose, and the same letters inside longer words, stay.
        check("docker compose pull", "docker compose pull");
        check(
            "INFO compose pull\nINFO docker compose up -d",
            "INFO compose pull\nINFO docker compose up -d",
        );
        check("composer dockerfile pulled", "composer dockerfile pulled");
        // Where the word stands as a value, it is one.
        check("POSTGRES_PASSWORD=compose", "POSTGRES_PASSWORD=***");
        check(
            "connect postgres://app:docker@db/app",
            "connect postgres://app:***@db/app",
        );
        check(
            r#"invalid value "pull" for x"#,
            r#"invalid value "***" for x"#,
        );
        check("pw=dock;x", "pw=***;x");
    }

    #[test]
    fn a_short_secret_is_masked_as_a_token_not_inside_a_word() {
        let r = Redactor::default();
        r.register("hunter22");
        let check = |text: &str, expected: &str| assert_eq!(r.redact(text), expected, "{text}");
        check("login hunter22 failed", "login *** failed");
        check("xhunter22 hunter22x", "xhunter22 hunter22x");
        check("pw=hunter22&x", "pw=***&x");
        // An escape before it is a boundary, not a letter it is glued to.
        check(r#"{"log":"line\nhunter22"}"#, r#"{"log":"line\n***"}"#);
        check(r"a\x41hunter22", r"a\x41***");
        check("a%0Ahunter22", "a%0A***");
        // A long value is masked glued to anything.
        r.register("Zx81-Qw72-Lp09");
        check("tokenZx81-Qw72-Lp09abc", "token***abc");
    }

    #[test]
    fn weaknesses_are_named_by_rule() {
        assert!(weakness("abc").is_some_and(|w| w.contains("never masked")));
        assert!(weakness("compose").is_some_and(|w| w.contains("plain word")));
        assert!(weakness("hunter22").is_some_and(|w| w.contains("whole token")));
        assert_eq!(weakness("a-long-secret-value"), None);
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

        /// A redactor that knows `v` and, registered before it, `others`.
        fn knowing(v: &str, others: &[String]) -> Redactor {
            let r = Redactor::default();
            for o in others {
                r.register(o);
            }
            r.register(v);
            r
        }

        fn json(v: &str) -> String {
            let s = serde_json::to_string(v).unwrap();
            s[1..s.len() - 1].to_string()
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

            #[test]
            fn a_long_value_embedded_anywhere_never_survives(
                v in value().prop_filter("long", |v| v.len() >= ANYWHERE_LEN),
                others in prop::collection::vec(value(), 0..3),
                pre in text(), post in text(),
            ) {
                let r = knowing(&v, &others);
                let out = r.redact(&format!("{pre}{v}{post}"));
                prop_assert!(!out.contains(&v), "{out:?}");
            }

            #[test]
            fn any_value_standing_as_a_value_never_survives(
                v in value(), others in prop::collection::vec(value(), 0..3),
                pre in text(), post in text(),
                (open, close) in prop::sample::select(vec![
                    ("KEY=", "\n"), ("KEY=", " "), ("://app:", "@db"), ("\"", "\""), ("'", "'"),
                    (" ", ";"), ("\n", ","), ("/", "/"), ("[", "]"),
                ]),
            ) {
                let r = knowing(&v, &others);
                let out = r.redact(&format!("{pre}{open}{v}{close}{post}"));
                prop_assert!(!out.contains(&v), "{out:?}");
            }

            #[test]
            fn a_short_secret_never_changes_the_words_it_is_part_of(
                v in "[a-z]{4,11}", before in "[a-z]{1,5}", after in "[a-z]{1,5}",
            ) {
                let r = Redactor::default();
                r.register(&v);
                let text = format!("docker {before}{v} {v}{after} {before}{v}{after} pull");
                prop_assert_eq!(r.redact(&text), text);
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
                    // A short plain word between whitespace (alone on a line, or behind a
                    // prefix that ends in a blank) reads as prose: doctor names such secrets
                    // instead (see `Rule::Value`). Behind a quote it is a value.
                    let after_value_mark = prefix.ends_with(|c: char| !c.is_whitespace());
                    if Rule::of(l.trim()) != Rule::Value || after_value_mark {
                        prop_assert!(!out.contains(l.trim()), "{:?} in {out:?}", l.trim());
                    }
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
                    format!("https://{user}:{password}@registry/"),
                ] {
                    // Apart from the text around it: a short credential is masked as a token.
                    let out = r.redact(&format!("{pre} {embedded} {post}"));
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
