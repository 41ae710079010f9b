//! Retire, laptop mode, temporary failures, the lock, corrupt state and the loop.

use monky_agent_proto::ReportResult;
use monky_agent_proto::testkit::{Desired, Endpoint, Fault};
use serde_json::json;

use crate::apply::compose_sub;
use crate::util::*;

fn down_args(w: &World) -> Vec<String> {
    w.docker_calls()
        .into_iter()
        .filter(|c| compose_sub(c) == Some("down"))
        .collect()
}

#[test]
fn retire_keeps_volumes_unless_purge_is_asked() {
    let w = World::new();
    let sha = w.applied();
    w.tenancy.set_desired(ENV, Desired::down(false));
    w.tick().ok();
    let downs = down_args(&w);
    assert_eq!(downs.len(), 1);
    assert!(
        downs[0].contains("--remove-orphans") && !downs[0].contains(" -v"),
        "{downs:?}"
    );
    let r = w.last_report();
    assert_report(&r, ReportResult::Down, None);
    assert_eq!(r.sha.as_deref(), Some(sha.as_str()));
    assert!(w.state()["applied_sha"].is_null());
    assert!(w.current_target().is_none());

    let w = World::new();
    w.applied();
    w.tenancy.set_desired(ENV, Desired::down(true));
    w.tick().ok();
    assert!(down_args(&w)[0].contains(" -v"));
}

#[test]
fn retire_never_purges_prod() {
    let w = World::new();
    w.stage_grant();
    let mut b = TestBundle::default();
    b.meta["tier"] = json!("prod");
    w.publish(&b);
    w.tick().ok();
    w.tenancy.set_desired(ENV, Desired::down(true));
    w.tick().ok();
    assert!(!down_args(&w)[0].contains(" -v"));

    let w = World::new();
    w.config_extra("prod: true\nvolumes_on_absent: purge\n");
    w.applied();
    w.tenancy.set_desired(ENV, Desired::down(false));
    w.tick().ok();
    assert!(!down_args(&w)[0].contains(" -v"));
}

#[test]
fn after_a_revert_the_running_prod_release_is_still_prod() {
    let w = World::new();
    w.stage_grant();
    let mut good = TestBundle::default();
    good.meta["tier"] = json!("prod");
    let good_sha = w.publish(&good);
    w.tick().ok();
    assert_eq!(w.state()["applied_prod"], json!(true));
    // A release without a tier that never becomes healthy is reverted (its tier's default).
    w.stub("UNHEALTHY_IF", "web:bad");
    w.publish(&TestBundle::tagged("bad"));
    w.tick().expect(1);
    let st = w.state();
    assert_eq!(st["applied_sha"], json!(good_sha));
    assert_eq!(
        st["applied_prod"],
        json!(true),
        "applied_prod must describe applied_sha's release, not the failed one"
    );
    // So the retire that follows keeps the prod release's volumes.
    w.tenancy.set_desired(ENV, Desired::down(true));
    w.tick().ok();
    assert!(!down_args(&w)[0].contains(" -v"), "{:?}", down_args(&w));

    // A failed prod release left in place (on_failure: leave) is no applied release, and its
    // volumes are still a prod release's.
    let w = World::new();
    w.stage_grant();
    w.publish(&good);
    w.tick().ok();
    w.stub("UNHEALTHY_IF", "web:bad");
    let mut bad = TestBundle::tagged("bad");
    bad.meta["tier"] = json!("prod");
    w.publish(&bad);
    w.tick().expect(1);
    let st = w.state();
    assert!(
        st["applied_sha"].is_null() && st["applied_prod"].is_null(),
        "{st}"
    );
    w.tenancy.set_desired(ENV, Desired::down(true));
    w.tick().ok();
    assert!(!down_args(&w)[0].contains(" -v"), "{:?}", down_args(&w));
}

#[test]
fn volumes_on_absent_purge() {
    let w = World::new();
    w.config_extra("volumes_on_absent: purge\n");
    w.applied();
    w.tenancy.set_desired(ENV, Desired::down(false));
    w.tick().ok();
    assert!(down_args(&w)[0].contains(" -v"));
}

#[test]
fn tenancy_unreachable_is_temporary_and_quiet_on_a_laptop() {
    let w = World::new();
    w.applied();
    w.tenancy
        .set_fault(Endpoint::Checkin, Fault::DropConnection);
    w.tick().expect(75);
    w.tenancy.set_fault(
        Endpoint::Checkin,
        Fault::Status {
            status: 503,
            body: "<html>bad gateway</html>".into(),
        },
    );
    w.tick().expect(75);
    w.config_extra("laptop_mode: true\n");
    let run = w.tick();
    run.ok();
    assert!(run.stderr().contains("offline"), "{}", run.stderr());
    assert_eq!(
        run.stderr().lines().count(),
        1,
        "one line, not a stack: {}",
        run.stderr()
    );
}

#[test]
fn openbao_down_during_apply_is_temporary_and_changes_nothing() {
    let w = World::new();
    let first = w.applied();
    // Sealed for the agent's logins; tenancy's own token lookups still pass.
    w.bao.set_fault(
        "/v1/auth/jwt-tenancy",
        monky_bao_client::testkit::Fault::Sealed,
    );
    // A bootstrap token is swapped for a lease at apply time, so the apply needs a login.
    w.publish(&TestBundle::tagged("2"));
    let mut st = w.state();
    st["token"]["source"] = json!("bootstrap");
    std::fs::write(w.state_dir().join("state.json"), st.to_string()).unwrap();
    w.tick().expect(75);
    assert_eq!(w.state()["applied_sha"], json!(first));
    assert_eq!(
        w.current_target().unwrap(),
        std::path::Path::new("releases").join(&first)
    );
}

#[test]
fn a_held_lock_exits_0_without_network() {
    let w = World::new();
    w.applied();
    let before = w.requests().len();
    let f = std::fs::File::options()
        .write(true)
        .open(w.state_dir().join("lock"))
        .unwrap();
    f.lock().unwrap();
    w.tick().ok();
    assert_eq!(w.requests().len(), before);
    drop(f);
    w.tick().ok();
    assert_eq!(w.requests().len(), before + 2);
}

#[test]
fn a_corrupt_state_is_set_aside_and_the_agent_recovers() {
    let w = World::new();
    w.applied();
    std::fs::write(w.state_dir().join("state.json"), "{garbage").unwrap();
    let run = w.tick();
    run.ok();
    assert!(run.stderr().contains("set aside"), "{}", run.stderr());
    let aside = std::fs::read_dir(w.state_dir())
        .unwrap()
        .flatten()
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("state.json.bad.")
        });
    assert!(aside);
    assert!(
        w.state()["applied_sha"].is_string(),
        "re-applied from tenancy's desired sha"
    );
}

#[test]
fn the_loop_stops_on_sigterm_after_the_current_tick() {
    let w = World::new();
    w.applied();
    w.tenancy.set_desired(
        ENV,
        Desired {
            checkin_interval_s: Some(1),
            ..Desired::sha(w.state()["applied_sha"].as_str().unwrap())
        },
    );
    let mut child = w
        .command(&["run"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while w.reports().len() < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(w.reports().len() >= 4, "the loop kept ticking");
    let pid = child.id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_retire_masks_the_secrets_of_a_release_it_did_not_render() {
    let w = World::new();
    w.applied();
    let kv_reads = |w: &World| {
        w.bao
            .agent_requests()
            .iter()
            .filter(|r| r.path.contains("/data/"))
            .count()
    };
    let reads_before = kv_reads(&w);
    // This tick reads no secret, yet compose quotes the release's .env in its error.
    w.tenancy.set_desired(ENV, Desired::down(false));
    w.stub("DOWN_FAIL_QUOTING_ENV", "1");
    let run = w.tick();
    run.expect(1);
    let last_error = w.state()["last_error"].as_str().unwrap().to_string();
    assert!(
        last_error.starts_with("COMPOSE_DOWN_FAILED: "),
        "{last_error}"
    );
    assert!(last_error.contains("failed to read .env"), "{last_error}");
    assert!(
        run.stderr().contains("failed to read .env"),
        "{}",
        run.stderr()
    );
    // The failed `down` reaches tenancy too, not only the journal.
    let report = w.last_report();
    assert_eq!(report.result, ReportResult::Failed);
    let detail = report.detail.clone().unwrap_or_default();
    assert!(detail.starts_with("COMPOSE_DOWN_FAILED: "), "{detail}");
    assert!(detail.contains("failed to read .env"), "{detail}");
    assert_eq!(w.state()["last_result"], "failed");
    let state = w.state().to_string();
    let report = format!("{report:?}");
    for secret in [GEMINI, PGPASS] {
        assert!(!run.stderr().contains(secret), "{}", run.stderr());
        assert!(!state.contains(secret), "{state}");
        assert!(!report.contains(secret), "{report}");
    }
    assert_eq!(kv_reads(&w), reads_before, "the retire read no secret");
}
