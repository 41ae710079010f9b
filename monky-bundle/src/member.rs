//! Bundle member names, accepted only after they are proven plain, relative and known.

use std::fmt;

use crate::refusal::{Refusal, printable};

/// The compose file's name in current renderer output.
const DOCKER_COMPOSE_YML: &str = "docker-compose.yml";
/// The compose file's alternative name.
const COMPOSE_YAML: &str = "compose.yaml";
const ENV_TEMPLATE: &str = ".env.template";
const SECRETS_MANIFEST: &str = "secrets.manifest.json";
const BUNDLE_JSON: &str = "bundle.json";
const ENV_EXAMPLE: &str = ".env.example";

/// Every name a bundle may contain, in byte order.
const KNOWN: [&str; 6] = [
    ENV_EXAMPLE,
    ENV_TEMPLATE,
    BUNDLE_JSON,
    COMPOSE_YAML,
    DOCKER_COMPOSE_YML,
    SECRETS_MANIFEST,
];

/// The name of a bundle member.
///
/// A value exists only for a name that is relative, normalised (no `.` or empty segments, no
/// `..`, no leading `/`, no `\`), free of NUL and control characters, and one of the six names
/// the protocol knows. Spellings such as `./bundle.json` are refused rather than normalised:
/// the bundle sha is defined over names, so exactly one spelling of each name is accepted, and
/// tenancy (Python `tarfile` with `arcname`) writes the plain one.
///
/// Ordering is byte order of the name, which is the order the sha is computed in.
/// There is deliberately no `Deref<Target = str>`, `AsRef<str>` or `Display`; use
/// [`as_str`](Self::as_str).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberName(&'static str);

impl MemberName {
    /// `docker-compose.yml`.
    pub const DOCKER_COMPOSE_YML: MemberName = MemberName(DOCKER_COMPOSE_YML);
    /// `compose.yaml`.
    pub const COMPOSE_YAML: MemberName = MemberName(COMPOSE_YAML);
    /// `.env.template`.
    pub const ENV_TEMPLATE: MemberName = MemberName(ENV_TEMPLATE);
    /// `secrets.manifest.json`.
    pub const SECRETS_MANIFEST: MemberName = MemberName(SECRETS_MANIFEST);
    /// `bundle.json`.
    pub const BUNDLE_JSON: MemberName = MemberName(BUNDLE_JSON);
    /// `.env.example` (optional).
    pub const ENV_EXAMPLE: MemberName = MemberName(ENV_EXAMPLE);
    /// The names the compose file may have, the preferred first; a bundle holds exactly one.
    pub const COMPOSE_FILES: [MemberName; 2] = [Self::DOCKER_COMPOSE_YML, Self::COMPOSE_YAML];

    /// Proves `raw` (a tar member path, as bytes) is an acceptable member name.
    ///
    /// The refusal is `BUNDLE_INVALID` naming the (escaped) member and the reason.
    pub fn parse(raw: &[u8]) -> Result<MemberName, Refusal> {
        let shown = || printable(&String::from_utf8_lossy(raw), 80);
        let refuse = |why: &str| Refusal::invalid(format!("{}: {why}", shown()));
        let Ok(text) = std::str::from_utf8(raw) else {
            return Err(refuse("name is not utf-8"));
        };
        if let Some(problem) = shape_problem(text) {
            return Err(refuse(problem));
        }
        KNOWN
            .iter()
            .find(|k| **k == text)
            .map(|k| MemberName(k))
            .ok_or_else(|| refuse("not a bundle member name"))
    }

    /// The name as text.
    pub fn as_str(&self) -> &'static str {
        self.0
    }

    /// All names a bundle may contain, in byte order.
    pub fn all() -> impl Iterator<Item = MemberName> {
        KNOWN.iter().map(|k| MemberName(k))
    }
}

impl fmt::Debug for MemberName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("MemberName").field(&self.0).finish()
    }
}

/// Why a path is not a plain relative name, or `None` when it is one.
fn shape_problem(text: &str) -> Option<&'static str> {
    if text.is_empty() {
        return Some("empty name");
    }
    if text.contains('\0') {
        return Some("name contains nul");
    }
    if text.chars().any(char::is_control) {
        return Some("name contains a control character");
    }
    if text.contains('\\') {
        return Some("name contains a backslash");
    }
    if text.starts_with('/') {
        return Some("absolute path");
    }
    let segments: Vec<&str> = text.split('/').collect();
    if segments.contains(&"..") {
        return Some("parent traversal");
    }
    if segments.contains(&".") {
        return Some("not a plain name (. segment)");
    }
    if segments.contains(&"") {
        return Some("not a plain name (empty segment)");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(raw: &[u8], expected: Result<&str, &str>) {
        let got = MemberName::parse(raw).map_err(|r| r.to_string());
        match (got, expected) {
            (Ok(name), Ok(want)) => assert_eq!(name.as_str(), want),
            (Err(err), Err(want)) => assert_eq!(err, want, "{raw:?}"),
            (got, want) => panic!("{raw:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn known_plain_names_are_accepted() {
        for name in KNOWN {
            check(name.as_bytes(), Ok(name));
        }
    }

    #[test]
    fn hostile_and_unusual_spellings_are_refused_with_a_reason() {
        check(b"", Err("BUNDLE_INVALID: : empty name"));
        check(b"../x", Err("BUNDLE_INVALID: ../x: parent traversal"));
        check(
            b"a/../../x",
            Err("BUNDLE_INVALID: a/../../x: parent traversal"),
        );
        check(b"./../x", Err("BUNDLE_INVALID: ./../x: parent traversal"));
        check(b"..", Err("BUNDLE_INVALID: ..: parent traversal"));
        check(
            b"/etc/passwd",
            Err("BUNDLE_INVALID: /etc/passwd: absolute path"),
        );
        check(
            b"./bundle.json",
            Err("BUNDLE_INVALID: ./bundle.json: not a plain name (. segment)"),
        );
        check(
            b"bundle.json/",
            Err("BUNDLE_INVALID: bundle.json/: not a plain name (empty segment)"),
        );
        check(
            b"a//bundle.json",
            Err("BUNDLE_INVALID: a//bundle.json: not a plain name (empty segment)"),
        );
        check(
            b"..\\x",
            Err("BUNDLE_INVALID: ..\\x: name contains a backslash"),
        );
        check(
            b"bun\0dle.json",
            Err("BUNDLE_INVALID: bun\\u{0}dle.json: name contains nul"),
        );
        check(
            b"a\nb",
            Err("BUNDLE_INVALID: a\\nb: name contains a control character"),
        );
        check(
            b"\xffbundle.json",
            Err("BUNDLE_INVALID: \\u{fffd}bundle.json: name is not utf-8"),
        );
        check(
            b"notes.txt",
            Err("BUNDLE_INVALID: notes.txt: not a bundle member name"),
        );
        check(
            b"sub/bundle.json",
            Err("BUNDLE_INVALID: sub/bundle.json: not a bundle member name"),
        );
        check(
            b"Bundle.json",
            Err("BUNDLE_INVALID: Bundle.json: not a bundle member name"),
        );
    }

    #[test]
    fn the_compose_file_names_are_the_two_known_spellings() {
        let names: Vec<&str> = MemberName::COMPOSE_FILES
            .iter()
            .map(|m| m.as_str())
            .collect();
        assert_eq!(names, ["docker-compose.yml", "compose.yaml"]);
        for name in MemberName::COMPOSE_FILES {
            assert_eq!(MemberName::parse(name.as_str().as_bytes()), Ok(name));
        }
    }

    #[test]
    fn order_is_byte_order_of_the_name() {
        let names: Vec<&str> = MemberName::all().map(|m| m.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        assert!(MemberName::BUNDLE_JSON < MemberName::COMPOSE_YAML);
    }
}
