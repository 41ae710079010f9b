//! Refusals: a stable code plus the names (never the values) that explain it.

use std::fmt;

/// Why a bundle is refused. The string form is what the agent reports to tenancy.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RefusalCode {
    /// `.env.template` references a variable that no manifest entry provides.
    EnvIncomplete,
    /// The compose file asks for host-level privileges.
    PrivilegedRefused,
    /// The desired sha was applied before and is not the current one.
    RollbackRefused,
    /// The docker data root has too little free space.
    DiskInsufficient,
    /// `bundle.json` names a renderer other than `compose`.
    RendererRefused,
    /// A manifest entry carries secret material instead of a path.
    ManifestValueRefused,
    /// A manifest path is not one of the env's own `see/` secrets (see
    /// [`KvPath`](crate::KvPath)).
    ManifestPathRefused,
    /// The bundle's content does not hash to the desired sha.
    BundleShaMismatch,
    /// The bundle is malformed (tar structure, member names, required members, JSON, YAML).
    BundleInvalid,
    /// The bundle exceeds a [`Limits`](crate::Limits) value.
    BundleTooLarge,
    /// A secret's value cannot be written where `.env.template` puts it without compose
    /// reading something else (e.g. a newline in an unquoted `URL=x${VAR}y`).
    EnvValueUnsafe,
    /// The compose file names a container, volume or network outside the project's own
    /// names: no host access, but another env's names; waived by the box's
    /// `allow_unprefixed_names`.
    BundleNonconforming,
    /// The compose file asks for more of the box than its budget gives one project; waived by
    /// raising the named budget key in the box's config.
    BudgetExceeded,
    /// Compose would interpolate a secret into a process's arguments (`command`,
    /// `entrypoint`, a healthcheck `test`, a `post_start`/`pre_stop` `command`), which every
    /// local user can read in `/proc/<pid>/cmdline`.
    SecretOnCommandLine,
    /// An image's registry resolves to an address of this box (loopback, link-local, its
    /// own) that the box's config does not name as its registry.
    RegistryNotAllowed,
    /// The box's resolver did not answer for an image's registry, so where dockerd would dial
    /// it is not known: temporary.
    RegistryUnresolved,
}

impl RefusalCode {
    /// The SCREAMING_CASE wire form, e.g. `ENV_INCOMPLETE`.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalCode::EnvIncomplete => "ENV_INCOMPLETE",
            RefusalCode::PrivilegedRefused => "PRIVILEGED_REFUSED",
            RefusalCode::RollbackRefused => "ROLLBACK_REFUSED",
            RefusalCode::DiskInsufficient => "DISK_INSUFFICIENT",
            RefusalCode::RendererRefused => "RENDERER_REFUSED",
            RefusalCode::ManifestValueRefused => "MANIFEST_VALUE_REFUSED",
            RefusalCode::ManifestPathRefused => "MANIFEST_PATH_REFUSED",
            RefusalCode::BundleShaMismatch => "BUNDLE_SHA_MISMATCH",
            RefusalCode::BundleInvalid => "BUNDLE_INVALID",
            RefusalCode::BundleTooLarge => "BUNDLE_TOO_LARGE",
            RefusalCode::EnvValueUnsafe => "ENV_VALUE_UNSAFE",
            RefusalCode::BundleNonconforming => "BUNDLE_NONCONFORMING",
            RefusalCode::BudgetExceeded => "BUDGET_EXCEEDED",
            RefusalCode::SecretOnCommandLine => "SECRET_ON_COMMAND_LINE",
            RefusalCode::RegistryNotAllowed => "REGISTRY_NOT_ALLOWED",
            RefusalCode::RegistryUnresolved => "REGISTRY_UNAVAILABLE",
        }
    }
}

impl fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal: the code and the names that explain it.
///
/// `names` hold variable names, service names, member names, numbers and short reasons, never a
/// secret value, so a refusal can go to the journal and into a report's `detail` as it is.
///
/// `Display` is `CODE: a, b`. `ENV_INCOMPLETE` keeps the protocol's wording and reads
/// `ENV_INCOMPLETE: unresolved: A, B` while its `names` stay the bare variable names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The refusal code.
    pub code: RefusalCode,
    /// What the code is about, in a stable order.
    pub names: Vec<String>,
}

impl Refusal {
    /// A refusal with the given code and names.
    pub fn new<I, S>(code: RefusalCode, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Refusal {
            code,
            names: names.into_iter().map(Into::into).collect(),
        }
    }

    /// A refusal with a single name.
    pub(crate) fn one(code: RefusalCode, name: impl Into<String>) -> Self {
        Refusal {
            code,
            names: vec![name.into()],
        }
    }

    pub(crate) fn invalid(name: impl Into<String>) -> Self {
        Refusal::one(RefusalCode::BundleInvalid, name)
    }
}

impl Refusal {
    /// What the refusal names, without its code (empty when it names nothing): for a caller
    /// that shows the code from [`Refusal::code`] itself.
    #[must_use]
    pub fn message(&self) -> String {
        let names = self.names.join(", ");
        if self.code == RefusalCode::EnvIncomplete && !names.is_empty() {
            format!("unresolved: {names}")
        } else {
            names
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code.as_str())?;
        if self.names.is_empty() {
            return Ok(());
        }
        write!(f, ": {}", self.message())
    }
}

impl std::error::Error for Refusal {}

/// Renders untrusted text (a member name, a renderer value) for a refusal: printable ASCII
/// passes, everything else is escaped, and the result is cut at `max` characters so a
/// hostile name cannot flood a report.
pub(crate) fn printable(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n >= max {
            out.push_str("...");
            break;
        }
        if c.is_ascii_graphic() || c == ' ' {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_joins_names() {
        let r = Refusal::new(
            RefusalCode::PrivilegedRefused,
            ["web: privileged", "db: pid host"],
        );
        assert_eq!(
            r.to_string(),
            "PRIVILEGED_REFUSED: web: privileged, db: pid host"
        );
        let r = Refusal::new(RefusalCode::EnvIncomplete, ["A", "B"]);
        assert_eq!(r.to_string(), "ENV_INCOMPLETE: unresolved: A, B");
        let r = Refusal::new(RefusalCode::BundleInvalid, Vec::<String>::new());
        assert_eq!(r.to_string(), "BUNDLE_INVALID");
    }

    #[test]
    fn the_message_is_the_display_without_the_code() {
        let r = Refusal::new(RefusalCode::EnvIncomplete, ["A", "B"]);
        assert_eq!(r.message(), "unresolved: A, B");
        let r = Refusal::one(RefusalCode::RollbackRefused, "older than the applied sha");
        assert_eq!(r.message(), "older than the applied sha");
        assert_eq!(
            Refusal::new(RefusalCode::BundleInvalid, Vec::<String>::new()).message(),
            ""
        );
    }

    #[test]
    fn printable_escapes_and_truncates() {
        assert_eq!(printable("a\nb\u{0}é", 80), "a\\nb\\u{0}\\u{e9}");
        assert_eq!(printable("abcdef", 3), "abc...");
    }
}
