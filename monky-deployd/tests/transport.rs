//! Transports: `proxy` maps the real host names onto loopback ports while TLS keeps checking the
//! OpenBao host name against the configured CA bundle.

use monky_agent_proto::ReportResult;

use monky_testkit::pki::TEST_HOSTS;

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

/// OpenBao's certificate not yet valid by the box's clock (a clock years behind): its own code,
/// whose next step is the clock, and exit 1 so the unit does not stay green; the grant is kept,
/// nothing is read.
#[test]
fn a_certificate_outside_its_dates_by_the_box_clock_is_tls_clock_and_exit_1() {
    for (from, until, says) in [(2090, 2099, "not yet valid"), (2001, 2002, "expired")] {
        let w = World::with_pki(Pki::valid_in_years(&TEST_HOSTS, from, until));
        w.stage_grant();
        w.publish(&TestBundle::default());
        let run = w.tick();
        run.expect(1);
        run.says(&["TLS_CLOCK", says, "by this machine's clock"]);
        assert!(
            !run.stderr().contains("re-run the install kit"),
            "{}",
            run.stderr()
        );
        assert!(w.bao.requests().is_empty());
        assert!(w.bootstrap_path().exists(), "the grant is kept");
        assert_eq!(w.state()["last_code"], "TLS_CLOCK");
    }
}
