//! What a failed release leaves on the box for a person to read after the agent moved on: its
//! redacted compose logs and probe outputs (`<env_id>/failed/<sha>.log`), and a bundle the
//! bundle author must fix (`<env_id>/failed/<sha>.tar`), so `monky-deployd logs` and
//! `monky-deployd bundle check` can be run on it. Bounded: the newest [`KEEP`] shas, each file
//! capped; 0600 in the agent's state dir, written through `fsx`.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::config::Config;
use crate::exit::Exit;
use crate::fsx;
use crate::redact::redact;

/// How many failed shas keep their evidence.
pub const KEEP: usize = 3;
/// The most bytes of one release's kept logs (their end is kept).
pub const MAX_LOG_BYTES: usize = 256 * 1024;
/// The most bytes of one kept bundle (the bundle limit: a larger one was never parsed).
pub const MAX_BUNDLE_BYTES: usize = 4 * 1024 * 1024;

const DIR: &str = "failed";

/// Where the evidence lives: `<state_dir>/<env_id>/failed`.
pub fn dir(cfg: &Config) -> PathBuf {
    cfg.state_dir.join(&cfg.env_id).join(DIR)
}

/// The kept logs of `sha`.
pub fn log_path(cfg: &Config, sha: &str) -> PathBuf {
    dir(cfg).join(format!("{sha}.log"))
}

/// The kept bundle of `sha`.
pub fn bundle_path(cfg: &Config, sha: &str) -> PathBuf {
    dir(cfg).join(format!("{sha}.tar"))
}

fn open(cfg: &Config) -> anyhow::Result<fsx::Dir> {
    fsx::Dir::state_root(&cfg.state_dir)?
        .ensure_sub(&cfg.env_id, 0o700)?
        .ensure_sub(DIR, 0o700)
}

/// Keeps `text` (redacted here, its end within [`MAX_LOG_BYTES`]) as `sha`'s logs; returns the
/// path. `sha` is a checked 64-hex sha, so safe as a file name.
pub fn keep_logs(cfg: &Config, sha: &str, text: &str) -> anyhow::Result<PathBuf> {
    let text = crate::logging::tail_of(&redact(text), MAX_LOG_BYTES);
    let d = open(cfg)?;
    d.write_atomic(&format!("{sha}.log"), text.as_bytes(), 0o600)?;
    prune(&d, sha);
    Ok(log_path(cfg, sha))
}

/// Keeps a bundle the bundle author must fix, when within [`MAX_BUNDLE_BYTES`]; returns the
/// path. A bundle carries paths, never secret values.
pub fn keep_bundle(cfg: &Config, sha: &str, bytes: &[u8]) -> anyhow::Result<Option<PathBuf>> {
    if bytes.len() > MAX_BUNDLE_BYTES {
        return Ok(None);
    }
    let d = open(cfg)?;
    d.write_atomic(&format!("{sha}.tar"), bytes, 0o600)?;
    prune(&d, sha);
    Ok(Some(bundle_path(cfg, sha)))
}

/// Drops the evidence of all but the newest [`KEEP`] shas, `written` always among them: ranked by
/// mtime, which a backward clock step could make the oldest just as it was written.
fn prune(d: &fsx::Dir, written: &str) {
    let Ok(entries) = d.entries() else { return };
    let mut shas: Vec<(i64, String)> = Vec::new();
    for (name, _) in &entries {
        let Some(sha) = name.split('.').next().filter(|s| is_sha(s)) else {
            continue;
        };
        let t = d.mtime(name).unwrap_or(0);
        match shas.iter_mut().find(|(_, s)| s == sha) {
            Some(entry) => entry.0 = entry.0.max(t),
            None => shas.push((t, sha.to_string())),
        }
    }
    shas.sort_by(|a, b| b.cmp(a));
    let others = shas.into_iter().filter(|(_, s)| s != written);
    for (_, sha) in others.skip(KEEP.saturating_sub(1)) {
        for ext in ["log", "tar"] {
            let _ = d.remove_file(&format!("{sha}.{ext}"));
        }
    }
}

fn is_sha(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The newest sha with kept logs, read without writing anything.
pub fn latest(cfg: &Config) -> Option<String> {
    let entries = std::fs::read_dir(dir(cfg)).ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let sha = name.strip_suffix(".log").filter(|s| is_sha(s))?.to_string();
            let t = e.metadata().ok()?.modified().ok()?;
            Some((t, sha))
        })
        .max()
        .map(|(_, sha)| sha)
}

/// `monky-deployd logs [<sha>]`: prints the kept logs of `sha` (a prefix of at least 7 hex
/// digits is enough), or of the newest failed release.
pub fn show(cfg: &Config, sha: Option<&str>) -> anyhow::Result<Exit> {
    let sha = match sha {
        Some(prefix) => find(cfg, prefix)?,
        None => latest(cfg).with_context(|| {
            format!(
                "no failed release's logs are kept in {}: nothing failed lately (or run this as the agent's user: sudo -u monky-deployd monky-deployd logs)",
                dir(cfg).display()
            )
        })?,
    };
    let path = log_path(cfg, &sha);
    let bytes = fsx::read_bounded(&path, MAX_LOG_BYTES as u64 + 1)
        .map_err(|p| anyhow::anyhow!("cannot read {}: {p}", path.display()))?;
    outln!("# {} ({})", sha, path.display());
    // Written redacted; redacted again for a secret registered since.
    for line in redact(&String::from_utf8_lossy(&bytes)).lines() {
        outln!("{line}");
    }
    Ok(Exit::Ok)
}

fn find(cfg: &Config, prefix: &str) -> anyhow::Result<String> {
    if prefix.len() < 7 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
        anyhow::bail!("{prefix:?} is not a sha: give at least 7 hex digits of one");
    }
    let prefix = prefix.to_ascii_lowercase();
    let found: Vec<String> = std::fs::read_dir(dir(cfg))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .filter_map(|n| n.strip_suffix(".log").map(str::to_string))
                .filter(|s| is_sha(s) && s.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => anyhow::bail!(
            "no kept logs for {prefix} in {}: only the last {KEEP} failed releases keep theirs",
            dir(cfg).display()
        ),
        _ => anyhow::bail!("{prefix} names more than one kept release: give more digits"),
    }
}

/// Whether a path exists, for the read-only commands' pointers.
pub fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn box_config(dir: &Path) -> Config {
        let state = dir.join("state");
        Config::parse(
            &format!("env_id: e1\nstate_dir: {}\n", state.display()),
            Path::new("test.yaml"),
        )
        .unwrap()
    }

    fn sha(n: u8) -> String {
        format!("{n:02x}").repeat(32)
    }

    #[test]
    fn kept_logs_are_private_bounded_and_the_newest_few() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = box_config(dir.path());
        let long = "a line of compose output\n".repeat(20_000);
        for n in 0..5 {
            let p = keep_logs(&cfg, &sha(n), &long).unwrap();
            let meta = std::fs::metadata(&p).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, 0o600);
            assert!(meta.len() as usize <= MAX_LOG_BYTES, "{}", meta.len());
            // mtimes one second apart make "newest" unambiguous
            let t = std::time::SystemTime::UNIX_EPOCH
                + std::time::Duration::from_secs(1000 + u64::from(n));
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        keep_bundle(&cfg, &sha(9), b"tar bytes").unwrap().unwrap();
        let mut left: Vec<String> = std::fs::read_dir(super::dir(&cfg))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left.len(), KEEP, "{left:?}");
        assert!(left.contains(&format!("{}.tar", sha(9))), "{left:?}");
        assert!(!left.contains(&format!("{}.log", sha(0))), "{left:?}");
        assert_eq!(latest(&cfg), Some(sha(4)));
        assert_eq!(find(&cfg, &sha(4)[..7]).unwrap(), sha(4));
        assert!(find(&cfg, "abc").is_err(), "too short");
        assert!(find(&cfg, "zzzzzzz").is_err(), "not hex");
        assert!(
            keep_bundle(&cfg, &sha(8), &vec![0; MAX_BUNDLE_BYTES + 1])
                .unwrap()
                .is_none()
        );
    }
}
