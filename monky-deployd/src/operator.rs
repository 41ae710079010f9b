//! The commands an operator runs to hold the box's course (`monky-deployd hold` / `unhold`);
//! the hold itself, its file and its rules are [`crate::hold`].

use anyhow::Context;

use crate::clock::BootDeadline;
use crate::config::Config;
use crate::exit::Exit;
use crate::hold::{Hold, MAX_FILE_BYTES, MAX_REASON_CHARS, parse_until, peek, write};
use crate::layout::Layout;

/// `monky-deployd hold [--reason TEXT] [--until TIME] [--replace]`: a hold in force is replaced
/// only with `--replace`, and the command says which one it replaced.
pub(crate) fn hold_command(
    cfg: &Config,
    reason: Option<String>,
    until: Option<String>,
    replace: bool,
) -> anyhow::Result<Exit> {
    let now = crate::clock::wall();
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
    let boot = crate::clock::boot();
    let hold = Hold {
        reason,
        since: now,
        until,
        // The operator's span, on the clock no step moves.
        until_boot: until
            .zip(boot.as_ref())
            .map(|(u, b)| BootDeadline::after(b, u.saturating_sub(now))),
    };
    let layout = as_state_owner(cfg)?;
    let clock = crate::statefile::peek(&layout).clock().cloned();
    let in_force = peek(&layout, clock.as_ref());
    if let Some(old) = &in_force {
        anyhow::ensure!(
            replace,
            "the box is already held ({}): give --replace to replace that hold, or run \
             `monky-deployd unhold` first",
            crate::redact::redact(&old.describe())
        );
    }
    write(&layout, &hold)?;
    if let Some(old) = &in_force {
        outln!("replaced {}", crate::redact::redact(&old.describe()));
    }
    outln!("{}", hold.describe());
    outln!("the agent checks in and reports, but applies, heals and retires nothing until then");
    Ok(Exit::Ok)
}

/// `monky-deployd unhold`.
pub(crate) fn unhold_command(cfg: &Config) -> anyhow::Result<Exit> {
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
