//! Wall-clock steps of 20 h either way, around real renewals on the real OpenBao and around a
//! failed release's backoff, and of 3 h around an operator's hold: nothing that lasts changes (and each such tick ends `TLS_CLOCK`). The agent's clocks are shifted through
//! `MONKY_DEPLOYD_TEST_CLOCK` (wall offset, boot offset, boot id), which only a build with the
//! test-only feature `failpoints` honours (the CI suite runs with --all-features).

#![cfg(feature = "failpoints")]

use monky_agent_proto::ReportResult;
use monky_testkit::bao::BaoPeer;

use crate::util::*;

const HOUR: i64 = 3600;

/// A tick with the wall clock `wall` seconds off and `boot` seconds of boot clock passed
/// (both relative to the real clocks), in the boot `boot_id` when given.
fn clocked<B: BaoPeer + 'static>(w: &World<B>, wall: i64, boot: i64, boot_id: Option<&str>) -> Run {
    let spec = format!("{wall} {boot} {}", boot_id.unwrap_or(""));
    Run(w
        .command(&["run", "--once"])
        .env("MONKY_DEPLOYD_TEST_CLOCK", spec.trim())
        .output()
        .unwrap())
}

/// A tick with the wall clock hours off OpenBao's did its work and ends `TLS_CLOCK`, exit 1:
/// scheduling holds whatever the clock does, but nothing says "ok" with it off. (A tick that
/// plays hours passing on the box's clocks alone, after OpenBao answered, is off by as much:
/// OpenBao's `Date` did not move.)
#[track_caller]
fn clock_off(run: &Run, by: &str) {
    run.expect(1);
    assert!(
        run.stderr()
            .contains(&format!("TLS_CLOCK: this box's clock is {by} ")),
        "{}",
        run.stderr()
    );
}

fn renewed(run: &Run) -> bool {
    run.stderr().contains("token renewed")
}

#[test]
fn one_tick_20h_ahead_does_not_stop_the_later_renewal_on_the_real_openbao() {
    let Some(w) = World::real_bao() else { return };
    w.applied();
    // One tick with the wall clock 20 h ahead: the 24 h token is fresh by OpenBao's TTL.
    let run = clocked(&w, 20 * HOUR, 0, None);
    clock_off(&run, "20h");
    assert!(!renewed(&run), "{}", run.stderr());
    // The clock is right again and 13 h have passed: 11 h left, below renew_below_s (12 h).
    // (13 h passed on the box alone: the renewal's Date says it is 13 h ahead.)
    let run = clocked(&w, 13 * HOUR, 13 * HOUR, None);
    clock_off(&run, "13h ahead");
    run.says(&["token renewed (ttl 86400s)"]);
    assert_report(&w.last_report(), ReportResult::Applied, None);
}

#[test]
fn a_clock_20h_behind_does_not_postpone_the_renewal_on_the_real_openbao() {
    let Some(w) = World::real_bao() else { return };
    w.applied();
    // The wall clock steps 20 h back, then 13 h pass: by the wall clock the token would have
    // 31 h left; OpenBao's TTL counted on the boot clock has 11 h.
    let run = clocked(&w, -20 * HOUR, 0, None);
    clock_off(&run, "20h");
    assert!(!renewed(&run), "{}", run.stderr());
    let run = clocked(&w, 13 * HOUR - 20 * HOUR, 13 * HOUR, None);
    clock_off(&run, "7h behind");
    run.says(&["token renewed (ttl 86400s)"]);
    // The renewed token is still the bearer OpenBao vouches for at the next checkin.
    clock_off(
        &clocked(&w, 13 * HOUR - 20 * HOUR, 13 * HOUR + 60, None),
        "7h behind",
    );
    assert_report(&w.last_report(), ReportResult::Applied, None);
}

#[test]
fn after_a_reboot_with_the_clock_behind_openbao_is_asked_and_renewal_stays_on_time() {
    let Some(w) = World::real_bao() else { return };
    w.applied();
    // Another boot, the wall clock 20 h behind: the stored expiry says 44 h, which nothing on
    // the box can check, so OpenBao's TTL is asked for.
    let run = clocked(&w, -20 * HOUR, 0, Some("a-later-boot"));
    clock_off(&run, "20h");
    run.says(&["token facts for this boot learnt from OpenBao (ttl"]);
    assert!(!renewed(&run), "{}", run.stderr());
    let run = clocked(&w, 13 * HOUR - 20 * HOUR, 13 * HOUR, Some("a-later-boot"));
    clock_off(&run, "7h behind");
    run.says(&["token renewed (ttl 86400s)"]);
}

fn bundle_requests<B: BaoPeer + 'static>(w: &World<B>) -> usize {
    w.requests()
        .iter()
        .filter(|r| r.path.starts_with("/v1/agent/bundle/"))
        .count()
}

#[test]
fn a_failed_release_waits_its_backoff_whatever_the_wall_clock_does() {
    let w = World::new();
    w.applied();
    w.stub("UNHEALTHY_IF", "web:bad");
    let bad = w.publish(&TestBundle::tagged("bad"));
    w.tick().expect(1);
    assert_eq!(w.state()["failed_sha"], bad.as_str());
    let bundles = bundle_requests(&w);

    // 10 s later with the clock 20 h ahead: the minute's wait is not over.
    let run = clocked(&w, 20 * HOUR + 10, 10, None);
    run.expect(1);
    assert_eq!(bundle_requests(&w), bundles, "{}", run.stderr());
    let detail = w.last_report().detail.unwrap();
    assert!(detail.contains("next attempt"), "{detail}");

    // 2 min later with the clock 20 h behind: the wait is over and the sha is tried again.
    let run = clocked(&w, 120 - 20 * HOUR, 120, None);
    run.expect(1);
    assert_eq!(bundle_requests(&w), bundles + 1, "{}", run.stderr());
    assert_eq!(w.state()["failed_attempts"], 2);

    // After a reboot, the clock a further 20 h behind: the wall-clock deadline, 20 h out, is
    // held to the longest wait two failures have (2 min + 10%) on the new boot's clock...
    let run = clocked(&w, 200 - 40 * HOUR, 0, Some("a-later-boot"));
    run.expect(1);
    assert_eq!(bundle_requests(&w), bundles + 1, "{}", run.stderr());
    // ...which runs out although the wall clock stays behind.
    let run = clocked(&w, 340 - 40 * HOUR, 140, Some("a-later-boot"));
    run.expect(1);
    assert_eq!(bundle_requests(&w), bundles + 2, "{}", run.stderr());
}

#[test]
fn an_implausible_stored_expiry_is_checked_with_openbao() {
    let w = World::new();
    w.applied();
    // More left on the boot clock than the token was ever granted: not an OpenBao answer.
    let mut st = w.state();
    st["token"]["expires_boot"]["at_s"] = serde_json::json!(u64::MAX / 2);
    std::fs::write(w.state_dir().join("state.json"), st.to_string()).unwrap();
    let n = w.bao.agent_requests().len();
    let run = w.tick();
    run.ok();
    run.says(&["token facts for this boot learnt from OpenBao"]);
    assert!(
        w.bao.agent_requests()[n..]
            .iter()
            .any(|r| r.path.ends_with("/lookup-self"))
    );
    let left = w.state()["token"]["expires_boot"]["at_s"].as_u64().unwrap();
    assert!(left < u64::MAX / 2, "rebased on OpenBao's TTL");
}

/// The boot clock costs a heartbeat nothing at OpenBao: no call within a boot, one
/// `lookup-self` in the first tick of a new boot, none after.
#[test]
fn a_heartbeat_asks_openbao_once_per_boot_at_most() {
    let w = World::new();
    w.applied();
    let paths = |from: usize| -> Vec<String> {
        w.bao.agent_requests()[from..]
            .iter()
            .map(|r| r.path.clone())
            .collect()
    };
    let n = w.bao.agent_requests().len();
    w.tick().ok();
    assert_eq!(paths(n), Vec::<String>::new(), "same boot");
    let n = w.bao.agent_requests().len();
    clocked(&w, 0, 0, Some("a-later-boot")).ok();
    let asked = paths(n);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].ends_with("/lookup-self"), "{asked:?}");
    let n = w.bao.agent_requests().len();
    clocked(&w, 60, 60, Some("a-later-boot")).ok();
    assert_eq!(
        paths(n),
        Vec::<String>::new(),
        "the new boot's facts are kept"
    );
}

/// Whether the tick left the hold file in place, and the last report says `HELD: <reason>`.
#[track_caller]
fn still_held<B: BaoPeer + 'static>(w: &World<B>, reason: &str) {
    assert!(w.state_dir().join("hold").exists(), "the hold file is gone");
    let detail = w.last_report().detail.unwrap_or_default();
    assert!(detail.starts_with(&format!("HELD: {reason}")), "{detail}");
    assert!(
        w.run(&["status"]).stdout().contains("held"),
        "status: {}",
        w.run(&["status"]).stdout()
    );
}

/// `hold --until 2h`, then a tick with the wall clock 3 h ahead (a bad NTP answer, a resumed
/// VM): the tick sees the step, keeps the hold and applies nothing; back at the real time,
/// within the 2 h, the box is still held. The hold's end is on the boot clock.
#[test]
fn a_wall_clock_step_does_not_end_a_hold() {
    let w = World::new();
    let sha = w.applied();
    w.run(&["hold", "--reason", "restore", "--until", "2h"])
        .ok();
    let bundles = bundle_requests(&w);
    w.publish(&TestBundle::tagged("2"));

    let run = clocked(&w, 3 * HOUR, 0, None);
    clock_off(&run, "3h ahead");
    still_held(&w, "restore");
    assert_eq!(bundle_requests(&w), bundles, "{}", run.stderr());
    w.assert_current(&sha);

    w.tick().ok();
    still_held(&w, "restore");
    assert_eq!(bundle_requests(&w), bundles);
    w.assert_current(&sha);
    let hold: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.state_dir().join("hold")).unwrap()).unwrap();
    assert!(hold["until_boot"]["at_s"].as_u64().is_some(), "{hold}");

    // Two hours later on both clocks the hold ends by itself and the release applies.
    let run = clocked(&w, 2 * HOUR + 10, 2 * HOUR + 10, None);
    clock_off(&run, "2h ahead");
    assert!(!w.state_dir().join("hold").exists(), "{}", run.stderr());
    assert_eq!(bundle_requests(&w), bundles + 1);
}

/// A hold file of an older agent (no end on the boot clock) past its end only by a clock that
/// stepped 3 h ahead is kept; at the real time, with the clock agreeing with OpenBao's, it is
/// carried onto the boot clock.
#[test]
fn an_older_hold_file_is_not_ended_by_a_stepped_clock() {
    let w = World::new();
    let sha = w.applied();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let path = w.state_dir().join("hold");
    let old = serde_json::json!({"reason": "old agent", "since": now, "until": now + 2 * 3600});
    std::fs::write(&path, old.to_string()).unwrap();
    let bundles = bundle_requests(&w);
    w.publish(&TestBundle::tagged("2"));

    let run = clocked(&w, 3 * HOUR, 0, None);
    clock_off(&run, "3h ahead");
    run.says(&["which the agent cannot vouch for now"]);
    still_held(&w, "old agent");
    assert_eq!(bundle_requests(&w), bundles);
    w.assert_current(&sha);

    w.tick().ok();
    still_held(&w, "old agent");
    let hold: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(hold["until"], old["until"]);
    assert!(hold["until_boot"]["at_s"].as_u64().is_some(), "{hold}");
}
