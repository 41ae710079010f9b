//! The failed-release backoff: how long a release that failed waits before it is tried again,
//! kept in state.json's flat `failed_*` fields.

use std::time::Duration;

use crate::code::Code;
use crate::state::State;

/// The wait of a release that failed once more: which attempt this was and when the next may
/// start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// How many applies of the sha failed in a row, this one included.
    pub attempts: u32,
    /// When the sha may be tried again (unix seconds).
    pub next_attempt_at: u64,
}

impl Backoff {
    /// The backoff after `sha` failed at `now`: one attempt more when it is the sha that failed
    /// before, else the first. `jitter` is in 0..1.
    pub fn after_failure(state: &State, sha: &str, now: u64, jitter: f64) -> Self {
        let attempts = if state.failed_sha.as_deref() == Some(sha) {
            state.failed_attempts.saturating_add(1)
        } else {
            1
        };
        Self {
            attempts,
            next_attempt_at: now.saturating_add(failure_backoff(attempts, jitter).as_secs()),
        }
    }

    /// Writes the backoff for `sha` into the state, with the failure's code and `CODE: names`
    /// that the reports repeat while it waits.
    pub fn record(self, state: &mut State, sha: &str, code: Code, detail: String) {
        state.failed_sha = Some(sha.to_string());
        state.failed_attempts = self.attempts;
        state.next_attempt_at = Some(self.next_attempt_at);
        state.failed_code = Some(code);
        state.failed_detail = Some(detail);
    }

    /// When `sha` may be tried again, if it is the failed sha and its wait has not run out at
    /// `now`. A query only: it changes nothing.
    pub fn deadline(state: &State, sha: &str, now: u64) -> Option<u64> {
        if state.failed_sha.as_deref() != Some(sha) {
            return None;
        }
        state.next_attempt_at.filter(|d| *d > now)
    }
}

/// The wait after the `attempts`-th failure of the same release: 1 min doubling up to 1 h,
/// spread by up to 20% (`jitter` in 0..1) so a fleet does not retry in step.
pub fn failure_backoff(attempts: u32, jitter: f64) -> Duration {
    let base = (60u64 << attempts.saturating_sub(1).min(6)).min(3600);
    Duration::from_secs(base).mul_f64(0.9 + 0.2 * jitter.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "a";
    const B: &str = "b";

    #[test]
    fn failure_backoff_doubles_from_a_minute_to_an_hour_with_jitter() {
        let secs = |n, j| failure_backoff(n, j).as_secs();
        assert_eq!(
            [1, 2, 3, 4, 5, 6, 7, 20].map(|n| secs(n, 0.5)),
            [60, 120, 240, 480, 960, 1920, 3600, 3600]
        );
        assert_eq!(secs(1, 0.0), 54);
        assert_eq!(secs(1, 1.0), 66);
        assert_eq!(secs(30, 1.0), 3960);
    }

    #[test]
    fn the_same_sha_counts_up_and_another_starts_over() {
        let mut st = State::default();
        let first = Backoff::after_failure(&st, A, 1000, 0.5);
        assert_eq!(
            first,
            Backoff {
                attempts: 1,
                next_attempt_at: 1060
            }
        );
        first.record(&mut st, A, Code::Unhealthy, "UNHEALTHY: web".into());
        let second = Backoff::after_failure(&st, A, 2000, 0.5);
        assert_eq!(
            second,
            Backoff {
                attempts: 2,
                next_attempt_at: 2120
            }
        );
        second.record(&mut st, A, Code::Unhealthy, "UNHEALTHY: web".into());
        assert_eq!(st.failed_attempts, 2);
        assert_eq!(st.failed_code, Some(Code::Unhealthy));
        assert_eq!(Backoff::after_failure(&st, B, 3000, 0.5).attempts, 1);
        st.failed_attempts = u32::MAX;
        assert_eq!(
            Backoff::after_failure(&st, A, u64::MAX, 1.0).attempts,
            u32::MAX
        );
        assert_eq!(
            Backoff::after_failure(&st, A, u64::MAX, 1.0).next_attempt_at,
            u64::MAX
        );
    }

    #[test]
    fn the_deadline_holds_only_for_the_failed_sha_and_changes_nothing() {
        let mut st = State::default();
        assert_eq!(Backoff::deadline(&st, A, 0), None);
        Backoff::after_failure(&st, A, 1000, 0.5).record(&mut st, A, Code::Failed, "x".into());
        let before = st.clone();
        assert_eq!(Backoff::deadline(&st, A, 1059), Some(1060));
        assert_eq!(Backoff::deadline(&st, A, 1060), None, "run out");
        assert_eq!(Backoff::deadline(&st, B, 1000), None, "another sha");
        assert_eq!(st, before);
    }
}
