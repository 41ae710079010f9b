//! The paths compose and dockerd open on the host, judged for what they will be when they are
//! opened: the files compose reads by path (literals only), bind sources that a container could
//! swap before the next start (none may sit below a writable bind, none may be or pass a link),
//! and the names the daemon compares after normalising them (ulimits, sysctls, propagation,
//! security options).

use std::collections::BTreeSet;
use std::path::{Component, Path};

use serde_json::{Map, Value};

use super::{Ctx, Place, Severity, Site, Walk, lexical, paths_of};
use crate::mount::{Mount, MountKind, foreign};
use crate::refusal::printable;

/// A file compose reads into its model by path (`env_file`, `label_file`) or binds into a
/// container (`configs.*.file`, `secrets.*.file`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum FileKey {
    /// Read into `environment` or `labels`: only the release's own `.env`.
    EnvFile,
    /// Bound into the container: a path inside the release dir.
    Member,
}

/// One host path a bind or a file key will open, as the policy places it.
struct Opened<'a> {
    /// The service (or `configs.c`, `secrets.s`) it belongs to.
    subject: String,
    /// `volumes`, `file`: the key it came from.
    key: &'static str,
    /// Inside the release (components below it) or on the host (absolute, resolved).
    place: Place,
    /// Whether a container may write through it.
    writable: bool,
    /// The compose file's own value of the key, which names the variables it used.
    raw: Option<&'a Value>,
    /// How the finding shows it: `./data/sub` for a release path, the path for a host one.
    shown: String,
    /// Whether the path is, or passes through, a symlink below the release dir.
    linked: bool,
}

impl Ctx<'_> {
    /// Judges every path the compose file makes compose or dockerd open, besides what the table
    /// judges key by key: the file keys on the compose file's own text, and the binds and file
    /// sources of the whole project together.
    pub(super) fn paths(&self, walk: &mut Walk, doc: &Map<String, Value>, raw: &Value) {
        self.file_keys(walk, raw);
        let opened = self.opened(doc, raw);
        self.swappable(walk, &opened);
    }

    /// `env_file`, `label_file` and a config's or secret's `file`, judged on the compose file as
    /// written (YAML anchors and merges expanded, nothing interpolated). compose reads these
    /// files while it builds its model, with every variable of its own process environment and
    /// of the rendered `.env` (secrets included) at hand, and `env_file` / `label_file` leave no
    /// trace in the model: only a literal path is known before it is opened.
    fn file_keys(&self, walk: &mut Walk, raw: &Value) {
        let empty = Map::new();
        let judge = |walk: &mut Walk, subject: &str, key: &str, kind: FileKey, v: &Value| {
            let site = Site {
                subject,
                parent: &empty,
                raw: None,
            };
            for (path, why) in file_key(kind, v) {
                // Before the lease, a variable that is a secret is named as one: its value is
                // exactly what no check could have seen.
                let mut vars = BTreeSet::new();
                crate::interp::names(&path, &mut vars, 0);
                let secret = self
                    .secrets
                    .and_then(|s| vars.iter().find(|v| s.contains(*v)))
                    .map(|v| format!(" (${{{v}}} is a secret)"))
                    .unwrap_or_default();
                walk.add(
                    Severity::Privileged,
                    &site,
                    &format!("{key} {}: {why}{secret}", printable(&path, 80)),
                );
            }
        };
        if let Some(services) = raw.get("services").and_then(Value::as_object) {
            for (name, svc) in services {
                for key in ["env_file", "label_file"] {
                    if let Some(v) = svc.get(key) {
                        judge(walk, name, key, FileKey::EnvFile, v);
                    }
                }
            }
        }
        for top in ["configs", "secrets"] {
            if let Some(items) = raw.get(top).and_then(Value::as_object) {
                for (name, item) in items {
                    if let Some(v) = item.get("file") {
                        judge(walk, &format!("{top}.{name}"), "file", FileKey::Member, v);
                    }
                }
            }
        }
    }

    /// Every bind source and file source of the project, placed.
    fn opened<'r>(&self, doc: &Map<String, Value>, raw: &'r Value) -> Vec<Opened<'r>> {
        let mut out = Vec::new();
        if let Some(services) = doc.get("services").and_then(Value::as_object) {
            for (name, svc) in services {
                let Some(Value::Array(items)) = svc.get("volumes") else {
                    continue;
                };
                let raw_volumes = raw
                    .get("services")
                    .and_then(|s| s.get(name))
                    .and_then(|s| s.get("volumes"));
                for m in items.iter().filter_map(Mount::parse) {
                    if let Some((source, writable)) = bind_source(&m) {
                        out.push(self.open(
                            name.clone(),
                            "volumes",
                            &source,
                            writable,
                            raw_volumes,
                        ));
                    }
                }
            }
        }
        for top in ["configs", "secrets"] {
            if let Some(items) = doc.get(top).and_then(Value::as_object) {
                for (name, item) in items {
                    for path in item.get("file").map(paths_of).unwrap_or_default() {
                        let raw_file = raw
                            .get(top)
                            .and_then(|t| t.get(name))
                            .and_then(|i| i.get("file"));
                        out.push(self.open(
                            format!("{top}.{name}"),
                            "file",
                            &path,
                            false,
                            raw_file,
                        ));
                    }
                }
            }
        }
        out
    }

    fn open<'r>(
        &self,
        subject: String,
        key: &'static str,
        source: &str,
        writable: bool,
        raw: Option<&'r Value>,
    ) -> Opened<'r> {
        let place = self.place(source);
        let shown = match self.lexically_inside(source) {
            Some(rest) if rest.is_empty() => ".".to_string(),
            Some(rest) => format!("./{}", rest.join("/")),
            None => match &place {
                Place::Release(rest) if rest.is_empty() => ".".to_string(),
                Place::Release(rest) => format!("./{}", rest.join("/")),
                Place::Host(p) => p.display().to_string(),
            },
        };
        Opened {
            subject,
            key,
            linked: self.linked(source),
            place,
            writable,
            raw,
            shown,
        }
    }

    /// The components below the release dir of a model path that lies there before any link
    /// is followed.
    fn lexically_inside(&self, source: &str) -> Option<Vec<String>> {
        let release = self.release.as_ref()?;
        let abs = lexical(Path::new(source.trim()));
        let rest = [self.release_dir.as_deref(), Some(release.as_path())]
            .into_iter()
            .flatten()
            .find_map(|b| abs.strip_prefix(b).ok())?;
        Some(
            rest.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect(),
        )
    }

    /// Whether a path below the release dir is a symlink or passes one, as it is on disk now.
    /// Only the model check knows the release dir; the file as the bundle carries it cannot
    /// hold a link (a bundle's members are regular files).
    fn linked(&self, source: &str) -> bool {
        let Some(release) = &self.release else {
            return false;
        };
        // The walk goes from the dir the release resolves to, where a planted link would be.
        let Some(rest) = self.lexically_inside(source) else {
            return false;
        };
        let mut at = release.clone();
        rest.iter().any(|c| {
            at.push(c);
            (self.read_link)(&at).is_some()
        })
    }

    /// Refuses every path source that a container could swap before dockerd opens it again at
    /// the next start (a restart policy, a `depends_on` order, `docker restart`, a reboot: none
    /// asks the agent): one at or below another service's or the same service's writable bind,
    /// one that is or passes a link, and a writable bind that holds the release dir itself.
    fn swappable(&self, walk: &mut Walk, opened: &[Opened]) {
        let empty = Map::new();
        for o in opened {
            let site = Site {
                subject: &o.subject,
                parent: &empty,
                raw: o.raw,
            };
            let report = |walk: &mut Walk, why: String| {
                let text = walk.key_value(&site, o.key, &o.shown);
                walk.add(Severity::Privileged, &site, &format!("{text} {why}"));
            };
            if o.linked {
                report(
                    walk,
                    "is a symlink or passes one: a container could have planted it".into(),
                );
            }
            if let (Some(release), Place::Host(p)) = (&self.release, &o.place)
                && o.writable
                && release.starts_with(p)
            {
                report(walk, "is writable and holds the release dir".into());
            }
            for w in opened.iter().filter(|w| w.writable) {
                if below(&o.place, &w.place) {
                    report(
                        walk,
                        format!(
                            "lies below the writable bind {} of {}: a container could swap it for a link",
                            w.shown, w.subject
                        ),
                    );
                    break;
                }
            }
        }
    }
}

/// Whether `inner` lies strictly below `outer`. A path equal to a writable bind's source is
/// not: its parent is not writable through that bind, so no container can replace it.
fn below(inner: &Place, outer: &Place) -> bool {
    match (inner, outer) {
        (Place::Release(i), Place::Release(o)) => i.len() > o.len() && i.starts_with(o),
        (Place::Host(i), Place::Host(o)) => i != o && i.starts_with(o),
        _ => false,
    }
}

/// The host path of one `volumes` entry and whether it is writable; `None` for a named or
/// anonymous volume, a tmpfs or anything dockerd does not open on the host.
fn bind_source(m: &Mount<'_>) -> Option<(String, bool)> {
    // An empty source (a variable not known yet) is judged where its value is.
    (m.kind == MountKind::Bind && !m.source.trim().is_empty())
        .then(|| (m.source.to_string(), !m.read_only))
}

/// The findings of one file key's value as written: `(path, why)` for each path refused.
fn file_key(kind: FileKey, v: &Value) -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    for path in paths_of(v) {
        if path.contains('$') {
            out.push((
                path,
                "a file compose reads must be named literally, without $ (a variable's value is only known when compose opens it)",
            ));
            continue;
        }
        if foreign(&path) {
            out.push((path, "not a path on this box"));
            continue;
        }
        let rel = release_relative(&path);
        let ok = match kind {
            FileKey::EnvFile => rel.as_ref().is_some_and(|r| r == &[".env"]),
            FileKey::Member => rel.as_ref().is_some_and(|r| !r.is_empty()),
        };
        if !ok {
            out.push((
                path,
                match kind {
                    FileKey::EnvFile => "only the release's own .env may be read",
                    FileKey::Member => "only a file inside the release dir",
                },
            ));
        }
    }
    out
}

/// The components of a relative path below the release dir, with `.` and `..` applied; `None`
/// for an absolute path, `~`, or one that climbs out.
fn release_relative(path: &str) -> Option<Vec<String>> {
    let path = path.trim();
    if path.is_empty() || path.starts_with('~') || path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<String> = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts)
}

/// A bind option or `bind.propagation` value that shares mounts with the host. dockerd
/// compares mount modes lower-cased, so `RSHARED` counts as `rshared`.
pub(super) fn shares_mounts(o: &str) -> bool {
    matches!(
        o.trim().to_ascii_lowercase().as_str(),
        "shared" | "rshared" | "slave" | "rslave"
    )
}

/// A ulimit name as dockerd uses it: it upper-cases the name into `RLIMIT_<NAME>`, so the
/// policy compares it trimmed and lower-cased.
pub(super) fn ulimit_name(name: &str) -> String {
    name.trim().to_ascii_lowercase()
}

/// A sysctl name as the runtime applies it, or `None` when it is no plain name. runc accepts
/// `/` for `.` (a name whose first separator is `/` has the two swapped) and writes the value
/// below `/proc/sys` by the name's segments, so an empty, `.` or `..` segment, or whitespace
/// inside, could reach a file outside the prefix the policy checked.
pub(super) fn sysctl_name(name: &str) -> Option<String> {
    let n = name.trim();
    let swapped: String = match n.find(['.', '/']) {
        Some(i) if n.as_bytes()[i] == b'/' => n
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => n.to_string(),
    };
    let plain = !swapped.is_empty()
        && swapped.split(['.', '/']).all(|seg| {
            !seg.is_empty()
                && seg != ".."
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '@' | ':' | '+'))
        });
    plain.then_some(swapped)
}

/// A `security_opt` entry that only sets no-new-privileges: dockerd takes `no-new-privileges`
/// alone, or with a boolean after `=` or `:`.
pub(super) fn no_new_privileges(opt: &str) -> bool {
    let o = opt.trim();
    if o == "no-new-privileges" {
        return true;
    }
    let Some((key, value)) = o.split_once('=').or_else(|| o.split_once(':')) else {
        return false;
    };
    key == "no-new-privileges"
        && matches!(
            value,
            "1" | "t"
                | "T"
                | "TRUE"
                | "true"
                | "True"
                | "0"
                | "f"
                | "F"
                | "FALSE"
                | "false"
                | "False"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_names_are_normalised_as_runc_does() {
        assert_eq!(
            sysctl_name(" net.core.somaxconn ").as_deref(),
            Some("net.core.somaxconn")
        );
        assert_eq!(
            sysctl_name("net/ipv4/conf/eno2.100/rp_filter").as_deref(),
            Some("net.ipv4.conf.eno2/100.rp_filter")
        );
        for bad in [
            "net/../kernel/core_pattern",
            "net.ipv4..x",
            "net. core",
            "",
            "net.a/../../b",
        ] {
            assert_eq!(sysctl_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_strictly_below_counts() {
        let r = |p: &[&str]| Place::Release(p.iter().map(|s| s.to_string()).collect());
        let h = |p: &str| Place::Host(p.into());
        assert!(below(&r(&["data", "sub"]), &r(&["data"])));
        assert!(below(&r(&["data", "a", "b"]), &r(&["data"])));
        assert!(!below(&r(&["data"]), &r(&["data"])));
        assert!(!below(&r(&["database"]), &r(&["data"])));
        assert!(!below(&r(&["data"]), &r(&["data", "sub"])));
        assert!(below(&h("/srv/shared/x"), &h("/srv/shared")));
        assert!(!below(&h("/srv/sharedx"), &h("/srv/shared")));
        assert!(!below(&r(&["data"]), &h("/")));
    }

    #[test]
    fn file_keys_are_literal_and_named() {
        let v = |s: &str| Value::String(s.into());
        assert!(file_key(FileKey::EnvFile, &v(".env")).is_empty());
        assert!(file_key(FileKey::EnvFile, &v("./.env")).is_empty());
        assert!(file_key(FileKey::EnvFile, &v("./data/../.env")).is_empty());
        assert_eq!(file_key(FileKey::EnvFile, &v("${HOME}/.env")).len(), 1);
        assert_eq!(file_key(FileKey::EnvFile, &v("$$x")).len(), 1);
        assert_eq!(file_key(FileKey::EnvFile, &v("bundle.json")).len(), 1);
        assert_eq!(file_key(FileKey::EnvFile, &v("../.env")).len(), 1);
        assert!(file_key(FileKey::Member, &v("./conf/c.txt")).is_empty());
        assert_eq!(file_key(FileKey::Member, &v(".")).len(), 1);
        assert_eq!(file_key(FileKey::Member, &v("/etc/hostname")).len(), 1);
    }

    #[test]
    fn security_opt_spellings() {
        for o in [
            "no-new-privileges",
            "no-new-privileges:true",
            "no-new-privileges=1",
            " no-new-privileges=false ",
        ] {
            assert!(no_new_privileges(o), "{o}");
        }
        for o in [
            "no-new-privileges=yes",
            "label=disable",
            "disable",
            "no-new-privileges:true:x",
        ] {
            assert!(!no_new_privileges(o), "{o}");
        }
    }
}
