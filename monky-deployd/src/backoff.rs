//! The one retry shape: a [`Backoff`] doubles a base wait per failure up to a cap and spreads
//! it by a jitter, so that a fleet of boxes does not retry in step. The run loop's temporary
//! failures, a failed release and a heal each keep one such value; no other code computes a
//! growing wait (tidy rule `one-backoff`).

use std::time::Duration;

/// How far past the first step a wait keeps doubling before the cap alone decides: enough for
/// any cap a caller gives (the shortest base, a second, reaches 18 h), and no shift overflows.
const MAX_DOUBLINGS: u32 = 16;

/// How a step is spread by a jitter draw `j` in 0..1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Jitter {
    /// Around the step: `step × (1 − spread + 2·spread·j)`, from `spread` below to `spread`
    /// above it, for a wait kept in state whose longest value must stay close to the step.
    Around(f64),
    /// Above the step only: `step + step × extra·j`, for a wait that must never be shorter
    /// than the step (the run loop's, never faster than the interval). Saturating.
    Above(f64),
}

/// A wait that doubles from `base` per failure up to `cap`, then spread by `jitter`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Backoff {
    /// The first step's wait.
    pub(crate) base: Duration,
    /// The longest step, before the jitter.
    pub(crate) cap: Duration,
    /// How a step is spread.
    pub(crate) jitter: Jitter,
}

impl Backoff {
    /// The step after the `failures`-th failure in a row, before the jitter: `base × 2^(n−1)`,
    /// at most `cap`. Zero failures count as one.
    #[must_use]
    pub(crate) fn step(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(MAX_DOUBLINGS);
        self.base.saturating_mul(1u32 << doublings).min(self.cap)
    }

    /// The wait after the `failures`-th failure in a row, with the jitter draw `j` (clamped to
    /// 0..1). Never overflows: a wait no `Duration` holds is `Duration::MAX`.
    #[must_use]
    pub(crate) fn wait(&self, failures: u32, j: f64) -> Duration {
        let step = self.step(failures);
        let j = j.clamp(0.0, 1.0);
        match self.jitter {
            Jitter::Around(spread) => {
                let factor = (1.0 - spread) + 2.0 * spread * j;
                Duration::try_from_secs_f64(step.as_secs_f64() * factor).unwrap_or(Duration::MAX)
            }
            Jitter::Above(extra) => step.saturating_add(
                Duration::try_from_secs_f64(step.as_secs_f64() * (extra * j))
                    .unwrap_or(Duration::MAX),
            ),
        }
    }

    /// The longest wait the `failures`-th step can have (the jitter at its top): what a kept
    /// deadline is held to when the clock it was set on is gone.
    #[must_use]
    pub(crate) fn longest(&self, failures: u32) -> Duration {
        self.wait(failures, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    const AROUND: Backoff = Backoff {
        base: secs(60),
        cap: secs(3600),
        jitter: Jitter::Around(0.1),
    };

    const ABOVE: Backoff = Backoff {
        base: secs(60),
        cap: secs(900),
        jitter: Jitter::Above(0.5),
    };

    #[test]
    fn the_step_doubles_from_the_base_to_the_cap() {
        assert_eq!(
            [0, 1, 2, 3, 4, 5, 6, 7, 20, u32::MAX].map(|n| AROUND.step(n).as_secs()),
            [60, 60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]
        );
        assert_eq!(
            [1, 2, 4, 5, 30].map(|n| ABOVE.step(n).as_secs()),
            [60, 120, 480, 900, 900]
        );
    }

    #[test]
    fn the_jitter_stays_within_its_bounds() {
        for n in [1, 2, 3, 7, 40] {
            let step = AROUND.step(n);
            for j in [-1.0, 0.0, 0.25, 0.5, 0.999, 1.0, 7.0] {
                let around = AROUND.wait(n, j);
                assert!(
                    around >= step.mul_f64(0.9) && around <= step.mul_f64(1.1),
                    "{n} {j}"
                );
                let step = ABOVE.step(n);
                let above = ABOVE.wait(n, j);
                assert!(above >= step && above <= step.mul_f64(1.5), "{n} {j}");
            }
        }
        assert_eq!(AROUND.wait(1, 0.0), secs(54));
        assert_eq!(AROUND.wait(1, 0.5), secs(60));
        assert_eq!(AROUND.longest(1), secs(66));
        assert_eq!(AROUND.longest(30), secs(3960));
        assert_eq!(ABOVE.wait(3, 1.0), secs(360));
        assert_eq!(ABOVE.longest(9), secs(1350));
    }

    #[test]
    fn no_wait_overflows() {
        let huge = Backoff {
            base: Duration::MAX,
            cap: Duration::MAX,
            jitter: Jitter::Above(0.5),
        };
        assert_eq!(huge.wait(u32::MAX, 1.0), Duration::MAX);
        let huge = Backoff {
            jitter: Jitter::Around(0.1),
            ..huge
        };
        assert_eq!(huge.wait(3, 1.0), Duration::MAX);
        assert!(huge.wait(3, 0.0) < Duration::MAX);
    }
}
