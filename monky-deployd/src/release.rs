//! Releases on disk: staging, promotion to `releases/<sha>`, the `current` symlink, pruning.
//!
//! Layout under `<state_dir>/<env_id>/`: `staging/<sha>.<pid>/` while a release is written,
//! `releases/<sha>/` once complete (bundle files + `.env`, 0600), and `current -> releases/<sha>`.
//! Every step is a rename, so a crash leaves `current` naming a complete release.
//!
//! Every directory is opened from the state dir's fd without following links ([`fsx::Dir`]),
//! and a release is checked before any compose command that starts or stops it
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

/// The rendered `.env` in a release dir (not a bundle member: the agent writes it).
pub const ENV_FILE: &str = ".env";
const DIGESTS: &str = "env-digests";
const KEY_FILE: &str = "release.key";

/// More entries than this in a release dir is not a release any more (nor worth listing).
const MAX_RELEASE_ENTRIES: usize = 4096;

/// The largest `.env` read back: the template's member cap plus the values' cap, escaped.
const MAX_ENV_BYTES: u64 = 16 * 1024 * 1024;

/// A complete release directory (staged or promoted).
#[derive(Debug)]
pub struct Release {
    dir: PathBuf,
    compose_file: bundle::MemberName,
    /// The keyed digest of the `.env` this process wrote into a staged release.
    env_digest: Option<String>,
}

impl Release {
    /// Opens a release directory if it holds a compose file (a regular file, not a link).
    pub fn open(dir: &Path) -> Option<Self> {
        bundle::MemberName::COMPOSE_FILES
            .into_iter()
            .find(|f| std::fs::symlink_metadata(dir.join(f.as_str())).is_ok_and(|m| m.is_file()))
            .map(|compose_file| Self {
                dir: dir.to_path_buf(),
                compose_file,
                env_digest: None,
            })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The compose file's text.
    pub fn compose_yaml(&self) -> anyhow::Result<String> {
        let path = self.dir.join(self.compose_file.as_str());
        let bytes = fsx::read_bounded(&path, MAX_ENV_BYTES)
            .map_err(|p| anyhow::anyhow!("cannot read {}: {p}", path.display()))?;
        String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))
    }

    fn meta(&self) -> Option<bundle::BundleMeta> {
        fsx::read_bounded(
            &self.dir.join(bundle::MemberName::BUNDLE_JSON.as_str()),
            MAX_ENV_BYTES,
        )
        .ok()
        .and_then(|b| bundle::BundleMeta::parse(&b).ok())
    }

    /// The release's `allow_privileged` (false when its `bundle.json` cannot be read).
    pub fn allow_privileged(&self) -> bool {
        self.meta().is_some_and(|m| m.allow_privileged)
    }

    /// Whether the release's `bundle.json` says prod (false when it cannot be read).
    pub fn is_prod(&self) -> bool {
        self.meta().is_some_and(|m| m.is_prod())
    }

    /// The compose project for this release. Every compose call on a release goes through
    /// here, so this is where the release's secrets become known to the redactor, also when
    /// this process did not read them (a retire or a fallback to an older release).
    ///
    /// The agent's budget override ([`bundle::budget::OVERRIDE_FILE`]), when the release has
    /// one, is merged over the compose file on every call, so `up`, `ps` and `down` see the
    /// same project compose's model showed.
    pub fn compose(&self, docker: &compose::Docker, cfg: &Config) -> compose::Compose {
        self.register_secrets();
        let project = docker.compose(
            &cfg.compose_project,
            &self.dir,
            &self.dir.join(self.compose_file.as_str()),
            &self.dir.join(ENV_FILE),
        );
        let over = self.dir.join(bundle::budget::OVERRIDE_FILE);
        if std::fs::symlink_metadata(&over).is_ok_and(|m| m.is_file()) {
            project.with_override(&over)
        } else {
            project
        }
    }

    /// Writes (or removes) the budget override that supplies the box's default pids limit to
    /// every service without one. Written again before every judgement of compose's model, so
    /// what was judged is what the agent wrote, whatever a container did to the file since;
    /// a missing or changed override shows in the model, which must hold a pids limit for
    /// every service.
    pub fn write_budget_override(&self, cfg: &Config) -> anyhow::Result<()> {
        let text = cfg.budget.pids_override_for(&self.compose_yaml()?);
        let (_root, envd) = env_dir(cfg)?;
        // A release reached through `current` (a heal, a fallback's recheck) is written in the
        // dir the agent's own link names, opened from the env dir like every other.
        let resolved;
        let (parent, name) = if self.dir == current_dir(cfg) {
            resolved = current_sha(cfg)?.context("current names no release")?;
            ("releases", resolved.as_str())
        } else {
            let parent = self
                .dir
                .parent()
                .and_then(Path::file_name)
                .and_then(|n| n.to_str())
                .context("release dir has no parent")?;
            let name = self
                .dir
                .file_name()
                .and_then(|n| n.to_str())
                .context("release dir has no name")?;
            (parent, name)
        };
        let dir = envd
            .sub(parent)?
            .and_then(|p| p.sub(name).transpose())
            .transpose()?
            .with_context(|| format!("{} is no longer on disk", self.dir.display()))?;
        match text {
            Some(t) => dir.write_atomic(bundle::budget::OVERRIDE_FILE, t.as_bytes(), 0o600),
            None => dir.remove_file(bundle::budget::OVERRIDE_FILE),
        }
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
        // Bounded, regular files only: a FIFO planted as `.env` cannot hang the tick here.
        let read = |name: &str| fsx::read_bounded(&self.dir.join(name), MAX_ENV_BYTES).ok();
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

/// The env's directory, opened from the checked state dir (created 0700 if missing).
fn env_dir(cfg: &Config) -> anyhow::Result<(Dir, Dir)> {
    let root = Dir::state_root(&cfg.state_dir)?;
    let env = root.ensure_sub(&cfg.env_id, 0o700)?;
    Ok((root, env))
}

/// The box-local key of the `.env` digests, made on first use (32 random bytes, 0600).
fn digest_key(root: &Dir) -> anyhow::Result<zeroize::Zeroizing<Vec<u8>>> {
    if let Some(key) = root.read_file(KEY_FILE, 1024)?
        && key.len() >= 32
    {
        return Ok(zeroize::Zeroizing::new(key));
    }
    let key = zeroize::Zeroizing::new(rand::random::<[u8; 32]>().to_vec());
    root.write_atomic(KEY_FILE, &key, 0o600)?;
    Ok(key)
}

/// HMAC-SHA256 of a `.env` under the box-local key, in hex. Keyed, so a digest that leaks
/// (it is no secret to the agent) does not let anyone test guesses of a short secret offline.
fn env_digest(key: &[u8], env: &[u8]) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(env);
    hex::encode(mac.finalize().into_bytes())
}

/// Writes the bundle's files and the rendered `.env` (0600) into a fresh staging directory
/// named for `sha`, the sha the bundle was checked against.
pub fn stage(
    cfg: &Config,
    sha: &Sha,
    b: &bundle::Bundle,
    env: &SecretString,
) -> anyhow::Result<Release> {
    let (root, envd) = env_dir(cfg)?;
    let staging = envd.ensure_sub("staging", 0o700)?;
    let name = format!("{sha}.{}", std::process::id());
    staging.remove_tree(&name)?;
    let dir = staging.ensure_sub(&name, 0o700)?;
    for (member, bytes) in b.files() {
        dir.write_atomic(member.as_str(), bytes, 0o600)?;
    }
    let env = env.expose_secret().as_bytes();
    dir.write_atomic(ENV_FILE, env, 0o600)?;
    let digest = env_digest(&digest_key(&root)?, env);
    let mut rel = Release::open(dir.path()).context("staged release has no compose file")?;
    rel.env_digest = Some(digest);
    Ok(rel)
}

/// A check a release must pass before `current` names it.
pub type Gate<'a> = &'a dyn Fn(&Release) -> anyhow::Result<()>;

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
pub fn promote(
    cfg: &Config,
    staged: Release,
    sha: &Sha,
    gate: Gate<'_>,
) -> anyhow::Result<Release> {
    let sha = sha.as_str();
    let (_root, envd) = env_dir(cfg)?;
    let releases = envd.ensure_sub("releases", 0o700)?;
    let staging = envd.ensure_sub("staging", 0o700)?;
    let name = staged
        .dir
        .file_name()
        .and_then(|n| n.to_str())
        .context("staged release has no name")?
        .to_string();
    let digest = staged
        .env_digest
        .as_deref()
        .context("staged release has no .env digest")?;
    envd.ensure_sub(DIGESTS, 0o700)?
        .write_atomic(sha, digest.as_bytes(), 0o600)?;
    if let Some(old) = releases.sub(sha)? {
        let new = staging.sub(&name)?.context("staged release vanished")?;
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
        staging.remove_tree(&name)?;
        gate(&Release::open(old.path()).context("promoted release has no compose file")?)?;
    } else {
        staging.rename_to(&name, &releases, sha)?;
        releases.sync()?;
    }
    crate::failpoint::hit("before-swap");
    envd.swap_symlink(&Path::new("releases").join(sha), "current")?;
    Release::open(&current_dir(cfg)).context("promoted release has no compose file")
}

/// Points `current` at an existing `releases/<sha>` (a fallback), once `gate` passed on it.
pub fn point_current(cfg: &Config, sha: &Sha, gate: Gate<'_>) -> anyhow::Result<Release> {
    let sha = sha.as_str();
    let (_root, envd) = env_dir(cfg)?;
    let releases = envd.ensure_sub("releases", 0o700)?;
    let rel = releases
        .sub(sha)?
        .and_then(|d| Release::open(d.path()))
        .with_context(|| {
            format!(
                "release {} is no longer on disk",
                releases.join(sha).display()
            )
        })?;
    gate(&rel)?;
    envd.swap_symlink(&Path::new("releases").join(sha), "current")?;
    Release::open(&current_dir(cfg)).context("current has no compose file")
}

/// The sha `current` names, when it is the agent's own link into `releases/`.
pub fn current_sha(cfg: &Config) -> anyhow::Result<Option<Sha>> {
    let (_root, envd) = env_dir(cfg)?;
    let Some(target) = envd.read_link("current") else {
        return Ok(None);
    };
    let sha = target
        .strip_prefix("releases")
        .ok()
        .and_then(|s| s.to_str())
        .and_then(|s| Sha::parse(s).ok());
    match sha {
        Some(sha) => Ok(Some(sha)),
        None => Err(fsx::unsafe_path(
            &envd.join("current"),
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
pub fn verify(cfg: &Config, sha: &Sha) -> anyhow::Result<()> {
    let sha = sha.as_str();
    let (root, envd) = env_dir(cfg)?;
    let releases = envd
        .sub("releases")?
        .with_context(|| format!("{} does not exist", envd.join("releases").display()))?;
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
    if actual != sha {
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
    let key = digest_key(&root)?;
    let digests = envd.ensure_sub(DIGESTS, 0o700)?;
    let digest = env_digest(&key, &env);
    match digests.read_file(sha, 1024)? {
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
pub fn clear_current(cfg: &Config) -> anyhow::Result<()> {
    let (_root, envd) = env_dir(cfg)?;
    if envd.read_link("current").is_some() {
        envd.remove_file("current")?;
        envd.sync()?;
    }
    Ok(())
}

/// Removes staging leftovers and temp files (after every tick, and so after a crash).
/// Nothing here follows a link: a planted one is removed itself.
pub fn clean_staging(cfg: &Config) {
    let Ok(root) = Dir::state_root(&cfg.state_dir) else {
        return;
    };
    root.remove_temp_files();
    if let Ok(Some(docker)) = root.sub("docker") {
        docker.remove_temp_files();
    }
    let Ok(Some(envd)) = root.sub(&cfg.env_id) else {
        return;
    };
    if let Err(e) = envd.remove_tree("staging") {
        tracing::warn!("cannot clear staging: {e:#}");
    }
    envd.remove_temp_files();
    for sub in [DIGESTS, "releases"] {
        if let Ok(Some(d)) = envd.sub(sub) {
            d.remove_temp_files();
        }
    }
    if let Ok(Some(releases)) = envd.sub("releases") {
        for (name, _) in releases.entries().unwrap_or_default() {
            if let Ok(Some(r)) = releases.sub(&name) {
                r.remove_temp_files();
            }
        }
    }
}

/// The releases that may be removed, newest first: every `releases/<sha>` but the one
/// `current` names and those in `protect`.
fn removable(envd: &Dir, releases: &Dir, protect: &[&str]) -> Vec<String> {
    let current = envd.read_link("current");
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

fn remove_release(envd: &Dir, releases: &Dir, name: &str) {
    tracing::info!("pruning release {}", releases.join(name).display());
    if let Err(e) = releases.remove_tree(name) {
        tracing::warn!("cannot prune {}: {e:#}", releases.join(name).display());
    }
    if let Ok(Some(d)) = envd.sub(DIGESTS) {
        let _ = d.remove_file(name);
    }
}

/// Keeps the newest `keep` releases; never removes the one `current` names nor those in
/// `protect` (the last healthy release, a failed sha that waits out its backoff).
pub fn prune(cfg: &Config, keep: usize, protect: &[&str]) {
    let Ok((_root, envd)) = env_dir(cfg) else {
        return;
    };
    let Ok(Some(releases)) = envd.sub("releases") else {
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
    let removable = removable(&envd, &releases, protect);
    for name in removable.iter().rev().take(excess) {
        remove_release(&envd, &releases, name);
    }
}

/// The bytes `releases/` and `staging/` hold on disk now.
pub fn usage(cfg: &Config) -> anyhow::Result<u64> {
    let (_root, envd) = env_dir(cfg)?;
    let mut used = 0u64;
    for sub in ["releases", "staging"] {
        if let Some(d) = envd.sub(sub)? {
            used = used.saturating_add(d.disk_usage());
        }
    }
    Ok(used)
}

/// Makes room for a release of `need` bytes under `releases_max_bytes` before it is staged:
/// older releases go first, oldest first (never `current` nor one of `protect`); when even
/// that is not enough, refused as `RELEASES_OVER_CAP` naming the cap, and nothing is staged.
pub fn make_room(cfg: &Config, need: u64, protect: &[&str]) -> anyhow::Result<()> {
    let cap = cfg.releases_max_bytes;
    let fits = |used: u64| used.saturating_add(need) <= cap;
    let mut used = usage(cfg)?;
    if fits(used) {
        return Ok(());
    }
    let (_root, envd) = env_dir(cfg)?;
    if let Some(releases) = envd.sub("releases")? {
        for name in removable(&envd, &releases, protect).iter().rev() {
            remove_release(&envd, &releases, name);
            used = usage(cfg)?;
            if fits(used) {
                return Ok(());
            }
        }
    }
    Err(Failure::coded(
        Code::ReleasesOverCap,
        format!(
            "{} and staging/ hold {used} bytes; with the new release's {need} that is over \
             releases_max_bytes ({cap}) after pruning every release but the running and last \
             good ones; look for data a container wrote into its release dir (`du -sh {}/*`), \
             move it to a named volume, or raise releases_max_bytes",
            envd.join("releases").display(),
            envd.join("releases").display(),
        ),
    )
    .into())
}
