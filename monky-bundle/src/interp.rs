//! The `$`-reference grammar shared by `.env.template` rendering and compose interpolation.
//!
//! Recognised: `$$` (a literal dollar), `$NAME`, `${NAME}`, and the modifiers `:-` / `-`
//! (default), `:?` / `?` (required with a message), `:+` / `+` (alternative). A modifier's word
//! may itself contain references (`${A:-${B}}`). Anything else beginning with `$` is text.
//! A finding names a value that came from a variable by the variable (`key_value`): the policy
//! and the budget both show values so.

use std::borrow::Cow;
use std::collections::BTreeSet;

use serde_json::Value;

use crate::refusal::printable;

/// Nested words deeper than this are not followed; callers decide what that means.
pub(crate) const MAX_DEPTH: usize = 16;

/// One piece of a scanned string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    /// Plain text, copied as is.
    Text(&'a str),
    /// `$$`.
    Dollar,
    /// A variable reference.
    Ref(Ref<'a>),
}

/// A variable reference and what to do when the variable is missing or empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ref<'a> {
    pub name: &'a str,
    pub op: Op<'a>,
    /// The reference exactly as written, e.g. `${A:-x}`.
    pub raw: &'a str,
}

/// The modifier of a braced reference. `colon` means "unset or empty" instead of "unset".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op<'a> {
    Plain,
    Default { colon: bool, word: &'a str },
    Required { colon: bool },
    Alt { colon: bool, word: &'a str },
}

/// The reference nests deeper than [`MAX_DEPTH`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooDeep;

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Whether `s` is a valid environment variable name (`[A-Za-z_][A-Za-z0-9_]*`).
pub(crate) fn is_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && is_name_start(b[0]) && b[1..].iter().all(|c| is_name_char(*c))
}

/// Splits `s` into pieces. Never fails: malformed references are text.
pub(crate) fn scan(s: &str) -> Vec<Piece<'_>> {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' {
            i += 1;
            continue;
        }
        let parsed = match bytes.get(i + 1) {
            Some(b'$') => Some((Piece::Dollar, i + 2)),
            Some(b'{') => braced(s, i),
            Some(c) if is_name_start(*c) => {
                let mut end = i + 2;
                while end < bytes.len() && is_name_char(bytes[end]) {
                    end += 1;
                }
                let r = Ref {
                    name: &s[i + 1..end],
                    op: Op::Plain,
                    raw: &s[i..end],
                };
                Some((Piece::Ref(r), end))
            }
            _ => None,
        };
        match parsed {
            Some((piece, end)) => {
                if text_start < i {
                    out.push(Piece::Text(&s[text_start..i]));
                }
                out.push(piece);
                i = end;
                text_start = end;
            }
            None => i += 1,
        }
    }
    if text_start < bytes.len() {
        out.push(Piece::Text(&s[text_start..]));
    }
    out
}

/// Parses `${...}` starting at `start` (the `$`). Returns the piece and the index after `}`.
fn braced(s: &str, start: usize) -> Option<(Piece<'_>, usize)> {
    let bytes = s.as_bytes();
    let name_start = start + 2;
    let mut i = name_start;
    if i >= bytes.len() || !is_name_start(bytes[i]) {
        return None;
    }
    while i < bytes.len() && is_name_char(bytes[i]) {
        i += 1;
    }
    let name = &s[name_start..i];
    if bytes.get(i) == Some(&b'}') {
        let r = Ref {
            name,
            op: Op::Plain,
            raw: &s[start..=i],
        };
        return Some((Piece::Ref(r), i + 1));
    }
    let colon = bytes.get(i) == Some(&b':');
    if colon {
        i += 1;
    }
    let kind = *bytes.get(i)?;
    if !matches!(kind, b'-' | b'?' | b'+') {
        return None;
    }
    let word_start = i + 1;
    let word_end = closing_brace(bytes, word_start)?;
    let word = &s[word_start..word_end];
    let op = match kind {
        b'-' => Op::Default { colon, word },
        b'?' => Op::Required { colon },
        _ => Op::Alt { colon, word },
    };
    let r = Ref {
        name,
        op,
        raw: &s[start..=word_end],
    };
    Some((Piece::Ref(r), word_end + 1))
}

/// Index of the `}` that closes a word starting at `from`, skipping nested `${...}` and `$$`.
fn closing_brace(bytes: &[u8], from: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            b'$' if bytes.get(i + 1) == Some(&b'$') => i += 2,
            b'$' if bytes.get(i + 1) == Some(&b'{') => {
                depth += 1;
                i += 2;
            }
            b'}' if depth == 0 => return Some(i),
            b'}' => {
                depth -= 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    None
}

/// How `$$` and a missing variable come out of [`expand`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `.env` rendering: `$$` stays `$$` and a missing reference stays as written, so the
    /// result is still valid input for the tool that reads the `.env` file.
    Template,
    /// Compose interpolation: `$$` becomes `$` and a missing reference becomes empty.
    Compose,
}

/// Looks a variable up; borrowed values let `.env` rendering avoid copying secrets.
pub(crate) type Lookup<'a> = dyn Fn(&str) -> Option<Cow<'a, str>> + 'a;

/// Appends the value of the variable `name` to `out`: `.env` rendering escapes it for the
/// place it lands in; compose interpolation copies it.
pub(crate) type Put<'a> = dyn Fn(&str, &str, &mut String) + 'a;

/// A [`Put`] that copies the value as it is.
pub(crate) fn verbatim(_name: &str, value: &str, out: &mut String) {
    out.push_str(value);
}

/// Expands every reference in `s` through `lookup`, appending to `out` (values via `put`).
pub(crate) fn expand_into(
    s: &str,
    lookup: &Lookup<'_>,
    put: &Put<'_>,
    mode: Mode,
    depth: usize,
    out: &mut String,
) -> Result<(), TooDeep> {
    if depth > MAX_DEPTH {
        return Err(TooDeep);
    }
    for piece in scan(s) {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Dollar => out.push_str(match mode {
                Mode::Template => "$$",
                Mode::Compose => "$",
            }),
            Piece::Ref(r) => {
                let value = lookup(r.name);
                let present = |colon: bool| match &value {
                    Some(v) => !colon || !v.is_empty(),
                    None => false,
                };
                match r.op {
                    Op::Plain | Op::Required { .. } => match (&value, mode) {
                        (Some(v), _) => put(r.name, v, out),
                        (None, Mode::Template) => out.push_str(r.raw),
                        (None, Mode::Compose) => {}
                    },
                    Op::Default { colon, word } => {
                        if present(colon) {
                            put(r.name, value.as_deref().unwrap_or_default(), out);
                        } else {
                            expand_into(word, lookup, put, mode, depth + 1, out)?;
                        }
                    }
                    Op::Alt { colon, word } => {
                        if present(colon) {
                            expand_into(word, lookup, put, mode, depth + 1, out)?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Every variable name referenced in `s`, including those inside modifier words.
pub(crate) fn names(s: &str, out: &mut std::collections::BTreeSet<String>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    for piece in scan(s) {
        if let Piece::Ref(r) = piece {
            out.insert(r.name.to_owned());
            if let Op::Default { word, .. } | Op::Alt { word, .. } = r.op {
                names(word, out, depth + 1);
            }
        }
    }
}

/// Names referenced in `s` that `provided` does not satisfy, following compose semantics:
/// a default covers a missing variable (but its own word must resolve), an alternative is
/// empty when the variable is missing, and a plain or required reference needs the variable.
pub(crate) fn unresolved(
    s: &str,
    provided: &dyn Fn(&str) -> bool,
    out: &mut std::collections::BTreeSet<String>,
    depth: usize,
) -> Result<(), TooDeep> {
    if depth > MAX_DEPTH {
        return Err(TooDeep);
    }
    for piece in scan(s) {
        let Piece::Ref(r) = piece else { continue };
        let have = provided(r.name);
        match r.op {
            Op::Plain | Op::Required { .. } => {
                if !have {
                    out.insert(r.name.to_owned());
                }
            }
            Op::Default { word, .. } => {
                if !have {
                    unresolved(word, provided, out, depth + 1)?;
                }
            }
            Op::Alt { word, .. } => {
                if have {
                    unresolved(word, provided, out, depth + 1)?;
                }
            }
        }
    }
    Ok(())
}

/// `key value` for a finding: before the lease the value as the file holds it (cut to `width`);
/// on compose's model, a value that came from a variable is named by the variable, never
/// printed, and one the compose file does not hold at all is named without its value.
pub(crate) fn key_value(
    model: bool,
    raw: Option<&Value>,
    key: &str,
    value: &str,
    width: usize,
) -> String {
    if !model {
        return format!("{key} {}", printable(value, width));
    }
    match raw {
        None => format!("{key} (value not shown: not in the compose file)"),
        Some(raw) => {
            let mut vars = BTreeSet::new();
            raw_vars(raw, &mut vars);
            if vars.is_empty() {
                format!("{key} {}", printable(value, width))
            } else {
                let names: Vec<String> = vars.iter().map(|v| format!("${{{v}}}")).collect();
                format!("{key} from {}", names.join(" "))
            }
        }
    }
}

/// The variable names a raw value references.
pub(crate) fn raw_vars(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::String(s) if s.contains('$') => names(s, out, 0),
        Value::Array(a) => a.iter().for_each(|x| raw_vars(x, out)),
        Value::Object(m) => m.values().for_each(|x| raw_vars(x, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn expand(s: &str, lookup: &Lookup<'_>, mode: Mode) -> Result<String, TooDeep> {
        let mut out = String::new();
        expand_into(s, lookup, &verbatim, mode, 0, &mut out).map(|()| out)
    }

    fn check_expand(input: &str, mode: Mode, expected: &str) {
        let map: BTreeMap<&str, &str> = [("A", "1"), ("EMPTY", ""), ("B", "/")].into();
        let lookup = |k: &str| map.get(k).map(|v| Cow::Borrowed(*v));
        assert_eq!(expand(input, &lookup, mode).unwrap(), expected, "{input:?}");
    }

    #[test]
    fn compose_mode() {
        for (input, expected) in [
            ("${A}", "1"),
            ("$A", "1"),
            ("x$A.y", "x1.y"),
            ("$AB", ""),
            ("${MISSING}", ""),
            ("${MISSING:-d}", "d"),
            ("${MISSING-d}", "d"),
            ("${EMPTY:-d}", "d"),
            ("${EMPTY-d}", ""),
            ("${A:-d}", "1"),
            ("${MISSING:-${B}}", "/"),
            (
                "${MISSING:-${M2:-/var/run/docker.sock}}",
                "/var/run/docker.sock",
            ),
            ("${A:+alt}", "alt"),
            ("${MISSING:+alt}", ""),
            ("${EMPTY:+alt}", ""),
            ("${EMPTY+alt}", "alt"),
            ("${MISSING:?boom}", ""),
            ("$$A", "$A"),
            ("$${A}", "${A}"),
            ("$", "$"),
            ("$1", "$1"),
            ("${", "${"),
            ("${A", "${A"),
            ("${1}", "${1}"),
            ("${A!x}", "${A!x}"),
            ("${MISSING:-a}b}", "ab}"),
        ] {
            check_expand(input, Mode::Compose, expected);
        }
    }

    #[test]
    fn template_mode_keeps_escapes_and_missing_references() {
        for (input, expected) in [
            ("${A}", "1"),
            ("$$A", "$$A"),
            ("${MISSING}", "${MISSING}"),
            ("$MISSING", "$MISSING"),
            ("${MISSING:?x}", "${MISSING:?x}"),
            ("${MISSING:-${A}}", "1"),
        ] {
            check_expand(input, Mode::Template, expected);
        }
    }

    #[test]
    fn deep_nesting_is_reported() {
        let mut s = String::from("x");
        for _ in 0..(MAX_DEPTH + 2) {
            s = format!("${{M:-{s}}}");
        }
        assert_eq!(expand(&s, &|_| None, Mode::Compose), Err(TooDeep));
        let mut out = BTreeSet::new();
        assert_eq!(unresolved(&s, &|_| false, &mut out, 0), Err(TooDeep));
    }

    #[test]
    fn unresolved_follows_defaults() {
        let provided = |n: &str| n == "A";
        let mut out = BTreeSet::new();
        unresolved(
            "${A} $B ${C:-x} ${D-${E}} ${A:+${F}} ${G:+${H}} $$I ${J:?m}",
            &provided,
            &mut out,
            0,
        )
        .unwrap();
        let got: Vec<&str> = out.iter().map(String::as_str).collect();
        assert_eq!(got, ["B", "E", "F", "J"]);
    }

    #[test]
    fn env_names() {
        assert!(is_env_name("A_1"));
        assert!(is_env_name("_x"));
        assert!(!is_env_name("1A"));
        assert!(!is_env_name(""));
        assert!(!is_env_name("A-B"));
        assert!(!is_env_name("É"));
    }
}
