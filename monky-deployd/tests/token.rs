//! The token flows: bootstrap, reuse, rate-limited lease, superseded grants, env pinning,
//! renewal and re-lease.

use monky_agent_proto::ReportResult;
use monky_testkit::tenancy::Desired;
use monky_testkit::tenancy::{Endpoint, Fault, Rate, RateLimits};
use serde_json::json;

use crate::util::*;

#[test]
fn no_token_and_no_grant_says_rerun_the_kit() {
    let w = World::new();
    let run = w.tick();
    run.expect(1);
    run.says(&["re-run the install kit"]);
    assert!(w.requests().is_empty(), "nothing was sent to tenancy");
}

#[test]
fn a_lease_token_is_reused_and_a_rate_limited_lease_does_not_block_a_deploy() {
    let w = World::new();
    w.applied();
    assert_eq!(w.tenancy.lease_count(ENV), 1);
    w.publish(&TestBundle::tagged("2"));
    w.tick().ok();
    assert_eq!(
        w.tenancy.lease_count(ENV),
        1,
        "a valid lease token is reused"
    );

    // A bootstrap token that meets a rate-limited lease still deploys, and swaps later.
    let w = World::new();
    w.tenancy.set_limits(RateLimits {
        lease: Rate::per_hour(0),
        ..RateLimits::default()
    });
    w.stage_grant();
    w.publish(&TestBundle::default());
    w.tick().ok();
    assert_eq!(w.state()["token"]["source"], "bootstrap");
    assert_report(&w.last_report(), ReportResult::Applied, None);
}

#[test]
fn a_rate_limited_lease_with_a_token_deploys_and_a_rate_limited_checkin_is_temporary() {
    let w = World::new();
    w.stage_grant();
    w.publish(&TestBundle::default());
    w.tenancy.set_fault(Endpoint::Lease, Fault::RetryAfter(120));
    // The bootstrap token exists, so the deploy goes on with it.
    w.tick().ok();
    // With the fault on checkin instead, the tick is temporary.
    w.tenancy
        .set_fault(Endpoint::Checkin, Fault::RetryAfter(30));
    w.tick().expect(75);
}

#[test]
fn a_superseded_grant_rebootstraps_with_a_fresh_one() {
    let w = World::new();
    w.applied();
    w.tenancy.supersede(ENV);
    w.stage_grant();
    w.tick().ok();
    assert!(!w.bootstrap_path().exists());
    assert_eq!(w.state()["token"]["source"], "bootstrap");
    assert_report(&w.last_report(), ReportResult::Applied, None);
}

#[test]
fn a_superseded_grant_without_a_fresh_one_keeps_a_token_openbao_accepts() {
    let w = World::new();
    w.applied();
    let token = std::fs::read(w.state_dir().join("bao.token")).unwrap();
    w.tenancy.supersede(ENV);
    let run = w.tick();
    run.expect(1);
    // Tenancy's word alone deletes nothing: OpenBao still accepts the token.
    run.says(&["TENANCY_REFUSED_TOKEN", "re-run the install kit"]);
    assert_eq!(
        std::fs::read(w.state_dir().join("bao.token")).unwrap(),
        token
    );
    // The kit's fresh grant then replaces it in the next tick.
    w.stage_grant();
    w.tick().ok();
    assert_ne!(
        std::fs::read(w.state_dir().join("bao.token")).unwrap(),
        token
    );
    assert_eq!(w.state()["token"]["source"], "bootstrap");
}

#[test]
fn a_token_of_another_env_exits_78_and_is_not_retried() {
    let w = World::new();
    w.applied();
    let text = std::fs::read_to_string(w.config_path())
        .unwrap()
        .replace(&format!("env_id: {ENV}"), "env_id: env-other");
    std::fs::write(w.config_path(), text).unwrap();
    let run = w.tick();
    run.expect(78);
    run.says(&["AGENT_ENV_MISMATCH"]);
    // The loop ends on 78 instead of retrying.
    w.run(&["run"]).expect(78);
}

#[test]
fn renewal_when_the_ttl_runs_low() {
    let w = World::new();
    w.applied();
    w.bao_extra("  renew_below_s: 200000\n");
    let before = w.state()["token"]["expires_at"].as_u64().unwrap();
    w.bao.advance_clock(std::time::Duration::from_secs(3600));
    std::thread::sleep(std::time::Duration::from_millis(1100));
    w.tick().ok();
    assert!(
        w.bao
            .agent_requests()
            .iter()
            .any(|r| r.path.ends_with("/renew-self"))
    );
    assert!(w.state()["token"]["expires_at"].as_u64().unwrap() > before);
}

/// The renewal depends on OpenBao alone, whatever the action was: under an operator's hold and
/// while a failed sha waits out its backoff, a due token is renewed all the same.
#[test]
fn renewal_runs_under_a_hold_and_during_a_backoff() {
    let renewals = |w: &World| {
        w.bao
            .agent_requests()
            .iter()
            .filter(|r| r.path.ends_with("/renew-self"))
            .count()
    };
    // Held: the tick applies nothing, says so, and renews the due token.
    let w = World::new();
    w.applied();
    w.run(&["hold", "--reason", "disk swap"]).ok();
    w.bao_extra("  renew_below_s: 200000\n");
    let before = renewals(&w);
    w.tick().ok();
    assert_eq!(renewals(&w), before + 1);
    let detail = w.last_report().detail.unwrap_or_default();
    assert!(detail.starts_with("HELD: disk swap"), "{detail}");

    // Waiting out a backoff: no bundle, no lease, and the due token renewed.
    let w = World::new();
    w.applied();
    w.stub("UNHEALTHY_IF", "web:bad");
    let bad = w.publish(&TestBundle::tagged("bad"));
    w.tick().expect(1);
    assert_eq!(w.state()["failed_sha"], bad.as_str());
    w.bao_extra("  renew_below_s: 200000\n");
    let (before, leases) = (renewals(&w), w.tenancy.lease_count(ENV));
    w.tick().expect(1);
    let detail = w.last_report().detail.unwrap_or_default();
    assert!(detail.contains("next attempt"), "{detail}");
    assert_eq!(
        w.tenancy.lease_count(ENV),
        leases,
        "no lease while the sha waits"
    );
    assert_eq!(renewals(&w), before + 1);
}

#[test]
fn a_fresh_lease_before_the_max_ttl() {
    let w = World::new();
    w.applied();
    let mut st = w.state();
    // Minted 29 days ago, before a reboot: the age is the wall clock's.
    st["token"]["obtained_at"] =
        json!(st["token"]["obtained_at"].as_u64().unwrap() - 29 * 24 * 3600);
    st["token"]["obtained_boot"]["boot_id"] = json!("an-earlier-boot");
    std::fs::write(w.state_dir().join("state.json"), st.to_string()).unwrap();
    let old = std::fs::read_to_string(w.state_dir().join("bao.token")).unwrap();
    w.tick().ok();
    assert_eq!(w.tenancy.lease_count(ENV), 2);
    let new = std::fs::read_to_string(w.state_dir().join("bao.token")).unwrap();
    assert_ne!(old, new);
    let lease_bodies: Vec<_> = w
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/agent/lease")
        .filter_map(|r| r.body)
        .collect();
    assert_eq!(lease_bodies.last().unwrap()["reason"], "renew");
    // The next tick works with the new token.
    w.tick().ok();
}

/// A renewal OpenBao caps below the token's TTL means its max TTL is near, however the age
/// looks on the box's clocks: the agent leases again, at this tick and the next ones until a
/// lease works.
#[test]
fn a_renewal_capped_by_the_max_ttl_leases_again() {
    let w = World::new();
    let day = std::time::Duration::from_secs(24 * 3600);
    // A 30-day token under the role's 30-day max TTL, renewed at every tick.
    w.bao.set_token_ttl(day * 30);
    w.applied();
    w.bao_extra("  renew_below_s: 4000000\n");
    assert_eq!(w.tenancy.lease_count(ENV), 1);
    // 20 days on at OpenBao: the renewal grants only the 10 days left to the max TTL.
    w.bao.advance_clock(day * 20);
    let run = w.tick();
    run.ok();
    run.says(&[
        "exceeded the effective max_ttl",
        "capped by the token's max TTL; re-leasing",
    ]);
    assert_eq!(w.tenancy.lease_count(ENV), 2);
    // The fake's clock, 20 days on, finds the new grant (minted by the wall clock) expired, so
    // this lease's login fails; the token is still good and the next tick leases again.
    run.says(&["token upkeep: BAO_LOGIN_REJECTED"]);
    assert_eq!(w.state()["token"]["max_ttl_near"], true);
    w.tick().ok();
    assert_eq!(w.tenancy.lease_count(ENV), 3);
}

#[test]
fn bootstrap_command_stores_a_token() {
    let w = World::new();
    w.stage_grant();
    let run = w.run(&["bootstrap"]);
    run.ok();
    assert!(w.state_dir().join("bao.token").exists());
    assert!(!w.bootstrap_path().exists());
    let again = w.run(&["bootstrap"]);
    again.ok();
    assert!(again.stdout().contains("--force"));
    w.stage_grant();
    w.run(&["bootstrap", "--force"]).ok();
    assert!(!w.bootstrap_path().exists());
    w.tenancy.set_desired(ENV, Desired::default());
    w.tick().ok();
}

/// A token whose TTL ran out by the agent's own record (no tick renewed it: the box was off),
/// refused by tenancy and OpenBao: the tick says it expired, and when, not "revoked"; the
/// tick after it, with no grant staged, says the same (`AGENT_UNAUTHENTICATED`, not
/// `NO_CREDENTIALS`), and so does `status`.
#[test]
fn a_token_expired_by_the_agents_record_is_called_expired_at_every_tick() {
    let w = World::new();
    w.applied();
    // The record says the token ran out an hour ago; OpenBao and tenancy no longer know it.
    let mut st = w.state();
    st["token"]["expires_at"] = serde_json::json!(1_000_000);
    st["token"]["expires_boot"] = serde_json::Value::Null;
    std::fs::write(w.state_dir().join("state.json"), st.to_string()).unwrap();
    w.tenancy.supersede(ENV);
    assert!(w.bao.revoke_tokens_for_env(ENV) >= 1);
    for _ in 0..2 {
        let run = w.tick();
        run.expect(1);
        run.says(&[
            "AGENT_UNAUTHENTICATED",
            "the token expired at 1970-01-12T13:46:40Z by the agent's record",
        ]);
        assert!(
            !run.stderr().contains("revoked or superseded"),
            "{}",
            run.stderr()
        );
        assert!(!run.stderr().contains("NO_CREDENTIALS"), "{}", run.stderr());
    }
    let status: serde_json::Value =
        serde_json::from_str(&w.run(&["status", "--json"]).ok().stdout()).unwrap();
    assert_eq!(status["token"]["lost"]["cause"], "expired", "{status:#}");
    // A new grant: the loss is over.
    w.stage_grant();
    w.tick().ok();
    assert!(w.state().get("token_lost").is_none(), "{}", w.state());
}
