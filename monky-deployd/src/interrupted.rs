//! The mark of an apply under way: written before `current` moves to the new release and
//! removed once the tick that wrote it has saved its outcome, so a tick that finds it knows the
//! last apply was cut short (kill, reboot, OOM, the tick deadline) between the swap and the
//! state save, and recovers it on purpose instead of reading the box's state as converged.

use anyhow::Context;
use serde::{Deserialize, Serialize};

use monky_agent_proto::Sha;

use crate::layout::Layout;

const MAX_FILE_BYTES: u64 = 4096;

/// An apply that started and has not been concluded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Marker {
    /// The release being applied; none in a mark that does not parse (it still says an apply
    /// was cut short, of a release it cannot name).
    pub(crate) sha: Option<Sha>,
    /// The release that was applied before it, if any.
    pub(crate) previous: Option<Sha>,
    /// When the apply reached the swap (unix seconds).
    pub(crate) started_at: u64,
}

/// Writes the marker (atomically, 0600) before the apply changes anything that runs.
pub(crate) fn write(layout: &Layout, marker: &Marker) -> anyhow::Result<()> {
    let bytes = serde_json::to_vec(marker).context("cannot encode the apply marker")?;
    layout.write_mark(&bytes)
}

/// The marker, for the tick (under its lock). One that does not parse still says an apply
/// was cut short, of a release it cannot name.
pub(crate) fn load(layout: &Layout) -> anyhow::Result<Option<Marker>> {
    let Some(bytes) = layout.read_mark(MAX_FILE_BYTES)? else {
        return Ok(None);
    };
    Ok(Some(serde_json::from_slice(&bytes).unwrap_or(Marker {
        sha: None,
        previous: None,
        started_at: 0,
    })))
}

/// The marker, for the read-only commands (status, explain): none when it cannot be read.
pub(crate) fn peek(layout: &Layout) -> Option<Marker> {
    layout
        .peek_mark(MAX_FILE_BYTES)
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// Removes the marker: the apply's outcome is saved.
pub(crate) fn clear(layout: &Layout) -> anyhow::Result<()> {
    layout.clear_mark()
}
