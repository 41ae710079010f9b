//! Manifest KV paths, proven to name one of the caller's own `see/` secrets: the only mapping
//! from a manifest path to a KV v2 API path, so tenancy's renderer refuses at render time the
//! path a box refuses before any request to OpenBao.

use std::fmt;

/// A KV v2 secret path that names `<mount>/data/<env>/see/<name>` for the caller's own env.
///
/// It only exists after [`KvPath::parse`] accepted a manifest path, so a value of this type can
/// be sent to OpenBao without further checks. It has no string-like traits; [`KvPath::api_path`]
/// gives the path below `/v1/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KvPath {
    mount: String,
    env_id: String,
    name: String,
}

impl KvPath {
    /// Accepts `<kv_mount>/<env_id>/see/<name>` (tenancy's form) and
    /// `<kv_mount>/data/<env_id>/see/<name>` (the API form).
    ///
    /// Pure: refuses, without any IO, an absolute path, empty, `.` and `..` segments, characters
    /// outside `A-Z a-z 0-9 - _ . @ + = , ~`, another mount, another env, anything but `see/`,
    /// and missing or extra segments.
    ///
    /// ```
    /// use monky_vocab::{KvPath, PathRefusal};
    ///
    /// let path = KvPath::parse("monky/env-qa-02/see/pg_password", "monky", "env-qa-02")?;
    /// assert_eq!(path.api_path(), "monky/data/env-qa-02/see/pg_password");
    /// let err = KvPath::parse("monky/env-qa-03/see/pg", "monky", "env-qa-02").unwrap_err();
    /// assert_eq!(err.path_refusal(), PathRefusal::OtherEnv);
    /// # Ok::<(), monky_vocab::KvPathRefused>(())
    /// ```
    pub fn parse(
        manifest_path: &str,
        kv_mount: &str,
        env_id: &str,
    ) -> Result<KvPath, KvPathRefused> {
        let refuse = |reason| KvPathRefused {
            path: manifest_path.to_owned(),
            reason,
        };
        if check_segment(kv_mount).is_err() {
            return Err(refuse(PathRefusal::BadMount));
        }
        if check_segment(env_id).is_err() {
            return Err(refuse(PathRefusal::BadEnvId));
        }
        if manifest_path.starts_with('/') {
            return Err(refuse(PathRefusal::Absolute));
        }
        let segments: Vec<&str> = manifest_path.split('/').collect();
        for segment in &segments {
            check_segment(segment).map_err(refuse)?;
        }
        let rest = match segments.split_first() {
            Some((mount, rest)) if *mount == kv_mount => rest,
            _ => return Err(refuse(PathRefusal::WrongMount)),
        };
        // Three segments after the mount is tenancy's form; four, with `data` first, the API
        // form. The count decides, so an env literally named `data` stays unambiguous.
        let rest = match rest.len() {
            0..=2 => return Err(refuse(PathRefusal::TooShort)),
            3 => rest,
            4 if rest[0] == "data" => &rest[1..],
            _ => return Err(refuse(PathRefusal::ExtraSegments)),
        };
        let [env, see, name] = rest else {
            return Err(refuse(PathRefusal::ExtraSegments));
        };
        if *env != env_id {
            return Err(refuse(PathRefusal::OtherEnv));
        }
        if *see != "see" {
            return Err(refuse(PathRefusal::NotSee));
        }
        Ok(KvPath {
            mount: kv_mount.to_owned(),
            env_id: env_id.to_owned(),
            name: (*name).to_owned(),
        })
    }

    /// The path below `/v1/`: `<mount>/data/<env>/see/<name>`.
    pub fn api_path(&self) -> String {
        format!("{}/data/{}/see/{}", self.mount, self.env_id, self.name)
    }

    /// The KV mount.
    pub fn mount(&self) -> &str {
        &self.mount
    }

    /// The env this secret belongs to (always the caller's own).
    pub fn env_id(&self) -> &str {
        &self.env_id
    }

    /// The secret's name below `see/`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path segments below `/v1/`, for building a URL without re-parsing.
    #[must_use]
    pub fn api_segments(&self) -> [&str; 5] {
        [&self.mount, "data", &self.env_id, "see", &self.name]
    }
}

impl fmt::Display for KvPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.api_path())
    }
}

/// One plain path segment: non-empty, not `.`/`..`, and only characters that need no escaping
/// (what a mount, an env id or a secret's name must be).
///
/// # Errors
/// Why `segment` is not one.
pub fn check_segment(segment: &str) -> Result<(), PathRefusal> {
    if segment.is_empty() {
        return Err(PathRefusal::EmptySegment);
    }
    if segment == "." || segment == ".." {
        return Err(PathRefusal::DotSegment);
    }
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_.@+=,~".contains(c);
    if !segment.chars().all(plain) {
        return Err(PathRefusal::BadCharacter);
    }
    Ok(())
}

/// Why a KV path from a manifest was refused before any request was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PathRefusal {
    /// The path starts with `/`.
    Absolute,
    /// A segment is empty (`a//b`, a trailing `/`, or an empty path).
    EmptySegment,
    /// A segment is `.` or `..`.
    DotSegment,
    /// A segment holds a character outside `A-Z a-z 0-9 - _ . @ + = , ~`.
    BadCharacter,
    /// The first segment is not the configured KV mount.
    WrongMount,
    /// The `<env>` segment is not the caller's own env_id.
    OtherEnv,
    /// The segment after `<env>` is not `see`.
    NotSee,
    /// Fewer segments than `<mount>/<env>/see/<name>`.
    TooShort,
    /// More segments than `<mount>/data/<env>/see/<name>`.
    ExtraSegments,
    /// The configured KV mount itself is not a single plain segment.
    BadMount,
    /// The caller's env_id itself is not a single plain segment.
    BadEnvId,
}

impl fmt::Display for PathRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathRefusal::Absolute => "absolute path",
            PathRefusal::EmptySegment => "empty path segment",
            PathRefusal::DotSegment => "`.` or `..` segment",
            PathRefusal::BadCharacter => "character not allowed in a path segment",
            PathRefusal::WrongMount => "not under the configured kv mount",
            PathRefusal::OtherEnv => "path of another env",
            PathRefusal::NotSee => "not under `see/`",
            PathRefusal::TooShort => "expected <mount>/<env>/see/<name>",
            PathRefusal::ExtraSegments => "extra path segments",
            PathRefusal::BadMount => "kv mount must be one plain path segment",
            PathRefusal::BadEnvId => "env_id must be one plain path segment",
        })
    }
}

/// A manifest path that is not one of the caller's own `see/` secrets; refused without any IO.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kv path {path:?} refused: {reason}")]
pub struct KvPathRefused {
    /// The path as given.
    pub path: String,
    /// Why it was refused.
    pub reason: PathRefusal,
}

impl KvPathRefused {
    /// Why the path was refused.
    #[must_use]
    pub fn path_refusal(&self) -> PathRefusal {
        self.reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `input` for mount `monky` and env `env-qa-02`; `expected` is the API path or the
    /// refusal.
    fn check(input: &str, expected: Result<&str, PathRefusal>) {
        check_for(input, "monky", "env-qa-02", expected);
    }

    fn check_for(input: &str, mount: &str, env: &str, expected: Result<&str, PathRefusal>) {
        let got = KvPath::parse(input, mount, env);
        match (got, expected) {
            (Ok(path), Ok(api)) => {
                assert_eq!(path.api_path(), api, "{input}");
                assert_eq!(path.to_string(), api, "{input}");
            }
            (Err(err), Err(reason)) => {
                assert_eq!(err.path_refusal(), reason, "{input}: {err}");
            }
            (got, expected) => panic!("{input}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn accepted_forms() {
        let api = "monky/data/env-qa-02/see/gemini_api_key";
        check("monky/env-qa-02/see/gemini_api_key", Ok(api));
        check("monky/data/env-qa-02/see/gemini_api_key", Ok(api));
        check(
            "monky/env-qa-02/see/pg.password",
            Ok("monky/data/env-qa-02/see/pg.password"),
        );
    }

    #[test]
    fn refusals() {
        use PathRefusal::*;
        check("monky/env-qa-03/see/pg", Err(OtherEnv));
        check("monky/data/env-qa-03/see/pg", Err(OtherEnv));
        check("monky/env-qa-02/see/../pg", Err(DotSegment));
        check("monky/env-qa-02/see/..", Err(DotSegment));
        check("monky/../env-qa-02/see/pg", Err(DotSegment));
        check("monky/./env-qa-02/see/pg", Err(DotSegment));
        check("monky/env-qa-02/see/.", Err(DotSegment));
        check("monky/env-qa-02/see/", Err(EmptySegment));
        check("monky/env-qa-02//see/pg", Err(EmptySegment));
        check("", Err(EmptySegment));
        check("monky/env-qa-02/see/a/b", Err(ExtraSegments));
        check("monky/data/env-qa-02/see/a/b", Err(ExtraSegments));
        check("monky/meta/env-qa-02/see/pg", Err(ExtraSegments));
        check("monky/env-qa-02/see", Err(TooShort));
        check("monky", Err(TooShort));
        check("secret/env-qa-02/see/pg", Err(WrongMount));
        check("monkyx/env-qa-02/see/pg", Err(WrongMount));
        check("/monky/env-qa-02/see/pg", Err(Absolute));
        check("monky/env-qa-02/ops/pg", Err(NotSee));
        check("monky/metadata/env-qa-02/see/pg", Err(ExtraSegments));
        check("monky/env-qa-02/see/pg?version=1", Err(BadCharacter));
        check("monky/env-qa-02/see/pg%2f..", Err(BadCharacter));
        check("monky/env-qa-02/see/p g", Err(BadCharacter));
        check("monky/env-qa-02/see/pg\n", Err(BadCharacter));
        check("monky\\env-qa-02\\see\\pg", Err(BadCharacter));
        check("monky/env-qa-02/see/*", Err(BadCharacter));
    }

    #[test]
    fn mount_and_env_must_be_plain() {
        use PathRefusal::*;
        check_for("a/b/env/see/x", "a/b", "env", Err(BadMount));
        check_for("monky/../see/x", "monky", "..", Err(BadEnvId));
        check_for("monky//see/x", "monky", "", Err(BadEnvId));
    }

    #[test]
    fn env_named_data_is_unambiguous() {
        check_for(
            "monky/data/see/x",
            "monky",
            "data",
            Ok("monky/data/data/see/x"),
        );
        check_for(
            "monky/data/data/see/x",
            "monky",
            "data",
            Ok("monky/data/data/see/x"),
        );
    }
}
