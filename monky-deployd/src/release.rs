//! Releases on disk: staging, promotion to `releases/<sha>`, the `current` symlink, pruning.
//!
//! Layout under `<state_dir>/<env_id>/`: `staging/<sha>.<pid>/` while a release is written,
//! `releases/<sha>/` once complete (bundle files + `.env`, 0600), and `current -> releases/<sha>`.
//! Every step is a rename, so a crash leaves `current` naming a complete release.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use monky_bundle as bundle;
use monky_compose as compose;
use secrecy::{ExposeSecret, SecretString};

use crate::config::Config;
use crate::fsx;

const ENV_FILE: &str = ".env";

/// A complete release directory (staged or promoted).
#[derive(Debug)]
pub struct Release {
    dir: PathBuf,
    compose_file: String,
}

impl Release {
    /// Opens a release directory if it holds a compose file.
    pub fn open(dir: &Path) -> Option<Self> {
        ["docker-compose.yml", "compose.yaml"]
            .into_iter()
            .find(|f| dir.join(f).is_file())
            .map(|f| Self {
                dir: dir.to_path_buf(),
                compose_file: f.to_string(),
            })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The compose project for this release. Every compose call on a release goes through
    /// here, so this is where the release's secrets become known to the redactor, also when
    /// this process did not read them (a retire or a fallback to an older release).
    pub fn compose(&self, docker: &compose::Docker, cfg: &Config) -> compose::Compose {
        self.register_secrets();
        docker.compose(
            &cfg.compose_project,
            &self.dir,
            &self.dir.join(&self.compose_file),
            &self.dir.join(ENV_FILE),
        )
    }
}

impl Release {
    /// Registers with the redactor the values of `.env` that came from the manifest's secrets.
    fn register_secrets(&self) {
        for (_, value) in self.secrets() {
            crate::redact::register(value.expose_secret());
        }
    }

    /// The values of `.env` that came from the manifest's secrets, by `.env` key.
    pub fn secrets(&self) -> Vec<(String, SecretString)> {
        let read = |name: &str| fs::read(self.dir.join(name)).ok();
        let (Some(manifest), Some(template), Some(env)) = (
            read(bundle::MemberName::SECRETS_MANIFEST.as_str()),
            read(bundle::MemberName::ENV_TEMPLATE.as_str()),
            read(ENV_FILE).map(zeroize::Zeroizing::new),
        ) else {
            return Vec::new();
        };
        let Ok(manifest) = bundle::Manifest::parse(&manifest) else {
            return Vec::new();
        };
        let vars = manifest.env_entries().map(|e| e.var.clone()).collect();
        let env = String::from_utf8_lossy(&env);
        bundle::secret_entries(&String::from_utf8_lossy(&template), &env, &vars)
    }
}

/// `<state_dir>/<env_id>/current`.
pub fn current_dir(cfg: &Config) -> PathBuf {
    cfg.env_dir().join("current")
}

fn releases_dir(cfg: &Config) -> PathBuf {
    cfg.env_dir().join("releases")
}

fn staging_dir(cfg: &Config) -> PathBuf {
    cfg.env_dir().join("staging")
}

/// Writes the bundle's files and the rendered `.env` (0600) into a fresh staging directory.
pub fn stage(cfg: &Config, b: &bundle::Bundle, env: &SecretString) -> anyhow::Result<Release> {
    fsx::private_dir(&cfg.env_dir(), 0o700)?;
    fsx::private_dir(&staging_dir(cfg), 0o700)?;
    let dir = staging_dir(cfg).join(format!("{}.{}", b.sha(), std::process::id()));
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    fsx::private_dir(&dir, 0o700)?;
    write_files(&dir, b, env)?;
    Release::open(&dir).context("staged release has no compose file")
}

fn write_files(dir: &Path, b: &bundle::Bundle, env: &SecretString) -> anyhow::Result<()> {
    for (name, bytes) in b.files() {
        fsx::atomic_write(&dir.join(name.as_str()), bytes, 0o600)?;
    }
    fsx::atomic_write(&dir.join(ENV_FILE), env.expose_secret().as_bytes(), 0o600)
}

/// Makes a staged release `releases/<sha>` and points `current` at it.
///
/// When `releases/<sha>` already exists (a retry of the same sha), its files are replaced one
/// atomic write at a time instead, so the directory `current` may name is never missing.
pub fn promote(cfg: &Config, staged: Release, sha: &str) -> anyhow::Result<Release> {
    let releases = releases_dir(cfg);
    fsx::private_dir(&releases, 0o700)?;
    let target = releases.join(sha);
    if target.is_dir() {
        for entry in fs::read_dir(staged.dir())? {
            let entry = entry?;
            let bytes = fs::read(entry.path())?;
            fsx::atomic_write(&target.join(entry.file_name()), &bytes, 0o600)?;
        }
        fs::remove_dir_all(staged.dir())?;
    } else {
        fs::rename(staged.dir(), &target)
            .with_context(|| format!("cannot promote to {}", target.display()))?;
        fsx::sync_dir(&releases)?;
    }
    crate::failpoint::hit("before-swap");
    fsx::swap_symlink(&Path::new("releases").join(sha), &current_dir(cfg))?;
    Release::open(&current_dir(cfg)).context("promoted release has no compose file")
}

/// Points `current` at an existing `releases/<sha>` (a fallback).
pub fn point_current(cfg: &Config, sha: &str) -> anyhow::Result<Release> {
    let dir = releases_dir(cfg).join(sha);
    Release::open(&dir)
        .with_context(|| format!("release {} is no longer on disk", dir.display()))?;
    fsx::swap_symlink(&Path::new("releases").join(sha), &current_dir(cfg))?;
    Release::open(&current_dir(cfg)).context("current has no compose file")
}

/// Removes `current` after a retire; the releases stay on disk.
pub fn clear_current(cfg: &Config) -> anyhow::Result<()> {
    match fs::remove_file(current_dir(cfg)) {
        Ok(()) => fsx::sync_dir(&cfg.env_dir()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).context("cannot remove current"),
    }
}

/// Removes staging leftovers and temp files (after every tick, and so after a crash).
pub fn clean_staging(cfg: &Config) {
    let _ = fs::remove_dir_all(staging_dir(cfg));
    fsx::remove_temp_files(&cfg.env_dir());
    fsx::remove_temp_files(&cfg.state_dir);
    if let Ok(entries) = fs::read_dir(releases_dir(cfg)) {
        for e in entries.flatten() {
            fsx::remove_temp_files(&e.path());
        }
    }
}

/// Keeps the newest `keep` releases (and always the current one).
pub fn prune(cfg: &Config, keep: usize) {
    let current = fs::read_link(current_dir(cfg)).ok();
    let Ok(entries) = fs::read_dir(releases_dir(cfg)) else {
        return;
    };
    let mut all: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    all.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, path) in all.into_iter().skip(keep) {
        let is_current = current
            .as_ref()
            .is_some_and(|c| path.file_name() == c.file_name());
        if !is_current {
            tracing::info!("pruning release {}", path.display());
            let _ = fs::remove_dir_all(&path);
        }
    }
}
