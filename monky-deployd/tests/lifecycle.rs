//! Retire, laptop mode, temporary failures, the lock, corrupt state and the loop.

use monky_agent_proto::ReportResult;
use monky_testkit::tenancy::{Desired, Endpoint, Fault};
use serde_json::json;

use crate::apply::compose_sub;
use crate::util::*;

fn down_args(w: &World) -> Vec<String> {
    w.docker_calls()
        .into_iter()
        .filter(|c| compose_sub(c) == Some("down"))
        .collect()
}

/// A world that applied `b` under the `config` lines, then retired with tenancy asking for a
/// purge or not: the world, the sha, and the `compose down` lines the retire ran.
fn retire(config: &str, b: &TestBundle, purge: bool) -> (World, String, Vec<String>) {
    let w = World::new();
    w.config_extra(config);
    w.stage_grant();
    let sha = w.publish(b);
    w.tick().ok();
    w.tenancy.set_desired(ENV, Desired::down(purge));
    w.tick().ok();
    let downs = down_args(&w);
    (w, sha, downs)
}

fn prod_bundle() -> TestBundle {
    let mut b = TestBundle::default();
    b.meta["tier"] = json!("prod");
    b
}

#[test]
fn retire_keeps_volumes_unless_purge_is_asked() {
    let (w, sha, downs) = retire("", &TestBundle::default(), false);
    assert_eq!(downs.len(), 1);
    assert!(
        downs[0].contains("--remove-orphans") && !downs[0].contains(" -v"),
        "{downs:?}"
    );
    let r = w.last_report();
    assert_report(&r, ReportResult::Down, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert!(w.state()["applied_sha"].is_null());
    assert!(w.current_target().is_none());
}

/// A release changed on disk is not taken down: its compose file could steer `down -v` at
/// volumes it never owned. The retire fails, `current` and the release stay.
#[test]
fn a_release_changed_on_disk_is_not_taken_down() {
    let w = World::new();
    w.stage_grant();
    let sha = w.publish(&TestBundle::default());
    w.tick().ok();
    let env = w.env_dir().join(format!("releases/{sha}/.env"));
    let mut text = std::fs::read_to_string(&env).unwrap();
    text.push_str("EXTRA=1\n");
    std::fs::write(&env, text).unwrap();
    w.tenancy.set_desired(ENV, Desired::down(true));
    w.tick().expect(1);
    assert_eq!(down_args(&w), Vec::<String>::new(), "no compose down");
    assert_report(
        &w.last_report(),
        ReportResult::Failed,
        Some("RELEASE_MODIFIED"),
    );
    assert_eq!(w.state()["applied_sha"], json!(sha));
    assert!(w.current_target().is_some());
}

#[test]
fn retire_removes_volumes_when_purged_or_configured_and_never_on_prod() {
    let qa = TestBundle::default();
    let prod = prod_bundle();
    for (config, bundle, purge, removes_volumes) in [
        ("", &qa, true, true),
        ("volumes_on_absent: purge\n", &qa, false, true),
        ("", &prod, true, false),
        ("prod: true\nvolumes_on_absent: purge\n", &qa, false, false),
    ] {
        let (_, _, downs) = retire(config, bundle, purge);
        let tier = &bundle.meta["tier"];
        assert_eq!(downs.len(), 1, "{config:?}, tier {tier}, purge {purge}");
        assert_eq!(
            downs[0].contains(" -v"),
            removes_volumes,
            "{config:?}, tier {tier}, purge {purge}: {downs:?}"
        );
    }
}

#[test]
fn after_a_revert_the_running_prod_release_is_still_prod() {
    let w = World::new();
    w.stage_grant();
    let good = prod_bundle();
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
    run.says(&["offline"]);
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
    w.bao
        .set_fault("/v1/auth/jwt-tenancy", monky_testkit::bao::Fault::Sealed);
    // A bootstrap token is swapped for a lease at apply time, so the apply needs a login.
    w.publish(&TestBundle::tagged("2"));
    let mut st = w.state();
    st["token"]["source"] = json!("bootstrap");
    std::fs::write(w.state_dir().join("state.json"), st.to_string()).unwrap();
    w.tick().expect(75);
    assert_eq!(w.state()["applied_sha"], json!(first));
    w.assert_current(&first);
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
    run.says(&["set aside"]);
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
    run.says(&["failed to read .env"]);
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

/// After a successful `down` the box is where tenancy wants it, and every view agrees: the
/// status and the metrics say converged, a later heartbeat too.
#[test]
fn after_a_retire_every_view_says_converged() {
    let w = World::new();
    let prom = w.path("metrics.prom");
    w.config_extra(&format!("metrics_textfile: {}\n", prom.display()));
    w.stage_grant();
    w.publish(&TestBundle::default());
    w.tick().ok();
    w.tenancy.set_desired(ENV, Desired::down(false));
    w.tick().ok();
    assert_report(&w.last_report(), ReportResult::Down, None);
    let status: serde_json::Value =
        serde_json::from_str(&w.run(&["status", "--json"]).stdout()).unwrap();
    assert_eq!(status["converged"], true, "{status:#}");
    let metrics = std::fs::read_to_string(&prom).unwrap();
    assert!(
        metrics.contains("monky_deployd_converged{env_id=\"env-qa-02\"} 1"),
        "{metrics}"
    );
    w.tenancy.advance_clock(std::time::Duration::from_secs(60));
    w.tick().ok();
    let metrics = std::fs::read_to_string(&prom).unwrap();
    assert!(
        metrics.contains("monky_deployd_converged{env_id=\"env-qa-02\"} 1"),
        "{metrics}"
    );
}
