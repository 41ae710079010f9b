//! Faults in the peers: one table of tenancy, OpenBao and docker failures, each met by a tick on
//! a box that already runs a release. Every cell checks the exit status, the report (when one
//! can be sent) and that the running release survives; then the loop mode's pacing under errors.

use std::path::{Path, PathBuf};
use std::time::Duration;

use monky_agent_proto::ReportResult;
use monky_testkit::bao::Fault as BaoFault;
use monky_testkit::tenancy::{Desired, Endpoint, Fault};
use serde_json::json;

use crate::util::*;

struct Cell {
    name: &'static str,
    /// Serve OpenBao over TLS through the proxy transport.
    tls: bool,
    /// Publish a new bundle before the fault, so the tick is an apply (else a heartbeat).
    apply: bool,
    /// Injects the fault into the world of a box that runs a release.
    fault: fn(&World),
    exit: i32,
    /// `None`: no report can reach tenancy; `Some(code)`: one `failed` report, detail `CODE: ...`.
    report: Option<&'static str>,
    /// Text the report's detail (or, without a report, stderr) must contain.
    says: &'static str,
}

const CELLS: &[Cell] = &[
    // ---- tenancy ----------------------------------------------------------------------------
    Cell {
        name: "tenancy: connection refused",
        tls: false,
        apply: true,
        fault: |w| {
            let url = w.tenancy.url().to_string();
            edit_config(w, &url, &format!("http://{}/", closed_port()));
        },
        exit: 75,
        report: None,
        says: "refused",
    },
    Cell {
        name: "tenancy: timeout",
        tls: false,
        apply: true,
        fault: |w| {
            edit_config(w, "tenancy:\n", "tenancy:\n  timeout_s: 1\n");
            w.tenancy
                .set_fault(Endpoint::Checkin, Fault::Delay(Duration::from_secs(4)));
        },
        exit: 75,
        report: None,
        says: "timed out",
    },
    Cell {
        name: "tenancy: 503 on checkin",
        tls: false,
        apply: true,
        fault: |w| {
            w.tenancy.set_fault(
                Endpoint::Checkin,
                Fault::Status {
                    status: 503,
                    body: r#"{"code":"UNAVAILABLE","detail":"database is restarting"}"#.into(),
                },
            );
        },
        exit: 75,
        report: None,
        says: "database is restarting",
    },
    Cell {
        name: "tenancy: 502 html on the bundle",
        tls: false,
        apply: true,
        fault: |w| {
            w.tenancy.set_fault(
                Endpoint::Bundle,
                Fault::Status {
                    status: 502,
                    body: "<html><body>bad gateway</body></html>".into(),
                },
            );
        },
        exit: 75,
        report: Some("TENANCY_UNAVAILABLE"),
        says: "not json",
    },
    Cell {
        name: "tenancy: 429 with Retry-After",
        tls: false,
        apply: true,
        fault: |w| {
            w.tenancy
                .set_fault(Endpoint::Checkin, Fault::RetryAfter(30))
        },
        exit: 75,
        report: None,
        says: "RATE_LIMITED",
    },
    Cell {
        name: "tenancy: garbage body",
        tls: false,
        apply: true,
        fault: |w| w.tenancy.set_fault(Endpoint::Checkin, Fault::Garbage),
        exit: 75,
        report: None,
        says: "not json",
    },
    Cell {
        name: "tenancy: truncated bundle",
        tls: false,
        apply: true,
        fault: |w| {
            w.tenancy
                .set_fault(Endpoint::Bundle, Fault::Truncate { keep: 700 });
        },
        exit: 75,
        report: Some("TENANCY_UNAVAILABLE"),
        says: "bundle",
    },
    Cell {
        name: "tenancy: reset mid-download",
        tls: false,
        apply: true,
        fault: |w| {
            w.tenancy
                .set_fault(Endpoint::Bundle, Fault::Reset { keep: 700 });
        },
        exit: 75,
        report: Some("TENANCY_UNAVAILABLE"),
        says: "bundle",
    },
    Cell {
        name: "tenancy: 100 MB bundle with a length",
        tls: false,
        apply: true,
        fault: |w| {
            w.tenancy.set_fault(
                Endpoint::Bundle,
                Fault::LargeBody {
                    len: 100 << 20,
                    chunked: false,
                },
            );
        },
        exit: 1,
        report: Some("BUNDLE_TOO_LARGE"),
        says: "exceeds 4194304 bytes",
    },
    Cell {
        name: "tenancy: 100 MB bundle, chunked",
        tls: false,
        apply: true,
        fault: |w| {
            w.tenancy.set_fault(
                Endpoint::Bundle,
                Fault::LargeBody {
                    len: 100 << 20,
                    chunked: true,
                },
            );
        },
        exit: 1,
        report: Some("BUNDLE_TOO_LARGE"),
        says: "exceeds 4194304 bytes",
    },
    // ---- OpenBao ----------------------------------------------------------------------------
    Cell {
        name: "openbao: down",
        tls: false,
        apply: true,
        // Only the agent's view: tenancy's own token lookups still reach OpenBao.
        fault: |w| {
            let url = w.bao.url().to_string();
            let url = url.trim_end_matches('/');
            edit_config(w, url, &format!("http://{}", closed_port()));
        },
        exit: 75,
        report: Some("BAO_UNAVAILABLE"),
        says: "token lookup",
    },
    Cell {
        name: "openbao: 503 sealed",
        tls: false,
        apply: true,
        fault: |w| {
            for path in ["auth/token/lookup-self", "auth/jwt-tenancy", "monky/"] {
                w.bao.set_fault(path, BaoFault::Sealed);
            }
        },
        exit: 75,
        report: Some("BAO_SEALED"),
        says: "sealed",
    },
    Cell {
        name: "openbao: 403 between login and the KV read",
        tls: false,
        apply: true,
        fault: |w| {
            w.bao.set_fault(
                "monky/data/",
                BaoFault::Status {
                    status: 403,
                    body: r#"{"errors":["1 error occurred:\n\t* permission denied\n\n"]}"#.into(),
                },
            );
        },
        exit: 1,
        report: Some("BAO_PERMISSION_DENIED"),
        says: "permission denied",
    },
    Cell {
        name: "openbao: expired token",
        tls: false,
        apply: true,
        // Past the 24 h TTL tenancy's bearer lookup fails too: 401, the token is dropped, and
        // with no grant on disk nothing can be reported.
        fault: |w| w.bao.advance_clock(Duration::from_secs(25 * 3600)),
        exit: 1,
        report: None,
        says: "re-run the install kit",
    },
    Cell {
        name: "openbao: pinned version does not exist",
        tls: false,
        apply: false,
        fault: |w| {
            let mut b = TestBundle::tagged("2");
            b.manifest["entries"][0]["version"] = json!(99);
            w.publish(&b);
        },
        exit: 1,
        report: Some("SECRET_NOT_FOUND"),
        says: "GEMINI_API_KEY",
    },
    Cell {
        name: "openbao: tls with the wrong ca",
        tls: true,
        apply: true,
        fault: |w| std::fs::write(w.path("ca.pem"), Pki::new().ca_pem).unwrap(),
        // No retry fixes a trust root: exit 1, so the unit turns red.
        exit: 1,
        report: Some("BAO_TLS_UNKNOWN_CA"),
        says: "certificate",
    },
    Cell {
        name: "openbao: certificate for another host",
        tls: true,
        apply: true,
        fault: |w| edit_config(w, "bao.example.test", "other.example.test"),
        // A certificate for another name is no outage a retry ends: the box admin's move.
        exit: 1,
        report: Some("BAO_TLS_WRONG_NAME"),
        says: "certificate",
    },
    // ---- docker -----------------------------------------------------------------------------
    Cell {
        name: "docker: daemon down during an apply",
        tls: false,
        apply: true,
        fault: daemon_down,
        exit: 1,
        report: Some("COMPOSE_PULL_FAILED"),
        says: "Cannot connect to the Docker daemon",
    },
    Cell {
        name: "docker: daemon down during a heartbeat",
        tls: false,
        apply: false,
        fault: daemon_down,
        exit: 1,
        report: Some("DOCKER_UNAVAILABLE"),
        says: "Cannot connect to the Docker daemon",
    },
    Cell {
        name: "docker: pull failure",
        tls: false,
        apply: true,
        fault: |w| w.stub("PULL_FAIL", "Error response from daemon: manifest unknown"),
        exit: 1,
        // A tag never pushed is the bundle author's, not the registry's.
        report: Some("IMAGE_NOT_FOUND"),
        says: "manifest unknown",
    },
    Cell {
        name: "docker: pull refused by the registry",
        tls: false,
        apply: true,
        fault: |w| {
            w.stub(
                "PULL_FAIL",
                "Error response from daemon: no basic auth credentials",
            )
        },
        exit: 1,
        report: Some("COMPOSE_PULL_FAILED"),
        says: "no basic auth credentials",
    },
    Cell {
        name: "docker: up failure",
        tls: false,
        apply: true,
        fault: |w| {
            w.stub("FAULT_IF", "web:2");
            w.stub(
                "UP_FAIL",
                "Error response from daemon: driver failed programming external connectivity: \
                 Bind for 0.0.0.0:8080 failed: port is already allocated",
            );
        },
        exit: 1,
        report: Some("COMPOSE_UP_FAILED"),
        says: "reverted to",
    },
    Cell {
        name: "docker: unhealthy after up",
        tls: false,
        apply: true,
        fault: |w| {
            w.stub("FAULT_IF", "web:2");
            w.stub("HEALTH", "unhealthy");
        },
        exit: 1,
        report: Some("UNHEALTHY"),
        says: "reverted to",
    },
];

fn daemon_down(w: &World) {
    std::fs::remove_file(w.stub_dir().join("docker.sock")).unwrap();
    w.stub("DAEMON_DOWN", "1");
}

/// Rewrites `from` to `to` in the agent's config (after every other config change).
fn edit_config(w: &World, from: &str, to: &str) {
    let text = std::fs::read_to_string(w.config_path()).unwrap();
    assert!(text.contains(from), "{from:?} not in the config:\n{text}");
    std::fs::write(w.config_path(), text.replace(from, to)).unwrap();
}

/// A loopback port nobody listens on (bound, then released).
fn closed_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn release_env(w: &World, sha: &str) -> PathBuf {
    w.env_dir().join("releases").join(sha).join(".env")
}

fn check(cell: &Cell) {
    let name = cell.name;
    let w = World::with(WorldOptions {
        tls_proxy: cell.tls,
    });
    let running = w.applied();
    assert_eq!(w.state()["applied_sha"], json!(running), "{name}: setup");
    let env_before = std::fs::read(release_env(&w, &running)).unwrap();
    let reports_before = w.reports().len();
    if cell.apply {
        w.publish(&TestBundle::tagged("2"));
    }
    (cell.fault)(&w);
    let run = w.tick();
    let stderr = run.stderr();
    assert_eq!(run.code(), cell.exit, "{name}: exit status\n{stderr}");

    let new_reports = &w.reports()[reports_before..];
    match cell.report {
        None => {
            assert!(new_reports.is_empty(), "{name}: {new_reports:#?}");
            assert!(stderr.contains(cell.says), "{name}: {stderr}");
        }
        Some(code) => {
            assert_eq!(new_reports.len(), 1, "{name}: {new_reports:#?}\n{stderr}");
            let r = &new_reports[0];
            assert_eq!(r.result, ReportResult::Failed, "{name}: {r:?}");
            let detail = r.detail.as_deref().unwrap_or_default();
            assert!(
                detail.starts_with(&format!("{code}: ")) && detail.contains(cell.says),
                "{name}: detail {detail:?}, wanted {code} and {:?}",
                cell.says
            );
            for secret in [GEMINI, PGPASS, REGISTRY_PASS] {
                assert!(!r.log_tail.contains(secret) && !detail.contains(secret));
            }
            let last_error = w.state()["last_error"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(last_error.starts_with(code), "{name}: {last_error:?}");
        }
    }

    // The running release: `current` still names it, its .env is byte for byte what it was,
    // and tenancy still hears it as the applied one. Nothing is left half-written.
    assert_eq!(
        w.current_target(),
        Some(Path::new("releases").join(&running)),
        "{name}: current"
    );
    assert_eq!(
        std::fs::read(w.env_dir().join("current/.env")).unwrap(),
        env_before,
        "{name}: the running release's .env"
    );
    assert_eq!(
        w.state()["applied_sha"],
        json!(running),
        "{name}: applied_sha"
    );
    assert!(
        !w.env_dir().join("staging").exists(),
        "{name}: staging left"
    );
}

#[test]
fn every_peer_fault_leaves_the_running_release_and_says_so() {
    // A few cells at a time: each runs an agent process against its own peers.
    let mut failed = Vec::new();
    for chunk in CELLS.chunks(4) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|cell| (cell.name, s.spawn(|| check(cell))))
                .collect();
            for (name, h) in handles {
                if h.join().is_err() {
                    failed.push(name);
                }
            }
        });
    }
    assert!(failed.is_empty(), "failed cells: {failed:#?}");
}

/// A state dir the agent cannot write is the box's problem, not a bundle's or a peer's: the
/// tick ends with `STATE_WRITE_FAILED` (not the generic `FAILED`), before any checkin, and the
/// running release stays. Here the lock is a directory, so opening it for writing fails.
#[test]
fn a_state_dir_that_cannot_be_written_fails_with_its_own_code() {
    check(&Cell {
        name: "state dir: the lock cannot be opened for writing",
        tls: false,
        apply: false,
        fault: |w| {
            let lock = w.state_dir().join("lock");
            std::fs::remove_file(&lock).unwrap();
            std::fs::create_dir(&lock).unwrap();
        },
        exit: 1,
        report: None,
        says: "STATE_WRITE_FAILED: ",
    });
}

// ---- the loop's pacing ---------------------------------------------------------------------

/// Gaps between the checkins the fake tenancy saw, in seconds.
fn checkin_gaps(w: &World, from: usize) -> Vec<f64> {
    let at: Vec<_> = w
        .requests()
        .into_iter()
        .filter(|r| r.endpoint == Some(Endpoint::Checkin))
        .skip(from)
        .map(|r| r.at)
        .collect();
    at.windows(2).map(|p| (p[1] - p[0]).as_secs_f64()).collect()
}

fn checkins(w: &World) -> usize {
    w.requests()
        .iter()
        .filter(|r| r.endpoint == Some(Endpoint::Checkin))
        .count()
}

/// Runs `monky-deployd run` until `n` more checkins arrived (or `limit` passed), then stops it
/// with SIGTERM; returns the gaps between those checkins.
fn loop_gaps(w: &World, n: usize, limit: Duration) -> Vec<f64> {
    let from = checkins(w);
    let mut child = w
        .command(&["run"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + limit;
    while checkins(w) < from + n && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert_eq!(
        child.wait().unwrap().code(),
        Some(0),
        "the loop stops on SIGTERM"
    );
    checkin_gaps(w, from)
}

/// A world whose loop ticks every second while healthy.
fn one_second_world() -> World {
    let w = World::new();
    w.config_extra("interval_s: 1\n");
    let sha = w.applied();
    w.tenancy.set_desired(
        ENV,
        Desired {
            checkin_interval_s: Some(1),
            ..Desired::sha(sha)
        },
    );
    // One healthy tick stores tenancy's 1 s interval, which the loop keeps using while failing.
    w.tick().ok();
    w
}

#[test]
fn the_loop_backs_off_exponentially_under_5xx_and_never_ticks_faster_than_the_interval() {
    let w = one_second_world();
    w.tenancy.set_fault(
        Endpoint::Checkin,
        Fault::Status {
            status: 503,
            body: "{}".into(),
        },
    );
    // Waits after failures 1..4: 1 s, 2 s, 4 s, 8 s, each plus up to half again of jitter.
    // A gap is that wait plus one failing tick, which a loaded machine can stretch.
    let gaps = loop_gaps(&w, 5, Duration::from_secs(45));
    assert!(gaps.len() >= 4, "{gaps:?}");
    let bounds = [(1.0, 1.5), (2.0, 3.0), (4.0, 6.0), (8.0, 12.0)];
    for (gap, (lo, hi)) in gaps.iter().zip(bounds) {
        // Below the floor would be a retry storm (and the floors doubling is what makes it
        // exponential); far above the ceiling, a stall.
        assert!(*gap >= lo - 0.05 && *gap <= hi + 2.0, "{gaps:?}");
    }
    // Jitter: the waits are not all exact powers of two.
    let jitter: f64 = gaps.iter().zip(bounds).map(|(g, (lo, _))| g - lo).sum();
    assert!(jitter > 0.05, "no jitter in {gaps:?}");

    // Healthy again: back to the interval at once.
    w.tenancy.clear_faults();
    let gaps = loop_gaps(&w, 4, Duration::from_secs(20));
    assert!(gaps.len() >= 3, "{gaps:?}");
    // The first gap still holds the last backoff; from then on the interval.
    for gap in &gaps[1..] {
        assert!((0.95..2.5).contains(gap), "{gaps:?}");
    }
}

#[test]
fn the_loop_honours_retry_after() {
    let w = one_second_world();
    w.tenancy.set_fault(Endpoint::Checkin, Fault::RetryAfter(3));
    let gaps = loop_gaps(&w, 3, Duration::from_secs(30));
    assert!(gaps.len() >= 2, "{gaps:?}");
    // Backoff alone would wait 1-1.5 s, then 2-3 s: tenancy's 3 s win both times.
    for gap in &gaps {
        assert!(*gap >= 2.95 && *gap < 5.0, "{gaps:?}");
    }
}

/// The reports tenancy took that say `failed`.
fn failed_reports(w: &World) -> Vec<monky_agent_proto::ReportRequest> {
    w.reports()
        .into_iter()
        .filter(|r| r.result == ReportResult::Failed)
        .collect()
}

#[test]
fn an_apply_without_a_sha_is_reported_failed_once_with_its_code() {
    let w = World::new();
    let sha = w.applied();
    let reports = w.reports().len();
    let fetches = bundle_fetches(&w);
    w.checkin_answers(&json!({"env_id": ENV, "desired_sha": null, "action": "apply"}));
    let run = w.tick();
    run.expect(1).says(&["CHECKIN_INVALID"]);
    // Said to tenancy once, as failed with the code, and nothing acted on.
    let new: Vec<_> = w.reports().into_iter().skip(reports).collect();
    assert_eq!(new.len(), 1, "{new:?}");
    assert_report(&new[0], ReportResult::Failed, Some("CHECKIN_INVALID: "));
    assert_eq!(new[0].sha, None);
    assert_eq!(bundle_fetches(&w), fetches);
    let st = w.state();
    assert_eq!(st["last_result"], "failed");
    assert_eq!(st["last_code"], "CHECKIN_INVALID");
    assert_eq!(st["applied_sha"], json!(sha));
    w.assert_current(&sha);
}

#[test]
fn a_success_report_tenancy_does_not_take_leaves_the_release_applied() {
    // Tenancy down for the report (a retry, 75) or refusing it (1): either way the release
    // came up, so it is applied, never `failed` and never waiting out a backoff; the next
    // tick's heartbeat reports it.
    for (status, exit, code) in [
        (503, 75, "TENANCY_UNAVAILABLE"),
        (400, 1, "TENANCY_REFUSED"),
    ] {
        let w = World::new();
        let first = w.applied();
        let sha = w.publish(&TestBundle::tagged("2"));
        w.tenancy.set_fault_times(
            Endpoint::Report,
            Fault::Status {
                status,
                body: r#"{"code":"BUSY","detail":"report store is busy"}"#.into(),
            },
            Some(1),
        );
        w.tick().expect(exit);
        assert!(failed_reports(&w).is_empty(), "{status}: {:?}", w.reports());
        let st = w.state();
        assert_eq!(st["applied_sha"], json!(sha), "{status}: {st}");
        assert_eq!(st["last_result"], "applied", "{status}: {st}");
        assert_eq!(st["last_code"], code, "{status}: {st}");
        assert!(st["failed_sha"].is_null(), "{status}: {st}");
        assert!(st["next_attempt_at"].is_null(), "{status}: {st}");
        w.assert_current(&sha);
        assert_ne!(first, sha);

        w.tick().ok();
        let r = w.last_report();
        assert_report(&r, ReportResult::Applied, None);
        assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
        assert!(failed_reports(&w).is_empty(), "{status}: {:?}", w.reports());
        assert!(w.state()["last_code"].is_null());
    }
}

fn bundle_fetches(w: &World) -> usize {
    w.requests()
        .iter()
        .filter(|r| r.endpoint == Some(Endpoint::Bundle))
        .count()
}
