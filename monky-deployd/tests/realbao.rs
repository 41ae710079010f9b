//! Full ticks against a real OpenBao set up as production (the `jwt-tenancy` mount, role and
//! policy `see-env`, KV v2 at `monky/`), with the stub docker: bootstrap, apply, heartbeat, a
//! pinned version, the lease swap whose revoke-self the policy refuses, renewal, an operator's
//! revocation and recovery, and a seal in the middle of the work. Tenancy's fake verifies the
//! agent's bearer with the real server's `auth/token/lookup`.

use std::time::{Duration, Instant};

use monky_agent_proto::ReportResult;
use monky_testkit::bao::{BaoPeer, RealBao};
use monky_testkit::tenancy::{Endpoint, Fault};
use serde_json::json;

use crate::util::*;

fn world() -> Option<World<RealBao>> {
    World::real_bao()
}

/// The rendered `.env` of the current release.
fn current_env(w: &World<RealBao>) -> String {
    std::fs::read_to_string(w.env_dir().join("current/.env")).unwrap()
}

#[test]
fn bootstrap_apply_heartbeat() {
    let Some(w) = world() else { return };
    w.stage_grant();
    let sha = w.publish(&TestBundle::default());
    let run = w.tick();
    run.ok();
    let r = w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    // Gemini pinned at version 1, the password at the latest: read from the real server.
    let env = current_env(&w);
    assert!(env.contains(&format!("GEMINI_API_KEY={GEMINI}\n")), "{env}");
    assert!(
        env.contains(&format!("POSTGRES_PASSWORD={PGPASS}\n")),
        "{env}"
    );
    assert!(!w.bootstrap_path().exists(), "the grant is consumed");
    for secret in [GEMINI, PGPASS] {
        assert!(!run.stderr().contains(secret), "{}", run.stderr());
        assert!(!r.log_tail.contains(secret));
    }

    // The heartbeat: the bearer is still good at the real server, nothing is re-read.
    let n = w.requests().len();
    w.tick().ok();
    let new: Vec<_> = w.requests()[n..].iter().map(|r| r.endpoint).collect();
    assert_eq!(new, [Some(Endpoint::Checkin), Some(Endpoint::Report)]);
    assert_report(&w.last_report(), ReportResult::Applied, None);
}

#[test]
fn over_tls_through_the_proxy_transport_as_on_a_box() {
    // HTTPS with a private CA as the only trust root, dialled as bao.example.test through the
    // proxy's mapped address: the real server's TLS stack against the agent's checks.
    let Some(w) = World::real_bao_opts(WorldOptions { tls_proxy: true }, None, |b| b) else {
        return;
    };
    assert_eq!(w.bao.url().scheme(), "https");
    w.stage_grant();
    w.publish(&TestBundle::default());
    w.tick().ok();
    assert_report(&w.last_report(), ReportResult::Applied, None);
    assert!(current_env(&w).contains(&format!("GEMINI_API_KEY={GEMINI}\n")));
}

#[test]
fn a_pinned_version_older_than_the_latest() {
    let Some(w) = world() else { return };
    let mut b = TestBundle::default();
    b.manifest["entries"][1]["version"] = json!(1);
    w.stage_grant();
    w.publish(&b);
    w.tick().ok();
    assert_report(&w.last_report(), ReportResult::Applied, None);
    let env = current_env(&w);
    assert!(env.contains("POSTGRES_PASSWORD=an-older-value\n"), "{env}");
    assert!(!env.contains(PGPASS));
}

#[test]
fn lease_swaps_apply_although_the_policy_refuses_revoke_self() {
    let Some(w) = world() else { return };
    w.stage_grant();
    w.publish(&TestBundle::default());
    let run = w.tick();
    run.ok();
    assert_report(&w.last_report(), ReportResult::Applied, None);
    assert_eq!(w.tenancy.lease_count(ENV), 1);
    // The bootstrap token was replaced by the lease's, and its revoke-self refused by the
    // policy (the ACL form of 403), so both tokens live on at the server.
    run.says(&["could not revoke the previous token", "permission denied"]);
    assert_eq!(w.bao.live_tokens_for_env(ENV), 2);
    assert_eq!(w.state()["token"]["source"], json!("lease"));

    // A new bundle: the lease token is reused, no second lease.
    w.publish(&TestBundle::tagged("2"));
    w.tick().ok();
    assert_report(&w.last_report(), ReportResult::Applied, None);
    assert_eq!(w.tenancy.lease_count(ENV), 1);

    // Near the max TTL (a token minted 29 days ago, before a reboot: its age is taken from
    // state.json's wall clock): the upkeep re-leases, and the swap's revoke-self is refused
    // again without failing the tick.
    let mut st = w.state();
    st["token"]["obtained_at"] = json!(st["token"]["obtained_at"].as_u64().unwrap() - 29 * 86_400);
    st["token"]["obtained_boot"]["boot_id"] = json!("an-earlier-boot");
    std::fs::write(w.state_dir().join("state.json"), st.to_string()).unwrap();
    let old = std::fs::read_to_string(w.state_dir().join("bao.token")).unwrap();
    let run = w.tick();
    run.ok();
    run.says(&["re-leasing", "could not revoke the previous token"]);
    assert_eq!(w.tenancy.lease_count(ENV), 2);
    assert_ne!(
        std::fs::read_to_string(w.state_dir().join("bao.token")).unwrap(),
        old
    );
    assert_eq!(w.bao.live_tokens_for_env(ENV), 3);
    // The new token is the bearer the real server vouches for at the next checkin.
    w.tick().ok();
    assert_report(&w.last_report(), ReportResult::Applied, None);
}

#[test]
fn renewal_under_a_short_role_ttl() {
    let Some(w) = World::real_bao_with(None, |b| b.token_ttl(Duration::from_secs(3600))) else {
        return;
    };
    w.stage_grant();
    w.publish(&TestBundle::default());
    let run = w.tick();
    run.ok();
    // A one-hour token is below the agent's renew threshold: the tick's upkeep renews it at
    // the real server, which grants the role's TTL again.
    run.says(&["token renewed (ttl 3600s)"]);
    let expires = w.state()["token"]["expires_at"].as_u64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        expires <= now + 3600 && expires + 120 > now + 3600,
        "{expires} vs {now}"
    );
}

#[test]
fn an_operator_revocation_asks_for_the_kit_then_a_new_grant_recovers() {
    let Some(w) = world() else { return };
    let sha = w.applied();
    assert_report(&w.last_report(), ReportResult::Applied, None);
    let current = w.current_target();

    assert!(w.bao.revoke_tokens_for_env(ENV) >= 1);
    let run = w.tick();
    run.expect(1);
    run.says(&["AGENT_UNAUTHENTICATED", "re-run the install kit"]);
    assert!(
        !w.state_dir().join("bao.token").exists(),
        "the dead token is deleted"
    );
    assert_eq!(
        w.current_target(),
        current,
        "the running release is untouched"
    );

    w.stage_grant();
    w.tick().ok();
    let r = w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert!(w.state_dir().join("bao.token").exists());
}

#[test]
fn a_seal_in_the_middle_of_the_work_is_temporary_then_unsealing_applies() {
    let Some(w) = world() else { return };
    let first = w.applied();
    let current = w.current_target();
    let env_before = current_env(&w);

    // The next bundle's download is held at tenancy; the server is sealed while it is in
    // flight, after checkin, before the agent's next OpenBao call.
    let second = w.publish(&TestBundle::tagged("2"));
    w.tenancy
        .set_fault(Endpoint::Bundle, Fault::Delay(Duration::from_millis(1500)));
    let n = w.requests().len();
    let child = w
        .command(&["run", "--once"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !w.requests()[n..]
        .iter()
        .any(|r| r.endpoint == Some(Endpoint::Bundle))
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no bundle request"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    w.bao.seal();
    let run = Run(child.wait_with_output().unwrap());
    run.expect(75);
    // The agent's own next call found the server sealed: temporary, its own code (OpenBao's
    // operators' move), with OpenBao's word.
    run.says(&["BAO_SEALED", "is sealed"]);
    assert_eq!(
        w.current_target(),
        current,
        "the running release is untouched"
    );
    assert_eq!(current_env(&w), env_before);
    assert_eq!(w.state()["applied_sha"], json!(first));

    w.tenancy.clear_faults();
    w.bao.unseal();
    w.tick().ok();
    let r = w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(second.as_str()));
    assert_eq!(w.state()["applied_sha"], json!(second));
}

#[test]
fn a_401_from_tenancy_for_a_token_the_real_openbao_accepts_keeps_it() {
    let Some(w) = world() else { return };
    let sha = w.applied();
    let token = std::fs::read(w.state_dir().join("bao.token")).unwrap();
    w.tenancy.set_fault(
        Endpoint::Checkin,
        Fault::Status {
            status: 401,
            body: r#"{"code":"AGENT_UNAUTHENTICATED","detail":"unknown or revoked token"}"#.into(),
        },
    );
    let run = w.tick();
    run.expect(1);
    // The real server's lookup-self said yes: the failure is tenancy's, the token stays.
    run.says(&["TENANCY_REFUSED_TOKEN", "OpenBao still accepts the token"]);
    assert_eq!(
        std::fs::read(w.state_dir().join("bao.token")).unwrap(),
        token
    );
    w.assert_current(&sha);

    w.tenancy.clear_faults();
    w.tick().ok();
    assert_report(&w.last_report(), ReportResult::Applied, None);
    assert_eq!(
        std::fs::read(w.state_dir().join("bao.token")).unwrap(),
        token
    );
}
