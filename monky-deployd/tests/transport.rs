//! Transports: `proxy` maps the real host names onto loopback ports while TLS keeps checking the
//! OpenBao host name against the configured CA bundle.

use monky_agent_proto::ReportResult;

use crate::util::*;

#[test]
fn proxy_transport_with_tls_and_a_ca_bundle() {
    let w = World::with(WorldOptions { tls_proxy: true });
    let sha = w.applied();
    assert_eq!(w.state()["applied_sha"], serde_json::json!(sha));
    assert_report(&w.last_report(), ReportResult::Applied, None);
    // Tenancy saw the intercept name and port in Host, though TCP went to its loopback port.
    let hosts: Vec<_> = w
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/v1/agent/"))
        .filter_map(|r| r.host)
        .collect();
    assert!(
        hosts.iter().all(|h| h == "monky.tenancy.deploy:443"),
        "{hosts:?}"
    );
}

#[test]
fn proxy_transport_with_the_wrong_ca_fails_for_the_box_admin_and_reads_nothing() {
    let w = World::with(WorldOptions { tls_proxy: true });
    std::fs::write(w.path("ca.pem"), Pki::new().ca_pem).unwrap();
    w.stage_grant();
    w.publish(&TestBundle::default());
    let run = w.tick();
    // No retry fixes a trust root: exit 1, so the unit turns red instead of staying green.
    run.expect(1);
    run.says(&["BAO_TLS_UNKNOWN_CA", "certificate", "owner=\"box admin\""]);
    assert!(w.bao.requests().is_empty());
    assert!(
        w.bootstrap_path().exists(),
        "the grant is kept for the next try"
    );
}
