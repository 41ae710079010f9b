//! The mark of an apply under way: written before `current` moves to the new release and
//! removed once the tick that wrote it has saved its outcome, so a tick that finds it knows the
//! last apply was cut short (kill, reboot, OOM, the tick deadline) between the swap and the
//! state save, and recovers it on purpose instead of reading the box's state as converged.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::fsx;

const FILE: &str = "applying";
const MAX_FILE_BYTES: u64 = 4096;

/// An apply that started and has not been concluded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// The release being applied.
    pub sha: String,
    /// The release that was applied before it, if any.
    pub previous: Option<String>,
    /// When the apply reached the swap (unix seconds).
    pub started_at: u64,
}

fn env_dir(cfg: &Config) -> anyhow::Result<fsx::Dir> {
    fsx::Dir::state_root(&cfg.state_dir)?.ensure_sub(&cfg.env_id, 0o700)
}

/// Writes the marker (atomically, 0600) before the apply changes anything that runs.
pub fn write(cfg: &Config, marker: &Marker) -> anyhow::Result<()> {
    let bytes = serde_json::to_vec(marker).context("cannot encode the apply marker")?;
    env_dir(cfg)?.write_atomic(FILE, &bytes, 0o600)
}

/// The marker, for the tick (under its lock). One that does not parse still says an apply
/// was cut short, of a release it cannot name.
pub fn load(cfg: &Config) -> anyhow::Result<Option<Marker>> {
    let Some(bytes) = env_dir(cfg)?.read_file(FILE, MAX_FILE_BYTES)? else {
        return Ok(None);
    };
    Ok(Some(serde_json::from_slice(&bytes).unwrap_or(Marker {
        sha: String::new(),
        previous: None,
        started_at: 0,
    })))
}

/// The marker, for the read-only commands (status, explain): none when it cannot be read.
pub fn peek(state_dir: &Path, env_id: &str) -> Option<Marker> {
    fsx::read_bounded(&state_dir.join(env_id).join(FILE), MAX_FILE_BYTES)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// Removes the marker: the apply's outcome is saved.
pub fn clear(cfg: &Config) -> anyhow::Result<()> {
    env_dir(cfg)?.remove_file(FILE)
}
