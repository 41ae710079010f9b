//! Debian package handling for setup: installs, and docker-compose 2.x from the next release
//! through a low-priority apt pin whose sources entry is derived from the machine's own sources.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::cmd;

/// Our sources entry for the next Debian release (deb822 format).
pub const NEXT_RELEASE_SOURCES: &str = "/etc/apt/sources.list.d/monky-next-release.sources";
/// Our apt preferences: the next release at 100, only `docker-compose` from it at 990.
pub const NEXT_RELEASE_PIN: &str = "/etc/apt/preferences.d/monky-next-release";
const ARCHIVE_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// The fields of /etc/os-release that setup needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OsRelease {
    /// `ID`, e.g. `debian`.
    pub id: String,
    /// `VERSION_CODENAME`, e.g. `bookworm`.
    pub codename: String,
}

impl OsRelease {
    /// Parses the text of /etc/os-release (values may be quoted).
    pub fn parse(text: &str) -> Result<Self> {
        let field = |name: &str| {
            text.lines()
                .filter_map(|l| l.trim().split_once('='))
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
                .filter(|v| !v.is_empty())
        };
        Ok(Self {
            id: field("ID").context("os-release has no ID")?,
            codename: field("VERSION_CODENAME").context("os-release has no VERSION_CODENAME")?,
        })
    }

    /// Reads /etc/os-release.
    pub fn read() -> Result<Self> {
        let text =
            std::fs::read_to_string("/etc/os-release").context("cannot read /etc/os-release")?;
        Self::parse(&text)
    }
}

/// The Debian release after `codename`, for the releases this project may meet.
pub fn next_release(codename: &str) -> Option<&'static str> {
    Some(match codename {
        "buster" => "bullseye",
        "bullseye" => "bookworm",
        "bookworm" => "trixie",
        "trixie" => "forky",
        "forky" => "duke",
        _ => return None,
    })
}

/// One `deb` source (from either the one-line or the deb822 format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSource {
    /// The file it came from.
    pub file: PathBuf,
    /// The archive URI, e.g. `http://mirror.example/debian`.
    pub uri: String,
    /// Suites, e.g. `bookworm`, `bookworm-updates`.
    pub suites: Vec<String>,
    /// Components, e.g. `main`.
    pub components: Vec<String>,
    /// `Signed-By`/`signed-by` when it names a keyring file (inline keys are not carried over).
    pub signed_by: Option<String>,
}

/// Parses the one-line format (`sources.list`, `*.list`); `deb-src` lines are skipped.
pub fn parse_one_line(file: &Path, text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut rest = match line
            .strip_prefix("deb ")
            .or_else(|| line.strip_prefix("deb\t"))
        {
            Some(rest) => rest.trim_start(),
            None => continue,
        };
        let mut signed_by = None;
        if let Some(opts) = rest.strip_prefix('[') {
            let Some((opts, after)) = opts.split_once(']') else {
                continue;
            };
            signed_by = opts
                .split_whitespace()
                .find_map(|o| o.strip_prefix("signed-by="))
                .map(str::to_owned);
            rest = after.trim_start();
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        out.push(AptSource {
            file: file.to_path_buf(),
            uri: uri.to_owned(),
            suites: vec![suite.to_owned()],
            components: words.map(str::to_owned).collect(),
            signed_by,
        });
    }
    out
}

/// Parses the deb822 format (`*.sources`); stanzas with `Enabled: no` or without `deb` are skipped.
pub fn parse_deb822(file: &Path, text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for stanza in stanzas(text) {
        let get = |name: &str| {
            stanza
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        let words = |name: &str| -> Vec<String> {
            get(name)
                .unwrap_or("")
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        if get("Enabled").is_some_and(|v| v.trim().eq_ignore_ascii_case("no")) {
            continue;
        }
        if !words("Types").iter().any(|t| t == "deb") {
            continue;
        }
        let signed_by = get("Signed-By")
            .map(str::trim)
            .filter(|v| !v.contains('\n') && !v.is_empty() && !v.starts_with("-----"))
            .map(str::to_owned);
        for uri in words("URIs") {
            out.push(AptSource {
                file: file.to_path_buf(),
                uri,
                suites: words("Suites"),
                components: words("Components"),
                signed_by: signed_by.clone(),
            });
        }
    }
    out
}

/// Splits deb822 text into stanzas of (field, value); continuation lines join with `\n`.
fn stanzas(text: &str) -> Vec<Vec<(String, String)>> {
    let mut all = Vec::new();
    let mut current: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            if !current.is_empty() {
                all.push(std::mem::take(&mut current));
            }
            continue;
        }
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = current.last_mut() {
                value.push('\n');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some((key, value)) = line.split_once(':') {
            current.push((key.trim().to_owned(), value.trim().to_owned()));
        }
    }
    if !current.is_empty() {
        all.push(current);
    }
    all
}

/// Reads every enabled `deb` source of the machine (sources.list, sources.list.d/*.list and
/// *.sources), except our own next-release entry.
pub fn system_sources() -> Result<Vec<AptSource>> {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut parts: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        parts.sort();
        files.extend(parts);
    }
    let mut out = Vec::new();
    for file in files {
        if file == Path::new(NEXT_RELEASE_SOURCES) {
            continue;
        }
        let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
        let parse: fn(&Path, &str) -> Vec<AptSource> = match ext {
            "sources" => parse_deb822,
            "list" => parse_one_line,
            _ if file == Path::new("/etc/apt/sources.list") => parse_one_line,
            _ => continue,
        };
        match std::fs::read_to_string(&file) {
            Ok(text) => out.extend(parse(&file, &text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
        }
    }
    Ok(out)
}

/// The source serving `codename` itself with `main` (not -updates or -security), preferring
/// http(s) mirrors; this is the mirror the next release is fetched from.
pub fn pick_mirror<'a>(sources: &'a [AptSource], codename: &str) -> Option<&'a AptSource> {
    let serves = |s: &&AptSource| {
        s.suites.iter().any(|x| x == codename) && s.components.iter().any(|c| c == "main")
    };
    let web = |s: &&AptSource| s.uri.starts_with("http://") || s.uri.starts_with("https://");
    sources
        .iter()
        .filter(serves)
        .find(web)
        .or_else(|| sources.iter().find(serves))
}

/// Our deb822 entry for `next` at the mirror of `from`.
pub fn next_release_entry(from: &AptSource, next: &str, fallback_keyring: Option<&str>) -> String {
    let mut text = format!(
        "# Added by `cargo xtask setup` (monky-deployd): docker-compose 2.x only, see\n\
         # {NEXT_RELEASE_PIN}. Mirror taken from {}.\n\
         Types: deb\nURIs: {}\nSuites: {next}\nComponents: main\n",
        from.file.display(),
        from.uri
    );
    if let Some(key) = from.signed_by.as_deref().or(fallback_keyring) {
        text.push_str(&format!("Signed-By: {key}\n"));
    }
    text
}

/// Our preferences: everything from `next` at 100 (never chosen over the current release),
/// only `package` from it at 990.
pub fn next_release_pin(next: &str, package: &str) -> String {
    format!(
        "# Added by `cargo xtask setup` (monky-deployd): take only {package} from {next}.\n\
         Package: *\nPin: release n={next}\nPin-Priority: 100\n\n\
         Package: {package}\nPin: release n={next}\nPin-Priority: 990\n"
    )
}

/// The `Candidate:` of `apt-cache policy` output, `None` for `(none)` or when absent.
pub fn parse_candidate(policy: &str) -> Option<String> {
    policy
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate:"))
        .map(str::trim)
        .filter(|v| !v.is_empty() && *v != "(none)")
        .map(str::to_owned)
}

/// The major version of a Debian version string (`1:2.26.1-4` -> 2).
pub fn debian_major(version: &str) -> Option<u32> {
    let upstream = version.split_once(':').map_or(version, |(_, v)| v);
    upstream.split(['.', '-', '+', '~']).next()?.parse().ok()
}

/// Runs apt with a lazy, once-only `apt-get update`.
#[derive(Debug, Default)]
pub struct Apt {
    updated: bool,
}

impl Apt {
    /// An apt runner that has not updated yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// `apt-get update`, at most once per xtask run.
    pub fn update_once(&mut self) -> Result<()> {
        if !self.updated {
            step("apt-get update");
            cmd::run(&mut apt_get(["update", "-q"]))?;
            self.updated = true;
        }
        Ok(())
    }

    /// True when dpkg reports `package` as installed.
    pub fn installed(package: &str) -> bool {
        cmd::capture(&mut cmd::new("dpkg-query", ["-W", "-f=${Status}", package]))
            .is_ok_and(|s| s.ends_with(" installed"))
    }

    /// Installs whichever of `packages` are missing, with `--no-install-recommends`.
    pub fn ensure_installed(&mut self, packages: &[&str]) -> Result<()> {
        let missing: Vec<&str> = packages
            .iter()
            .copied()
            .filter(|p| !Self::installed(p))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        self.update_once()?;
        step(&format!("apt-get install {}", missing.join(" ")));
        let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
        args.extend(missing);
        cmd::run(&mut apt_get(args))
    }

    /// The install candidate of `package` per `apt-cache policy`.
    pub fn candidate(package: &str) -> Result<Option<String>> {
        let policy = cmd::capture(&mut cmd::new("apt-cache", ["policy", package]))?;
        Ok(parse_candidate(&policy))
    }

    /// Installs docker-compose 2.x: from the current release when it has one, else from the
    /// next release through our sources entry and pin. Returns the installed version.
    pub fn install_compose_v2(&mut self) -> Result<String> {
        const PACKAGE: &str = "docker-compose";
        self.update_once()?;
        if let Some(version) = Self::candidate(PACKAGE)?
            && debian_major(&version).is_some_and(|m| m >= 2)
        {
            step(&format!(
                "apt's candidate for {PACKAGE} is already {version}"
            ));
        } else {
            self.add_next_release(PACKAGE)?;
        }
        let version = Self::candidate(PACKAGE)?
            .with_context(|| format!("apt has no candidate for {PACKAGE}"))?;
        if debian_major(&version).is_none_or(|m| m < 2) {
            bail!(
                "apt's candidate for {PACKAGE} is {version}, not 2.x, even with the next release \
                 pinned ({NEXT_RELEASE_SOURCES}, {NEXT_RELEASE_PIN})"
            );
        }
        step(&format!(
            "apt-get install --no-install-recommends {PACKAGE}={version}"
        ));
        cmd::run(&mut apt_get([
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            &format!("{PACKAGE}={version}"),
        ]))?;
        Ok(version)
    }

    /// promtool validates the agent's metrics textfile in the suite. Debian ships it as its own
    /// package from the release after bookworm on; there it comes through the same next-release
    /// entry as compose, at that release's default pin (100), as the only candidate.
    pub fn ensure_promtool(&mut self) -> Result<()> {
        const PACKAGE: &str = "promtool";
        if Self::installed(PACKAGE) {
            return Ok(());
        }
        self.update_once()?;
        if Self::candidate(PACKAGE)?.is_none() {
            self.add_next_release("docker-compose")?;
        }
        self.ensure_installed(&[PACKAGE])
    }

    fn add_next_release(&mut self, package: &str) -> Result<()> {
        let os = OsRelease::read()?;
        if os.id != "debian" {
            bail!(
                "compose v2 is missing and this is {} {}, not Debian: install docker-compose 2.x \
                 (or the docker compose plugin) by hand",
                os.id,
                os.codename
            );
        }
        let next = next_release(&os.codename)
            .with_context(|| format!("do not know the Debian release after {:?}", os.codename))?;
        let sources = system_sources()?;
        let mirror = pick_mirror(&sources, &os.codename).with_context(|| {
            format!(
                "no apt source serves `{} main` (looked in /etc/apt/sources.list and \
                 /etc/apt/sources.list.d): cannot derive a mirror for {next}",
                os.codename
            )
        })?;
        let keyring = Path::new(ARCHIVE_KEYRING)
            .exists()
            .then_some(ARCHIVE_KEYRING);
        step(&format!(
            "adding {next} from {} (mirror of {}) pinned to 100, {package} to 990",
            mirror.uri,
            mirror.file.display()
        ));
        write_if_changed(
            Path::new(NEXT_RELEASE_SOURCES),
            &next_release_entry(mirror, next, keyring),
        )?;
        write_if_changed(
            Path::new(NEXT_RELEASE_PIN),
            &next_release_pin(next, package),
        )?;
        // Update only our new list; the others were updated a moment ago.
        cmd::run(&mut apt_get([
            "update",
            "-q",
            &format!("-oDir::Etc::sourcelist={NEXT_RELEASE_SOURCES}"),
            "-oDir::Etc::sourceparts=-",
            "-oAPT::Get::List-Cleanup=0",
        ]))
    }
}

fn apt_get<I, S>(args: I) -> std::process::Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = cmd::new("apt-get", args);
    c.env("DEBIAN_FRONTEND", "noninteractive");
    c
}

fn write_if_changed(path: &Path, text: &str) -> Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

fn step(what: &str) {
    println!("    apt: {what}");
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "\
Types: deb
# a comment
URIs: http://mirror.test/debian
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.test/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://src.test/debian
Suites: bookworm
Components: main

Enabled: no
Types: deb
URIs: http://disabled.test/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://inline.test/debian
Suites: bookworm
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 abc
";

    #[test]
    fn deb822_keeps_enabled_binary_sources() {
        let found = parse_deb822(Path::new("/x.sources"), DEB822);
        let uris: Vec<&str> = found.iter().map(|s| s.uri.as_str()).collect();
        assert_eq!(
            uris,
            [
                "http://mirror.test/debian",
                "http://mirror.test/debian-security",
                "http://inline.test/debian"
            ]
        );
        assert_eq!(found[0].suites, ["bookworm", "bookworm-updates"]);
        assert_eq!(
            found[0].signed_by.as_deref(),
            Some("/usr/share/keyrings/debian-archive-keyring.gpg")
        );
        assert_eq!(found[2].signed_by, None, "inline keys are not carried over");
    }

    #[test]
    fn one_line_format_with_and_without_options() {
        let text = "\
# deb http://commented.test/debian bookworm main
deb [arch=amd64 signed-by=/etc/k.gpg] http://a.test/debian bookworm main non-free
deb-src http://src.test/debian bookworm main
deb http://b.test/debian bookworm-security main # trailing
deb cdrom:[Debian]/ bookworm main
";
        let found = parse_one_line(Path::new("/s.list"), text);
        assert_eq!(found.len(), 3);
        assert_eq!(found[0].uri, "http://a.test/debian");
        assert_eq!(found[0].signed_by.as_deref(), Some("/etc/k.gpg"));
        assert_eq!(found[0].components, ["main", "non-free"]);
        assert_eq!(found[1].suites, ["bookworm-security"]);
        assert_eq!(found[2].uri, "cdrom:[Debian]/");
    }

    #[test]
    fn mirror_is_the_release_itself_and_prefers_http() {
        let mut sources = parse_one_line(
            Path::new("/s.list"),
            "deb cdrom:/x/ bookworm main\ndeb http://sec.test/debian-security bookworm-security main\n",
        );
        sources.extend(parse_deb822(Path::new("/d.sources"), DEB822));
        let mirror = pick_mirror(&sources, "bookworm").unwrap();
        assert_eq!(mirror.uri, "http://mirror.test/debian");
        assert!(pick_mirror(&sources, "trixie").is_none());
        let entry = next_release_entry(mirror, "trixie", None);
        assert!(
            entry.contains("URIs: http://mirror.test/debian\n"),
            "{entry}"
        );
        assert!(entry.contains("Suites: trixie\n"), "{entry}");
        assert!(
            entry.contains("Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"),
            "{entry}"
        );
        let parsed = parse_deb822(Path::new("/ours.sources"), &entry);
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].suites, ["trixie"]);
    }

    #[test]
    fn pin_pins_only_the_package_high() {
        let pin = next_release_pin("trixie", "docker-compose");
        let stanzas = stanzas(&pin);
        assert_eq!(stanzas.len(), 2);
        let field = |i: usize, k: &str| {
            stanzas[i]
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(field(0, "Package"), "*");
        assert_eq!(field(0, "Pin-Priority"), "100");
        assert_eq!(field(1, "Package"), "docker-compose");
        assert_eq!(field(1, "Pin"), "release n=trixie");
        assert_eq!(field(1, "Pin-Priority"), "990");
    }

    #[test]
    fn os_release_and_next_release() {
        let os = OsRelease::parse("PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_CODENAME=bookworm\n").unwrap();
        assert_eq!(os.id, "debian");
        assert_eq!(os.codename, "bookworm");
        assert_eq!(next_release("bookworm"), Some("trixie"));
        assert_eq!(next_release("jammy"), None);
        assert!(OsRelease::parse("ID=debian\n").is_err());
    }

    #[test]
    fn candidate_and_major() {
        let policy =
            "docker-compose:\n  Installed: 1.29.2-3\n  Candidate: 2.26.1-4\n  Version table:\n";
        assert_eq!(parse_candidate(policy).as_deref(), Some("2.26.1-4"));
        assert_eq!(
            parse_candidate("x:\n  Installed: (none)\n  Candidate: (none)\n"),
            None
        );
        let check = |v: &str, m: Option<u32>| assert_eq!(debian_major(v), m, "{v}");
        check("2.26.1-4", Some(2));
        check("1.29.2-3", Some(1));
        check("1:1.35.0-4+deb12u1", Some(1));
        check("garbage", None);
    }
}
