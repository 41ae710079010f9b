//! The agent's state dir on disk: the one place that opens it and the one place that names
//! anything below it.
//!
//! ```text
//! <state_dir>/ (0700)          lock, state.json, bao.token, release.key, hold, docker/
//!   <env_id>/                  releases/<sha>/, staging/, env-digests/<sha>, failed/,
//!                              current -> releases/<sha>, applying
//! ```
//!
//! A [`Layout`] holds the state dir's fd, opened once per tick (or command) with the
//! StrictModes checks of `fsx::Dir::state_root`; every other module asks it for a
//! `fsx::Dir` or a file and so never builds a path below the state dir, and every directory
//! below it is opened from its parent's fd without following a link. The read-only commands
//! (status, explain, doctor, the metrics file) use [`Layout::peek`], which creates nothing and
//! reads what it can.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::Context;
use monky_agent_proto::Sha;

use crate::config::Config;
use crate::fsx::{self, Dir};

/// The record of the images this env pulled itself, in the env's dir.
const PULLED_IMAGES: &str = "pulled-images";
/// The most image IDs [`Layout::record_pulled_images`] keeps: releases kept times services.
const MAX_PULLED_IMAGES: usize = 512;
const MAX_PULLED_IMAGES_BYTES: u64 = 64 * 1024;

const LOCK: &str = "lock";
const STATE: &str = "state.json";
const TOKEN: &str = "bao.token";
const RELEASE_KEY: &str = "release.key";
const HOLD: &str = "hold";
const LISTENERS: &str = "listeners";
const DOCKER: &str = "docker";
const DOCKER_CONFIG_JSON: &str = "config.json";
/// The registry credential at rest, beside `config.json` in `docker/` but not read by the docker
/// CLI: it is copied into `config.json` only for a pull from a registry proven the box's.
const CREDENTIAL_JSON: &str = "credential.json";
/// The largest credential file read back.
const MAX_CREDENTIAL_BYTES: u64 = 64 * 1024;
const RELEASES: &str = "releases";
const STAGING: &str = "staging";
const DIGESTS: &str = "env-digests";
const FAILED: &str = "failed";
const CURRENT: &str = "current";
const APPLYING: &str = "applying";
const CHILDREN: &str = "children";

/// The largest token file read back.
const MAX_TOKEN_BYTES: u64 = 64 * 1024;
/// The largest key file read back.
const MAX_KEY_BYTES: u64 = 1024;

/// The docker CLI's config dir (`DOCKER_CONFIG`), a path because the docker CLI needs one.
pub(crate) fn docker_config_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(DOCKER)
}

/// The docker CLI's `config.json` (the stored registry credential), a path for `doctor`'s look.
pub(crate) fn docker_config_json(state_dir: &Path) -> PathBuf {
    docker_config_dir(state_dir).join(DOCKER_CONFIG_JSON)
}

/// The registry credential at rest (`docker/credential.json`), a path for `doctor`'s look.
pub(crate) fn credential_json(state_dir: &Path) -> PathBuf {
    docker_config_dir(state_dir).join(CREDENTIAL_JSON)
}

/// The env's directory (`<state_dir>/<env_id>`), a path for messages and the original agent's
/// takeover.
pub(crate) fn env_path(state_dir: &Path, env_id: &str) -> PathBuf {
    state_dir.join(env_id)
}

/// The state dir of one env, held open.
#[derive(Debug)]
pub(crate) struct Layout {
    /// `None` only for a read-only open of a state dir that cannot be opened: every read then
    /// finds nothing, every write fails.
    root: Option<Dir>,
    path: PathBuf,
    env_id: String,
}

impl Layout {
    /// Opens the config's state dir (created 0700 if missing) and checks it as sshd's
    /// StrictModes would; refused with `STATE_DIR_UNSAFE` otherwise. For the tick and the
    /// commands that write.
    pub(crate) fn open(cfg: &Config) -> anyhow::Result<Self> {
        Self::open_at(&cfg.state_dir, &cfg.env_id)
    }

    /// As [`Layout::open`], for a state dir and env given apart from a config.
    pub(crate) fn open_at(state_dir: &Path, env_id: &str) -> anyhow::Result<Self> {
        Ok(Self {
            root: Some(Dir::state_root(state_dir)?),
            path: state_dir.to_path_buf(),
            env_id: env_id.to_string(),
        })
    }

    /// Opens the config's state dir for reading only: nothing is created, a dir that cannot
    /// be opened reads as empty.
    pub(crate) fn peek(cfg: &Config) -> Self {
        Self::peek_at(&cfg.state_dir, &cfg.env_id)
    }

    /// As [`Layout::peek`], for a state dir and env given apart from a config.
    pub(crate) fn peek_at(state_dir: &Path, env_id: &str) -> Self {
        Self {
            root: Dir::open_read_only(state_dir).ok(),
            path: state_dir.to_path_buf(),
            env_id: env_id.to_string(),
        }
    }

    /// A second handle on the same directory (the tick deadline's thread keeps one).
    pub(crate) fn try_clone(&self) -> anyhow::Result<Self> {
        let root = match &self.root {
            Some(r) => Some(r.try_clone()?),
            None => None,
        };
        Ok(Self {
            root,
            path: self.path.clone(),
            env_id: self.env_id.clone(),
        })
    }

    /// The state dir's path, for messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The env this layout is for.
    pub(crate) fn env_id(&self) -> &str {
        &self.env_id
    }

    fn root(&self) -> anyhow::Result<&Dir> {
        self.root
            .as_ref()
            .with_context(|| format!("cannot open {}", self.path.display()))
    }

    /// Reads a file below `dir` for a read-only command: `None` when missing or not a bounded
    /// regular file.
    fn peek_in(dir: Option<&Dir>, name: &str, max: u64) -> Option<Vec<u8>> {
        dir?.read(name, max).ok()
    }

    // ---- the state dir's own files -----------------------------------------------------------

    /// Takes the tick's lock (`flock` on `lock`); `None` when another tick holds it.
    pub(crate) fn lock(&self) -> anyhow::Result<Option<File>> {
        let root = self.root()?;
        let f = root.open_plain(LOCK, 0o600)?;
        match f.try_lock() {
            Ok(()) => Ok(Some(f)),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(e).with_context(|| format!("cannot lock {}", root.join(LOCK).display()))
            }
        }
    }

    /// `state.json`'s path, for messages.
    pub(crate) fn state_path(&self) -> PathBuf {
        self.path.join(STATE)
    }

    /// `state.json`, for the tick: `None` when missing, an error when it is not a bounded
    /// regular file.
    pub(crate) fn read_state(&self) -> anyhow::Result<Option<Vec<u8>>> {
        self.root()?.read_file(STATE, fsx::MAX_STATE_FILE_BYTES)
    }

    /// `state.json`, for a read-only command: `None` when it cannot be read.
    pub(crate) fn peek_state(&self) -> Option<Vec<u8>> {
        Self::peek_in(self.root.as_ref(), STATE, fsx::MAX_STATE_FILE_BYTES)
    }

    /// Writes `state.json` atomically, 0600.
    pub(crate) fn write_state(&self, bytes: &[u8]) -> anyhow::Result<()> {
        self.root()?.write_atomic(STATE, bytes, 0o600)
    }

    /// Moves `state.json` aside as `state.json.bad.<stamp>`; returns the new path.
    pub(crate) fn set_state_aside(&self, stamp: u64) -> anyhow::Result<PathBuf> {
        let root = self.root()?;
        let aside = format!("{STATE}.bad.{stamp}");
        root.rename_to(STATE, root, &aside)
            .with_context(|| format!("cannot move {} aside", self.state_path().display()))?;
        Ok(root.join(aside))
    }

    /// `bao.token`'s path, for messages.
    pub(crate) fn token_path(&self) -> PathBuf {
        self.path.join(TOKEN)
    }

    /// The stored OpenBao token's bytes, for the tick.
    pub(crate) fn read_token(&self) -> anyhow::Result<Option<zeroize::Zeroizing<Vec<u8>>>> {
        Ok(self
            .root()?
            .read_file(TOKEN, MAX_TOKEN_BYTES)?
            .map(zeroize::Zeroizing::new))
    }

    /// The stored token's bytes, for a read-only command (doctor's lookup).
    pub(crate) fn peek_token(&self) -> Option<zeroize::Zeroizing<Vec<u8>>> {
        Self::peek_in(self.root.as_ref(), TOKEN, MAX_TOKEN_BYTES).map(zeroize::Zeroizing::new)
    }

    /// Whether anything is stored under the token's name (a link counts: it is no token, but
    /// something is there).
    pub(crate) fn has_token(&self) -> bool {
        self.root.as_ref().is_some_and(|r| r.has(TOKEN))
    }

    /// Stores the token atomically, 0600.
    pub(crate) fn write_token(&self, token: &[u8]) -> anyhow::Result<()> {
        self.root()?.write_atomic(TOKEN, token, 0o600)
    }

    /// Removes the stored token.
    pub(crate) fn remove_token(&self) -> anyhow::Result<()> {
        self.root()?.remove_file(TOKEN)
    }

    /// The listeners judged the box's before (`peers::Listeners`), leniently: `None` when
    /// missing or not a small regular file.
    pub(crate) fn peek_listeners(&self) -> Option<Vec<u8>> {
        Self::peek_in(self.root.as_ref(), LISTENERS, 4096)
    }

    /// Writes the listeners' memory atomically, 0600.
    pub(crate) fn write_listeners(&self, bytes: &[u8]) -> anyhow::Result<()> {
        self.root()?.write_atomic(LISTENERS, bytes, 0o600)
    }

    /// The box-local key of the `.env` digests; `None` when missing.
    pub(crate) fn read_release_key(&self) -> anyhow::Result<Option<zeroize::Zeroizing<Vec<u8>>>> {
        Ok(self
            .root()?
            .read_file(RELEASE_KEY, MAX_KEY_BYTES)?
            .map(zeroize::Zeroizing::new))
    }

    /// Stores the box-local key, 0600.
    pub(crate) fn write_release_key(&self, key: &[u8]) -> anyhow::Result<()> {
        self.root()?.write_atomic(RELEASE_KEY, key, 0o600)
    }

    /// The hold file's path, for messages.
    pub(crate) fn hold_path(&self) -> PathBuf {
        self.path.join(HOLD)
    }

    /// The hold file, for the tick and the hold commands.
    pub(crate) fn read_hold(&self, max: u64) -> anyhow::Result<Option<Vec<u8>>> {
        self.root()?.read_file(HOLD, max)
    }

    /// The hold file, for a read-only command.
    pub(crate) fn peek_hold(&self, max: u64) -> Option<Vec<u8>> {
        Self::peek_in(self.root.as_ref(), HOLD, max)
    }

    /// Writes the hold file atomically, 0600.
    pub(crate) fn write_hold(&self, bytes: &[u8]) -> anyhow::Result<()> {
        self.root()?.write_atomic(HOLD, bytes, 0o600)
    }

    /// Removes the hold file.
    pub(crate) fn remove_hold(&self) -> anyhow::Result<()> {
        self.root()?.remove_file(HOLD)
    }

    /// The docker CLI's config dir (0700, created if missing).
    pub(crate) fn docker(&self) -> anyhow::Result<Dir> {
        self.root()?.ensure_sub(DOCKER, 0o700)
    }

    /// Stores the docker CLI's `config.json` (the registry credential), 0600 in `docker/`.
    pub(crate) fn write_docker_config(&self, json: &[u8]) -> anyhow::Result<()> {
        self.docker()?.write_atomic(DOCKER_CONFIG_JSON, json, 0o600)
    }

    /// Removes the docker CLI's `config.json`, so no later docker command hands a credential to
    /// dockerd.
    pub(crate) fn remove_docker_config(&self) -> anyhow::Result<()> {
        let docker = self.docker()?;
        if docker.has(DOCKER_CONFIG_JSON) {
            docker.remove_file(DOCKER_CONFIG_JSON)?;
        }
        Ok(())
    }

    /// The docker CLI's `config.json`, when there is one.
    pub(crate) fn read_docker_config(&self) -> anyhow::Result<Option<zeroize::Zeroizing<Vec<u8>>>> {
        Ok(self
            .docker()?
            .read_file(DOCKER_CONFIG_JSON, MAX_CREDENTIAL_BYTES)?
            .map(zeroize::Zeroizing::new))
    }

    /// Stores the registry credential at rest (the `config.json` it becomes), 0600 in
    /// `docker/`, where the docker CLI does not read it.
    pub(crate) fn write_credential(&self, json: &[u8]) -> anyhow::Result<()> {
        self.docker()?.write_atomic(CREDENTIAL_JSON, json, 0o600)
    }

    /// The registry credential at rest, when there is one.
    pub(crate) fn read_credential(&self) -> anyhow::Result<Option<zeroize::Zeroizing<Vec<u8>>>> {
        Ok(self
            .docker()?
            .read_file(CREDENTIAL_JSON, MAX_CREDENTIAL_BYTES)?
            .map(zeroize::Zeroizing::new))
    }

    /// Checks that `doctor` can write the state dir: a probe file written and removed.
    pub(crate) fn probe_writable(&self) -> anyhow::Result<()> {
        let root = self.root()?;
        root.write_atomic(".doctor-probe", b"", 0o600)?;
        root.remove_file(".doctor-probe")
    }

    /// Names directly in the state dir that the agent would refuse as links it did not make
    /// (`docker/` and the env's dir), for `doctor`.
    pub(crate) fn planted_links(&self) -> Vec<PathBuf> {
        let Some(root) = &self.root else {
            return Vec::new();
        };
        [DOCKER, self.env_id.as_str()]
            .into_iter()
            .filter(|n| root.read_link(n).is_some())
            .map(|n| root.join(n))
            .collect()
    }

    /// Removes the temp files a killed process left in the state dir and `docker/`.
    pub(crate) fn remove_temp_files(&self) {
        let Some(root) = &self.root else { return };
        root.remove_temp_files();
        if let Ok(Some(docker)) = root.sub(DOCKER) {
            docker.remove_temp_files();
        }
    }

    // ---- the env's directory -----------------------------------------------------------------

    /// The env's directory's path, for messages.
    pub(crate) fn env_path(&self) -> PathBuf {
        env_path(&self.path, &self.env_id)
    }

    /// The env's directory (0700, created if missing).
    pub(crate) fn env(&self) -> anyhow::Result<Dir> {
        self.root()?.ensure_sub(&self.env_id, 0o700)
    }

    /// The env's directory when it exists.
    pub(crate) fn env_if_any(&self) -> anyhow::Result<Option<Dir>> {
        match &self.root {
            Some(root) => root.sub(&self.env_id),
            None => Ok(None),
        }
    }

    /// The IDs of the images this env pulled itself (`<env>/pulled-images`, one ID per line),
    /// empty when there is no record yet or it cannot be read: an image not in it is pulled
    /// again before it runs.
    pub(crate) fn pulled_images(&self) -> std::collections::BTreeSet<String> {
        let Ok(Some(env)) = self.env_if_any() else {
            return std::collections::BTreeSet::new();
        };
        env.read(PULLED_IMAGES, MAX_PULLED_IMAGES_BYTES)
            .ok()
            .map(|bytes| {
                String::from_utf8_lossy(&bytes)
                    .lines()
                    .filter(|l| l.starts_with("sha256:"))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Adds `ids` to the record of [`Layout::pulled_images`], newest last, keeping the newest
    /// 512.
    pub(crate) fn record_pulled_images(&self, ids: &[String]) -> anyhow::Result<()> {
        let env = self.env()?;
        let old = env
            .read(PULLED_IMAGES, MAX_PULLED_IMAGES_BYTES)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let mut kept: Vec<&str> = old
            .lines()
            .filter(|l| l.starts_with("sha256:") && !ids.iter().any(|i| i == l))
            .collect();
        kept.extend(ids.iter().map(String::as_str));
        let skip = kept.len().saturating_sub(MAX_PULLED_IMAGES);
        let text: String = kept[skip..].iter().map(|l| format!("{l}\n")).collect();
        env.write_atomic(PULLED_IMAGES, text.as_bytes(), 0o600)
    }

    fn env_sub(&self, name: &str) -> anyhow::Result<Dir> {
        self.env()?.ensure_sub(name, 0o700)
    }

    fn env_sub_if_any(&self, name: &str) -> anyhow::Result<Option<Dir>> {
        match self.env_if_any()? {
            Some(env) => env.sub(name),
            None => Ok(None),
        }
    }

    /// `releases/`'s path, for messages.
    pub(crate) fn releases_path(&self) -> PathBuf {
        self.env_path().join(RELEASES)
    }

    /// `releases/` (created if missing).
    pub(crate) fn releases(&self) -> anyhow::Result<Dir> {
        self.env_sub(RELEASES)
    }

    /// `releases/` when it exists.
    pub(crate) fn releases_if_any(&self) -> anyhow::Result<Option<Dir>> {
        self.env_sub_if_any(RELEASES)
    }

    /// `staging/` (created if missing).
    pub(crate) fn staging(&self) -> anyhow::Result<Dir> {
        self.env_sub(STAGING)
    }

    /// `children/`: the process groups of the docker and compose calls running now, one file
    /// each, so the tick after a killed one ends what it left running before its own calls.
    pub fn children(&self) -> anyhow::Result<Dir> {
        self.env_sub(CHILDREN)
    }

    /// `staging/` when it exists.
    pub(crate) fn staging_if_any(&self) -> anyhow::Result<Option<Dir>> {
        self.env_sub_if_any(STAGING)
    }

    /// Removes `staging/` and everything in it, without following a link.
    pub(crate) fn remove_staging(&self) -> anyhow::Result<()> {
        match self.env_if_any()? {
            Some(env) => env.remove_tree(STAGING),
            None => Ok(()),
        }
    }

    /// `env-digests/` (created if missing).
    pub(crate) fn digests(&self) -> anyhow::Result<Dir> {
        self.env_sub(DIGESTS)
    }

    /// `env-digests/` when it exists.
    pub(crate) fn digests_if_any(&self) -> anyhow::Result<Option<Dir>> {
        self.env_sub_if_any(DIGESTS)
    }

    /// `failed/`'s path, for messages.
    pub(crate) fn failed_path(&self) -> PathBuf {
        self.env_path().join(FAILED)
    }

    /// `failed/` (created if missing).
    pub(crate) fn failed(&self) -> anyhow::Result<Dir> {
        self.env_sub(FAILED)
    }

    /// `failed/` when it exists (and, for a read-only command, can be opened).
    pub(crate) fn failed_if_any(&self) -> Option<Dir> {
        self.env_sub_if_any(FAILED).ok().flatten()
    }

    /// `current`'s path: what compose is given as a running release's directory.
    pub(crate) fn current_path(&self) -> PathBuf {
        self.env_path().join(CURRENT)
    }

    /// Where `current` points, when it is a link.
    pub(crate) fn current_target(&self) -> anyhow::Result<Option<PathBuf>> {
        Ok(self.env_if_any()?.and_then(|env| env.read_link(CURRENT)))
    }

    /// Points `current` at `releases/<sha>` atomically.
    pub(crate) fn point_current(&self, sha: &Sha) -> anyhow::Result<()> {
        self.env()?
            .swap_symlink(&Path::new(RELEASES).join(sha.as_str()), CURRENT)
    }

    /// The release name a `current` target names when it is the agent's own link
    /// (`releases/<name>`), not yet checked as a sha.
    pub(crate) fn release_of_target(target: &Path) -> Option<&str> {
        target.strip_prefix(RELEASES).ok().and_then(|s| s.to_str())
    }

    /// Removes `current` (a retire); the releases stay.
    pub(crate) fn remove_current(&self) -> anyhow::Result<()> {
        if let Some(env) = self.env_if_any()?
            && env.read_link(CURRENT).is_some()
        {
            env.remove_file(CURRENT)?;
            env.sync()?;
        }
        Ok(())
    }

    /// Removes the temp files a killed process left in the env's directory and below.
    pub(crate) fn remove_env_temp_files(&self) {
        let Ok(Some(env)) = self.env_if_any() else {
            return;
        };
        env.remove_temp_files();
        for sub in [DIGESTS, RELEASES] {
            if let Ok(Some(d)) = env.sub(sub) {
                d.remove_temp_files();
            }
        }
        if let Ok(Some(releases)) = env.sub(RELEASES) {
            for (name, _) in releases.entries().unwrap_or_default() {
                if let Ok(Some(r)) = releases.sub(&name) {
                    r.remove_temp_files();
                }
            }
        }
    }

    /// The apply mark (`applying`), for the tick.
    pub(crate) fn read_mark(&self, max: u64) -> anyhow::Result<Option<Vec<u8>>> {
        self.env()?.read_file(APPLYING, max)
    }

    /// The apply mark, for a read-only command.
    pub(crate) fn peek_mark(&self, max: u64) -> Option<Vec<u8>> {
        Self::peek_in(self.env_if_any().ok().flatten().as_ref(), APPLYING, max)
    }

    /// Writes the apply mark atomically, 0600.
    pub(crate) fn write_mark(&self, bytes: &[u8]) -> anyhow::Result<()> {
        self.env()?.write_atomic(APPLYING, bytes, 0o600)
    }

    /// Removes the apply mark.
    pub(crate) fn clear_mark(&self) -> anyhow::Result<()> {
        self.env()?.remove_file(APPLYING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_only_open_creates_nothing_and_reads_what_is_there() {
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("state");
        let peek = Layout::peek_at(&state, "e1");
        assert!(peek.peek_state().is_none());
        assert!(!peek.has_token());
        assert!(
            peek.write_state(b"{}").is_err(),
            "a read-only open of nothing writes nothing"
        );
        assert!(!state.exists());

        let layout = Layout::open_at(&state, "e1").unwrap();
        layout.write_state(b"{}").unwrap();
        layout.write_token(b"t").unwrap();
        layout.write_mark(b"m").unwrap();
        let peek = Layout::peek_at(&state, "e1");
        assert_eq!(peek.peek_state().unwrap(), b"{}");
        assert!(peek.has_token());
        assert_eq!(peek.peek_mark(16).unwrap(), b"m");
        assert!(peek.failed_if_any().is_none());
    }

    #[test]
    fn current_names_a_release_below_releases() {
        let t = tempfile::tempdir().unwrap();
        let layout = Layout::open_at(&t.path().join("state"), "e1").unwrap();
        assert!(layout.current_target().unwrap().is_none());
        let sha = Sha::parse(&"abcd".repeat(16)).unwrap();
        layout
            .releases()
            .unwrap()
            .ensure_sub(sha.as_str(), 0o700)
            .unwrap();
        layout.point_current(&sha).unwrap();
        let target = layout.current_target().unwrap().unwrap();
        assert_eq!(Layout::release_of_target(&target), Some(sha.as_str()));
        assert_eq!(Layout::release_of_target(Path::new("/tmp/abc")), None);
        layout.remove_current().unwrap();
        assert!(layout.current_target().unwrap().is_none());
    }
}
