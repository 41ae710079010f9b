//! An operator's hold on the box (`monky-deployd hold` / `unhold`): while it lasts a tick checks
//! in and reports, but neither applies, heals nor retires. It is the file `hold` in the state
//! dir, written atomically through `fsx` like the rest of the agent's state, so the tick, which
//! runs as the agent's user, reads a file of its own; a hold past its `until` ends by itself.

use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;
use monky_agent_proto as proto;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::exit::Exit;
use crate::layout::Layout;
use crate::state;

/// A reason is a line for people, not a document.
const MAX_REASON_CHARS: usize = 500;
const MAX_FILE_BYTES: u64 = 8 * 1024;

/// The hold as the file keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// Why, as the operator wrote it.
    pub reason: Option<String>,
    /// When it was put (unix seconds).
    pub since: u64,
    /// When it ends by itself (unix seconds).
    pub until: Option<u64>,
}

impl Hold {
    /// Whether it still holds at `now`.
    pub fn holds_at(&self, now: u64) -> bool {
        self.until.is_none_or(|u| now < u)
    }

    /// The wire shape tenancy sees.
    pub fn wire(&self) -> proto::Hold {
        proto::Hold {
            // Every way out is redacted, an operator's text included.
            reason: self
                .reason
                .as_deref()
                .map(|r| crate::redact::redact(r).into_string()),
            since: self.since,
            until: self.until,
        }
    }

    /// `HELD: <reason>; until <time>`, for reports and `explain`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{}: {}",
            crate::code::Code::Held,
            self.reason.as_deref().unwrap_or("no reason given")
        );
        match self.until {
            Some(u) => s.push_str(&format!("; until {}", crate::status::rfc3339(u))),
            None => s.push_str("; until `monky-deployd unhold`"),
        }
        s
    }
}

/// The hold in force, from the file, for the read-only commands (status, explain): `None`
/// when there is none, it cannot be read, or its `until` has passed.
pub fn peek(layout: &Layout) -> Option<Hold> {
    layout
        .peek_hold(MAX_FILE_BYTES)
        .map(|b| parse(&b).unwrap_or_else(|_| unparsable()))
        .filter(|h| h.holds_at(state::now()))
}

fn parse(bytes: &[u8]) -> serde_json::Result<Hold> {
    serde_json::from_slice::<Hold>(bytes)
}

/// What a hold file that does not parse means, to the tick and the read-only commands alike.
fn unparsable() -> Hold {
    Hold {
        reason: Some("the hold file does not parse".into()),
        since: 0,
        until: None,
    }
}

/// The hold in force, for the tick (under its lock): a hold past its `until` is removed, so it
/// ends by itself; a file that does not parse holds, as a hold without a reason, since an
/// operator who wrote it meant to stop the box.
pub fn load(layout: &Layout) -> anyhow::Result<Option<Hold>> {
    let Some(bytes) = layout.read_hold(MAX_FILE_BYTES)? else {
        return Ok(None);
    };
    let hold = parse(&bytes).unwrap_or_else(|e| {
        tracing::warn!(
            "{} does not parse ({e}); it holds the box all the same",
            layout.hold_path().display()
        );
        unparsable()
    });
    if hold.holds_at(state::now()) {
        return Ok(Some(hold));
    }
    tracing::info!(
        "the hold put {} ran out; the box is no longer held",
        crate::status::rfc3339(hold.since)
    );
    layout.remove_hold()?;
    Ok(None)
}

/// Reads `--until`: an RFC 3339 time (`2026-12-01T18:00:00Z`) or a duration from now (`2h`,
/// `30m`, `1day`).
pub fn parse_until(text: &str, now: u64) -> anyhow::Result<u64> {
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        let secs = t
            .duration_since(UNIX_EPOCH)
            .map_err(|_| anyhow::anyhow!("--until {text:?} is before 1970"))?
            .as_secs();
        anyhow::ensure!(
            secs > now,
            "--until {text:?} is in the past: give a later time"
        );
        return Ok(secs);
    }
    let d: Duration = humantime::parse_duration(text).map_err(|_| {
        anyhow::anyhow!(
            "--until {text:?} is neither a time (2026-12-01T18:00:00Z) nor a duration (2h, 30m): \
             give one of those"
        )
    })?;
    anyhow::ensure!(
        !d.is_zero(),
        "--until {text:?} is no time at all: give a later time"
    );
    Ok(now.saturating_add(d.as_secs()))
}

/// `monky-deployd hold [--reason TEXT] [--until TIME]`.
pub fn hold_command(
    cfg: &Config,
    reason: Option<String>,
    until: Option<String>,
) -> anyhow::Result<Exit> {
    let now = state::now();
    let until = until.map(|u| parse_until(&u, now)).transpose()?;
    let reason = reason
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty());
    if let Some(r) = &reason {
        anyhow::ensure!(
            r.chars().count() <= MAX_REASON_CHARS && !r.chars().any(char::is_control),
            "--reason must be one line of at most {MAX_REASON_CHARS} characters: shorten it"
        );
    }
    let hold = Hold {
        reason,
        since: now,
        until,
    };
    let layout = as_state_owner(cfg)?;
    let mut bytes = serde_json::to_vec_pretty(&hold).context("cannot encode the hold")?;
    bytes.push(b'\n');
    layout.write_hold(&bytes)?;
    outln!("{}", hold.describe());
    outln!("the agent checks in and reports, but applies, heals and retires nothing until then");
    Ok(Exit::Ok)
}

/// `monky-deployd unhold`.
pub fn unhold_command(cfg: &Config) -> anyhow::Result<Exit> {
    let layout = as_state_owner(cfg)?;
    let had = layout.read_hold(MAX_FILE_BYTES)?.is_some();
    layout.remove_hold()?;
    outln!(
        "{}",
        if had {
            "hold removed: the next tick converges the box again"
        } else {
            "the box was not held"
        }
    );
    Ok(Exit::Ok)
}

/// Opens the state dir as its owner. Run as root, this thread takes the owner's uid and gid
/// first (the command runs on one thread), so the file is the agent's own and the state dir's
/// checks apply unchanged; run as the agent, nothing changes.
fn as_state_owner(cfg: &Config) -> anyhow::Result<Layout> {
    use rustix::process::{Gid, Uid, geteuid};
    let state_dir = &cfg.state_dir;
    if geteuid().is_root()
        && let Ok(st) = rustix::fs::stat(state_dir)
        && st.st_uid != 0
    {
        let (uid, gid) = (st.st_uid, st.st_gid);
        rustix::thread::set_thread_groups(&[])
            .and_then(|()| {
                rustix::thread::set_thread_res_gid(
                    Gid::from_raw(gid),
                    Gid::from_raw(gid),
                    Gid::from_raw(gid),
                )
            })
            .and_then(|()| {
                rustix::thread::set_thread_res_uid(
                    Uid::from_raw(uid),
                    Uid::from_raw(uid),
                    Uid::from_raw(uid),
                )
            })
            .with_context(|| {
                format!(
                    "cannot act as uid {uid}, the owner of {}: run the command as that user",
                    state_dir.display()
                )
            })?;
    }
    Layout::open(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_is_a_time_or_a_duration_from_now() {
        let now = 1_800_000_000;
        assert_eq!(parse_until("2h", now).unwrap(), now + 7200);
        assert_eq!(parse_until("30m", now).unwrap(), now + 1800);
        let t = humantime::parse_rfc3339("2027-06-01T08:00:00Z")
            .unwrap()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert_eq!(parse_until("2027-06-01T08:00:00Z", now).unwrap(), t);
        for bad in ["", "soon", "0s", "2020-01-01T00:00:00Z"] {
            let e = parse_until(bad, now).unwrap_err().to_string();
            assert!(e.contains("--until"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_hold_ends_at_its_until() {
        let h = Hold {
            reason: Some("db migration by hand".into()),
            since: 100,
            until: Some(200),
        };
        assert!(h.holds_at(199));
        assert!(!h.holds_at(200));
        assert!(
            Hold {
                until: None,
                ..h.clone()
            }
            .holds_at(u64::MAX)
        );
        assert!(
            h.describe()
                .starts_with("HELD: db migration by hand; until ")
        );
        assert_eq!(h.wire().until, Some(200));
    }
}
