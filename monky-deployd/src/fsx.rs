//! Crash-safe file operations: atomic writes with a mode, private directories, symlink swaps.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::Context;

/// Creates `dir` (and parents) and makes it mode `mode`.
pub fn private_dir(dir: &Path, mode: u32) -> anyhow::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set mode {mode:o} on {}", dir.display()))
}

/// Writes `bytes` to `path` atomically with `mode`: a temp file in the same directory, fsync,
/// rename, fsync the directory. A crash leaves the old file or the new one, never a torn one.
pub fn atomic_write(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .with_context(|| format!("{} has no parent directory", path.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        // The umask may have narrowed the mode, never widened it; set it exactly.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        crate::failpoint::hit("mid-write");
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        fs::rename(&tmp, path)
            .with_context(|| format!("cannot move {} into place", path.display()))?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Points the symlink `link` at `target` atomically (a temp link renamed over it).
pub fn swap_symlink(target: &Path, link: &Path) -> anyhow::Result<()> {
    let dir = link
        .parent()
        .with_context(|| format!("{} has no parent directory", link.display()))?;
    let tmp = dir.join(format!(".current.tmp.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("cannot create symlink {}", tmp.display()))?;
    fs::rename(&tmp, link).with_context(|| format!("cannot swap {}", link.display()))?;
    sync_dir(dir)
}

/// fsyncs a directory so a rename in it is durable.
pub fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}

/// Removes leftover temp files (`.<name>.tmp.<pid>`) a killed process left in `dir`.
pub fn remove_temp_files(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.contains(".tmp.") {
            let _ = fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_sets_the_exact_mode_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.token");
        atomic_write(&p, b"one", 0o600).unwrap();
        atomic_write(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn swap_symlink_replaces_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("current");
        swap_symlink(Path::new("releases/a"), &link).unwrap();
        swap_symlink(Path::new("releases/b"), &link).unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("releases/b"));
    }
}
