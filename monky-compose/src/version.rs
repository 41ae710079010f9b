//! Compose's version, read from `docker compose version`, and the features each version has.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A compose version, `major.minor.patch`; suffixes such as `-desktop.1` or `+ds1` are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ComposeVersion {
    /// Major version; 1 is the python compose, refused.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl ComposeVersion {
    /// `up --wait` exists from this version on.
    pub const WAIT: ComposeVersion = ComposeVersion::new(2, 1, 1);
    /// `up --wait-timeout` works from this version on (2.17.0-2.17.2 mangled it).
    pub const WAIT_TIMEOUT: ComposeVersion = ComposeVersion::new(2, 17, 3);
    /// `ps --format json` prints one object per line from this version on (an array before).
    pub const PS_JSON_LINES: ComposeVersion = ComposeVersion::new(2, 21, 0);

    /// A version from its parts.
    #[must_use]
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        ComposeVersion {
            major,
            minor,
            patch,
        }
    }

    /// Parses `2.20.2`, `v2.20.2`, `2.26.1-desktop.1`, `2.24.6+ds1-0ubuntu1` or `1.29.2,`.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim().trim_start_matches(['v', 'V']);
        let end = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let mut parts = text[..end].split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        Some(ComposeVersion::new(major, minor, patch))
    }

    /// Reads the version out of what `docker compose version` or `docker-compose version`
    /// printed: `Docker Compose version v2.20.2` or `docker-compose version 1.29.2, build x`.
    #[must_use]
    pub fn from_version_output(output: &str) -> Option<Self> {
        output.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| w.eq_ignore_ascii_case("version"))?;
            ComposeVersion::parse(words.next()?)
        })
    }
}

impl fmt::Display for ComposeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for ComposeVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ComposeVersion::parse(s).ok_or_else(|| format!("not a compose version: {s:?}"))
    }
}

impl TryFrom<String> for ComposeVersion {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<ComposeVersion> for String {
    fn from(v: ComposeVersion) -> String {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse() {
        let check = |text: &str, expected: Option<(u32, u32, u32)>| {
            assert_eq!(
                ComposeVersion::parse(text),
                expected.map(|(a, b, c)| ComposeVersion::new(a, b, c)),
                "{text:?}"
            );
        };
        check("2.20.2", Some((2, 20, 2)));
        check("v2.30.3", Some((2, 30, 3)));
        check("2.26.1-desktop.1", Some((2, 26, 1)));
        check("2.24.6+ds1-0ubuntu1~22.04.1", Some((2, 24, 6)));
        check("1.29.2,", Some((1, 29, 2)));
        check("2.17", Some((2, 17, 0)));
        check("v2", Some((2, 0, 0)));
        check("", None);
        check("dev", None);
        check("2.x.1", None);
    }

    #[test]
    fn versions_from_version_output() {
        let check = |text: &str, expected: Option<&str>| {
            assert_eq!(
                ComposeVersion::from_version_output(text).map(|v| v.to_string()),
                expected.map(str::to_owned),
                "{text:?}"
            );
        };
        check("Docker Compose version v2.20.2\n", Some("2.20.2"));
        check(
            "Docker Compose version 2.24.6+ds1-0ubuntu1\n",
            Some("2.24.6"),
        );
        check(
            "docker-compose version 1.29.2, build unknown\ndocker-py version: 5.0.3\n",
            Some("1.29.2"),
        );
        check("docker: 'compose' is not a docker command.\n", None);
        check("", None);
    }

    #[test]
    fn version_order_and_thresholds() {
        let v = |s: &str| ComposeVersion::parse(s).unwrap();
        assert!(v("2.17.2") < ComposeVersion::WAIT_TIMEOUT);
        assert!(v("2.17.3") >= ComposeVersion::WAIT_TIMEOUT);
        assert!(v("2.1.0") < ComposeVersion::WAIT);
        assert!(v("2.10.0") > v("2.9.9"));
        assert_eq!(serde_json::to_string(&v("v2.20.2")).unwrap(), "\"2.20.2\"");
        assert_eq!(
            serde_json::from_str::<ComposeVersion>("\"2.32.0\"").unwrap(),
            v("2.32.0")
        );
        assert!(serde_json::from_str::<ComposeVersion>("\"x\"").is_err());
    }
}
