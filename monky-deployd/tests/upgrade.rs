//! Upgrading a box from the original agent: its state.json taken over, its `transport: sdk`
//! carried onto the proxy, its log levels understood, and the `.env` quoting change named.

use std::time::Duration;

use monky_agent_proto::ReportResult;
use serde_json::{Value, json};

use crate::apply::compose_sub;
use crate::util::*;

/// Rewrites the agent's state.json into the original agent's shape: no `version`, only the
/// fields the original kept, and a token entry without the times this agent records.
fn as_original(w: &World, sha: &str) {
    let original = json!({
        "env_id": ENV,
        "applied_sha": sha,
        "desired_sha": sha,
        "last_checkin": 1_790_000_000.5,
        "last_result": "applied",
        "last_error": null,
        "token": {"source": "lease"},
    });
    std::fs::write(
        w.state_dir().join("state.json"),
        serde_json::to_vec_pretty(&original).unwrap(),
    )
    .unwrap();
}

fn bao_paths(w: &World) -> Vec<String> {
    w.bao.agent_requests().into_iter().map(|r| r.path).collect()
}

#[test]
fn the_first_tick_after_a_takeover_sends_the_running_sha_leases_nothing_and_renews_the_token() {
    let w = World::new();
    let sha = w.applied();
    assert_eq!(w.tenancy.lease_count(ENV), 1);
    as_original(&w, &sha);
    // The token is 13 h old: under 12 h of its 24 h TTL left, so upkeep renews it.
    w.bao.advance_clock(Duration::from_secs(13 * 3600));
    w.bao.clear_requests();
    w.clear_stub();
    std::fs::write(w.stub_dir().join("calls.log"), "").unwrap();
    let reports_before = w.reports().len();

    let run = w.tick();
    run.ok();
    assert!(
        run.stderr()
            .contains("written by the original agent; taken over"),
        "{}",
        run.stderr()
    );
    // Checkin carried the running sha, so tenancy answered none: a heartbeat, not a redeploy.
    let checkin = w
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path.ends_with("/checkin"))
        .expect("a checkin");
    let body: Value = checkin.body.expect("a checkin body");
    assert_eq!(body["applied_sha"], sha.as_str());
    assert_eq!(w.tenancy.lease_count(ENV), 1, "no lease after the upgrade");
    let calls = w.docker_calls();
    assert!(
        !calls
            .iter()
            .filter_map(|c| compose_sub(c))
            .any(|s| s == "up" || s == "pull"),
        "{calls:?}"
    );
    let reports = w.reports();
    assert_eq!(reports.len(), reports_before + 1);
    assert_report(reports.last().unwrap(), ReportResult::Applied, None);
    assert_eq!(
        reports.last().unwrap().sha.as_ref().map(|s| s.as_str()),
        Some(sha.as_str())
    );
    // The token was due: renewed, and its facts are recorded now.
    let paths = bao_paths(&w);
    assert!(
        paths.iter().any(|p| p.ends_with("auth/token/renew-self")),
        "{paths:?}"
    );
    let st = w.state();
    assert_eq!(st["version"], 1);
    assert_eq!(st["applied_sha"], sha.as_str());
    assert_eq!(st["applied_prod"], false);
    assert!(st["token"]["expires_at"].as_u64().unwrap() > 0);
}

#[test]
fn a_prod_release_taken_over_is_never_purged() {
    let w = World::new();
    let mut b = TestBundle::default();
    b.meta["tier"] = json!("prod");
    w.stage_grant();
    let sha = w.publish(&b);
    w.tick().ok();
    as_original(&w, &sha);
    w.tenancy
        .set_desired(ENV, monky_testkit::tenancy::Desired::down(true));
    let run = w.tick();
    run.ok();
    let downs: Vec<String> = w
        .docker_calls()
        .into_iter()
        .filter(|c| compose_sub(c) == Some("down"))
        .collect();
    assert!(!downs.is_empty(), "{}", run.stderr());
    assert!(downs.iter().all(|c| !c.contains(" -v")), "{downs:?}");
}

#[test]
fn the_first_apply_over_the_originals_release_names_the_values_its_env_mangled() {
    let w = World::new();
    let sha = w.applied();
    as_original(&w, &sha);
    // A password with a dollar: the original's unquoted `.env` let compose expand it.
    let mangled = "pa$word-Secret #9";
    w.bao.put_secret(ENV, "pg_password", mangled);
    let next = w.publish(&TestBundle::tagged("2"));
    let run = w.tick();
    run.ok();
    let report = w.last_report();
    assert_report(&report, ReportResult::Applied, None);
    assert_eq!(report.sha.as_ref().map(|s| s.as_str()), Some(next.as_str()));
    assert!(
        report
            .log_tail
            .contains("ENV_QUOTING_CHANGED: POSTGRES_PASSWORD:"),
        "{}",
        report.log_tail
    );
    assert!(!report.log_tail.contains("GEMINI_API_KEY:"));
    assert!(!report.log_tail.contains(mangled) && !run.stderr().contains(mangled));
    let explain = w.run(&["explain"]);
    explain.ok();
    explain.prints(&["POSTGRES_PASSWORD"]);
    assert!(!explain.stdout().contains(mangled));
    // Only the first apply over the original's release: the next one is this agent's own.
    w.publish(&TestBundle::tagged("3"));
    w.tick().ok();
    assert!(!w.last_report().log_tail.contains("ENV_QUOTING_CHANGED"));
}

#[test]
fn the_originals_log_levels_keep_warnings_and_an_unknown_level_is_a_config_error() {
    let w = World::new();
    w.config_extra("log_level: WARNING\n");
    std::fs::create_dir_all(w.state_dir()).unwrap();
    std::fs::write(w.state_dir().join("state.json"), "{not json").unwrap();
    w.stage_grant();
    w.publish(&TestBundle::default());
    let run = w.tick();
    run.ok();
    let err = run.stderr();
    // The warning about the set-aside file is there; info lines are not.
    assert!(err.contains("set aside"), "{err}");
    assert!(!err.contains("checkin: action"), "{err}");

    let w = World::new();
    w.config_extra("log_level: verbose\n");
    let run = w.tick();
    run.expect(78);
    run.says(&["log_level"]);
}

#[test]
fn a_box_on_the_sdk_transport_ticks_through_the_proxy() {
    let w = World::with(WorldOptions { tls_proxy: true });
    let text = std::fs::read_to_string(w.config_path()).unwrap();
    assert!(text.contains("transport: proxy\n"));
    std::fs::write(
        w.config_path(),
        text.replace("transport: proxy\n", "transport: sdk\n"),
    )
    .unwrap();
    w.stage_grant();
    let sha = w.publish(&TestBundle::default());
    w.tick().ok();
    let report = w.last_report();
    assert_report(&report, ReportResult::Applied, None);
    assert_eq!(report.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
}

#[test]
fn status_into_a_closed_pipe_ends_quietly() {
    let w = World::new();
    w.applied();
    for args in [
        &["status", "--json"][..],
        &["status"],
        &["explain"],
        &["version"],
    ] {
        // The reader is gone before the agent writes a byte, as with `| head -n 0`.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = w
            .command(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panic"), "{args:?}: {err}");
    }
}

/// A release of the original's that publishes host port 80, applied after the upgrade: refused
/// with `BUDGET_EXCEEDED` naming `budget.min_published_port`, the running release kept; the key
/// set as docs/OPERATIONS.md's upgrade section shows it lets the next tick apply.
#[test]
fn a_release_publishing_port_80_is_refused_by_the_key_until_the_box_admin_sets_it() {
    let w = World::new();
    let sha = w.applied();
    as_original(&w, &sha);
    w.tick().ok();
    let port_80 = TestBundle {
        compose: "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:2\n    env_file: .env\n    ports: [\"80:8080\"]\n"
            .into(),
        ..TestBundle::default()
    };
    let new = w.publish(&port_80);
    w.tick().expect(1);
    let detail = w.last_report().detail.unwrap();
    assert!(
        detail.starts_with("BUDGET_EXCEEDED: ")
            && detail.contains("web: ports 80 below budget.min_published_port 1024"),
        "{detail}"
    );
    w.assert_current(&sha);
    let explain = w.run(&["explain"]);
    assert!(
        explain.stdout().contains("budget.min_published_port"),
        "{}",
        explain.stdout()
    );
    // The box admin's setting, as the docs spell it.
    let doc = include_str!("../../docs/OPERATIONS.md");
    let upgrading = doc
        .split("\n## Upgrading from the original agent\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the upgrade section");
    let yaml = upgrading
        .split("```yaml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the upgrade section shows the budget key");
    assert!(yaml.contains("min_published_port: 80"), "{yaml}");
    w.config_extra(yaml);
    w.tick().ok();
    w.assert_current(&new);
    assert_eq!(w.last_report().result, ReportResult::Applied);
}
