//! Files on a hostile box: directories walked from a directory fd with `O_NOFOLLOW`, atomic
//! writes through temp files created `O_CREAT|O_EXCL|O_NOFOLLOW` under unpredictable names,
//! bounded reads that accept regular files only, and StrictModes-style owner and mode checks.
//!
//! The state dir itself may be reached through links the admin made (it is named in the
//! config) and is opened once, by the layout (`layout.rs`); every component below it is opened
//! relative to its parent's fd and must not be a symlink. `current`, the one link, which only
//! the agent creates, is read as a link (`readlinkat`) and never followed.

use std::ffi::{CString, OsStr};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::code::Code;
use crate::exit::Failure;

/// The largest file the agent reads back from its own state dir (state.json, bao.token, a key).
pub(crate) const MAX_STATE_FILE_BYTES: u64 = 4 * 1024 * 1024;

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// A refusal with the state-dir code: `path` and why it cannot be trusted, and the fix.
pub(crate) fn unsafe_path(path: &Path, why: &str) -> anyhow::Error {
    Failure::coded(
        Code::StateDirUnsafe,
        format!(
            "{}: {why}; only the agent's user may change anything under its state dir \
             (remove what was planted, then `chown -R` the state dir to the agent's user and \
             `chmod 0700` it)",
            path.display()
        ),
    )
    .into()
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// What is wrong with a directory's owner or mode, as sshd's StrictModes judges it: the owner
/// must be one of `owners` and neither group nor others may write it.
pub(crate) fn owner_mode_problem(st: &rustix::fs::Stat, owners: &[u32]) -> Option<String> {
    let mode = st.st_mode & 0o7777;
    if !owners.contains(&st.st_uid) {
        return Some(format!(
            "owned by uid {}, not by {}",
            st.st_uid,
            owners
                .iter()
                .map(|u| format!("uid {u}"))
                .collect::<Vec<_>>()
                .join(" or ")
        ));
    }
    if mode & 0o022 != 0 {
        return Some(format!("mode {mode:o} lets group or others write it"));
    }
    None
}

/// Checks a directory outside the state dir that the agent writes into (the metrics textfile's):
/// a directory owned by the agent's uid or root, not writable by group or others.
pub(crate) fn check_dir_owner(dir: &Path) -> Result<(), String> {
    let st = rustix::fs::stat(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(format!("{} is not a directory", dir.display()));
    }
    match owner_mode_problem(&st, &[euid(), 0]) {
        Some(p) => Err(format!("{}: {p}", dir.display())),
        None => Ok(()),
    }
}

/// A directory held open; every name below it is resolved from this fd without following links.
#[derive(Debug)]
pub(crate) struct Dir {
    fd: OwnedFd,
    path: PathBuf,
    /// Whether a subdirectory must be the agent's own (StrictModes). Off only below a
    /// read-only open ([`Dir::open_read_only`]): `status` run as root reads the agent's files.
    strict: bool,
}

impl Dir {
    /// Opens (creating it 0700 if missing) the agent's state dir and checks it as sshd's
    /// StrictModes would: a directory owned by the agent's uid, not writable by group or others.
    /// Anything else is refused with [`Code::StateDirUnsafe`].
    pub(crate) fn state_root(path: &Path) -> anyhow::Result<Self> {
        match rustix::fs::mkdir(path, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(Errno::NOENT) => {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .create(path)
                    .with_context(|| format!("cannot create {}", path.display()))?;
                rustix::fs::chmod(path, Mode::from_raw_mode(0o700))
                    .with_context(|| format!("cannot set mode 700 on {}", path.display()))?;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
        }
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| unsafe_path(path, &format!("cannot open it as a directory ({e})")))?;
        let st = rustix::fs::fstat(&fd)?;
        if let Some(p) = owner_mode_problem(&st, &[euid()]) {
            return Err(unsafe_path(path, &p));
        }
        if st.st_mode & 0o077 != 0 {
            // Readable by others but writable only by the agent: safe to narrow, so narrow it.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700))
                .with_context(|| format!("cannot set mode 700 on {}", path.display()))?;
        }
        Ok(Self {
            fd,
            path: path.to_path_buf(),
            strict: true,
        })
    }

    /// Opens an existing directory for the read-only commands (status, explain, doctor, the
    /// metrics file): nothing is created or narrowed, and neither it nor a subdirectory opened
    /// from it is judged by owner, since those commands may run as root or an operator; a link
    /// below it is still never followed. For reading only: nothing may be written through it.
    pub(crate) fn open_read_only(path: &Path) -> anyhow::Result<Self> {
        let fd = rustix::fs::open(path, DIR_FLAGS.difference(OFlags::NOFOLLOW), Mode::empty())
            .with_context(|| format!("cannot open {}", path.display()))?;
        Ok(Self {
            fd,
            path: path.to_path_buf(),
            strict: false,
        })
    }

    /// A second fd on the same directory.
    pub(crate) fn try_clone(&self) -> anyhow::Result<Self> {
        Ok(Self {
            fd: self
                .fd
                .try_clone()
                .context("cannot duplicate a directory fd")?,
            path: self.path.clone(),
            strict: self.strict,
        })
    }

    /// The directory's path, for messages and for the programs that need one (compose).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in this directory, for messages.
    pub(crate) fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// Opens the subdirectory `name` without following a link; `None` when it does not exist.
    pub(crate) fn sub(&self, name: &str) -> anyhow::Result<Option<Self>> {
        match rustix::fs::openat(&self.fd, name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => self.checked_sub(fd, name).map(Some),
            Err(Errno::NOENT) => Ok(None),
            Err(Errno::LOOP | Errno::NOTDIR) => Err(unsafe_path(
                &self.join(name),
                "it is a symlink or not a directory, and the agent did not make it",
            )),
            Err(e) => Err(e).with_context(|| format!("cannot open {}", self.join(name).display())),
        }
    }

    /// Opens the subdirectory `name`, creating it with `mode` if missing, and sets `mode` on it.
    pub(crate) fn ensure_sub(&self, name: &str, mode: u32) -> anyhow::Result<Self> {
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot create {}", self.join(name).display()));
            }
        }
        let dir = self.sub(name)?.with_context(|| {
            format!(
                "{} vanished while it was created",
                self.join(name).display()
            )
        })?;
        rustix::fs::fchmod(&dir.fd, Mode::from_raw_mode(mode))
            .with_context(|| format!("cannot set mode {mode:o} on {}", dir.path.display()))?;
        Ok(dir)
    }

    fn checked_sub(&self, fd: OwnedFd, name: &str) -> anyhow::Result<Self> {
        let path = self.join(name);
        if self.strict {
            let st = rustix::fs::fstat(&fd)?;
            if let Some(p) = owner_mode_problem(&st, &[euid()]) {
                return Err(unsafe_path(&path, &p));
            }
        }
        Ok(Self {
            fd,
            path,
            strict: self.strict,
        })
    }

    /// Whether `name` is a regular file here (not a link to one).
    pub(crate) fn has_file(&self, name: &str) -> bool {
        rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
    }

    /// Whether anything (a file, a link, a directory) has the name `name` here.
    pub(crate) fn has(&self, name: &str) -> bool {
        rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }

    /// Writes `bytes` to `name` atomically with exactly `mode`: a temp file created
    /// `O_EXCL|O_NOFOLLOW` under an unpredictable name, fsync, rename over `name`, fsync the
    /// directory. A crash leaves the old file or the new one; a planted name is never reused.
    pub(crate) fn write_atomic(&self, name: &str, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
        self.replace(name, bytes, mode, true)
    }

    /// As [`write_atomic`](Self::write_atomic), without the two fsyncs: for a directory whose
    /// files are made durable together ([`sync_files`](Self::sync_files)) before it is made
    /// visible (a staged release), or for a file the agent writes again before every use
    /// (the compose files it derives). A reader still sees the old file or the whole new one.
    pub(crate) fn write_staged(&self, name: &str, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
        self.replace(name, bytes, mode, false)
    }

    /// Makes every regular file of this directory (not below it) and the directory itself
    /// durable: one fsync each, at the end of a staging, instead of two per file written.
    ///
    /// # Errors
    /// When the directory cannot be listed or a file cannot be synced.
    pub(crate) fn sync_files(&self) -> anyhow::Result<()> {
        for (name, kind) in self.entries()? {
            if kind != FileType::RegularFile {
                continue;
            }
            let fd = rustix::fs::openat(
                &self.fd,
                name.as_str(),
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
                Mode::empty(),
            )
            .with_context(|| format!("cannot open {}", self.join(&name).display()))?;
            rustix::fs::fsync(&fd)
                .with_context(|| format!("cannot sync {}", self.join(&name).display()))?;
        }
        self.sync()
    }

    fn replace(&self, name: &str, bytes: &[u8], mode: u32, durable: bool) -> anyhow::Result<()> {
        let (tmp, fd) = self.create_temp(name, mode)?;
        let result = (|| {
            // The umask may have narrowed the mode, never widened it; set it exactly.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
            crate::failpoint::hit_at("mid-write", name);
            let mut f = std::fs::File::from(fd);
            f.write_all(bytes)
                .and_then(|()| if durable { f.sync_all() } else { Ok(()) })
                .with_context(|| format!("cannot write {}", self.join(&tmp).display()))?;
            rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name)
                .with_context(|| format!("cannot move {} into place", self.join(name).display()))?;
            if durable { self.sync() } else { Ok(()) }
        })();
        if result.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
        }
        result
    }

    fn create_temp(&self, name: &str, mode: u32) -> anyhow::Result<(String, OwnedFd)> {
        let flags = OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::EXCL
            | OFlags::NOFOLLOW
            | OFlags::CLOEXEC
            | OFlags::NOCTTY;
        for _ in 0..16 {
            let tmp = temp_name(name);
            match rustix::fs::openat(&self.fd, tmp.as_str(), flags, Mode::from_raw_mode(mode)) {
                Ok(fd) => return Ok((tmp, fd)),
                Err(Errno::EXIST) => continue,
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("cannot create {}", self.join(&tmp).display()));
                }
            }
        }
        anyhow::bail!(
            "cannot create a temp file for {}: every name tried exists",
            self.join(name).display()
        )
    }

    /// Reads `name` if it is a regular file of at most `max` bytes, opened `O_NOFOLLOW|O_NONBLOCK`
    /// so a link, FIFO or device is refused instead of followed, waited on or read forever.
    /// `None` when it does not exist.
    pub(crate) fn read_file(&self, name: &str, max: u64) -> anyhow::Result<Option<Vec<u8>>> {
        match self.read(name, max) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(ReadProblem::Missing) => Ok(None),
            Err(p) => Err(unsafe_path(&self.join(name), &p.to_string())),
        }
    }

    /// As [`Dir::read_file`], with the problem itself for the caller to name.
    pub(crate) fn read(&self, name: &str, max: u64) -> Result<Vec<u8>, ReadProblem> {
        read_regular(Some(&self.fd), Path::new(name), max)
    }

    /// Opens (creating it with `mode` if missing) a regular file for writing, without following
    /// a link and without truncating it (the lock file).
    pub(crate) fn open_plain(&self, name: &str, mode: u32) -> anyhow::Result<std::fs::File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::from_raw_mode(mode),
        )
        .map_err(|e| match e {
            Errno::LOOP => unsafe_path(&self.join(name), "it is a symlink"),
            e => {
                anyhow::Error::new(e).context(format!("cannot open {}", self.join(name).display()))
            }
        })?;
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(unsafe_path(&self.join(name), "it is not a regular file"));
        }
        Ok(std::fs::File::from(fd))
    }

    /// Removes the file or link `name` (never what a link points to); a missing one is fine.
    pub(crate) fn remove_file(&self, name: &str) -> anyhow::Result<()> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => {
                Err(e).with_context(|| format!("cannot remove {}", self.join(name).display()))
            }
        }
    }

    /// Removes `name` and everything below it without following any link: a planted link is
    /// removed itself, its target is left alone. A missing `name` is fine. However deep the
    /// tree, the walk holds two descriptors and no stack frame per level ([`Walk`]); a tree of
    /// more than [`TREE_ENTRIES_MAX`] entries is removed up to there and refused, naming it.
    pub(crate) fn remove_tree(&self, name: &str) -> anyhow::Result<()> {
        self.remove_tree_within(name, tree_entries())
    }

    fn remove_tree_within(&self, name: &str, entries: usize) -> anyhow::Result<()> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::ISDIR | Errno::PERM) => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot remove {}", self.join(name).display()));
            }
        }
        let path = self.join(name);
        let fd = match rustix::fs::openat(&self.fd, name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
        };
        let mut walk = Walk::new(fd, entries).map_err(|s| s.into_error(&path))?;
        walk.clear_files().map_err(|s| s.into_error(&path))?;
        loop {
            if let Some(sub) = walk.next_subdir() {
                if walk.descend(&sub).map_err(|s| s.into_error(&path))? {
                    walk.clear_files().map_err(|s| s.into_error(&path))?;
                } else {
                    // Gone, or made a file or a link since the listing: removed as one.
                    let _ = rustix::fs::unlinkat(&walk.cur, &sub, AtFlags::empty());
                }
                continue;
            }
            match walk.ascend().map_err(|s| s.into_error(&path))? {
                Some(left) => match rustix::fs::unlinkat(&walk.cur, &left, AtFlags::REMOVEDIR) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => {
                        return Err(WalkStop::Io(e).into_error(&path));
                    }
                },
                None => break,
            }
        }
        drop(walk);
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("cannot remove {}", path.display())),
        }
    }

    /// The names in this directory (not `.` or `..`) with their types, as the directory says
    /// them (a link is a link).
    pub(crate) fn entries(&self) -> anyhow::Result<Vec<(String, FileType)>> {
        let fd = rustix::fs::openat(&self.fd, ".", DIR_FLAGS, Mode::empty())?;
        let mut dir = rustix::fs::Dir::new(fd)
            .with_context(|| format!("cannot list {}", self.path.display()))?;
        let mut out = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry.with_context(|| format!("cannot list {}", self.path.display()))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let mut kind = entry.file_type();
            if kind == FileType::Unknown {
                kind = rustix::fs::statat(&self.fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                    .map_or(FileType::Unknown, |st| FileType::from_raw_mode(st.st_mode));
            }
            out.push((String::from_utf8_lossy(name).into_owned(), kind));
        }
        Ok(out)
    }

    /// The bytes allocated on disk below this directory, the directory's own entries included,
    /// each inode once (a file hard-linked forty times is one file, as `du` counts it), nothing
    /// followed through a link. `seen` holds the inodes already counted, so one set shared by
    /// several calls counts a file linked into several trees once. The walk holds two
    /// descriptors however deep the tree goes; one of more than [`TREE_ENTRIES_MAX`] entries,
    /// or one that changes under the walk, is counted up to there and said to be partial.
    pub(crate) fn disk_usage(&self, seen: &mut Seen) -> Measured {
        self.disk_usage_within(seen, tree_entries())
    }

    fn disk_usage_within(&self, seen: &mut Seen, entries: usize) -> Measured {
        let mut bytes = 0u64;
        let walked = (|| -> Result<(), WalkStop> {
            let fd = rustix::fs::openat(&self.fd, ".", DIR_FLAGS, Mode::empty())?;
            let mut walk = Walk::new(fd, entries)?;
            bytes = bytes.saturating_add(walk.stat_entries(seen)?);
            loop {
                if let Some(sub) = walk.next_subdir() {
                    if walk.descend(&sub)? {
                        bytes = bytes.saturating_add(walk.stat_entries(seen)?);
                    }
                } else if walk.ascend()?.is_none() {
                    return Ok(());
                }
            }
        })();
        Measured {
            bytes,
            partial: walked.err().map(|s| s.into_error(&self.path).to_string()),
        }
    }

    /// The bytes `name` (not followed through a link) holds on disk, unless its inode is in
    /// `seen` already; 0 when it cannot be read.
    pub(crate) fn entry_bytes(&self, name: &str, seen: &mut Seen) -> u64 {
        rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_or(0, |st| bytes_once(&st, seen))
    }

    /// The modification time of `name` (a link's own), in seconds.
    pub(crate) fn mtime(&self, name: &str) -> Option<i64> {
        rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .map(|st| st.st_mtime)
    }

    /// Moves `name` to `to` in `dest` (a rename within the file system).
    pub(crate) fn rename_to(&self, name: &str, dest: &Dir, to: &str) -> anyhow::Result<()> {
        rustix::fs::renameat(&self.fd, name, &dest.fd, to).with_context(|| {
            format!(
                "cannot move {} to {}",
                self.join(name).display(),
                dest.join(to).display()
            )
        })
    }

    /// Points the symlink `name` at `target` atomically (a temp link under an unpredictable name,
    /// renamed over it).
    pub(crate) fn swap_symlink(&self, target: &Path, name: &str) -> anyhow::Result<()> {
        let mut last = None;
        for _ in 0..16 {
            let tmp = temp_name(name);
            match rustix::fs::symlinkat(target, &self.fd, tmp.as_str()) {
                Ok(()) => {
                    let moved = rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name);
                    if let Err(e) = moved {
                        let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
                        return Err(e)
                            .with_context(|| format!("cannot swap {}", self.join(name).display()));
                    }
                    return self.sync();
                }
                Err(Errno::EXIST) => last = Some(Errno::EXIST),
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot create symlink {}", self.join(&tmp).display())
                    });
                }
            }
        }
        Err(last.unwrap_or(Errno::EXIST)).with_context(|| {
            format!(
                "cannot create a temp link for {}",
                self.join(name).display()
            )
        })
    }

    /// The target of the symlink `name`, when it is one.
    pub(crate) fn read_link(&self, name: &str) -> Option<PathBuf> {
        rustix::fs::readlinkat(&self.fd, name, Vec::new())
            .ok()
            .map(|t| PathBuf::from(OsStr::from_bytes(t.as_bytes())))
    }

    /// fsyncs the directory so a rename in it is durable.
    pub(crate) fn sync(&self) -> anyhow::Result<()> {
        rustix::fs::fsync(&self.fd).with_context(|| format!("cannot sync {}", self.path.display()))
    }

    /// Removes leftover temp files (`.<name>.tmp.<suffix>`) a killed process left here.
    pub(crate) fn remove_temp_files(&self) {
        let Ok(entries) = self.entries() else {
            return;
        };
        for (name, _) in entries {
            if is_temp_name(&name) {
                let _ = rustix::fs::unlinkat(&self.fd, name.as_str(), AtFlags::empty());
            }
        }
    }
}

/// The most entries one walk of a tree visits (a removal, a disk measure): what a container
/// wrote through a bind may be any size, and a tick must end. A million entries take seconds.
pub(crate) const TREE_ENTRIES_MAX: usize = 1_000_000;

/// The entries one walk may visit: [`TREE_ENTRIES_MAX`], or, with the test-only feature
/// `failpoints`, `MONKY_DEPLOYD_TEST_TREE_ENTRIES`, so a test names a tree without making a
/// million entries.
fn tree_entries() -> usize {
    #[cfg(feature = "failpoints")]
    if let Some(n) = std::env::var("MONKY_DEPLOYD_TEST_TREE_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    TREE_ENTRIES_MAX
}

/// What [`Dir::disk_usage`] counted, and why it stopped early when it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Measured {
    /// The bytes counted.
    pub(crate) bytes: u64,
    /// Why the walk ended before the tree did (too many entries, changed under the walk, a
    /// directory it could not read): the bytes are then a lower bound.
    pub(crate) partial: Option<String>,
}

/// Why a [`Walk`] stopped before the end of its tree.
#[derive(Debug)]
enum WalkStop {
    /// More entries than the walk may visit.
    Budget(usize),
    /// A directory's `..` is not the directory the walk came from: it was moved meanwhile.
    Moved,
    /// A system call failed.
    Io(Errno),
}

impl From<Errno> for WalkStop {
    fn from(e: Errno) -> Self {
        Self::Io(e)
    }
}

impl WalkStop {
    fn into_error(self, root: &Path) -> anyhow::Error {
        let root = root.display();
        match self {
            Self::Budget(max) => anyhow::anyhow!(
                "{root} holds more than {max} entries, more than the agent walks in one tick; \
                 a container wrote them through a bind: stop it and remove the tree by hand \
                 (`rm -rf {root}`), then move that data to a named volume"
            ),
            Self::Moved => anyhow::anyhow!(
                "a directory below {root} was moved while the agent walked it (a running \
                 container writes there); the walk stopped and the next tick tries again"
            ),
            Self::Io(e) => anyhow::anyhow!("cannot walk {root}: {e}"),
        }
    }
}

/// A directory's identity, to know that `..` leads back to the directory the walk came from.
type DirId = (u64, u64);

fn dir_id(fd: &OwnedFd) -> Result<DirId, Errno> {
    let st = rustix::fs::fstat(fd)?;
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    Ok((st.st_dev as u64, st.st_ino as u64))
}

/// One level of a [`Walk`]: the directory's identity, its name in its parent, and the
/// subdirectories still to visit.
struct Frame {
    id: DirId,
    name: CString,
    subdirs: Vec<CString>,
}

/// A depth-first walk of a tree that holds one descriptor on the directory it is in, however
/// deep the tree, and stays on the tree's file system: going down opens a subdirectory `O_NOFOLLOW` from its parent's fd, going
/// up opens `..` and proves it is the directory the walk came from (device and inode), so a
/// tree moved under the walk stops it rather than leading it outside. The levels live in a
/// vector, not on the call stack, and every entry listed counts against a budget.
struct Walk {
    cur: OwnedFd,
    levels: Vec<Frame>,
    left: usize,
    max: usize,
}

impl Walk {
    fn new(root: OwnedFd, entries: usize) -> Result<Self, WalkStop> {
        let id = dir_id(&root)?;
        Ok(Self {
            cur: root,
            levels: vec![Frame {
                id,
                name: CString::default(),
                subdirs: Vec::new(),
            }],
            left: entries,
            max: entries,
        })
    }

    fn top(&mut self) -> &mut Frame {
        self.levels.last_mut().expect("a walk has its root level")
    }

    /// The current directory's entries as raw names (a container's names need not be UTF-8),
    /// each counted against the budget.
    fn list(&mut self) -> Result<Vec<(CString, FileType)>, WalkStop> {
        let mut dir = rustix::fs::Dir::read_from(&self.cur)?;
        let mut out = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry?;
            let name = entry.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            self.left = self.left.checked_sub(1).ok_or(WalkStop::Budget(self.max))?;
            out.push((name.to_owned(), entry.file_type()));
        }
        Ok(out)
    }

    /// Removes every entry of the current directory that is not a directory, and keeps the
    /// directories to visit.
    fn clear_files(&mut self) -> Result<(), WalkStop> {
        let mut subdirs = Vec::new();
        for (name, kind) in self.list()? {
            if kind == FileType::Directory {
                subdirs.push(name);
                continue;
            }
            match rustix::fs::unlinkat(&self.cur, &name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(Errno::ISDIR | Errno::PERM) => subdirs.push(name),
                Err(e) => return Err(e.into()),
            }
        }
        self.top().subdirs = subdirs;
        Ok(())
    }

    /// Counts the current directory's entries into `seen` and keeps the directories to visit.
    fn stat_entries(&mut self, seen: &mut Seen) -> Result<u64, WalkStop> {
        let mut bytes = 0u64;
        let mut subdirs = Vec::new();
        for (name, _) in self.list()? {
            let Ok(st) = rustix::fs::statat(&self.cur, &name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            bytes = bytes.saturating_add(bytes_once(&st, seen));
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                subdirs.push(name);
            }
        }
        self.top().subdirs = subdirs;
        Ok(bytes)
    }

    fn next_subdir(&mut self) -> Option<CString> {
        self.top().subdirs.pop()
    }

    /// Goes down into `name`; `false` when it is gone or no longer a directory.
    fn descend(&mut self, name: &CString) -> Result<bool, WalkStop> {
        let fd = match rustix::fs::openat(&self.cur, name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            // Replaced by a file or a link since the listing: never followed.
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let id = dir_id(&fd)?;
        if id.0 != self.levels[0].id.0 {
            // Another file system mounted here: not the release's to remove or count.
            return Ok(false);
        }
        self.cur = fd;
        self.levels.push(Frame {
            id,
            name: name.clone(),
            subdirs: Vec::new(),
        });
        Ok(true)
    }

    /// Goes back up to the parent, proven to be the directory the walk came down from; the
    /// name of the directory left, or `None` when the walk left its root.
    fn ascend(&mut self) -> Result<Option<CString>, WalkStop> {
        let left = self.levels.pop().expect("a walk has its root level");
        let Some(parent) = self.levels.last() else {
            return Ok(None);
        };
        let fd = rustix::fs::openat(&self.cur, c"..", DIR_FLAGS, Mode::empty())?;
        if dir_id(&fd)? != parent.id {
            return Err(WalkStop::Moved);
        }
        self.cur = fd;
        Ok(Some(left.name))
    }
}

/// `.<name>.tmp.<16 random hex digits>`: nobody can plant it ahead of the agent.
fn temp_name(name: &str) -> String {
    format!(".{name}.tmp.{:016x}", rand::random::<u64>())
}

/// The inodes (device, inode) a disk measure has counted already.
pub(crate) type Seen = std::collections::HashSet<(u64, u64)>;

/// The bytes a stat says are allocated, or 0 for an inode counted already.
fn bytes_once(st: &rustix::fs::Stat, seen: &mut Seen) -> u64 {
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    let id = (st.st_dev as u64, st.st_ino as u64);
    if !seen.insert(id) {
        return 0;
    }
    u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512)
}

/// Whether `name` has the shape of the agent's temp files.
pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp.")
}

/// Why a bounded read refused a file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadProblem {
    /// It does not exist.
    Missing,
    /// A symlink, FIFO, device, socket or directory.
    NotRegular(&'static str),
    /// Group or others may read it (only for reads that ask for a private file).
    Readable(u32),
    /// Owned by another uid (only for reads that ask for a private file).
    Owner(u32),
    /// Larger than allowed.
    TooLarge(u64),
    /// Any other error.
    Io(String),
}

impl std::fmt::Display for ReadProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing => f.write_str("it does not exist"),
            Self::NotRegular(kind) => write!(f, "it is a {kind}, not a regular file"),
            Self::Readable(mode) => write!(f, "mode {mode:o} lets group or others read it"),
            Self::Owner(uid) => write!(f, "it is owned by uid {uid}"),
            Self::TooLarge(max) => write!(f, "it is larger than {max} bytes"),
            Self::Io(e) => f.write_str(e),
        }
    }
}

fn kind_name(t: FileType) -> &'static str {
    match t {
        FileType::Symlink => "symlink",
        FileType::Fifo => "FIFO",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Socket => "socket",
        FileType::Directory => "directory",
        _ => "special file",
    }
}

fn open_regular(at: Option<&OwnedFd>, path: &Path) -> Result<OwnedFd, ReadProblem> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    let opened = match at {
        Some(dir) => rustix::fs::openat(dir, path, flags, Mode::empty()),
        None => rustix::fs::open(path, flags, Mode::empty()),
    };
    opened.map_err(|e| match e {
        Errno::NOENT => ReadProblem::Missing,
        Errno::LOOP => ReadProblem::NotRegular("symlink"),
        e => ReadProblem::Io(e.to_string()),
    })
}

fn read_fd(fd: OwnedFd, max: u64) -> Result<Vec<u8>, ReadProblem> {
    let st = rustix::fs::fstat(&fd).map_err(|e| ReadProblem::Io(e.to_string()))?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != FileType::RegularFile {
        return Err(ReadProblem::NotRegular(kind_name(kind)));
    }
    if u64::try_from(st.st_size).unwrap_or(u64::MAX) > max {
        return Err(ReadProblem::TooLarge(max));
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| ReadProblem::Io(e.to_string()))?;
    // The file may have grown between the stat and the read.
    if bytes.len() as u64 > max {
        return Err(ReadProblem::TooLarge(max));
    }
    Ok(bytes)
}

fn read_regular(at: Option<&OwnedFd>, path: &Path, max: u64) -> Result<Vec<u8>, ReadProblem> {
    read_fd(open_regular(at, path)?, max)
}

/// Reads a private file someone else could have planted (the bootstrap grant): a regular file,
/// not a link, FIFO or device, owned by the agent's uid or root, not readable by group or
/// others, at most `max` bytes.
pub(crate) fn read_private(path: &Path, max: u64) -> Result<Vec<u8>, ReadProblem> {
    let fd = open_regular(None, path)?;
    let st = rustix::fs::fstat(&fd).map_err(|e| ReadProblem::Io(e.to_string()))?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != FileType::RegularFile {
        return Err(ReadProblem::NotRegular(kind_name(kind)));
    }
    if st.st_uid != euid() && st.st_uid != 0 {
        return Err(ReadProblem::Owner(st.st_uid));
    }
    if st.st_mode & 0o077 != 0 {
        return Err(ReadProblem::Readable(st.st_mode & 0o777));
    }
    read_fd(fd, max)
}

/// Writes the metrics textfile: its directory must pass [`check_dir_owner`]; the file is
/// written atomically through an unpredictable temp name, so a link is replaced, never
/// written through.
pub(crate) fn write_outside(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(OsStr::to_str)
        .with_context(|| format!("{} has no usable file name", path.display()))?;
    check_dir_owner(dir).map_err(|p| {
        anyhow::anyhow!(
            "refusing to write {}: {p}; make the directory owned by the agent's user (or root) \
             and not writable by group or others",
            path.display()
        )
    })?;
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("cannot open {}", dir.display()))?;
    let dir = Dir {
        fd,
        path: dir.to_path_buf(),
        strict: true,
    };
    dir.write_atomic(name, bytes, mode)
}

/// The raw fd of a [`Dir`], for the few callers that pass it on.
impl AsFd for Dir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root() -> (tempfile::TempDir, Dir) {
        let t = tempfile::tempdir().unwrap();
        let d = Dir::state_root(&t.path().join("state")).unwrap();
        (t, d)
    }

    #[test]
    fn write_atomic_sets_the_exact_mode_and_leaves_no_temp() {
        let (_t, d) = root();
        d.write_atomic("x.token", b"one", 0o600).unwrap();
        d.write_atomic("x.token", b"two", 0o600).unwrap();
        let p = d.join("x.token");
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(d.entries().unwrap().len(), 1);
    }

    #[test]
    fn staged_writes_replace_whole_files_and_are_synced_together_without_following_a_link() {
        let (t, d) = root();
        d.write_staged(".env", b"A=1\n", 0o600).unwrap();
        d.write_staged(".env", b"A=2\n", 0o600).unwrap();
        d.write_staged("docker-compose.yml", b"services: {}\n", 0o600)
            .unwrap();
        let p = d.join(".env");
        assert_eq!(std::fs::read(&p).unwrap(), b"A=2\n");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // A link planted beside them is skipped, not opened; a directory is not a file.
        let victim = t.path().join("victim");
        std::fs::write(&victim, "x").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("data")).unwrap();
        d.ensure_sub("sub", 0o700).unwrap();
        d.sync_files().unwrap();
        assert_eq!(d.entries().unwrap().len(), 4);
    }

    #[test]
    fn a_planted_temp_name_is_never_followed_or_reused() {
        let (t, d) = root();
        let victim = t.path().join("victim");
        std::fs::write(&victim, "root only").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        // The names the old code would have used, for this pid.
        let pid = std::process::id();
        std::os::unix::fs::symlink(&victim, d.join(format!(".x.token.tmp.{pid}"))).unwrap();
        d.write_atomic("x.token", b"secret", 0o644).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"root only");
        assert_eq!(
            std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn symlinked_subdirs_are_refused_and_removed_without_following() {
        let (t, d) = root();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, d.join("sub")).unwrap();
        let e = d.ensure_sub("sub", 0o700).unwrap_err();
        assert!(
            format!("{e:#}").contains(Code::StateDirUnsafe.as_str()),
            "{e:#}"
        );
        assert!(d.sub("sub").is_err());
        d.remove_tree("sub").unwrap();
        assert!(outside.join("keep").exists());
        assert_eq!(
            std::fs::metadata(&outside).unwrap().permissions().mode() & 0o777,
            0o755
        );
        let s = d.ensure_sub("sub", 0o700).unwrap();
        let inner = s.ensure_sub("a", 0o700).unwrap();
        inner.write_atomic("f", b"1", 0o600).unwrap();
        std::os::unix::fs::symlink(&outside, inner.join("link")).unwrap();
        d.remove_tree("sub").unwrap();
        assert!(!d.join("sub").exists());
        assert!(outside.join("keep").exists());
    }

    /// A chain of `depth` directories below `d`'s `name`, made one level at a time from the
    /// parent's fd (its path is longer than any path a system call takes), a file in each.
    fn chain(d: &Dir, name: &str, depth: usize) {
        let mut cur = d.ensure_sub(name, 0o700).unwrap().fd;
        for _ in 0..depth {
            rustix::fs::mkdirat(&cur, "d", Mode::from_raw_mode(0o700)).unwrap();
            let f =
                rustix::fs::openat(&cur, "f", OFlags::CREATE | OFlags::WRONLY, Mode::RUSR).unwrap();
            drop(f);
            cur = rustix::fs::openat(&cur, "d", DIR_FLAGS, Mode::empty()).unwrap();
        }
    }

    /// The descriptors of this process open on `dir` or below it. Other tests run in other
    /// threads of the same process and open descriptors of their own, so a count of all of
    /// them would race; a count of those under `dir` does not.
    fn open_fds_under(dir: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            // As text: a removed directory reads back as "<path> (deleted)".
            .filter(|target| {
                let (target, dir) = (target.to_string_lossy(), dir.to_string_lossy());
                target.starts_with(&*dir)
            })
            .count()
    }

    #[test]
    fn a_tree_deeper_than_the_stack_and_the_fd_limit_is_measured_and_removed() {
        let (_t, d) = root();
        chain(&d, "deep", 5_000);
        let deep = d.join("deep");
        let before = open_fds_under(&deep);
        let sub = d.sub("deep").unwrap().unwrap();
        let m = sub.disk_usage(&mut Seen::new());
        assert_eq!(m.partial, None);
        assert!(m.bytes >= 5_000 * 4096, "{}", m.bytes);
        drop(sub);
        d.remove_tree("deep").unwrap();
        assert!(!d.has("deep"));
        assert_eq!(before, 0);
        assert_eq!(open_fds_under(&deep), 0, "no descriptor is left open");
    }

    #[test]
    fn a_tree_over_the_budget_is_named_and_what_fits_is_removed() {
        let (_t, d) = root();
        let wide = d.ensure_sub("wide", 0o700).unwrap();
        for i in 0..50 {
            wide.write_staged(&format!("f{i}"), b"x", 0o600).unwrap();
        }
        let sub = d.sub("wide").unwrap().unwrap();
        let m = sub.disk_usage_within(&mut Seen::new(), 10);
        assert!(
            m.partial
                .as_deref()
                .unwrap()
                .contains("more than 10 entries")
        );
        let e = d.remove_tree_within("wide", 10).unwrap_err().to_string();
        assert!(e.contains("wide holds more than 10 entries"), "{e}");
        assert!(d.has("wide"), "named, not removed");
        d.remove_tree("wide").unwrap();
        assert!(!d.has("wide"));
    }

    #[test]
    fn names_that_are_not_utf8_are_removed_too() {
        let (_t, d) = root();
        let s = d.ensure_sub("odd", 0o700).unwrap();
        let name = OsStr::from_bytes(b"\xff\xfe");
        rustix::fs::mkdirat(&s.fd, name, Mode::from_raw_mode(0o700)).unwrap();
        let inner = rustix::fs::openat(&s.fd, name, DIR_FLAGS, Mode::empty()).unwrap();
        drop(
            rustix::fs::openat(&inner, name, OFlags::CREATE | OFlags::WRONLY, Mode::RUSR).unwrap(),
        );
        d.remove_tree("odd").unwrap();
        assert!(!d.has("odd"));
    }

    #[test]
    fn reads_refuse_links_fifos_devices_and_large_files() {
        let (t, d) = root();
        std::fs::write(d.join("ok"), "fine").unwrap();
        assert_eq!(d.read_file("ok", 10).unwrap().unwrap(), b"fine");
        assert!(d.read_file("missing", 10).unwrap().is_none());
        assert!(d.read_file("ok", 2).is_err());
        std::os::unix::fs::symlink(t.path(), d.join("link")).unwrap();
        assert!(d.read_file("link", 10).is_err());
        rustix::fs::mknodat(&d, "fifo", FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
        assert_eq!(d.read("fifo", 10), Err(ReadProblem::NotRegular("FIFO")));
        assert_eq!(
            read_regular(None, Path::new("/dev/zero"), 10),
            Err(ReadProblem::NotRegular("character device"))
        );
    }

    #[test]
    fn strict_modes_refuse_a_group_writable_state_dir() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("state");
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o770)).unwrap();
        let e = Dir::state_root(&p).unwrap_err();
        assert!(format!("{e:#}").contains("group or others write"), "{e:#}");
    }

    #[test]
    fn swap_symlink_replaces_the_link() {
        let (_t, d) = root();
        d.swap_symlink(Path::new("dir/a"), "link").unwrap();
        d.swap_symlink(Path::new("dir/b"), "link").unwrap();
        assert_eq!(d.read_link("link").unwrap(), Path::new("dir/b"));
    }
}
