//! The agent's two clocks: the wall clock (what state.json, reports and `status` show) and the
//! boot clock (`CLOCK_BOOTTIME` tagged with the kernel's boot id), which schedules the token's
//! renewal and the failed-release backoff because no wall-clock step can move it.
//!
//! A wall clock can step by hours in either direction (a bad RTC, a resumed VM, an NTP answer
//! nobody authenticated); `CLOCK_BOOTTIME` only moves forward, suspend included, and restarts at
//! a reboot, which the boot id (`/proc/sys/kernel/random/boot_id`) tells apart. A deadline kept
//! as a [`BootDeadline`] therefore holds within a boot whatever the wall clock does; across a
//! reboot its owner falls back to a safe choice (ask OpenBao, clamp the wait).
//!
//! With the test-only feature `failpoints`, `MONKY_DEPLOYD_TEST_CLOCK="<wall> <boot> [<id>]"`
//! shifts the wall clock and the boot clock by signed seconds and may replace the boot id, so
//! the tests step one clock and not the other; the code path is otherwise the real one.

use serde::{Deserialize, Serialize};

/// A moment on the boot clock: seconds since this boot, and which boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootInstant {
    /// The kernel's boot id.
    pub boot_id: String,
    /// Seconds of `CLOCK_BOOTTIME`.
    pub secs: u64,
}

/// A deadline on the boot clock, as state.json keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootDeadline {
    /// The boot the deadline was set in; in another boot it says nothing.
    pub boot_id: String,
    /// `CLOCK_BOOTTIME` seconds at the deadline.
    pub at_s: u64,
}

impl BootDeadline {
    /// The deadline `secs` after `now`.
    #[must_use]
    pub fn after(now: &BootInstant, secs: u64) -> Self {
        Self {
            boot_id: now.boot_id.clone(),
            at_s: now.secs.saturating_add(secs),
        }
    }

    /// Seconds left at `now` (0 once passed); `None` when set in another boot.
    #[must_use]
    pub fn remaining(&self, now: &BootInstant) -> Option<u64> {
        (self.boot_id == now.boot_id).then(|| self.at_s.saturating_sub(now.secs))
    }

    /// Seconds since the deadline's moment at `now` (0 before it); `None` in another boot.
    #[must_use]
    pub fn elapsed(&self, now: &BootInstant) -> Option<u64> {
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

/// Now on the boot clock; `None` where the kernel has no boot id (not Linux, `/proc` absent),
/// and then every deadline falls back as after a reboot.
#[must_use]
pub fn boot() -> Option<BootInstant> {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let (_, boot_offset, id) = test_offsets();
    let boot_id = match id {
        Some(id) => id,
        None => std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()?
            .trim()
            .to_string(),
    };
    (!boot_id.is_empty()).then(|| BootInstant {
        boot_id,
        secs: shift(secs, boot_offset),
    })
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
    fn the_real_boot_clock_has_an_id_and_moves_forward() {
        let a = boot().expect("linux has a boot id");
        let b = boot().unwrap();
        assert_eq!(a.boot_id, b.boot_id);
        assert!(b.secs >= a.secs);
        assert_eq!(shift(10, -20), 0);
        assert_eq!(shift(10, 5), 15);
    }
}
