//! `run` without `--once`: ticks in a loop for boxes without the timer (laptops).
//!
//! The pace is tenancy's `checkin_interval_s` (config `interval_s` until it says one). A temporary
//! failure backs off exponentially with jitter, never faster than the interval, and honours
//! Retry-After. 78 ends the loop. SIGTERM and SIGINT let the current tick finish, then exit 0.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::Rng;
use tracing::info;

use crate::backoff::{Backoff, Jitter};
use crate::config::Config;
use crate::exit::Exit;
use crate::tick::{self, TickOptions};

/// The longest a backoff grows.
const MAX_BACKOFF: Duration = Duration::from_secs(15 * 60);

/// Loops until a signal or an unrecoverable status.
pub(crate) fn run(cfg: &Config, opts: TickOptions) -> anyhow::Result<Exit> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("cannot install signal handler")?;
    }
    let mut failures = 0u32;
    let test_interval = test_interval();
    loop {
        let outcome = tick::run_once(cfg, opts);
        if outcome.exit == Exit::Config {
            info!("exit 78: not retrying");
            return Ok(Exit::Config);
        }
        let interval = test_interval.unwrap_or_else(|| {
            outcome
                .interval
                .unwrap_or(cfg.interval)
                .max(Duration::from_secs(1))
        });
        failures = if outcome.exit == Exit::Temporary {
            failures + 1
        } else {
            0
        };
        let wait = next_wait(
            interval,
            failures,
            outcome.retry_after,
            rand::rng().random_range(0.0..1.0),
        );
        if stop.load(Ordering::Relaxed) {
            return Ok(Exit::Ok);
        }
        if failures > 0 {
            info!(
                "temporary failure #{failures}; next tick in {}s",
                wait.as_secs()
            );
        }
        // A wait no clock can represent is as good as forever: the loop then waits for a signal.
        let until = Instant::now().checked_add(wait);
        while until.is_none_or(|until| Instant::now() < until) {
            if stop.load(Ordering::Relaxed) {
                info!("signal received; stopping");
                return Ok(Exit::Ok);
            }
            let left = until.map_or(Duration::MAX, |u| {
                u.saturating_duration_since(Instant::now())
            });
            std::thread::sleep(Duration::from_millis(100).min(left));
        }
    }
}

/// The soak test's pace, in a build with the test-only feature `failpoints`:
/// `MONKY_DEPLOYD_TEST_INTERVAL_MS` replaces the interval (whole seconds, at least one,
/// everywhere else) so that thousands of ticks fit in a test run. Backoff and Retry-After still
/// apply on top of it. A release build has no such knob: the variable is not even read.
fn test_interval() -> Option<Duration> {
    #[cfg(feature = "failpoints")]
    {
        std::env::var("MONKY_DEPLOYD_TEST_INTERVAL_MS")
            .ok()?
            .parse()
            .ok()
            .map(Duration::from_millis)
    }
    #[cfg(not(feature = "failpoints"))]
    None
}

/// The wait before the next tick: the interval when healthy; after `failures` temporary failures,
/// interval x 2^(failures-1), capped, plus up to half again of jitter, and at least Retry-After.
fn next_wait(
    interval: Duration,
    failures: u32,
    retry_after: Option<Duration>,
    jitter: f64,
) -> Duration {
    if failures == 0 {
        return interval;
    }
    let backoff = Backoff {
        base: interval,
        cap: MAX_BACKOFF.max(interval),
        jitter: Jitter::Above(0.5),
    };
    backoff
        .wait(failures, jitter)
        .max(retry_after.unwrap_or_default())
        .max(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_never_undercuts_the_interval_and_honours_retry_after() {
        let s = Duration::from_secs;
        assert_eq!(next_wait(s(60), 0, None, 0.9), s(60));
        assert_eq!(next_wait(s(60), 1, None, 0.0), s(60));
        assert_eq!(next_wait(s(60), 2, None, 0.0), s(120));
        assert_eq!(next_wait(s(60), 3, None, 1.0), s(360));
        assert_eq!(next_wait(s(60), 30, None, 0.0), MAX_BACKOFF);
        assert_eq!(next_wait(s(60), 1, Some(s(600)), 0.0), s(600));
        assert_eq!(next_wait(s(3600), 5, None, 0.0), s(3600));
    }

    #[test]
    fn no_wait_overflows() {
        let huge = Duration::from_secs(u64::MAX);
        assert_eq!(next_wait(huge, 0, Some(huge), 1.0), huge);
        for failures in [1, 2, 40, u32::MAX] {
            assert!(next_wait(huge, failures, Some(huge), 1.0) >= huge);
            assert!(next_wait(Duration::from_secs(1), failures, Some(huge), 1.0) >= huge);
        }
    }
}
