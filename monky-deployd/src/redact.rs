//! The redactor: the one filter every way out of the agent goes through.
//!
//! Logs, the report's `log_tail` and `detail`, `status`, state.json's `last_error` and the error
//! printed by `main` are all passed through [`redact`]. It masks every value the agent has read
//! from OpenBao (registered with [`register`] the moment it is read, in its plain, JSON-escaped
//! and per-line forms), OpenBao token shapes, JWTs, bearer headers and registry auth strings.

use std::sync::{OnceLock, RwLock};

use base64::Engine as _;
use regex::Regex;

/// What a masked value becomes.
pub const MASK: &str = "***";

/// Values shorter than this are not masked on their own: masking every "on" or "1" in a log would
/// hide the log without protecting anything a guess would not find.
pub const MIN_VALUE_LEN: usize = 4;

fn values() -> &'static RwLock<Vec<String>> {
    static VALUES: OnceLock<RwLock<Vec<String>>> = OnceLock::new();
    VALUES.get_or_init(|| RwLock::new(Vec::new()))
}

fn patterns() -> &'static [(Regex, &'static str)] {
    static PATTERNS: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        [
            // Bearer and vault-token headers, whatever follows.
            (r"(?i)(authorization:\s*bearer\s+)[^\s,;]+", "${1}***"),
            (r"(?i)(x-vault-token:\s*)[^\s,;]+", "${1}***"),
            (r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}", "${1}***"),
            // JWTs: three base64url parts, the first a JSON header.
            (r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*", MASK),
            // OpenBao/Vault token shapes: legacy `s.` + 24, and the prefixed forms.
            (r"\b(?:hv[sbr]|[sbr])\.[A-Za-z0-9_-]{20,}", MASK),
            // Docker config auth strings and basic-auth headers.
            (r#"(?i)("auth"\s*:\s*")[A-Za-z0-9+/=]+"#, "${1}***"),
            (r"(?i)(\bbasic\s+)[A-Za-z0-9+/=]{8,}", "${1}***"),
        ]
        .into_iter()
        .map(|(re, with)| (Regex::new(re).expect("static redaction pattern"), with))
        .collect()
    })
}

/// Remembers a secret value so that every later output masks it.
///
/// The JSON-escaped form and each line of a multi-line value are remembered too, so the value
/// does not survive being embedded in a JSON body or wrapped across log lines.
pub fn register(value: &str) {
    let mut forms = vec![value.to_string()];
    if let Ok(json) = serde_json::to_string(value) {
        forms.push(json[1..json.len() - 1].to_string());
    }
    forms.extend(value.lines().map(|l| l.trim().to_string()));
    let mut guard = values().write().unwrap_or_else(|p| p.into_inner());
    for form in forms {
        if form.len() >= MIN_VALUE_LEN && !guard.contains(&form) {
            guard.push(form);
        }
    }
    // Longest first, so a value that contains another is masked whole.
    guard.sort_by_key(|v| std::cmp::Reverse(v.len()));
}

/// Remembers a registry credential: the password, and the base64 `user:password` docker stores.
pub fn register_basic_auth(user: &str, password: &str) {
    register(password);
    let engine = base64::engine::general_purpose::STANDARD;
    register(&engine.encode(format!("{user}:{password}")));
}

/// Masks everything secret in `text`.
pub fn redact(text: &str) -> String {
    let mut out = text.to_string();
    for v in values().read().unwrap_or_else(|p| p.into_inner()).iter() {
        if out.contains(v.as_str()) {
            out = out.replace(v.as_str(), MASK);
        }
    }
    for (re, with) in patterns() {
        if re.is_match(&out) {
            out = re.replace_all(&out, *with).into_owned();
        }
    }
    out
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
}
