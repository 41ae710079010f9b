//! Where `cargo xtask setup` keeps its run state, and the `KEY=VALUE` env files it writes; the
//! run ids and the file removal that setup, demo and teardown share.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};

/// Prefix of every name (run id, compose project, container, network, volume) the suite uses.
pub const NAME_PREFIX: &str = "monky-e2e-";
/// Label key put on containers and images that setup creates; its value is the run id.
pub const RUN_LABEL: &str = "io.monky.e2e.run";
/// Label key baked into the test images (value: the image name, e.g. `web`).
pub const IMAGE_LABEL: &str = "io.monky.e2e.image";

/// `bytes` bytes from /dev/urandom as lower-case hex (run ids, the registry secret, demo values).
pub fn random_hex(bytes: usize) -> Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("cannot read /dev/urandom")?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Removes a file or a folder tree; absent is fine.
pub fn remove_if_exists(path: &Path) -> Result<()> {
    let result = match path.symlink_metadata() {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
    };
    result.with_context(|| format!("cannot remove {}", path.display()))
}

/// The workspace root (the folder holding the top-level Cargo.toml).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The folder for run state: `$MONKY_CI_RUN_DIR`, else `<workspace>/target/ci-run`.
pub fn ci_run_dir() -> PathBuf {
    match std::env::var_os("MONKY_CI_RUN_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => workspace_root().join("target").join("ci-run"),
    }
}

/// The env file the end-to-end tests read (also exported as `MONKY_E2E_ENV` by `cargo xtask ci`).
pub fn e2e_env_path() -> PathBuf {
    ci_run_dir().join("e2e.env")
}

/// The private state file (PIDs of what setup started) that teardown reads.
pub fn state_path() -> PathBuf {
    ci_run_dir().join("state.env")
}

/// An ordered list of `KEY=VALUE` lines. Values never contain whitespace, quotes or `$`, so the
/// file is both line-parseable (split at the first `=`) and sourceable by a POSIX shell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvFile {
    entries: Vec<(String, String)>,
}

impl EnvFile {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (or replaces) `key`; refuses keys and values that would need quoting.
    pub fn set(&mut self, key: &str, value: impl Into<String>) -> Result<()> {
        let value = value.into();
        ensure!(
            !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'),
            "env key {key:?} is not an upper-case shell name"
        );
        if let Some(bad) = value
            .chars()
            .find(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '$' | '`' | '\\' | ';' | '#'))
        {
            bail!("value of {key} contains {bad:?}, which the env file format does not allow");
        }
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((key.to_owned(), value)),
        }
        Ok(())
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// All entries in insertion order.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Parses `KEY=VALUE` lines; blank lines and `#` comments are skipped.
    pub fn parse(text: &str) -> Result<Self> {
        let mut file = Self::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .with_context(|| format!("line {}: no `=` in {line:?}", n + 1))?;
            file.set(key, value)
                .with_context(|| format!("line {}", n + 1))?;
        }
        Ok(file)
    }

    /// Renders the file with `header` as leading `#` comment lines.
    pub fn render(&self, header: &str) -> String {
        let mut out = String::new();
        for line in header.lines() {
            let _ = writeln!(out, "# {line}");
        }
        for (key, value) in &self.entries {
            let _ = writeln!(out, "{key}={value}");
        }
        out
    }

    /// Reads and parses `path`; `Ok(None)` when it does not exist.
    pub fn load(path: &Path) -> Result<Option<Self>> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text)
                .map(Some)
                .with_context(|| format!("cannot parse {}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Writes the file atomically (temp file + rename) with mode 0600: it may hold a password.
    pub fn save(&self, path: &Path, header: &str) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, self.render(header))
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot chmod {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot rename {} into place", tmp.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_replaces() {
        let mut file = EnvFile::new();
        file.set("A_B", "1").unwrap();
        file.set("C", "127.0.0.1:5000/monky/web:1").unwrap();
        file.set("A_B", "2").unwrap();
        let text = file.render("hello\nworld");
        assert_eq!(
            text,
            "# hello\n# world\nA_B=2\nC=127.0.0.1:5000/monky/web:1\n"
        );
        assert_eq!(EnvFile::parse(&text).unwrap(), file);
        assert_eq!(file.get("A_B"), Some("2"));
        assert_eq!(file.get("D"), None);
    }

    #[test]
    fn refuses_values_that_need_quoting() {
        let check = |key: &str, value: &str, ok: bool| {
            assert_eq!(EnvFile::new().set(key, value).is_ok(), ok, "{key}={value}");
        };
        check("OK", "a-b_c.d/e:f@g,h=i", true);
        check("OK", "", true);
        check("SPACE", "docker compose", false);
        check("QUOTE", "it's", false);
        check("DOLLAR", "$HOME", false);
        check("lower", "x", false);
        check("", "x", false);
    }

    #[test]
    fn parse_reports_the_bad_line() {
        let err = EnvFile::parse("# c\n\nA=1\nnot a pair\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 4"), "{err:#}");
    }

    #[test]
    fn save_then_load() {
        let dir = std::env::temp_dir().join(format!("xtask-state-test-{}", std::process::id()));
        let path = dir.join("x.env");
        let mut file = EnvFile::new();
        file.set("K", "v").unwrap();
        file.save(&path, "h").unwrap();
        assert_eq!(EnvFile::load(&path).unwrap(), Some(file));
        assert_eq!(EnvFile::load(&dir.join("missing.env")).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
