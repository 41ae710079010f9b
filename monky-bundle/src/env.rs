//! `.env.template` handling: which variables it references and the rendered `.env`.
//!
//! The template is read as compose reads the `.env` it becomes ([`crate::dotenv`]): a quoted
//! value may span lines. A line whose first non-blank character starts a statement with `#` is
//! a comment. Comments are copied verbatim and never contribute references: the renderer's own
//! header says it "substitutes every ${VAR}", and counting that as a variable once refused a
//! healthy bundle.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use secrecy::zeroize::Zeroizing;
use secrecy::{ExposeSecret, SecretString};

use crate::dotenv::{self, Span};
use crate::interp::{self, Mode};
use crate::refusal::{Refusal, RefusalCode};

/// The text's lines that are not comment lines, each with its line ending. A line inside a
/// quoted value that spans lines is the value's, whatever it starts with.
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    let scan = dotenv::scan(text);
    let mut start = 0;
    text.split_inclusive('\n').filter(move |line| {
        let at = start;
        start += line.len();
        !scan.is_comment_line(text, at)
    })
}

/// Every variable the template references outside comment lines: `${VAR}`, `$VAR`, and the
/// names inside modifiers (`${A:-${B}}` references `A` and `B`). `$$` is a literal dollar and
/// references nothing.
///
/// Call it on a template, not on a rendered `.env`: a rendered value may contain `$` and
/// would then look like a reference (and a name built from a secret would reach a log).
///
/// ```
/// let vars = monky_bundle::referenced_vars("# every ${VAR}\nKEY=${KEY}\nPG=${PG:-x} $$LIT\n");
/// assert_eq!(vars.into_iter().collect::<Vec<_>>(), ["KEY", "PG"]);
/// ```
pub fn referenced_vars(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code_lines(text) {
        interp::names(line, &mut out, 0);
    }
    out
}

/// Variables the template needs but `provided` lacks. `${VAR:-x}` and `${VAR-x}` are
/// satisfied by their default (whose own references must then resolve), `${VAR:+x}` is empty
/// without `VAR`, and `${VAR}`, `$VAR` and `${VAR:?msg}` need `VAR`. A reference nested too
/// deeply to follow counts its outer name as unresolved.
pub fn unresolved_vars(template: &str, provided: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let have = |n: &str| provided.contains(n);
    for line in code_lines(template) {
        if interp::unresolved(line, &have, &mut out, 0).is_err() {
            // Whatever was collected stays; the outermost names say where to look.
            for piece in interp::scan(line) {
                if let interp::Piece::Ref(r) = piece
                    && !have(r.name)
                {
                    out.insert(r.name.to_owned());
                }
            }
        }
    }
    out
}

/// The most the values substituted into one `.env` may take: a few references to large secrets
/// fit many times over, while a small template that references a secret thousands of times
/// cannot make the agent allocate gigabytes.
pub const MAX_ENV_VALUE_BYTES: usize = 4 * 1024 * 1024;

/// Renders `.env` from `.env.template`.
///
/// References take their value from `values`; `${VAR:-x}`/`${VAR-x}` fall back to the default
/// and `${VAR:+x}` to the alternative, as compose does. `$$` stays `$$` and a reference without a
/// value stays as written: the output is read by compose, which gives both their usual
/// meaning, and [`check_env_complete`](crate::check_env_complete) is what refuses a template
/// with missing values before anything is rendered. Comment lines are copied verbatim, with
/// no substitution inside them. Line endings are kept.
///
/// Values are written so that compose reads back exactly the value (compose's `.env` reader
/// interpolates `$`, ends an unquoted value at ` #`, trims it and stops at a newline):
/// - `KEY=${VAR}` (the reference is the whole unquoted value): a value without `$`, `\`,
///   quotes, `#`, line breaks or blanks at its ends is written as it is; any other becomes
///   `KEY="..."` with `\`, `"`, `$`, newline and carriage return escaped.
/// - inside `"..."`: escaped the same way; inside `'...'`: `'` becomes `\'`.
/// - elsewhere in an unquoted value: `$` becomes `$$`.
///
/// A value that cannot be written where the template puts it (a line break, `#`, a quote or
/// a blank at its ends in the middle of an unquoted value; a backslash before a quote inside
/// `'...'`) refuses with `ENV_VALUE_UNSAFE` naming the variable and the template line; values
/// adding up to more than [`MAX_ENV_VALUE_BYTES`] refuse with `BUNDLE_TOO_LARGE`.
///
/// ```
/// use std::collections::BTreeMap;
/// use secrecy::{ExposeSecret, SecretString};
///
/// let values = BTreeMap::from([
///     ("KEY".to_string(), SecretString::from("s3cret")),
///     ("PW".to_string(), SecretString::from("pa$s #1")),
/// ]);
/// let env = monky_bundle::render_env(
///     "# uses ${KEY}\nKEY=${KEY}\nMODE=${MODE:-prod}\nPW=${PW}\n",
///     &values,
/// )?;
/// assert_eq!(
///     env.expose_secret(),
///     "# uses ${KEY}\nKEY=s3cret\nMODE=prod\nPW=\"pa$$s #1\"\n"
/// );
/// # Ok::<(), monky_bundle::Refusal>(())
/// ```
pub fn render_env(
    template: &str,
    values: &BTreeMap<String, SecretString>,
) -> Result<SecretString, Refusal> {
    let lookup = |name: &str| values.get(name).map(|v| Cow::Borrowed(v.expose_secret()));
    // The buffer is reserved once, for the template's own text plus a budget for values, and
    // never grows: a reallocation would leave a copy of the secrets in freed memory. Every
    // reference (at most one per `$`) writes at most its value escaped (two bytes a byte) and
    // quoted; a template that could need more than MAX_ENV_VALUE_BYTES is refused when it does.
    let longest = values
        .values()
        .map(|v| v.expose_secret().len())
        .max()
        .unwrap_or(0);
    let refs: usize = code_lines(template).map(|l| l.matches('$').count()).sum();
    let budget = refs
        .saturating_mul(2 * longest + 2)
        .min(MAX_ENV_VALUE_BYTES);
    let mut out = Zeroizing::new(String::with_capacity(template.len() + budget));
    let capacity = out.capacity();
    let spent = Cell::new(0usize);
    let over = Cell::new(false);
    let scan = dotenv::scan(template);
    let mut line_start = 0;
    for (index, line) in template.split_inclusive('\n').enumerate() {
        let base = line_start;
        line_start += line.len();
        if scan.is_comment_line(template, base) {
            out.push_str(line);
            continue;
        }
        let unsafe_value = Cell::new(None);
        let mark = out.len();
        let mut too_deep = false;
        for piece in interp::scan(line) {
            let (raw, at) = match piece {
                interp::Piece::Text(t) => {
                    out.push_str(t);
                    continue;
                }
                interp::Piece::Dollar => {
                    out.push_str("$$");
                    continue;
                }
                interp::Piece::Ref(r) => {
                    let at = base + offset_in(line, r.raw);
                    (r, at)
                }
            };
            let place = place_of(scan.value_at(at), at, &raw);
            let put = |name: &str, value: &str, out: &mut String| {
                let place = if name == raw.name {
                    place
                } else {
                    place.nested()
                };
                if spent.get() + 2 * value.len() + 2 > budget {
                    over.set(true);
                    return;
                }
                let before = out.len();
                if place.write(value, out).is_err() && unsafe_value.get().is_none() {
                    unsafe_value.set(Some(values.get_key_value(name).map_or("", |(k, _)| k)));
                }
                spent.set(spent.get() + out.len() - before);
            };
            if interp::expand_into(raw.raw, &lookup, &put, Mode::Template, 0, &mut out).is_err() {
                too_deep = true;
                break;
            }
        }
        if over.get() {
            return Err(Refusal::one(
                RefusalCode::BundleTooLarge,
                format!(".env.template renders over {MAX_ENV_VALUE_BYTES} bytes of values"),
            ));
        }
        if let Some(name) = unsafe_value.get() {
            return Err(Refusal::new(
                RefusalCode::EnvValueUnsafe,
                [
                    name.to_string(),
                    format!(".env.template line {}", index + 1),
                ],
            ));
        }
        if too_deep {
            // Too deeply nested to follow: keep the line as written, unresolved.
            out.truncate(mark);
            out.push_str(line);
        }
    }
    debug_assert_eq!(out.capacity(), capacity, "the .env buffer was reallocated");
    // Copied into an exact-size allocation; the working buffer is zeroed when dropped.
    Ok(SecretString::from(out.as_str()))
}

/// Every spelling [`render_env`] may give `value` in a `.env` file, for a redactor to mask: a
/// message of compose's that quotes a line of the file shows the value escaped, not as read.
///
/// ```
/// let forms = monky_bundle::env_spellings("pa$s \"x\"");
/// assert!(forms.iter().any(|f| f == r#"pa$$s \"x\""#));
/// ```
pub fn env_spellings(value: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    // The whole-value form is the double-quoted one between quotes.
    for place in [Place::Unquoted, Place::Double, Place::Single] {
        let mut form = String::new();
        if place.write(value, &mut form).is_ok() && form != value && !out.contains(&form) {
            out.push(form);
        }
    }
    out
}

/// The secret values in a rendered `.env`, read back as compose reads them, for a redactor that
/// must know the secrets of a release it did not render itself (compose quotes `.env` lines in
/// its errors, and containers print their environment).
///
/// A line of `env` counts when the `.env.template` line with the same key references one of
/// `secret_vars`; its whole value is returned (`postgres://app:<pw>@db` for a value built
/// around a secret). Lines that are comments or not assignments are skipped.
///
/// ```
/// use std::collections::BTreeSet;
/// use secrecy::ExposeSecret;
///
/// let template = "# every ${PW}\nPW=${PW}\nMODE=prod\n";
/// let env = "# every ${PW}\nPW=\"pa$$s #1\"\nMODE=prod\n";
/// let values = monky_bundle::secret_values(template, env, &BTreeSet::from(["PW".to_string()]));
/// let values: Vec<&str> = values.iter().map(|v| v.expose_secret()).collect();
/// assert_eq!(values, ["pa$s #1"]);
/// ```
pub fn secret_values(
    template: &str,
    env: &str,
    secret_vars: &BTreeSet<String>,
) -> Vec<SecretString> {
    secret_entries(template, env, secret_vars)
        .into_iter()
        .map(|(_, value)| value)
        .collect()
}

/// The `.env` keys whose value `.env.template` builds from one of `secret_vars` (the manifest's
/// variables): the variables through which compose can put a secret into the compose model.
///
/// ```
/// let vars = ["PG".to_string()].into_iter().collect();
/// let keys = monky_bundle::secret_keys("# ${PG}\nA=${PG}\nB=x${PG:-y}\nC=lit\nD=$$PG\n", &vars);
/// assert_eq!(keys.into_iter().collect::<Vec<_>>(), ["A", "B"]);
/// ```
pub fn secret_keys(template: &str, secret_vars: &BTreeSet<String>) -> BTreeSet<String> {
    dotenv::scan(template)
        .statements
        .iter()
        .filter_map(|s| {
            let v = s.value?;
            let mut names = BTreeSet::new();
            interp::names(&template[v.start..v.end], &mut names, 0);
            names
                .iter()
                .any(|n| secret_vars.contains(n))
                .then(|| s.key.to_owned())
        })
        .collect()
}

/// As [`secret_values`], each value with the `.env` key it is assigned to, for a report that
/// names a secret without showing it.
pub fn secret_entries(
    template: &str,
    env: &str,
    secret_vars: &BTreeSet<String>,
) -> Vec<(String, SecretString)> {
    let secret_keys = secret_keys(template, secret_vars);
    read_env(env)
        .filter(|(key, _)| secret_keys.contains(*key))
        .map(|(key, value)| (key.to_owned(), SecretString::from(value)))
        .collect()
}

/// The assignments of a `.env` text as compose reads them, in order: each `KEY=value` or
/// `export KEY=value` line outside comment lines, with a valid variable name, and its value
/// read as compose reads it:
/// - `"..."`: `\n`, `\r` and `\<c>` escapes, `$$` for a dollar, nothing after the closing quote;
/// - `'...'`: literal but for `\'`, nothing after the closing quote;
/// - unquoted: cut at the first ` #` (a space, not a tab, then `#`), trimmed, `$$` for a dollar.
///
/// A `$` that compose would interpolate is kept as it is. Values of a rendered `.env` are
/// secrets: a caller that keeps one wraps it (as [`secret_entries`] does).
///
/// ```
/// let env = "# A=x\nA=\"q\\\"d\" # note\nexport B='s\\'x'\nC=plain #c\nD=x\t#y\nnot a line\n";
/// let read: Vec<(&str, String)> = monky_bundle::read_env(env).collect();
/// assert_eq!(
///     read,
///     [("A", "q\"d".into()), ("B", "s'x".into()), ("C", "plain".into()), ("D", "x\t#y".into())]
/// );
/// ```
pub fn read_env(env: &str) -> impl Iterator<Item = (&str, String)> {
    dotenv::scan(env)
        .statements
        .into_iter()
        .filter_map(move |s| {
            let v = s.value?;
            Some((s.key, read_value(&env[v.start..v.end], v.quote)))
        })
}

/// A `.env` value's text (inside its quotes) as compose reads it: `"..."` with its escapes,
/// `'...'` with `\'`, an unquoted one as it is; `$$` is a dollar but in `'...'`.
fn read_value(body: &str, quote: Option<u8>) -> String {
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars().peekable();
    match quote {
        Some(b'"') => {
            while let Some(c) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some('n') => out.push('\n'),
                        Some('r') => out.push('\r'),
                        Some(other) => out.push(other),
                        None => out.push('\\'),
                    },
                    '$' if chars.peek() == Some(&'$') => {
                        chars.next();
                        out.push('$');
                    }
                    c => out.push(c),
                }
            }
        }
        Some(_) => {
            while let Some(c) = chars.next() {
                match c {
                    '\\' if chars.peek() == Some(&'\'') => {
                        chars.next();
                        out.push('\'');
                    }
                    c => out.push(c),
                }
            }
        }
        None => out.push_str(&body.replace("$$", "$")),
    }
    out
}

/// Byte offset of `part` (a slice of `line`) in `line`.
fn offset_in(line: &str, part: &str) -> usize {
    part.as_ptr() as usize - line.as_ptr() as usize
}

/// Where a reference written at byte `at` of the template lands: in `value` (the statement's
/// value it lies in, if any) or outside every value.
fn place_of(value: Option<Span>, at: usize, r: &interp::Ref<'_>) -> Place {
    let Some(v) = value.filter(|v| at >= v.start && at + r.raw.len() <= v.end) else {
        return Place::Unquoted;
    };
    match v.quote {
        Some(b'"') => Place::Double,
        Some(_) => Place::Single,
        None if at == v.start
            && at + r.raw.len() == v.end
            && matches!(
                r.op,
                interp::Op::Plain | interp::Op::Default { .. } | interp::Op::Required { .. }
            ) =>
        {
            Place::Whole
        }
        None => Place::Unquoted,
    }
}

/// Where a value lands in a `.env` line, which decides how it must be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The whole unquoted value: quoted when it needs to be.
    Whole,
    /// Part of an unquoted value.
    Unquoted,
    /// Inside `"..."`.
    Double,
    /// Inside `'...'`.
    Single,
}

impl Place {
    /// Where a reference nested in this one's default or alternative lands.
    fn nested(self) -> Place {
        match self {
            Place::Whole => Place::Unquoted,
            other => other,
        }
    }

    /// Appends `value` so that compose reads it back exactly; `Err` when it cannot be.
    fn write(self, value: &str, out: &mut String) -> Result<(), ()> {
        // compose trims an unquoted value of Unicode white space (U+00A0 included).
        let blank_ends =
            value.starts_with(char::is_whitespace) || value.ends_with(char::is_whitespace);
        match self {
            Place::Whole
                if !blank_ends && !value.contains(['$', '\\', '"', '\'', '#', '\n', '\r']) =>
            {
                out.push_str(value);
            }
            Place::Whole => {
                out.push('"');
                escape_double(value, out);
                out.push('"');
            }
            Place::Double => escape_double(value, out),
            Place::Single => {
                if value.ends_with('\\') || value.contains("\\'") {
                    return Err(());
                }
                for c in value.chars() {
                    if c == '\'' {
                        out.push('\\');
                    }
                    out.push(c);
                }
            }
            Place::Unquoted => {
                if blank_ends || value.contains(['#', '"', '\'', '\n', '\r']) {
                    return Err(());
                }
                for c in value.chars() {
                    if c == '$' {
                        out.push('$');
                    }
                    out.push(c);
                }
            }
        }
        Ok(())
    }
}

/// The body of a `"..."` value reading back as `value`.
fn escape_double(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '$' => out.push_str("$$"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn comment_lines_are_not_references() {
        let text = "# The agent substitutes every ${VAR} from OpenBao.\n   # ${ALSO_COMMENT}\n\
                    GEMINI_API_KEY=${GEMINI_API_KEY}\nPG=${PGPASSWORD:-x}\n";
        assert_eq!(
            referenced_vars(text),
            set(&["GEMINI_API_KEY", "PGPASSWORD"])
        );
        assert_eq!(unresolved_vars(text, &set(&[])), set(&["GEMINI_API_KEY"]));
    }

    #[test]
    fn bare_and_braced_references_count() {
        let text = "A=$ONE\nB=${TWO}\nC=$$THREE\nD=${FOUR-x}\nE=${FIVE:?need}\nF=x$SIX.y\n";
        assert_eq!(
            referenced_vars(text),
            set(&["FIVE", "FOUR", "ONE", "SIX", "TWO"])
        );
        assert_eq!(
            unresolved_vars(text, &set(&["ONE"])),
            set(&["FIVE", "SIX", "TWO"])
        );
    }

    #[test]
    fn render_keeps_crlf_and_comments() {
        let values = BTreeMap::from([("A".to_string(), SecretString::from("v"))]);
        let out = render_env("# ${A}\r\nX=${A}\r\nY=$$A\r\nZ=${B}", &values).unwrap();
        assert_eq!(out.expose_secret(), "# ${A}\r\nX=v\r\nY=$$A\r\nZ=${B}");
    }

    #[test]
    fn render_values_are_not_rescanned() {
        let values = BTreeMap::from([
            ("A".to_string(), SecretString::from("${B}")),
            ("B".to_string(), SecretString::from("leak")),
        ]);
        // and a value's `$` is escaped, so compose does not rescan it either
        assert_eq!(
            render_env("X=${A}\n", &values).unwrap().expose_secret(),
            "X=\"$${B}\"\n"
        );
    }
}
