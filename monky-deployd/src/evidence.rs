//! What a failed release leaves on the box for a person to read after the agent moved on: its
//! redacted compose logs and probe outputs (`<env_id>/failed/<sha>.log`), and a bundle the
//! bundle author must fix (`<env_id>/failed/<sha>.tar`), so `monky-deployd logs` and
//! `monky-deployd bundle check` can be run on it. Bounded: the newest [`KEEP`] shas, each file
//! capped; 0600 in the agent's state dir, written through `fsx`.

use std::path::PathBuf;

use anyhow::Context;

use crate::config::Config;
use crate::exit::Exit;
use crate::fsx;
use crate::layout::Layout;
use crate::redact::redact;

/// How many failed shas keep their evidence.
pub(crate) const KEEP: usize = 3;
/// The most bytes of one release's kept logs (their end is kept).
pub(crate) const MAX_LOG_BYTES: usize = 256 * 1024;
/// The most bytes of one kept bundle (the bundle limit: a larger one was never parsed).
pub(crate) const MAX_BUNDLE_BYTES: usize = 4 * 1024 * 1024;

/// Where the evidence lives: `<state_dir>/<env_id>/failed`, for messages.
pub(crate) fn dir(layout: &Layout) -> PathBuf {
    layout.failed_path()
}

/// The kept logs of `sha`, for messages.
pub(crate) fn log_path(layout: &Layout, sha: &str) -> PathBuf {
    dir(layout).join(log_name(sha))
}

fn log_name(sha: &str) -> String {
    format!("{sha}.log")
}

fn bundle_name(sha: &str) -> String {
    format!("{sha}.tar")
}

/// Keeps `text` (redacted here, its end within [`MAX_LOG_BYTES`]) as `sha`'s logs; returns the
/// path. `sha` is a checked 64-hex sha, so safe as a file name.
pub(crate) fn keep_logs(layout: &Layout, sha: &str, text: &str) -> anyhow::Result<PathBuf> {
    let text = redact(text).tail(MAX_LOG_BYTES);
    let d = layout.failed()?;
    d.write_atomic(&log_name(sha), text.as_str().as_bytes(), 0o600)?;
    prune(&d, sha);
    Ok(d.join(log_name(sha)))
}

/// Keeps a bundle the bundle author must fix, when within [`MAX_BUNDLE_BYTES`]; returns the
/// path. A bundle carries paths, never secret values.
pub(crate) fn keep_bundle(
    layout: &Layout,
    sha: &str,
    bytes: &[u8],
) -> anyhow::Result<Option<PathBuf>> {
    if bytes.len() > MAX_BUNDLE_BYTES {
        return Ok(None);
    }
    let d = layout.failed()?;
    d.write_atomic(&bundle_name(sha), bytes, 0o600)?;
    prune(&d, sha);
    Ok(Some(d.join(bundle_name(sha))))
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

/// The shas with kept logs and their logs' mtimes.
fn kept_logs(d: &fsx::Dir) -> Vec<(i64, String)> {
    d.entries()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(name, _)| {
            let sha = name.strip_suffix(".log").filter(|s| is_sha(s))?.to_string();
            d.has_file(&name).then_some((d.mtime(&name)?, sha))
        })
        .collect()
}

/// The newest sha with kept logs, read without writing anything.
pub(crate) fn latest(layout: &Layout) -> Option<String> {
    kept_logs(&layout.failed_if_any()?)
        .into_iter()
        .max()
        .map(|(_, sha)| sha)
}

/// `monky-deployd logs [<sha>]`: prints the kept logs of `sha` (a prefix of at least 7 hex
/// digits is enough), or of the newest failed release.
pub(crate) fn show(cfg: &Config, sha: Option<&str>) -> anyhow::Result<Exit> {
    let layout = Layout::peek(cfg);
    let sha = match sha {
        Some(prefix) => find(&layout, prefix)?,
        None => latest(&layout).with_context(|| {
            format!(
                "no failed release's logs are kept in {}: nothing failed lately (or run this as the agent's user: sudo -u monky-deployd monky-deployd logs)",
                dir(&layout).display()
            )
        })?,
    };
    let path = log_path(&layout, &sha);
    let bytes = layout
        .failed_if_any()
        .context("the kept logs' directory is gone")?
        .read(&log_name(&sha), MAX_LOG_BYTES as u64 + 1)
        .map_err(|p| anyhow::anyhow!("cannot read {}: {p}", path.display()))?;
    outln!("# {} ({})", sha, path.display());
    // Written redacted; redacted again for a secret registered since.
    for line in redact(&String::from_utf8_lossy(&bytes)).as_str().lines() {
        outln!("{line}");
    }
    Ok(Exit::Ok)
}

fn find(layout: &Layout, prefix: &str) -> anyhow::Result<String> {
    if prefix.len() < 7 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
        anyhow::bail!("{prefix:?} is not a sha: give at least 7 hex digits of one");
    }
    let prefix = prefix.to_ascii_lowercase();
    let found: Vec<String> = layout
        .failed_if_any()
        .map(|d| kept_logs(&d))
        .unwrap_or_default()
        .into_iter()
        .map(|(_, sha)| sha)
        .filter(|s| s.starts_with(&prefix))
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => anyhow::bail!(
            "no kept logs for {prefix} in {}: only the last {KEEP} failed releases keep theirs",
            dir(layout).display()
        ),
        _ => anyhow::bail!("{prefix} names more than one kept release: give more digits"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

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
        let layout = Layout::open(&box_config(dir.path())).unwrap();
        let long = "a line of compose output\n".repeat(20_000);
        for n in 0..5 {
            let p = keep_logs(&layout, &sha(n), &long).unwrap();
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
        keep_bundle(&layout, &sha(9), b"tar bytes")
            .unwrap()
            .unwrap();
        let mut left: Vec<String> = std::fs::read_dir(super::dir(&layout))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left.len(), KEEP, "{left:?}");
        assert!(left.contains(&format!("{}.tar", sha(9))), "{left:?}");
        assert!(!left.contains(&format!("{}.log", sha(0))), "{left:?}");
        assert_eq!(latest(&layout), Some(sha(4)));
        assert_eq!(find(&layout, &sha(4)[..7]).unwrap(), sha(4));
        assert!(find(&layout, "abc").is_err(), "too short");
        assert!(find(&layout, "zzzzzzz").is_err(), "not hex");
        assert!(
            keep_bundle(&layout, &sha(8), &vec![0; MAX_BUNDLE_BYTES + 1])
                .unwrap()
                .is_none()
        );
    }
}
