//! The agent's two clocks: the wall clock (what state.json, reports and `status` show) and the
//! boot clock (`CLOCK_BOOTTIME` tagged with the kernel's boot id), which schedules the token's
//! renewal and the failed-release backoff because no wall-clock step can move it.
//!
//! A wall clock can step by hours in either direction (a bad RTC, a resumed VM, an NTP answer
//! nobody authenticated); `CLOCK_BOOTTIME` only moves forward, suspend included, and restarts at
//! a reboot, which the boot id (`/proc/sys/kernel/random/boot_id`) tells apart. A deadline kept
//! as a `BootDeadline` therefore holds within a boot whatever the wall clock does; across a
//! reboot its owner falls back to a safe choice (ask OpenBao, clamp the wait).
//!
//! With the test-only feature `failpoints`, `MONKY_DEPLOYD_TEST_CLOCK="<wall> <boot> [<id>]"`
//! shifts the wall clock and the boot clock by signed seconds and may replace the boot id, so
//! the tests step one clock and not the other; the code path is otherwise the real one.

use serde::{Deserialize, Serialize};

/// A moment on the boot clock: seconds since this boot, and which boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BootInstant {
    /// The kernel's boot id.
    pub(crate) boot_id: String,
    /// Seconds of `CLOCK_BOOTTIME`.
    pub(crate) secs: u64,
}

/// A deadline on the boot clock, as state.json keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BootDeadline {
    /// The boot the deadline was set in; in another boot it says nothing.
    pub(crate) boot_id: String,
    /// `CLOCK_BOOTTIME` seconds at the deadline.
    pub(crate) at_s: u64,
}

impl BootDeadline {
    /// The deadline `secs` after `now`.
    #[must_use]
    pub(crate) fn after(now: &BootInstant, secs: u64) -> Self {
        Self {
            boot_id: now.boot_id.clone(),
            at_s: now.secs.saturating_add(secs),
        }
    }

    /// Seconds left at `now` (0 once passed); `None` when set in another boot.
    #[must_use]
    pub(crate) fn remaining(&self, now: &BootInstant) -> Option<u64> {
        (self.boot_id == now.boot_id).then(|| self.at_s.saturating_sub(now.secs))
    }

    /// Seconds since the deadline's moment at `now` (0 before it); `None` in another boot.
    #[must_use]
    pub(crate) fn elapsed(&self, now: &BootInstant) -> Option<u64> {
        (self.boot_id == now.boot_id).then(|| now.secs.saturating_sub(self.at_s))
    }
}

/// Seconds since the epoch by the wall clock (0 before 1970).
#[must_use]
pub fn wall() -> u64 {
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    shift(real, test_offsets().0)
}

/// The kernel's id of this boot, read once per process: it cannot change while the process
/// lives, and a tick asks for it several times (the hold, the backoff, the token's upkeep).
fn this_boot_id() -> Option<&'static str> {
    static ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|id| id.trim().to_string())
    })
    .as_deref()
}

/// Now on the boot clock; `None` where the kernel has no boot id (not Linux, `/proc` absent),
/// and then every deadline falls back as after a reboot.
#[must_use]
pub(crate) fn boot() -> Option<BootInstant> {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let (_, boot_offset, id) = test_offsets();
    let boot_id = match id {
        Some(id) => id,
        None => this_boot_id()?.to_string(),
    };
    (!boot_id.is_empty()).then(|| BootInstant {
        boot_id,
        secs: shift(secs, boot_offset),
    })
}

/// The most this box's wall clock may be off OpenBao's before `status`, `explain`, `doctor`
/// and the tick say `TLS_CLOCK`, in seconds: the skew a certificate check tolerates. rustls, as
/// every TLS stack, allows none on a certificate's dates; what a box behind its peer gets is
/// the issuer's backdating of `notBefore`, which for OpenBao's own PKI (`not_before_duration`)
/// is 30 s. A box further behind refuses a certificate OpenBao's operators just renewed, and a
/// box ahead refuses one that long before its end; docs/OPERATIONS.md ("The clock") argues it.
pub(crate) const SKEW_TOLERANCE_S: u64 = 30;

/// How far this box's wall clock was from OpenBao's at one answer (its `Date` header), with
/// the moment on both of the box's clocks, so a later wall-clock step within the same boot is
/// seen without asking OpenBao again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ClockReading {
    /// The box's wall clock minus OpenBao's, in seconds (positive: the box is ahead): of the
    /// values the answer allows (`Date` has whole seconds, the call took its time), the one
    /// nearest 0, so a slow answer never makes a skew.
    pub(crate) box_ahead_s: i64,
    /// When it was read, by the wall clock.
    pub(crate) at: u64,
    /// The same moment on the boot clock.
    pub(crate) at_boot: Option<BootDeadline>,
}

impl ClockReading {
    /// The reading of an answer dated `date`, sent at `sent` and received at `received` by
    /// the (real) wall clock, taken at `boot`.
    #[must_use]
    pub(crate) fn of(
        date: std::time::SystemTime,
        sent: std::time::SystemTime,
        received: std::time::SystemTime,
        boot: Option<&BootInstant>,
    ) -> Self {
        // Whole seconds, rounded up or down; the box's own moments by its (test) wall clock.
        let secs = |t: std::time::SystemTime, up: bool, by: i64| {
            let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let whole = d.as_secs() + u64::from(up && d.subsec_nanos() > 0);
            i64::try_from(shift(whole, by)).unwrap_or(i64::MAX)
        };
        let wall = test_offsets().0;
        let (date, sent, received) = (
            secs(date, false, 0),
            secs(sent, false, wall),
            secs(received, true, wall),
        );
        // OpenBao stamped its answer between the send and the receipt, at `date` plus less
        // than a second.
        let low = sent.saturating_sub(date).saturating_sub(1);
        let high = received.saturating_sub(date);
        Self {
            box_ahead_s: if low > 0 {
                low
            } else if high < 0 {
                high
            } else {
                0
            },
            at: received.unsigned_abs(),
            at_boot: boot.map(|b| BootDeadline::after(b, 0)),
        }
    }

    /// How far the box is ahead of OpenBao at `wall` and `boot`: the reading, moved by any
    /// step of the wall clock since (the wall clock moving other than the boot clock); `None`
    /// in another boot, or without a boot clock, where the reading says nothing of the box's
    /// wall clock now.
    #[must_use]
    pub(crate) fn ahead_at(&self, wall: u64, boot: Option<&BootInstant>) -> Option<i64> {
        let (then, now) = (self.at_boot.as_ref()?, boot?);
        if then.boot_id != now.boot_id {
            return None;
        }
        let wall_moved = i128::from(wall) - i128::from(self.at);
        let boot_moved = i128::from(now.secs) - i128::from(then.at_s);
        let ahead = i128::from(self.box_ahead_s) + wall_moved - boot_moved;
        Some(i64::try_from(ahead).unwrap_or(if ahead < 0 { i64::MIN } else { i64::MAX }))
    }

    /// What is wrong with the box's clock at `wall` and `boot`, in words, when it is off
    /// OpenBao's by more than [`SKEW_TOLERANCE_S`].
    #[must_use]
    pub(crate) fn problem(&self, wall: u64, boot: Option<&BootInstant>) -> Option<String> {
        skew_problem(self.ahead_at(wall, boot)?)
    }
}

/// What is wrong with a box clock `ahead` seconds ahead of OpenBao's (behind when negative),
/// in words, when that is more than [`SKEW_TOLERANCE_S`].
#[must_use]
pub(crate) fn skew_problem(ahead: i64) -> Option<String> {
    (ahead.unsigned_abs() > SKEW_TOLERANCE_S).then(|| {
        let (way, effect) = if ahead > 0 {
            (
                "ahead of",
                "a certificate looks expired here that much early",
            )
        } else {
            (
                "behind",
                "a certificate renewed within that span is not yet valid here",
            )
        };
        format!(
            "this box's clock is {} {way} OpenBao's (by its Date header), more than the \
             {SKEW_TOLERANCE_S} s a certificate check tolerates: {effect}",
            human(ahead.unsigned_abs()),
        )
    })
}

/// A unix time as RFC 3339 (UTC, seconds).
pub(crate) fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
        .to_string()
}

/// A span in its largest unit, rounded (`45s`, `12m`, `5h`, `3d`): stable from tick to tick, so
/// a skew that stays is counted as a repeat, not logged again.
pub(crate) fn human(secs: u64) -> String {
    let round = |unit: u64| secs.saturating_add(unit / 2) / unit;
    // Each unit from one and a half of it: a second short of 2 days reads "2d", not "48h".
    match secs {
        s if s < 90 => format!("{s}s"),
        s if s < 5400 => format!("{}m", round(60)),
        s if s < 129_600 => format!("{}h", round(3600)),
        _ => format!("{}d", round(86400)),
    }
}

fn shift(secs: u64, by: i64) -> u64 {
    if by >= 0 {
        secs.saturating_add(by.unsigned_abs())
    } else {
        secs.saturating_sub(by.unsigned_abs())
    }
}

/// The test clock's wall offset, boot offset and boot id (none without the feature).
#[cfg(feature = "failpoints")]
fn test_offsets() -> (i64, i64, Option<String>) {
    let Ok(spec) = std::env::var("MONKY_DEPLOYD_TEST_CLOCK") else {
        return (0, 0, None);
    };
    let mut parts = spec.split_whitespace();
    let mut next = || {
        parts
            .next()
            .and_then(|p| p.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let (wall, boot) = (next(), next());
    let id = spec.split_whitespace().nth(2).map(str::to_string);
    (wall, boot, id)
}

#[cfg(not(feature = "failpoints"))]
#[inline]
fn test_offsets() -> (i64, i64, Option<String>) {
    (0, 0, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code::CodePolicy as _;

    fn at(id: &str, secs: u64) -> BootInstant {
        BootInstant {
            boot_id: id.into(),
            secs,
        }
    }

    #[test]
    fn a_deadline_counts_within_its_boot_only() {
        let d = BootDeadline::after(&at("a", 100), 60);
        assert_eq!(d.remaining(&at("a", 100)), Some(60));
        assert_eq!(d.remaining(&at("a", 200)), Some(0));
        assert_eq!(d.elapsed(&at("a", 200)), Some(40));
        assert_eq!(d.remaining(&at("b", 100)), None);
        assert_eq!(BootDeadline::after(&at("a", u64::MAX), 5).at_s, u64::MAX);
    }

    #[test]
    fn a_clock_reading_is_the_skew_nearest_zero_and_follows_a_later_step() {
        use std::time::{Duration, UNIX_EPOCH};
        let t = |s: u64, ms: u64| UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms);
        let boot = at("a", 500);
        let read = |date, sent, received| ClockReading::of(date, sent, received, Some(&boot));
        // In time: anything within the call and Date's second is no skew.
        assert_eq!(read(t(1000, 0), t(999, 900), t(1001, 100)).box_ahead_s, 0);
        // A slow answer (20 s) is no skew either.
        assert_eq!(read(t(1000, 0), t(990, 0), t(1010, 0)).box_ahead_s, 0);
        // Three days ahead, two behind (the nearest reading to 0).
        let ahead = read(t(1000, 0), t(260_200, 0), t(260_200, 400));
        assert_eq!(ahead.box_ahead_s, 259_199);
        assert_eq!(
            read(t(173_800, 0), t(1000, 0), t(1000, 0)).box_ahead_s,
            -172_800
        );
        let fine = read(t(1000, 0), t(1000, 0), t(1000, 0));
        assert_eq!(fine.at, 1000);
        // 60 s later on both clocks: nothing moved.
        assert_eq!(fine.ahead_at(1060, Some(&at("a", 560))), Some(0));
        assert_eq!(fine.problem(1060, Some(&at("a", 560))), None);
        // The wall clock stepped 3 days ahead since, without a new answer: seen.
        assert_eq!(
            fine.ahead_at(1060 + 259_200, Some(&at("a", 560))),
            Some(259_200)
        );
        let p = fine.problem(1060 + 259_200, Some(&at("a", 560))).unwrap();
        assert!(p.contains("3d ahead of OpenBao's"), "{p}");
        let p = fine.problem(1060 - 31, Some(&at("a", 560))).unwrap();
        assert!(p.contains("31s behind OpenBao's"), "{p}");
        assert_eq!(fine.problem(1060 - 30, Some(&at("a", 560))), None);
        // The code's next step names the same tolerance.
        let step = crate::code::Code::TlsClock.next_step();
        assert!(
            step.contains(&format!("{SKEW_TOLERANCE_S} s off")),
            "{step}"
        );
        assert_eq!(
            [31, 119, 7199, 172_799, 259_199, 129_599].map(human),
            ["31s", "2m", "2h", "2d", "3d", "36h"]
        );
        // Another boot, or no boot clock: the reading says nothing now.
        assert_eq!(fine.ahead_at(1060, Some(&at("b", 60))), None);
        assert_eq!(fine.ahead_at(1060, None), None);
        assert_eq!(
            ahead.ahead_at(0, Some(&at("a", u64::MAX))).map(i64::signum),
            Some(-1)
        );
    }

    #[test]
    fn the_real_boot_clock_has_an_id_and_moves_forward() {
        let a = boot().expect("linux has a boot id");
        let b = boot().unwrap();
        assert_eq!(a.boot_id, b.boot_id);
        assert!(b.secs >= a.secs);
        assert_eq!(shift(10, -20), 0);
        assert_eq!(shift(10, 5), 15);
    }
}
