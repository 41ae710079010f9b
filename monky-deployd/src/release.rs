//! Releases on disk: staging, promotion to `releases/<sha>`, the `current` symlink, pruning.
//!
//! Layout under `<state_dir>/<env_id>/`: `staging/<sha>.<pid>/` while a release is written,
//! `releases/<sha>/` once complete (bundle files + `.env`, 0600), and `current -> releases/<sha>`.
//! Every step is a rename, so a crash leaves `current` naming a complete release.
//!
//! Every directory is opened from its parent's fd without following links, starting from the
//! state dir's fd that [`Layout`] holds; a [`Release`] keeps its own directory's fd, and the
//! release `current` names is opened from `releases/` by the sha the link names, never through
//! the link. Only compose is given a path. A release is checked before any compose command
//! that starts or stops it
//! ([`verify`]): its members must still hash to its sha and its `.env` must match the keyed
//! digest recorded when the agent wrote it (`<env_id>/env-digests/<sha>`, HMAC-SHA256 under
//! the box-local key `<state_dir>/release.key`), because a container that binds its own
//! release dir can rewrite both.

use std::path::{Path, PathBuf};

use anyhow::Context;
use hmac::{Hmac, Mac};
use monky_agent_proto::Sha;
use monky_bundle as bundle;
use monky_compose as compose;
use secrecy::{ExposeSecret, SecretString};

use crate::code::Code;
use crate::config::Config;
use crate::exit::Failure;
use crate::fsx::{self, Dir};
use crate::layout::Layout;

/// The rendered `.env` in a release dir (not a bundle member: the agent writes it).
pub(crate) const ENV_FILE: &str = ".env";

/// More entries than this in a release dir is not a release any more (nor worth listing).
const MAX_RELEASE_ENTRIES: usize = 4096;

/// The largest `.env` read back: the template's member cap plus the values' cap, escaped.
const MAX_ENV_BYTES: u64 = 16 * 1024 * 1024;

/// The largest recorded digest read back (64 hex digits).
const MAX_DIGEST_BYTES: u64 = 1024;

/// A complete release directory (staged or promoted), held open: every file of it is read
/// and written through its fd, which was opened from its parent's without following a link.
/// Only compose is given a path ([`Release::dir`]), as the docker CLI needs one.
#[derive(Debug)]
pub(crate) struct Release {
    fd: Dir,
    /// What compose is given as the project's directory: `<env>/current` for the release
    /// reached through `current` (what compose has always been given for the running
    /// release, so its containers' configuration does not change), else the dir's own path.
    path: PathBuf,
    compose_file: bundle::MemberName,
    /// The sha the release is of: the one it was staged, promoted or opened as.
    sha: Sha,
    /// The keyed digest of its `.env`: the one this process wrote into a staged release, or
    /// the one recorded for `releases/<sha>`.
    env_digest: Option<String>,
}

impl Release {
    /// A release of `sha` in `fd`, if it holds a compose file (a regular file, not a link).
    fn of(fd: Dir, path: PathBuf, sha: &Sha, env_digest: Option<String>) -> Option<Self> {
        let compose_file = bundle::MemberName::COMPOSE_FILES
            .into_iter()
            .find(|f| fd.has_file(f.as_str()))?;
        Some(Self {
            fd,
            path,
            compose_file,
            sha: sha.clone(),
            env_digest,
        })
    }

    /// `releases/<sha>` with the digest recorded for its `.env`; `None` when it is not there
    /// or holds no compose file.
    fn promoted(layout: &Layout, sha: &Sha, path: PathBuf) -> anyhow::Result<Option<Self>> {
        let Some(fd) = layout
            .releases_if_any()?
            .map(|r| r.sub(sha.as_str()))
            .transpose()?
            .flatten()
        else {
            return Ok(None);
        };
        let digest = layout
            .digests_if_any()?
            .and_then(|d| d.read(sha.as_str(), MAX_DIGEST_BYTES).ok())
            .and_then(|b| String::from_utf8(b).ok());
        Ok(Self::of(fd, path, sha, digest))
    }

    /// The release `current` names, opened from `releases/` by the sha the link names (never
    /// through the link); `None` when there is none or it holds no compose file.
    pub(crate) fn current(layout: &Layout) -> anyhow::Result<Option<Self>> {
        match current_sha(layout)? {
            Some(sha) => Self::promoted(layout, &sha, layout.current_path()),
            None => Ok(None),
        }
    }

    /// The release's sha.
    pub(crate) fn sha(&self) -> &Sha {
        &self.sha
    }

    /// The directory compose is given.
    pub(crate) fn dir(&self) -> &Path {
        &self.path
    }

    /// The compose file's text.
    pub(crate) fn compose_yaml(&self) -> anyhow::Result<String> {
        let name = self.compose_file.as_str();
        let bytes = self
            .fd
            .read(name, MAX_ENV_BYTES)
            .map_err(|p| anyhow::anyhow!("cannot read {}: {p}", self.fd.join(name).display()))?;
        String::from_utf8(bytes)
            .with_context(|| format!("{} is not UTF-8", self.fd.join(name).display()))
    }

    fn meta(&self) -> Option<bundle::BundleMeta> {
        self.fd
            .read(bundle::MemberName::BUNDLE_JSON.as_str(), MAX_ENV_BYTES)
            .ok()
            .and_then(|b| bundle::BundleMeta::parse(&b).ok())
    }

    /// The `.env` keys built from the manifest's secrets (names only; `.env` is not read).
    pub(crate) fn secret_keys(&self) -> std::collections::BTreeSet<String> {
        let read = |name: &str| self.fd.read(name, MAX_ENV_BYTES).ok();
        let (Some(manifest), Some(template)) = (
            read(bundle::MemberName::SECRETS_MANIFEST.as_str()),
            read(bundle::MemberName::ENV_TEMPLATE.as_str()),
        ) else {
            return std::collections::BTreeSet::new();
        };
        let Ok(manifest) = bundle::Manifest::parse(&manifest) else {
            return std::collections::BTreeSet::new();
        };
        let vars = manifest.env_entries().map(|e| e.var.clone()).collect();
        bundle::secret_keys(&String::from_utf8_lossy(&template), &vars)
    }

    /// The release's `allow_privileged` (false when its `bundle.json` cannot be read).
    pub(crate) fn allow_privileged(&self) -> bool {
        self.meta().is_some_and(|m| m.allow_privileged)
    }

    /// The release's `address` (bundle.json's), the host its routing labels may name; none
    /// when its `bundle.json` cannot be read.
    pub fn address(&self) -> Option<String> {
        self.meta().map(|m| m.address)
    }

    /// Whether the release's `bundle.json` says prod (false when it cannot be read).
    pub(crate) fn is_prod(&self) -> bool {
        self.meta().is_some_and(|m| m.is_prod())
    }

    /// The compose project for this release. Every compose call on a release goes through
    /// here, so this is where the release's secrets become known to the redactor, also when
    /// this process did not read them (a retire or a fallback to an older release): once per
    /// release and `.env` in the process ([`crate::redact::register_release`]).
    ///
    /// The agent's budget override ([`bundle::budget::OVERRIDE_FILE`]), when the release has
    /// one, is merged over the compose file on every call, so `up`, `ps` and `down` see the
    /// same project compose's model showed.
    ///
    /// compose reads the agent's plain rewrite of the compose file
    /// ([`bundle::PLAIN_COMPOSE_FILE`], written by [`Release::write_plain_compose`] before each
    /// judgement), never the bundle's own text; a release of an older agent without one is
    /// judged, and so given one, before anything starts from it.
    pub(crate) fn compose(&self, docker: &compose::Docker, cfg: &Config) -> compose::Compose {
        self.register_secrets();
        let file = if self.fd.has_file(bundle::PLAIN_COMPOSE_FILE) {
            bundle::PLAIN_COMPOSE_FILE
        } else {
            self.compose_file.as_str()
        };
        let project = docker.compose(
            &cfg.compose_project,
            &self.path,
            &self.path.join(file),
            &self.path.join(ENV_FILE),
        );
        if self.fd.has_file(bundle::budget::OVERRIDE_FILE) {
            project.with_override(&self.path.join(bundle::budget::OVERRIDE_FILE))
        } else {
            project
        }
    }

    /// Writes the compose file compose runs ([`bundle::plain_compose`]): the agent's own parse
    /// of the bundle's compose file, one plain-ASCII JSON document, so any difference between
    /// the agent's YAML parser and compose's is harmless. Written again before every judgement,
    /// whatever a container did to the file since.
    pub(crate) fn write_plain_compose(&self) -> anyhow::Result<()> {
        let plain = bundle::plain_compose(&self.compose_yaml()?)
            .map_err(|r| crate::exit::Failure::from(&r))?;
        self.fd
            .write_staged(bundle::PLAIN_COMPOSE_FILE, plain.as_bytes(), 0o600)
    }

    /// Writes the pull override ([`bundle::PULL_OVERRIDE_FILE`]) for this release's compose
    /// file and returns its path, for `compose pull` only; `None` (and no file) when the file
    /// has no service.
    pub(crate) fn write_pull_override(&self) -> anyhow::Result<Option<PathBuf>> {
        match bundle::pull_override(&self.compose_yaml()?) {
            Some(t) => {
                self.fd
                    .write_staged(bundle::PULL_OVERRIDE_FILE, t.as_bytes(), 0o600)?;
                Ok(Some(self.path.join(bundle::PULL_OVERRIDE_FILE)))
            }
            None => {
                self.fd.remove_file(bundle::PULL_OVERRIDE_FILE)?;
                Ok(None)
            }
        }
    }

    /// Writes (or removes) the budget override that supplies the box's default pids limit to
    /// every service without one. Written again before every judgement of compose's model, so
    /// what was judged is what the agent wrote, whatever a container did to the file since;
    /// a missing or changed override shows in the model, which must hold a pids limit for
    /// every service.
    pub(crate) fn write_budget_override(&self, cfg: &Config) -> anyhow::Result<()> {
        match cfg.budget.budget_override_for(&self.compose_yaml()?) {
            Some(t) => self
                .fd
                .write_staged(bundle::budget::OVERRIDE_FILE, t.as_bytes(), 0o600),
            None => self.fd.remove_file(bundle::budget::OVERRIDE_FILE),
        }
    }
}

impl Release {
    /// Registers with the redactor the values of `.env` that came from the manifest's secrets,
    /// unless this process did for the same release and `.env` already. Without a known
    /// digest (a release written before digests were kept) it reads them every time.
    fn register_secrets(&self) {
        let key = self
            .env_digest
            .as_ref()
            .map(|d| format!("{}:{d}", self.sha));
        crate::redact::register_release(key.as_deref(), || {
            self.secrets().into_iter().map(|(_, v)| v).collect()
        });
    }

    /// The values of `.env` that came from the manifest's secrets, by `.env` key.
    pub(crate) fn secrets(&self) -> Vec<(String, SecretString)> {
        #[cfg(test)]
        tests::ENV_READS.with(|n| n.set(n.get() + 1));
        // Bounded, regular files only: a FIFO planted as `.env` cannot hang the tick here.
        let read = |name: &str| self.fd.read(name, MAX_ENV_BYTES).ok();
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

/// The box-local key of the `.env` digests, made on first use (32 random bytes, 0600).
fn digest_key(layout: &Layout) -> anyhow::Result<zeroize::Zeroizing<Vec<u8>>> {
    if let Some(key) = layout.read_release_key()?
        && key.len() >= 32
    {
        return Ok(key);
    }
    let key = zeroize::Zeroizing::new(rand::random::<[u8; 32]>().to_vec());
    layout.write_release_key(&key)?;
    Ok(key)
}

/// HMAC-SHA256 of a `.env` under the box-local key, in hex. Keyed, so a digest that leaks
/// (it is no secret to the agent) does not let anyone test guesses of a short secret offline.
fn env_digest(key: &[u8], env: &[u8]) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(env);
    hex::encode(mac.finalize().into_bytes())
}

/// A release written to `staging/` by [`stage`], and only by it: what [`promote`] takes, so no
/// other release (a fallback's, the one `current` names) can be promoted in its place.
#[derive(Debug)]
pub(crate) struct Staged(Release);

impl Staged {
    /// The staged release, for the checks before its promotion.
    pub(crate) fn release(&self) -> &Release {
        &self.0
    }
}

/// Writes the bundle's files and the rendered `.env` (0600) into a fresh staging directory
/// named for `sha`, the sha the bundle was checked against.
pub(crate) fn stage(
    layout: &Layout,
    sha: &Sha,
    b: &bundle::Bundle,
    env: &SecretString,
) -> anyhow::Result<Staged> {
    let staging = layout.staging()?;
    let name = format!("{sha}.{}", std::process::id());
    staging.remove_tree(&name)?;
    let dir = staging.ensure_sub(&name, 0o700)?;
    // Made durable together when promoted (`sync_files`), not two fsyncs per file.
    for (member, bytes) in b.files() {
        dir.write_staged(member.as_str(), bytes, 0o600)?;
    }
    let env = env.expose_secret().as_bytes();
    dir.write_staged(ENV_FILE, env, 0o600)?;
    let digest = env_digest(&digest_key(layout)?, env);
    let path = dir.path().to_path_buf();
    Release::of(dir, path, sha, Some(digest))
        .map(Staged)
        .context("staged release has no compose file")
}

/// A check a release must pass before `current` names it.
pub(crate) type Gate<'a> = &'a dyn Fn(&Release) -> Result<(), Failure>;

/// Makes a staged release `releases/<sha>` and points `current` at it.
///
/// A new sha's staging dir is renamed to `releases/<sha>`: the same files in a fresh directory
/// of the agent's, so the verdict the caller's gate gave the staged release holds for it and
/// compose's model is not built again. When `releases/<sha>` already exists (a retry of the
/// same sha), its members and `.env` are replaced one atomic write at a time (a link planted at
/// a member's name is replaced, never written through), a member-named file the bundle does
/// not have is removed, and anything else there (a relative bind's source dir a container may
/// still use, and may have filled with links) is kept, so the directory `current` may name is
/// never missing; that directory is not the one judged, so `gate` must pass on it before
/// `current` names it.
pub(crate) fn promote(layout: &Layout, staged: Staged, gate: Gate<'_>) -> anyhow::Result<Release> {
    let Staged(staged) = staged;
    let sha_typed = staged.sha.clone();
    let sha = sha_typed.as_str();
    let releases = layout.releases()?;
    let staging = layout.staging()?;
    let name = staged
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .context("staged release has no name")?
        .to_string();
    let digest = staged
        .env_digest
        .clone()
        .context("staged release has no .env digest")?;
    layout
        .digests()?
        .write_atomic(sha, digest.as_bytes(), 0o600)?;
    if let Some(old) = releases.sub(sha)? {
        let new = &staged.fd;
        let written: Vec<String> = new.entries()?.into_iter().map(|(n, _)| n).collect();
        for member in &written {
            let bytes = new
                .read(member, MAX_ENV_BYTES)
                .map_err(|p| anyhow::anyhow!("{}: {p}", new.join(member).display()))?;
            old.write_atomic(member, &bytes, 0o600)?;
        }
        for (entry, _) in old.entries()? {
            let stale =
                bundle::MemberName::parse(entry.as_bytes()).is_ok() && !written.contains(&entry);
            if stale {
                old.remove_tree(&entry)?;
            }
        }
        drop(staged);
        staging.remove_tree(&name)?;
        let path = old.path().to_path_buf();
        gate(
            &Release::of(old, path, &sha_typed, Some(digest))
                .context("promoted release has no compose file")?,
        )?;
    } else {
        // The staged files reach the disk before the name that makes them a release does.
        staged.fd.sync_files()?;
        staging.rename_to(&name, &releases, sha)?;
        releases.sync()?;
    }
    crate::failpoint::hit("before-swap");
    layout.point_current(&sha_typed)?;
    Release::current(layout)?.context("promoted release has no compose file")
}

/// Points `current` at an existing `releases/<sha>` (a fallback), once `gate` passed on it.
pub(crate) fn point_current(layout: &Layout, sha: &Sha, gate: Gate<'_>) -> anyhow::Result<Release> {
    let at = layout.releases_path().join(sha.as_str());
    let rel = Release::promoted(layout, sha, at.clone())?
        .with_context(|| format!("release {} is no longer on disk", at.display()))?;
    gate(&rel)?;
    layout.point_current(sha)?;
    Release::current(layout)?.context("current has no compose file")
}

/// Whether `releases/<sha>` is on disk (a directory, not a link).
pub(crate) fn on_disk(layout: &Layout, sha: &str) -> bool {
    layout
        .releases_if_any()
        .ok()
        .flatten()
        .is_some_and(|r| r.sub(sha).is_ok_and(|d| d.is_some()))
}

/// The sha `current` names, when it is the agent's own link into `releases/`.
pub(crate) fn current_sha(layout: &Layout) -> anyhow::Result<Option<Sha>> {
    let Some(target) = layout.current_target()? else {
        return Ok(None);
    };
    let sha = Layout::release_of_target(&target).and_then(|s| Sha::parse(s).ok());
    match sha {
        Some(sha) => Ok(Some(sha)),
        None => Err(fsx::unsafe_path(
            &layout.current_path(),
            &format!(
                "it points at {}, not into releases/ (the agent never makes such a link)",
                target.display()
            ),
        )),
    }
}

fn modified(dir: &Path, why: &str) -> anyhow::Error {
    Failure::coded(
        Code::ReleaseModified,
        format!(
            "{}: {why}; the release changed on disk since the agent wrote it and is not \
             started; find what wrote it (a container binding its own release dir?)",
            dir.display()
        ),
    )
    .into()
}

/// Checks `releases/<sha>` before a compose command starts or stops it: every bundle member
/// there is a regular file (opened `O_NOFOLLOW|O_NONBLOCK`, bounded) and together they hash to
/// `sha`; `.env` is a regular file whose keyed digest is the one recorded when the agent wrote
/// it. Other entries (a relative bind's source dir) are not compose input and are left alone.
///
/// A release written by a version that kept no digest has its `.env` digest recorded now,
/// once, after its members verified.
pub(crate) fn verify(layout: &Layout, sha: &Sha) -> anyhow::Result<()> {
    let sha = sha.as_str();
    let releases = layout
        .releases_if_any()?
        .with_context(|| format!("{} does not exist", layout.releases_path().display()))?;
    let dir = releases.sub(sha)?.with_context(|| {
        format!(
            "release {} is no longer on disk",
            releases.join(sha).display()
        )
    })?;
    let limits = bundle::Limits::default();
    let entries = dir.entries()?;
    if entries.len() > MAX_RELEASE_ENTRIES {
        return Err(modified(
            dir.path(),
            &format!("it holds more than {MAX_RELEASE_ENTRIES} entries"),
        ));
    }
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for (name, _) in entries {
        if name == ENV_FILE || bundle::MemberName::parse(name.as_bytes()).is_err() {
            continue;
        }
        let bytes = dir
            .read(&name, limits.max_member_bytes)
            .map_err(|p| modified(dir.path(), &format!("{name}: {p}")))?;
        files.push((name, bytes));
    }
    let actual = bundle::bundle_sha(files.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
    if actual.as_str() != sha {
        return Err(modified(
            dir.path(),
            &format!(
                "its members ({}) no longer hash to its sha",
                files
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let env = dir
        .read(ENV_FILE, MAX_ENV_BYTES)
        .map(zeroize::Zeroizing::new)
        .map_err(|p| modified(dir.path(), &format!("{ENV_FILE}: {p}")))?;
    let key = digest_key(layout)?;
    let digests = layout.digests()?;
    let digest = env_digest(&key, &env);
    match digests.read_file(sha, MAX_DIGEST_BYTES)? {
        Some(recorded) if recorded == digest.as_bytes() => Ok(()),
        Some(_) => Err(modified(
            dir.path(),
            &format!("{ENV_FILE} differs from the one the agent wrote"),
        )),
        None => {
            tracing::warn!(
                "no digest recorded for {} (written before digests were kept); recording it now",
                dir.join(ENV_FILE).display()
            );
            digests.write_atomic(sha, digest.as_bytes(), 0o600)
        }
    }
}

/// Removes `current` after a retire; the releases stay on disk.
pub(crate) fn clear_current(layout: &Layout) -> anyhow::Result<()> {
    layout.remove_current()
}

/// Removes staging leftovers and temp files (after every tick, and so after a crash).
/// Nothing here follows a link: a planted one is removed itself.
pub(crate) fn clean_staging(layout: &Layout) {
    layout.remove_temp_files();
    if let Err(e) = layout.remove_staging() {
        tracing::warn!("cannot clear staging: {e:#}");
    }
    layout.remove_env_temp_files();
}

/// The releases that may be removed, newest first: every `releases/<sha>` but the one
/// `current` names and those in `protect`.
fn removable(layout: &Layout, releases: &Dir, protect: &[&str]) -> Vec<String> {
    let current = layout.current_target().ok().flatten();
    let current = current
        .as_ref()
        .and_then(|c| c.file_name())
        .and_then(|f| f.to_str());
    let mut all: Vec<(i64, String)> = releases
        .entries()
        .unwrap_or_default()
        .into_iter()
        .filter(|(n, _)| !fsx::is_temp_name(n))
        .filter_map(|(n, _)| Some((releases.mtime(&n)?, n)))
        .collect();
    all.sort_by_key(|e| std::cmp::Reverse(e.0));
    all.into_iter()
        .map(|(_, n)| n)
        .filter(|n| Some(n.as_str()) != current && !protect.contains(&n.as_str()))
        .collect()
}

fn remove_release(layout: &Layout, releases: &Dir, name: &str) {
    tracing::info!("pruning release {}", releases.join(name).display());
    if let Err(e) = releases.remove_tree(name) {
        tracing::warn!("cannot prune {}: {e:#}", releases.join(name).display());
    }
    if let Ok(Some(d)) = layout.digests_if_any() {
        let _ = d.remove_file(name);
    }
}

/// Keeps the newest `keep` releases; never removes the one `current` names nor those in
/// `protect` (the last healthy release, a failed sha that waits out its backoff).
pub(crate) fn prune(layout: &Layout, keep: usize, protect: &[&str]) {
    let Ok(Some(releases)) = layout.releases_if_any() else {
        return;
    };
    // `keep` counts every release, the kept ones included: the removable ones beyond it go.
    let total = releases
        .entries()
        .unwrap_or_default()
        .into_iter()
        .filter(|(n, _)| !fsx::is_temp_name(n))
        .count();
    let excess = total.saturating_sub(keep);
    let removable = removable(layout, &releases, protect);
    for name in removable.iter().rev().take(excess) {
        remove_release(layout, &releases, name);
    }
}

/// What `releases/` and `staging/` hold on disk, each inode counted once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// What the agent wrote: each release's top-level bundle members, `.env` and budget
    /// override (and the directories themselves). This is what `releases_max_bytes` caps.
    pub(crate) agent: u64,
    /// Everything else below a release dir: what containers wrote through a relative bind.
    /// Measured and reported, never capped: a container must not be able to keep the next
    /// release (its own fix, perhaps) from being deployed.
    pub(crate) container: u64,
    /// The release dirs whose walk stopped before their end, each with why: too deep or too
    /// wide to walk (or remove) within a tick, or changed under the walk.
    pub(crate) partial: Vec<String>,
}

/// Whether a top-level entry of a release dir is one the agent writes.
fn written_by_agent(name: &str, kind: rustix::fs::FileType) -> bool {
    kind == rustix::fs::FileType::RegularFile
        && (name == ENV_FILE
            || name == bundle::budget::OVERRIDE_FILE
            || fsx::is_temp_name(name)
            || bundle::MemberName::parse(name.as_bytes()).is_ok())
}

/// The bytes `releases/` and `staging/` hold on disk now, the agent's apart from the
/// containers'. A file the agent wrote that a container linked elsewhere counts as the agent's.
pub(crate) fn usage(layout: &Layout) -> anyhow::Result<Usage> {
    measure(layout, true)
}

/// The agent's part of [`usage`] alone: what the cap judges, without a walk through what
/// containers wrote (however large it grew).
fn agent_usage(layout: &Layout) -> anyhow::Result<u64> {
    Ok(measure(layout, false)?.agent)
}

fn measure(layout: &Layout, containers: bool) -> anyhow::Result<Usage> {
    let mut used = Usage::default();
    let mut seen = fsx::Seen::new();
    let parents: Vec<Dir> = [layout.releases_if_any()?, layout.staging_if_any()?]
        .into_iter()
        .flatten()
        .collect();
    let mut trees = Vec::new();
    for parent in &parents {
        for (name, kind) in parent.entries().unwrap_or_default() {
            used.agent = used
                .agent
                .saturating_add(parent.entry_bytes(&name, &mut seen));
            if kind != rustix::fs::FileType::Directory {
                continue;
            }
            let Ok(Some(dir)) = parent.sub(&name) else {
                continue;
            };
            for (entry, kind) in dir.entries().unwrap_or_default() {
                if written_by_agent(&entry, kind) {
                    used.agent = used
                        .agent
                        .saturating_add(dir.entry_bytes(&entry, &mut seen));
                }
            }
            trees.push(dir);
        }
    }
    // The containers' part after every file of the agent's, whose inodes are then seen and
    // count nothing again.
    for dir in trees.iter().filter(|_| containers) {
        let measured = dir.disk_usage(&mut seen);
        used.container = used.container.saturating_add(measured.bytes);
        used.partial.extend(measured.partial);
    }
    Ok(used)
}

/// Makes room for a release of `need` bytes under `releases_max_bytes` before it is staged:
/// older releases go first, oldest first (never `current` nor one of `protect`); when even
/// that is not enough, refused as `RELEASES_OVER_CAP` naming the cap, and nothing is staged.
pub(crate) fn make_room(
    layout: &Layout,
    cfg: &Config,
    need: u64,
    protect: &[&str],
) -> anyhow::Result<()> {
    let cap = cfg.releases_max_bytes;
    let fits = |used: u64| used.saturating_add(need) <= cap;
    let mut used = agent_usage(layout)?;
    if fits(used) {
        return Ok(());
    }
    if let Some(releases) = layout.releases_if_any()? {
        for name in removable(layout, &releases, protect).iter().rev() {
            remove_release(layout, &releases, name);
            used = agent_usage(layout)?;
            if fits(used) {
                return Ok(());
            }
        }
    }
    Err(Failure::coded(
        Code::ReleasesOverCap,
        format!(
            "the releases the agent wrote into {} and staging/ hold {used} bytes; with the new \
             release's {need} that is over releases_max_bytes ({cap}) after pruning every release \
             but the running, last good and backed-off ones; raise releases_max_bytes ({} that \
             containers wrote into their release dirs is not counted)",
            layout.releases_path().display(),
            usage(layout).map_or_else(
                |_| "what".to_owned(),
                |u| crate::verdict::human_bytes(u.container)
            ),
        ),
    )
    .into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// Reads of a release's `.env` by [`Release::secrets`] on this thread.
        pub(crate) static ENV_READS: Cell<usize> = const { Cell::new(0) };
    }

    fn reads() -> usize {
        ENV_READS.with(Cell::get)
    }

    /// The typed stages' claim in docs/architecture.md, as a compile check: `promote` takes
    /// only a `Staged`, which `stage` returns and whose field is private to this module.
    #[test]
    fn promote_takes_only_a_staged_release() {
        let _stage: fn(&Layout, &Sha, &bundle::Bundle, &SecretString) -> anyhow::Result<Staged> =
            stage;
        let _promote: fn(&Layout, Staged, Gate<'_>) -> anyhow::Result<Release> = promote;
    }

    fn config(dir: &Path) -> Config {
        Config::parse(
            &format!("env_id: e1\nstate_dir: {}\n", dir.join("state").display()),
            Path::new("test.yaml"),
        )
        .unwrap()
    }

    /// `releases/<sha>` as an apply leaves it: members, a `.env` with `secret` as its one
    /// secret value, and its recorded digest.
    fn release_on_disk(layout: &Layout, sha: &str, secret: &str) {
        let dir = layout.releases().unwrap().ensure_sub(sha, 0o700).unwrap();
        let manifest = serde_json::json!({"vault_mode": "openbao", "entries": [
            {"var": "DB_PASSWORD", "path": "monky/e1/see/db", "kind": "supplied", "version": 1},
        ]});
        for (name, bytes) in [
            (
                "compose.yaml",
                "services:\n  web:\n    image: web:1\n".to_string(),
            ),
            (".env.template", "DB_PASSWORD=${DB_PASSWORD}\n".to_string()),
            ("secrets.manifest.json", manifest.to_string()),
            (ENV_FILE, format!("DB_PASSWORD={secret}\n")),
        ] {
            dir.write_atomic(name, bytes.as_bytes(), 0o600).unwrap();
        }
        let env = format!("DB_PASSWORD={secret}\n");
        let digest = env_digest(&digest_key(layout).unwrap(), env.as_bytes());
        layout
            .digests()
            .unwrap()
            .write_atomic(sha, digest.as_bytes(), 0o600)
            .unwrap();
    }

    #[test]
    fn a_releases_secrets_are_read_and_registered_once_per_release() {
        let t = tempfile::tempdir().unwrap();
        let cfg = config(t.path());
        let layout = Layout::open(&cfg).unwrap();
        let docker = compose::Docker::builder("/bin/true")
            .docker_config(crate::layout::docker_config_dir(&cfg.state_dir))
            .build()
            .unwrap();
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let (secret_a, secret_b) = ("once-only-secret-value-a1", "once-only-secret-value-b2");
        release_on_disk(&layout, &a, secret_a);
        release_on_disk(&layout, &b, secret_b);
        layout.point_current(&Sha::parse(&a).unwrap()).unwrap();

        let before = reads();
        // Every compose call of an apply opens the release anew (staged, gated, promoted,
        // `up`, `ps`): the values are read back once.
        for _ in 0..4 {
            let rel = Release::current(&layout).unwrap().unwrap();
            let _ = rel.compose(&docker, &cfg);
        }
        assert_eq!(reads() - before, 1);
        assert_eq!(
            crate::redact::redact(&format!("pw={secret_a}")).as_str(),
            "pw=***"
        );
        // A release this process did not render (a fallback, a retire) is read the first
        // time compose is called on it, so its values are masked too.
        let _ = point_current(&layout, &Sha::parse(&b).unwrap(), &|_| Ok(()))
            .unwrap()
            .compose(&docker, &cfg);
        assert_eq!(reads() - before, 2);
        assert_eq!(
            crate::redact::redact(&format!("pw={secret_b}")).as_str(),
            "pw=***"
        );
        let _ = Release::current(&layout)
            .unwrap()
            .unwrap()
            .compose(&docker, &cfg);
        assert_eq!(reads() - before, 2);
    }

    #[test]
    fn a_release_is_read_through_its_own_fd_not_through_current() {
        let t = tempfile::tempdir().unwrap();
        let cfg = config(t.path());
        let layout = Layout::open(&cfg).unwrap();
        let sha = "c".repeat(64);
        release_on_disk(&layout, &sha, "some-secret-value-c3");
        layout.point_current(&Sha::parse(&sha).unwrap()).unwrap();
        let rel = Release::current(&layout).unwrap().unwrap();
        // Compose is given `current`, as it always was, so a container's config is unchanged.
        assert_eq!(rel.dir(), layout.current_path());
        // `current` turned into a link out of releases/ afterwards: the release held open
        // still reads its own files, and a new open refuses the link.
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("compose.yaml"), "services: {planted: {}}\n").unwrap();
        layout.remove_current().unwrap();
        std::os::unix::fs::symlink(&outside, layout.current_path()).unwrap();
        assert!(rel.compose_yaml().unwrap().contains("web:1"));
        let e = Release::current(&layout).unwrap_err();
        assert!(format!("{e:#}").contains("not into releases/"), "{e:#}");
    }

    #[test]
    fn the_cap_counts_the_agents_files_each_inode_once_and_a_containers_apart() {
        let tmp = tempfile::tempdir().unwrap();
        let mut cfg = config(tmp.path());
        cfg.releases_max_bytes = 16 << 20;
        let layout = Layout::open(&cfg).unwrap();
        let sha = "a".repeat(64);
        release_on_disk(&layout, &sha, "s3cret");
        let rel = layout.releases_path().join(&sha);
        let base = usage(&layout).unwrap();
        // A container's bind: 40 hard links of one 1 MiB file are 1 MiB, and not the agent's.
        std::fs::create_dir(rel.join("data")).unwrap();
        std::fs::write(rel.join("data/one"), vec![1u8; 1 << 20]).unwrap();
        for i in 0..40 {
            std::fs::hard_link(rel.join("data/one"), rel.join(format!("data/l{i}"))).unwrap();
        }
        let used = usage(&layout).unwrap();
        assert_eq!(used.agent, base.agent);
        assert!(((1 << 20)..(2 << 20)).contains(&used.container), "{used:?}");
        make_room(&layout, &cfg, 1 << 20, &[&sha]).unwrap();
        // The agent's own files over the cap are refused, naming it.
        std::fs::write(rel.join(ENV_FILE), vec![b'x'; 20 << 20]).unwrap();
        let e = make_room(&layout, &cfg, 1 << 20, &[&sha]).unwrap_err();
        assert!(format!("{e:#}").contains("releases_max_bytes"), "{e:#}");
    }
}
