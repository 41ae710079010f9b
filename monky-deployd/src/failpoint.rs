//! Crash points for the crash-recovery tests (cargo feature `failpoints`).
//!
//! With the feature on, `MONKY_DEPLOYD_FAILPOINT=<name>` makes the process kill itself with
//! SIGKILL when it reaches `hit(<name>)`, so a test can prove that a crash at that step loses
//! nothing. Without the feature, `hit` compiles to nothing. The same test-only feature gives the
//! loop mode a millisecond interval for the soak test (see `runloop`).

/// [`hit`] for a point in the work on one file: `<point>` or `<point>:<file>` kills.
pub(crate) fn hit_at(point: &str, file: &str) {
    #[cfg(feature = "failpoints")]
    if std::env::var("MONKY_DEPLOYD_FAILPOINT").is_ok_and(|v| {
        v == point || v.strip_prefix(point).and_then(|r| r.strip_prefix(':')) == Some(file)
    }) {
        hit(&std::env::var("MONKY_DEPLOYD_FAILPOINT").unwrap_or_default());
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = (point, file);
}

/// Dies here if the failpoint `name` is armed (feature `failpoints` only).
#[inline]
pub(crate) fn hit(name: &str) {
    #[cfg(feature = "failpoints")]
    if std::env::var("MONKY_DEPLOYD_FAILPOINT").is_ok_and(|v| v == name) {
        // SIGKILL: no destructors, no flush, exactly what a power cut or OOM kill leaves behind.
        use rustix::process::{Signal, getpid, kill_process};
        let _ = kill_process(getpid(), Signal::KILL);
        std::process::abort();
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
