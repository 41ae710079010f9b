//! `.env.template` handling: which variables it references and the rendered `.env`.
//!
//! A line whose first non-blank character is `#` is a comment. Comments are copied verbatim
//! and never contribute references: the renderer's own header says it "substitutes every
//! ${VAR}", and counting that as a variable once refused a healthy bundle.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use secrecy::zeroize::Zeroizing;
use secrecy::{ExposeSecret, SecretString};

use crate::interp::{self, Mode};

/// Whether `line` (with or without its line ending) is a comment line.
pub(crate) fn is_comment_line(line: &str) -> bool {
    line.trim_start().starts_with('#')
}

/// The template's lines that are not comments, each with its line ending.
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.split_inclusive('\n').filter(|l| !is_comment_line(l))
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

/// Renders `.env` from `.env.template`.
///
/// References take their value from `values`; `${VAR:-x}`/`${VAR-x}` fall back to the default
/// and `${VAR:+x}` to the alternative, as compose does. `$$` stays `$$` and a reference without a
/// value stays as written: the output is read by compose, which gives both their usual
/// meaning, and [`check_env_complete`](crate::check_env_complete) is what refuses a template
/// with missing values before anything is rendered. Comment lines are copied verbatim, with
/// no substitution inside them. Line endings are kept.
///
/// ```
/// use std::collections::BTreeMap;
/// use secrecy::{ExposeSecret, SecretString};
///
/// let values = BTreeMap::from([("KEY".to_string(), SecretString::from("s3cret"))]);
/// let env = monky_bundle::render_env("# uses ${KEY}\nKEY=${KEY}\nMODE=${MODE:-prod}\n", &values);
/// assert_eq!(env.expose_secret(), "# uses ${KEY}\nKEY=s3cret\nMODE=prod\n");
/// ```
pub fn render_env(template: &str, values: &BTreeMap<String, SecretString>) -> SecretString {
    let lookup = |name: &str| values.get(name).map(|v| Cow::Borrowed(v.expose_secret()));
    // Reserve generously so the buffer holding secret values is not reallocated (and the old
    // allocation left behind un-zeroed) while it is being filled.
    let value_bytes: usize = values.values().map(|v| v.expose_secret().len()).sum();
    let mut out = Zeroizing::new(String::with_capacity(template.len() + 4 * value_bytes + 64));
    for line in template.split_inclusive('\n') {
        if is_comment_line(line) {
            out.push_str(line);
            continue;
        }
        let mark = out.len();
        if interp::expand_into(line, &lookup, Mode::Template, 0, &mut out).is_err() {
            // Too deeply nested to follow: keep the line as written, unresolved.
            out.truncate(mark);
            out.push_str(line);
        }
    }
    // Copied into an exact-size allocation; the working buffer is zeroed when dropped.
    SecretString::from(out.as_str())
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
        let out = render_env("# ${A}\r\nX=${A}\r\nY=$$A\r\nZ=${B}", &values);
        assert_eq!(out.expose_secret(), "# ${A}\r\nX=v\r\nY=$$A\r\nZ=${B}");
    }

    #[test]
    fn render_values_are_not_rescanned() {
        let values = BTreeMap::from([
            ("A".to_string(), SecretString::from("${B}")),
            ("B".to_string(), SecretString::from("leak")),
        ]);
        assert_eq!(render_env("X=${A}\n", &values).expose_secret(), "X=${B}\n");
    }
}
