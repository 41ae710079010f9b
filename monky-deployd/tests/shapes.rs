//! A peer's values are shapes: a tick meets tenancy answers of the wrong shape (a padded or
//! multibyte `desired_sha`, another env's answer, intervals and waits no clock can hold) and
//! refuses them by code, saves its state and keeps the running release; the loop never crashes
//! on a peer's number.

use std::time::{Duration, Instant};

use monky_testkit::tenancy::{Desired, Endpoint, Fault};
use serde_json::json;

use crate::util::*;

/// A box running `TestBundle::default()` and then `tagged("2")`; returns both shas.
fn two_releases(w: &World) -> (String, String) {
    let first = w.applied();
    let second = w.publish(&TestBundle::tagged("2"));
    w.tick().ok();
    assert_eq!(w.state()["applied_sha"], json!(second));
    (first, second)
}

fn logins(w: &World) -> usize {
    w.bao
        .agent_requests()
        .iter()
        .filter(|r| r.path.ends_with("/login"))
        .count()
}

fn bundle_fetches(w: &World) -> usize {
    w.requests()
        .iter()
        .filter(|r| r.endpoint == Some(Endpoint::Bundle))
        .count()
}

#[test]
fn a_desired_sha_of_the_wrong_shape_is_checkin_invalid_and_changes_nothing() {
    // Each spelling names the release that ran before: a padded one got past the rollback guard,
    // and a multibyte character at byte 12 crashed every tick.
    let spellings: [fn(&str) -> String; 5] = [
        |s| format!(" {s}"),
        |s| format!("{s}\n"),
        |s| format!("\u{3000}{s}"),
        |s| format!("{}é{}", &s[..12], &s[14..]),
        |s| s.to_uppercase(),
    ];
    for spell in spellings {
        // A world each: tenancy's checkin bucket holds six a minute.
        let w = World::new();
        let (first, second) = two_releases(&w);
        let current = w.current_target();
        let fetches = bundle_fetches(&w);
        let sha = spell(&first);
        w.tenancy.set_desired(ENV, Desired::sha(sha.clone()));
        let run = w.tick();
        // Not a panic (101), and not the rollback guard's business: the answer never decoded.
        run.expect(1);
        assert!(
            run.stderr().contains("CHECKIN_INVALID"),
            "{sha:?}: {}",
            run.stderr()
        );
        assert_eq!(bundle_fetches(&w), fetches, "{sha:?}: a bundle was fetched");
        let state = w.state();
        assert_eq!(state["applied_sha"], json!(second), "{sha:?}");
        assert!(
            state["last_error"]
                .as_str()
                .is_some_and(|e| e.starts_with("CHECKIN_INVALID: ")),
            "{sha:?}: {state}"
        );
        assert_eq!(w.current_target(), current, "{sha:?}");
        // Only the agent's own release dirs exist: nothing was staged under another name.
        let releases: Vec<_> = std::fs::read_dir(w.env_dir().join("releases"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            releases.iter().all(|r| *r == first || *r == second),
            "{sha:?}: {releases:?}"
        );
    }
}

#[test]
fn another_envs_checkin_answer_is_refused() {
    let w = World::new();
    let (_, second) = two_releases(&w);
    w.checkin_answers(
        &json!({"env_id": "env-other", "desired_sha": "ab".repeat(32), "action": "apply"}),
    );
    let run = w.tick();
    run.expect(1);
    run.says(&["CHECKIN_INVALID", "env-other"]);
    assert_eq!(w.state()["applied_sha"], json!(second));
}

#[test]
fn another_envs_lease_answer_is_refused_before_any_login() {
    let w = World::new();
    let first = w.applied();
    let logins_before = logins(&w);
    let jwt = w.tenancy.mint_grant("env-other");
    let body = json!({"env_id": "env-other", "login_jwt": secrecy::ExposeSecret::expose_secret(&jwt),
                      "ttl_s": 3600, "mount": "jwt-tenancy", "role": "see-env", "addr": null});
    w.tenancy.set_fault(
        Endpoint::Lease,
        Fault::Status {
            status: 200,
            body: body.to_string(),
        },
    );
    // The first apply swapped the bootstrap token for a lease; a new lease is due only when
    // that one is no longer valid, so drop it from state to force one.
    let mut state = w.state();
    state["token"]["source"] = json!("bootstrap");
    std::fs::write(
        w.state_dir().join("state.json"),
        serde_json::to_vec(&state).unwrap(),
    )
    .unwrap();
    w.publish(&TestBundle::tagged("2"));
    let run = w.tick();
    run.expect(1);
    assert_report(
        &w.last_report(),
        monky_agent_proto::ReportResult::Failed,
        Some("LEASE_INVALID: "),
    );
    assert_eq!(logins(&w), logins_before, "the foreign grant was used");
    assert_eq!(w.state()["applied_sha"], json!(first));
}

/// Runs `monky-deployd run` until one more checkin has been answered and saved, checks that
/// the loop is still alive (waiting, not crashed), then stops it with SIGTERM; returns its
/// stderr.
fn loop_survives_one_checkin(w: &World) -> String {
    let checkins = |w: &World| {
        w.requests()
            .iter()
            .filter(|r| r.endpoint == Some(Endpoint::Checkin))
            .count()
    };
    let from = checkins(w);
    let mut child = w
        .command(&["run"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while checkins(w) <= from && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(checkins(w) > from, "no checkin");
    // Past the tick's end (state saved, metrics written): the loop is now waiting.
    std::thread::sleep(Duration::from_secs(2));
    let alive = child.try_wait().unwrap().is_none();
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(alive, "the loop died: {:?}\n{stderr}", out.status);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    stderr.into_owned()
}

#[test]
fn a_checkin_interval_of_u64_max_or_1e12_waits_an_hour_at_most() {
    for interval in [u64::MAX, 1_000_000_000_000] {
        let w = World::new();
        let sha = w.applied();
        w.tenancy.set_desired(
            ENV,
            Desired {
                checkin_interval_s: Some(interval),
                ..Desired::sha(sha)
            },
        );
        loop_survives_one_checkin(&w);
        assert_eq!(w.state()["checkin_interval_s"], json!(3600), "{interval}");
    }
}

#[test]
fn a_retry_after_of_u64_max_or_1e12_does_not_crash_the_loop() {
    for wait in [u64::MAX, 1_000_000_000_000] {
        let w = World::new();
        w.applied();
        w.tenancy
            .set_fault(Endpoint::Checkin, Fault::RetryAfter(wait));
        let stderr = loop_survives_one_checkin(&w);
        assert!(stderr.contains("next tick in 3600s"), "{wait}: {stderr}");
    }
}
