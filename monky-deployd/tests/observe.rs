//! Beyond the original: failed-release backoff and fallback, `explain`, `doctor`, the metrics
//! textfile.

use monky_agent_proto::ReportResult;
use monky_deployd::code::CodePolicy as _;
use monky_testkit::tenancy::Desired;
use serde_json::json;

use crate::apply::compose_sub;
use crate::util::*;

fn ups(w: &World) -> usize {
    w.docker_calls()
        .iter()
        .filter(|c| compose_sub(c) == Some("up"))
        .count()
}

fn bundle_requests(w: &World) -> usize {
    w.requests()
        .iter()
        .filter(|r| r.path.starts_with("/v1/agent/bundle/"))
        .count()
}

#[test]
fn a_failed_release_falls_back_and_waits_before_the_next_attempt() {
    let w = World::new();
    let good = w.applied();
    w.stub("UNHEALTHY_IF", "web:bad");
    let bad = w.publish(&TestBundle::tagged("bad"));
    let ups_before = ups(&w);
    w.tick().expect(1);

    // The failed release was tried, then the good one brought back.
    assert_eq!(
        ups(&w),
        ups_before + 2,
        "up of the bad release, then of the good one"
    );
    let r = w.last_report();
    assert_report(&r, ReportResult::Failed, Some("UNHEALTHY: "));
    let detail = r.detail.unwrap();
    assert!(
        detail.contains(&format!("reverted to {}", &good[..12])),
        "{detail}"
    );
    assert!(detail.contains("next attempt"), "{detail}");
    w.assert_current(&good);
    assert_eq!(w.state()["applied_sha"], json!(good));
    assert_eq!(w.state()["failed_sha"], json!(bad));
    assert!(
        w.env_dir().join("releases").join(&bad).is_dir(),
        "the failed release stays on disk"
    );

    // Inside the backoff window: checkin and report only; no bundle, lease or docker call.
    let (leases, bundles, calls) = (
        w.tenancy.lease_count(ENV),
        bundle_requests(&w),
        w.docker_calls().len(),
    );
    w.tick().expect(1);
    let r = w.last_report();
    assert_report(&r, ReportResult::Failed, Some("UNHEALTHY: "));
    let detail = r.detail.unwrap();
    assert!(
        detail.contains("next attempt") && detail.contains(&format!("running {}", &good[..12])),
        "{detail}"
    );
    assert_eq!(
        (
            w.tenancy.lease_count(ENV),
            bundle_requests(&w),
            w.docker_calls().len()
        ),
        (leases, bundles, calls)
    );

    // --force tries now; the second failure doubles the wait.
    w.run(&["run", "--once", "--force"]).expect(1);
    assert_eq!(bundle_requests(&w), bundles + 1);
    assert_eq!(w.state()["failed_attempts"], json!(2));
    let wait = w.state()["next_attempt_at"].as_u64().unwrap() - monky_deployd::clock::wall();
    assert!(
        (100..=140).contains(&wait),
        "second wait ~2 min, got {wait}s"
    );

    // A new desired sha resets the backoff and applies at once.
    let fixed = w.publish(&TestBundle::tagged("3"));
    w.tick().ok();
    assert_eq!(w.state()["applied_sha"], json!(fixed));
    assert!(w.state()["failed_sha"].is_null());
}

#[test]
fn prod_leaves_a_failed_release_in_place_unless_configured() {
    let w = World::new();
    w.stage_grant();
    let mut good = TestBundle::default();
    good.meta["tier"] = json!("prod");
    w.publish(&good);
    w.tick().ok();
    w.stub("UNHEALTHY_IF", "web:bad");
    let mut bad = TestBundle::tagged("bad");
    bad.meta["tier"] = json!("prod");
    let bad_sha = w.publish(&bad);
    w.tick().expect(1);
    let detail = w.last_report().detail.unwrap();
    assert!(
        detail.contains("left") && detail.contains("on_failure: leave"),
        "{detail}"
    );
    w.assert_current(&bad_sha);
    assert!(w.state()["applied_sha"].is_null(), "nothing healthy runs");

    let w2 = World::new();
    w2.config_extra("on_failure: revert\n");
    w2.stage_grant();
    let good_sha = w2.publish(&good);
    w2.tick().ok();
    w2.stub("UNHEALTHY_IF", "web:bad");
    w2.publish(&bad);
    w2.tick().expect(1);
    w2.assert_current(&good_sha);
}

#[test]
fn a_pull_failure_backs_off_without_touching_current() {
    let w = World::new();
    let good = w.applied();
    w.stub("PULL_FAIL", "manifest unknown");
    w.publish(&TestBundle::tagged("missing"));
    w.tick().expect(1);
    let detail = w.last_report().detail.unwrap();
    assert!(
        detail.starts_with("IMAGE_NOT_FOUND: ")
            && detail.contains("manifest unknown")
            && detail.contains(&format!("running {}", &good[..12])),
        "{detail}"
    );
    assert!(w.state()["next_attempt_at"].is_u64());
    let calls = w.docker_calls().len();
    w.tick().expect(1);
    assert_eq!(
        w.docker_calls().len(),
        calls,
        "no pull inside the backoff window"
    );
    assert_eq!(w.state()["applied_sha"], json!(good));
}

fn explain(w: &World) -> String {
    let run = w.run(&["explain"]);
    run.ok();
    run.stdout()
}

#[test]
fn explain_names_the_gap_and_the_next_step_for_every_code() {
    let w = World::new();
    let sha = w.applied();
    let out = explain(&w);
    assert!(
        out.contains("converged") && out.contains("nothing to do"),
        "{out}"
    );
    assert!(
        out.contains(&sha[..12]) && out.contains("1/1 container(s) running and healthy"),
        "{out}"
    );
    assert!(out.contains("lease, expires in"), "{out}");

    for code in monky_deployd::code::Code::ALL {
        let step = code.next_step();
        let mut st = w.state();
        st["desired_sha"] = json!("f".repeat(64));
        st["last_error"] = json!(format!("{code}: some-name"));
        st["last_code"] = json!(code.as_str());
        std::fs::write(w.state_dir().join("state.json"), st.to_string()).unwrap();
        let out = explain(&w);
        assert!(out.contains(&format!("{code}: some-name")), "{code}: {out}");
        assert!(out.contains(step), "{code}: next step missing:\n{out}");
    }
}

#[test]
fn explain_shows_the_backoff_deadline() {
    let w = World::new();
    w.applied();
    w.stub("UNHEALTHY_IF", "web:bad");
    w.publish(&TestBundle::tagged("bad"));
    w.tick().expect(1);
    let out = explain(&w);
    assert!(out.contains("failed and waits: next attempt"), "{out}");
    assert!(out.contains("UNHEALTHY"), "{out}");
}

fn doctor(w: &World) -> (i32, serde_json::Value) {
    let run = w.run(&["doctor", "--json"]);
    (
        run.code(),
        serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("{e}: {}", run.stdout())),
    )
}

fn verdict(doc: &serde_json::Value, name: &str) -> String {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .map(|c| c["verdict"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("no check {name}: {doc}"))
}

#[test]
fn doctor_passes_on_a_working_box_and_names_each_broken_check() {
    let w = World::new();
    w.applied();
    let (code, doc) = doctor(&w);
    assert_eq!(code, 0, "{doc:#}");
    for name in [
        "config",
        "state dir",
        "compose v2",
        "docker socket",
        "tenancy",
        "openbao",
        "token",
        "disk",
    ] {
        assert_eq!(verdict(&doc, name), "ok", "{name}: {doc:#}");
    }
    let human = w.run(&["doctor"]);
    human.ok();
    human.prints(&["ok   compose v2"]);

    // Each check broken on purpose. (Compose cannot be hidden here: the driver also finds the
    // system plugin directories' binary and runs it on its own, which is the point; its "not
    // found, looked in ..." error is tested in monky-compose's stub tests.)
    use std::os::unix::fs::PermissionsExt;
    type Step = Box<dyn Fn(&World)>;
    let breaks: Vec<(&str, Step, Step)> = vec![
        (
            "state dir",
            Box::new(|w| {
                std::fs::set_permissions(w.state_dir(), std::fs::Permissions::from_mode(0o755))
                    .unwrap()
            }),
            Box::new(|w| {
                std::fs::set_permissions(w.state_dir(), std::fs::Permissions::from_mode(0o700))
                    .unwrap()
            }),
        ),
        (
            "token",
            Box::new(|w| {
                std::fs::write(
                    w.state_dir().join("bao.token"),
                    "s.NotAValidTokenAtAll000000",
                )
                .unwrap()
            }),
            Box::new(|_| {}),
        ),
        (
            "disk",
            Box::new(|w| {
                let mut st = w.state();
                st["last_disk_need_bytes"] = json!(1u64 << 60);
                std::fs::write(w.state_dir().join("state.json"), st.to_string()).unwrap();
            }),
            Box::new(|_| {}),
        ),
    ];
    for (name, brk, fix) in breaks {
        brk(&w);
        let (code, doc) = doctor(&w);
        assert_eq!(code, 1, "{name}: {doc:#}");
        assert_eq!(verdict(&doc, name), "fail", "{name}: {doc:#}");
        let check = doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
            .clone();
        assert!(
            !check["fix"].as_str().unwrap().is_empty(),
            "{name} has no fix"
        );
        fix(&w);
    }
    // The docker socket and tenancy: point them at nothing.
    let run = Run(w
        .command(&["doctor", "--json"])
        .env(
            "DOCKER_HOST",
            format!("unix://{}", w.path("nothing.sock").display()),
        )
        .output()
        .unwrap());
    let doc: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
    assert_eq!(verdict(&doc, "docker socket"), "fail", "{doc:#}");
    let text = std::fs::read_to_string(w.config_path()).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let text = text.replace(&w.tenancy.url().to_string(), &format!("http://{closed}/"));
    std::fs::write(w.config_path(), text).unwrap();
    let (_, doc) = doctor(&w);
    assert_eq!(verdict(&doc, "tenancy"), "fail", "{doc:#}");
}

#[test]
fn doctor_catches_a_wrong_ca() {
    let w = World::with(WorldOptions { tls_proxy: true });
    w.applied();
    assert_eq!(doctor(&w).0, 0);
    // The proxy transport's identity file must be readable.
    w.config_extra(&format!(
        "identity: {}\n",
        w.path("missing-identity.json").display()
    ));
    let (code, doc) = doctor(&w);
    assert_eq!(
        (code, verdict(&doc, "identity")),
        (1, "fail".to_string()),
        "{doc:#}"
    );
    std::fs::write(w.path("missing-identity.json"), "{}").unwrap();
    let (code, doc) = doctor(&w);
    assert_eq!(
        (code, verdict(&doc, "identity")),
        (0, "ok".to_string()),
        "{doc:#}"
    );
    std::fs::write(w.path("ca.pem"), Pki::new().ca_pem).unwrap();
    let (code, doc) = doctor(&w);
    assert_eq!(code, 1);
    assert_eq!(verdict(&doc, "openbao"), "fail", "{doc:#}");
    // A CA bundle without a certificate is refused before any call, naming the file to fix.
    for empty in ["", "not a certificate\n"] {
        std::fs::write(w.path("ca.pem"), empty).unwrap();
        let (code, doc) = doctor(&w);
        assert_eq!(code, 1);
        assert_eq!(verdict(&doc, "openbao"), "fail", "{doc:#}");
        let says = doc.to_string();
        let path = w.path("ca.pem").display().to_string();
        assert!(
            says.contains(&format!("bao.ca_bundle {path}: invalid ca bundle")),
            "{doc:#}"
        );
    }
}

#[test]
fn the_metrics_textfile_is_written_every_tick_and_promtool_accepts_it() {
    let w = World::new();
    let prom = w.path("metrics/monky-deployd.prom");
    std::fs::create_dir_all(prom.parent().unwrap()).unwrap();
    w.config_extra(&format!("metrics_textfile: {}\n", prom.display()));
    let mut b = TestBundle::default();
    b.env_template.push_str("MISSING=${MISSING}\n");
    w.stage_grant();
    w.publish(&b);
    w.tick().expect(1);
    let text = std::fs::read_to_string(&prom).unwrap();
    assert!(
        text.contains(&format!("monky_deployd_exit_code{{env_id=\"{ENV}\"}} 1")),
        "{text}"
    );
    assert!(text.contains("code=\"ENV_INCOMPLETE\"} 1"), "{text}");
    let sha = w.publish(&TestBundle::default());
    w.tick().ok();
    let text = std::fs::read_to_string(&prom).unwrap();
    assert!(text.contains(&format!("sha=\"{sha}\"}} 1")), "{text}");
    assert!(
        text.contains(&format!("monky_deployd_exit_code{{env_id=\"{ENV}\"}} 0")),
        "{text}"
    );

    let promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&prom).unwrap())
        .output()
        .expect("promtool is needed (Debian package promtool; `cargo xtask setup` installs it)");
    assert!(
        promtool.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&promtool.stdout),
        String::from_utf8_lossy(&promtool.stderr)
    );
    w.tenancy.set_desired(ENV, Desired::sha(sha));
}
