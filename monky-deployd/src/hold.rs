//! An operator's hold on the box (`monky-deployd hold` / `unhold`): while it lasts a tick checks
//! in and reports, but neither applies, heals nor retires. It is the file `hold` in the state
//! dir, written atomically through `fsx` like the rest of the agent's state, so the tick, which
//! runs as the agent's user, reads a file of its own.
//!
//! A hold with an end ends by itself, and only when the agent is sure the end has come: its end
//! is kept on the boot clock too (`until_boot`, with the boot id, as the failed release's
//! backoff is), which no step of the wall clock moves. In another boot, or for a hold file
//! written before the boot clock was kept, the wall clock decides, and only while it agrees
//! with OpenBao's by a reading of this boot ([`crate::clock::ClockReading`]): a tick that finds
//! the clock stepped, or cannot tell, keeps the hold.

use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;
use monky_agent_proto as proto;
use serde::{Deserialize, Serialize};

use crate::clock::{BootDeadline, BootInstant, ClockReading};
use crate::layout::Layout;

/// A reason is a line for people, not a document.
pub(crate) const MAX_REASON_CHARS: usize = 500;
pub(crate) const MAX_FILE_BYTES: u64 = 8 * 1024;

/// The hold as the file keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Hold {
    /// Why, as the operator wrote it.
    pub(crate) reason: Option<String>,
    /// When it was put (unix seconds).
    pub(crate) since: u64,
    /// When it ends by itself (unix seconds).
    pub(crate) until: Option<u64>,
    /// The same end on the boot clock, in the boot the hold was put (or carried into): what
    /// decides within that boot. Absent from hold files of older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) until_boot: Option<BootDeadline>,
}

/// Whether a hold is still in force, as far as the agent can be sure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// It holds.
    Holds,
    /// Its end has come, by the boot clock, or by a wall clock that agrees with OpenBao's.
    Ended,
    /// Past its end by the wall clock alone, which the agent cannot vouch for now (stepped,
    /// or not read against OpenBao's in this boot): it still holds.
    Unsure,
}

impl Hold {
    /// Where the hold stands at `now` (wall) and `boot`, with `clock` the last reading of the
    /// box's clock against OpenBao's.
    pub(crate) fn standing(
        &self,
        now: u64,
        boot: Option<&BootInstant>,
        clock: Option<&ClockReading>,
    ) -> Standing {
        let Some(until) = self.until else {
            return Standing::Holds;
        };
        if let Some(left) = boot.and_then(|b| self.until_boot.as_ref()?.remaining(b)) {
            return if left > 0 {
                Standing::Holds
            } else {
                Standing::Ended
            };
        }
        if now < until {
            Standing::Holds
        } else if wall_clock_trusted(now, boot, clock) {
            Standing::Ended
        } else {
            Standing::Unsure
        }
    }

    /// Whether it is still in force at `now`, `boot` and `clock` (an unsure end holds).
    pub(crate) fn holds_at(
        &self,
        now: u64,
        boot: Option<&BootInstant>,
        clock: Option<&ClockReading>,
    ) -> bool {
        self.standing(now, boot, clock) != Standing::Ended
    }

    /// The wire shape tenancy sees.
    pub(crate) fn wire(&self) -> proto::Hold {
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

    /// The hold carried into `boot`: its end on this boot's clock, from the wall clock's time
    /// left, for a hold that has none in this boot. Only with a wall clock the agent trusts.
    fn rebased(&self, now: u64, boot: &BootInstant) -> Self {
        let mut h = self.clone();
        h.until_boot = self
            .until
            .map(|u| BootDeadline::after(boot, u.saturating_sub(now)));
        h
    }

    /// The hold as a note of its code, `HELD: <reason>; until <time>` once shown, for reports
    /// and `explain`.
    pub(crate) fn note(&self) -> crate::exit::Failure {
        let mut s = self
            .reason
            .as_deref()
            .unwrap_or("no reason given")
            .to_string();
        match self.until {
            Some(u) => s.push_str(&format!("; until {}", crate::clock::rfc3339(u))),
            None => s.push_str("; until `monky-deployd unhold`"),
        }
        crate::exit::Failure::coded(crate::code::Code::Held, s)
    }

    /// [`Hold::note`] as it is shown.
    pub(crate) fn describe(&self) -> String {
        self.note().to_string()
    }
}

/// Whether the wall clock at `now` agrees with OpenBao's, by a reading taken in this boot: the
/// only wall clock a hold's end is taken from.
fn wall_clock_trusted(now: u64, boot: Option<&BootInstant>, clock: Option<&ClockReading>) -> bool {
    clock
        .and_then(|r| r.ahead_at(now, boot))
        .is_some_and(|ahead| ahead.unsigned_abs() <= crate::clock::SKEW_TOLERANCE_S)
}

/// The hold in force, from the file, for the read-only commands (status, explain): `None`
/// when there is none, it cannot be read, or its end has surely come (`clock`: the last
/// reading of the box's clock against OpenBao's, from state.json).
pub(crate) fn peek(layout: &Layout, clock: Option<&ClockReading>) -> Option<Hold> {
    let boot = crate::clock::boot();
    layout
        .peek_hold(MAX_FILE_BYTES)
        .map(|b| parse(&b).unwrap_or_else(|_| unparsable()))
        .filter(|h| h.holds_at(crate::clock::wall(), boot.as_ref(), clock))
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
        until_boot: None,
    }
}

/// The hold in force, for the tick (under its lock), with `clock` the last reading of the box's
/// clock against OpenBao's. A hold whose end has surely come is removed, so it ends by itself;
/// one past its end by a wall clock the agent cannot vouch for holds, and says why; one without
/// an end in this boot is carried into it while the wall clock is trusted. A file that does
/// not parse holds, as a hold without a reason, since an operator who wrote it meant to stop
/// the box.
pub(crate) fn load(layout: &Layout, clock: Option<&ClockReading>) -> anyhow::Result<Option<Hold>> {
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
    let (now, boot) = (crate::clock::wall(), crate::clock::boot());
    match hold.standing(now, boot.as_ref(), clock) {
        Standing::Holds => {
            let unanchored = hold.until.is_some()
                && boot.as_ref().is_some_and(|b| {
                    hold.until_boot
                        .as_ref()
                        .is_none_or(|d| d.boot_id != b.boot_id)
                });
            if let Some(b) = boot.as_ref().filter(|_| unanchored)
                && wall_clock_trusted(now, Some(b), clock)
            {
                let carried = hold.rebased(now, b);
                write(layout, &carried)?;
                return Ok(Some(carried));
            }
            Ok(Some(hold))
        }
        Standing::Unsure => {
            tracing::warn!(
                "the hold's end {} has passed by this box's clock, which the agent cannot vouch \
                 for now (stepped, or not yet read against OpenBao's in this boot): the box stays \
                 held until a tick can tell, or `monky-deployd unhold`",
                crate::clock::rfc3339(hold.until.unwrap_or_default())
            );
            Ok(Some(hold))
        }
        Standing::Ended => {
            tracing::info!(
                "the hold put {} ran out; the box is no longer held",
                crate::clock::rfc3339(hold.since)
            );
            layout.remove_hold()?;
            Ok(None)
        }
    }
}

pub(crate) fn write(layout: &Layout, hold: &Hold) -> anyhow::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(hold).context("cannot encode the hold")?;
    bytes.push(b'\n');
    layout.write_hold(&bytes)
}

/// Reads `--until`: an RFC 3339 time, in UTC (`2026-12-01T18:00:00Z`) or with an offset
/// (`2026-12-01T19:00:00+01:00`), or a duration from now (`2h`, `30m`, `1day`).
pub(crate) fn parse_until(text: &str, now: u64) -> anyhow::Result<u64> {
    if let Some(secs) = rfc3339(text.trim()) {
        let secs = secs.ok_or_else(|| anyhow::anyhow!("--until {text:?} is before 1970"))?;
        anyhow::ensure!(
            secs > now,
            "--until {text:?} is in the past: give a later time"
        );
        return Ok(secs);
    }
    let d: Duration = humantime::parse_duration(text).map_err(|_| {
        anyhow::anyhow!(
            "--until {text:?} is neither a time (2026-12-01T18:00:00Z, \
             2026-12-01T19:00:00+01:00) nor a duration (2h, 30m): give one of those"
        )
    })?;
    anyhow::ensure!(
        !d.is_zero(),
        "--until {text:?} is no time at all: give a later time"
    );
    Ok(now.saturating_add(d.as_secs()))
}

/// An RFC 3339 time as unix seconds: `None` when `text` is no such time, `Some(None)` when it
/// is one before 1970. A numeric offset (`+01:00`, `-05:30`) is taken off the local time;
/// without one the time is UTC (`Z`, or nothing, as `humantime` reads it).
fn rfc3339(text: &str) -> Option<Option<u64>> {
    let (local, offset) = match text.len().checked_sub(6).map(|i| text.split_at(i)) {
        Some((local, off)) if local.contains('T') || local.contains('t') || local.contains(' ') => {
            match off.as_bytes() {
                [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2]
                    if [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit()) =>
                {
                    let digit = |d: &u8| i64::from(d - b'0');
                    let hours = digit(h1) * 10 + digit(h2);
                    let minutes = digit(m1) * 10 + digit(m2);
                    if hours > 23 || minutes > 59 {
                        return None;
                    }
                    let secs = (hours * 60 + minutes) * 60;
                    (local, if *sign == b'+' { secs } else { -secs })
                }
                _ => (text, 0),
            }
        }
        _ => (text, 0),
    };
    let t = humantime::parse_rfc3339_weak(local).ok()?;
    let utc = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i128::from(d.as_secs()) - i128::from(offset),
        Err(_) => return Some(None),
    };
    Some(u64::try_from(utc).ok())
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
        // An offset is taken off the local time, either way.
        assert_eq!(parse_until("2027-06-01T09:00:00+01:00", now).unwrap(), t);
        assert_eq!(parse_until("2027-06-01T02:30:00-05:30", now).unwrap(), t);
        assert_eq!(parse_until("2027-06-01T08:00:00+00:00", now).unwrap(), t);
        assert_eq!(parse_until("2027-06-01 08:00:00", now).unwrap(), t);
        for bad in [
            "",
            "soon",
            "0s",
            "2020-01-01T00:00:00Z",
            "2020-01-01T01:00:00+01:00",
            "2027-06-01T09:00:00+25:00",
            "2027-06-01T09:00:00+1:00",
        ] {
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
            until_boot: None,
        };
        // An older hold file, with the wall clock agreeing with OpenBao's in this boot.
        let boot = at("a", 1000);
        let fine = reading(0, 150, 950);
        assert!(h.holds_at(199, Some(&boot), Some(&fine)));
        assert_eq!(
            h.standing(250, Some(&at("a", 1050)), Some(&fine)),
            Standing::Ended
        );
        assert!(
            Hold {
                until: None,
                ..h.clone()
            }
            .holds_at(u64::MAX, None, None)
        );
        assert!(
            h.describe()
                .starts_with("HELD: db migration by hand; until ")
        );
        assert_eq!(h.wire().until, Some(200));
        // The file keeps its old shape when there is no boot deadline, and reads old files.
        let text = serde_json::to_string(&h).unwrap();
        assert!(!text.contains("until_boot"), "{text}");
        let old: Hold = serde_json::from_str(r#"{"reason":null,"since":100,"until":200}"#).unwrap();
        assert_eq!(old.until_boot, None);
    }

    fn at(id: &str, secs: u64) -> BootInstant {
        BootInstant {
            boot_id: id.into(),
            secs,
        }
    }

    /// A reading `ahead` seconds off OpenBao's, taken at wall `wall` and second `boot` of
    /// boot "a".
    fn reading(ahead: i64, wall: u64, boot: u64) -> ClockReading {
        ClockReading {
            box_ahead_s: ahead,
            at: wall,
            at_boot: Some(BootDeadline {
                boot_id: "a".into(),
                at_s: boot,
            }),
        }
    }

    /// `hold --until 2h` at wall 10 000, second 1000 of boot "a".
    fn two_hours() -> Hold {
        Hold {
            reason: None,
            since: 10_000,
            until: Some(17_200),
            until_boot: Some(BootDeadline::after(&at("a", 1000), 7200)),
        }
    }

    #[test]
    fn within_its_boot_the_boot_clock_decides_whatever_the_wall_clock_does() {
        let h = two_hours();
        let fine = reading(0, 10_000, 1000);
        // A minute later with the wall clock 3 h ahead: no wall-clock end is acted on.
        let s = h.standing(10_060 + 3 * 3600, Some(&at("a", 1060)), Some(&fine));
        assert_eq!(s, Standing::Holds);
        // Back at the real time: still held.
        assert_eq!(
            h.standing(10_120, Some(&at("a", 1120)), Some(&fine)),
            Standing::Holds
        );
        // Two hours on the boot clock, the wall clock 3 h behind: over.
        assert_eq!(
            h.standing(17_200 - 3 * 3600, Some(&at("a", 8200)), Some(&fine)),
            Standing::Ended
        );
    }

    #[test]
    fn in_another_boot_only_a_trusted_wall_clock_ends_it() {
        let h = two_hours();
        let later = at("b", 30);
        let read_in_b = |ahead| ClockReading {
            box_ahead_s: ahead,
            at: 17_280,
            at_boot: Some(BootDeadline {
                boot_id: "b".into(),
                at_s: 10,
            }),
        };
        // Before its end by the wall clock: held, trusted or not.
        assert_eq!(h.standing(17_000, Some(&later), None), Standing::Holds);
        // Past it: no reading of this boot, or one that finds the clock 3 h ahead: unsure.
        assert_eq!(
            h.standing(17_300, Some(&later), Some(&reading(0, 10_000, 1000))),
            Standing::Unsure,
            "a reading of the old boot says nothing now"
        );
        assert_eq!(
            h.standing(17_300, Some(&later), Some(&read_in_b(3 * 3600))),
            Standing::Unsure
        );
        assert_eq!(
            h.standing(17_300, Some(&later), Some(&read_in_b(0))),
            Standing::Ended
        );
        // No boot clock at all: never sure of the wall clock.
        assert_eq!(h.standing(17_300, None, None), Standing::Unsure);
        // Carried into boot "b" with 200 s left by a trusted wall clock.
        let carried = h.rebased(17_000, &later);
        assert_eq!(
            carried.until_boot,
            Some(BootDeadline {
                boot_id: "b".into(),
                at_s: 230
            })
        );
        assert_eq!(
            carried.standing(17_000 + 3 * 3600, Some(&at("b", 229)), None),
            Standing::Holds
        );
    }
}
