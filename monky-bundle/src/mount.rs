//! One entry of a service's `volumes`, parsed once: the short syntax (`source:target[:modes]`,
//! or `target` alone) and the long one (`type:`, `source:`, `read_only:`, `bind:`, ...). The
//! compose policy's volume rule, its bind-source rule (`policy/paths.rs`), its list of used
//! volumes and the budget's tmpfs sizes all read this value, so they cannot read one entry two
//! ways.

use serde_json::Value;

/// What a mount is, as dockerd will make it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MountKind<'a> {
    /// A host path (short syntax: a source that starts with `/`, `.` or `~`; long: `type: bind`).
    Bind,
    /// A named volume (short syntax: any other source; long: `type: volume` or no type).
    Volume,
    /// The short syntax's `target` alone: a fresh volume with no name.
    Anonymous,
    /// Long syntax `type: tmpfs`.
    Tmpfs,
    /// Any other long `type` (`image`, `npipe`, `cluster`, a typo).
    Other(&'a str),
}

/// One `volumes` entry of a service.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Mount<'a> {
    pub kind: MountKind<'a>,
    /// The host path or volume name as written; empty where there is none.
    pub source: &'a str,
    /// The path in the container; empty where the entry gives none.
    pub target: &'a str,
    /// Whether it was written in the long syntax (compose's model always is).
    pub long: bool,
    /// Short syntax: a `ro` mode; long: a truthy `read_only`.
    pub read_only: bool,
    /// The mode words that may set propagation: the short syntax's modes (each as written),
    /// the long syntax's `bind.propagation`.
    pub modes: Vec<&'a str>,
    /// Short syntax: a `z` or `Z` mode; long: any `bind.selinux`.
    pub relabel: bool,
    /// Long syntax `bind.recursive`.
    pub recursive: Option<&'a str>,
    /// Long syntax `volume.subpath`.
    pub subpath: Option<&'a str>,
    /// Long syntax `tmpfs.size`, unread (a number or a size string); `null` is none.
    pub tmpfs_size: Option<&'a Value>,
    /// The text that is a path in another OS's syntax ([`foreign`]): the whole short entry, or a
    /// long bind's source.
    pub foreign: Option<&'a str>,
}

impl<'a> Mount<'a> {
    /// The mount an entry of `volumes` describes; `None` for a value that is neither a string
    /// nor a mapping.
    pub(crate) fn parse(item: &'a Value) -> Option<Self> {
        match item {
            Value::String(s) => Some(Self::short(s)),
            Value::Object(m) => {
                let text = |v: Option<&'a Value>| v.and_then(Value::as_str);
                let source = text(m.get("source")).unwrap_or("");
                let kind = match text(m.get("type")).unwrap_or("volume") {
                    "bind" => MountKind::Bind,
                    "volume" => MountKind::Volume,
                    "tmpfs" => MountKind::Tmpfs,
                    other => MountKind::Other(other),
                };
                let bind = |k: &str| text(m.get("bind").and_then(|b| b.get(k)));
                Some(Mount {
                    kind,
                    source,
                    target: text(m.get("target")).unwrap_or(""),
                    long: true,
                    read_only: m.get("read_only").is_some_and(truthy),
                    modes: bind("propagation").into_iter().collect(),
                    relabel: bind("selinux").is_some(),
                    recursive: bind("recursive"),
                    subpath: text(m.get("volume").and_then(|v| v.get("subpath"))),
                    tmpfs_size: m
                        .get("tmpfs")
                        .and_then(|t| t.get("size"))
                        .filter(|s| !s.is_null()),
                    foreign: (kind == MountKind::Bind && foreign(source)).then_some(source),
                })
            }
            _ => None,
        }
    }

    fn short(s: &'a str) -> Self {
        let parts: Vec<&str> = s.split(':').collect();
        let (kind, source, target) = match parts.as_slice() {
            [target] => (MountKind::Anonymous, "", *target),
            [source, target, ..] if is_path(source) => (MountKind::Bind, *source, *target),
            [source, target, ..] => (MountKind::Volume, *source, *target),
            [] => (MountKind::Anonymous, "", ""),
        };
        let modes: Vec<&str> = parts.get(2).map_or(Vec::new(), |o| o.split(',').collect());
        let is = |word: &str| modes.iter().any(|o| o.trim().eq_ignore_ascii_case(word));
        Mount {
            kind,
            source,
            target,
            long: false,
            read_only: is("ro"),
            relabel: is("z"),
            recursive: None,
            subpath: None,
            tmpfs_size: None,
            foreign: foreign(s).then_some(s),
            modes,
        }
    }

    /// The name this entry may give a top-level volume: its source, or an anonymous volume's
    /// path. Wider than the named volumes alone, so that a top-level volume is judged whenever
    /// any entry could be read as naming it.
    pub(crate) fn volume_name(&self) -> &'a str {
        match self.kind {
            MountKind::Anonymous => self.target,
            _ => self.source,
        }
    }
}

/// Whether a short-syntax source is a host path rather than a volume name.
pub(crate) fn is_path(source: &str) -> bool {
    source.starts_with('/') || source.starts_with('.') || source.starts_with('~')
}

/// A path in another OS's syntax, which this box's dockerd would not read as the policy does:
/// a drive letter (`C:\`, `c:/`), a backslash anywhere, or a UNC or device name (`\\server`,
/// `//./pipe/x`, `//server/share`).
pub(crate) fn foreign(path: &str) -> bool {
    let p = path.trim();
    let b = p.as_bytes();
    let drive = b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':';
    drive || p.contains('\\') || p.starts_with("//")
}

/// A compose boolean as compose reads it (`true`, `"yes"`, `1`, ...).
pub(crate) fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => matches!(
            s.trim().to_ascii_lowercase().as_str(),
            "true" | "yes" | "y" | "on" | "1"
        ),
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::Null | Value::Array(_) | Value::Object(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(item: Value, expected: (MountKind<'_>, &str, &str, bool)) {
        let m = Mount::parse(&item).unwrap();
        assert_eq!(
            (m.kind, m.source, m.target, m.read_only),
            expected,
            "{item}"
        );
    }

    #[test]
    fn both_syntaxes_parse_to_one_mount() {
        use MountKind::*;
        check(json!("./data:/data"), (Bind, "./data", "/data", false));
        check(json!("/etc/x:/x:ro,z"), (Bind, "/etc/x", "/x", true));
        check(json!("~/x:/x:RO"), (Bind, "~/x", "/x", true));
        check(
            json!("pgdata:/var/lib/pg"),
            (Volume, "pgdata", "/var/lib/pg", false),
        );
        check(json!("/cache"), (Anonymous, "", "/cache", false));
        check(
            json!({"type": "bind", "source": "/srv", "target": "/s", "read_only": "yes"}),
            (Bind, "/srv", "/s", true),
        );
        check(
            json!({"source": "pgdata", "target": "/d"}),
            (Volume, "pgdata", "/d", false),
        );
        check(
            json!({"type": "tmpfs", "target": "/t"}),
            (Tmpfs, "", "/t", false),
        );
        check(
            json!({"type": "image", "source": "x"}),
            (Other("image"), "x", "", false),
        );
        assert_eq!(Mount::parse(&json!(3)), None);
    }

    #[test]
    fn the_short_syntax_keeps_its_modes_and_names_a_foreign_entry_whole() {
        let item = json!("./a:/b:rshared,Z");
        let m = Mount::parse(&item).unwrap();
        assert_eq!(
            (m.modes.as_slice(), m.relabel),
            (&["rshared", "Z"][..], true)
        );
        let item = json!("C:\\data:/data");
        let m = Mount::parse(&item).unwrap();
        // The drive letter splits off as a volume named `C`; the entry is foreign as a whole.
        assert_eq!(
            (m.kind, m.foreign),
            (MountKind::Volume, Some("C:\\data:/data"))
        );
        // A long volume's source is never judged as a path.
        let item = json!({"type": "volume", "source": "C:\\x"});
        assert_eq!(Mount::parse(&item).unwrap().foreign, None);
    }

    #[test]
    fn an_anonymous_volume_s_path_counts_as_a_volume_name() {
        // The two old readings disagreed on `- /data` alone: the policy's volume rule read an
        // anonymous volume, the list of used volumes read a volume named `/data`. The stricter
        // reading is kept: a top-level volume `/data` is judged, not dropped as unused.
        let item = json!("/data");
        let m = Mount::parse(&item).unwrap();
        assert_eq!((m.kind, m.volume_name()), (MountKind::Anonymous, "/data"));
    }

    #[test]
    fn foreign_paths() {
        for p in [
            "C:\\x",
            "c:/x",
            "\\\\server\\share",
            "//./pipe/docker_engine",
            "//srv/share",
            "./a\\b",
        ] {
            assert!(foreign(p), "{p}");
        }
        for p in ["./data", "/etc/localtime", "data", "~/x"] {
            assert!(!foreign(p), "{p}");
        }
    }
}
