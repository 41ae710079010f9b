//! What an operator is told about a broken box: per situation, the tick (exit, code, summary
//! line with whose move it is), `status --json`, `explain` and `doctor --json` say the cause,
//! and nothing says "converged" or all-ok while it is broken. No output carries a secret.

use monky_testkit::bao::Fault as BaoFault;
use monky_testkit::tenancy::{Endpoint, Fault};
use serde_json::Value;

use crate::util::*;

/// `TLS_CLOCK`'s next step as `explain` and `status` give it.
#[cfg(feature = "failpoints")]
const TLS_CLOCK_STEP: &str = "a peer's certificate is expired or not yet valid by this box's clock, or the clock is more than 30 s off OpenBao's: check the clock (`timedatectl`, NTP sync); if the clock is right, the peer's operator renews the certificate";

/// Everything an operator can read after a tick.
struct Views {
    tick: Run,
    status: Value,
    explain: String,
    doctor_exit: i32,
    doctor: Value,
}

/// The agent run with `args` and the environment `env` on top of the world's.
fn run_with(w: &World, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = w.command(args);
    c.envs(env.iter().copied());
    Run(c.output().unwrap())
}

impl Views {
    fn of(w: &World, tick: Run) -> Views {
        Self::with(w, tick, &[])
    }

    /// The views read with `env` set, as the tick was (a test clock).
    fn with(w: &World, tick: Run, env: &[(&str, &str)]) -> Views {
        let status = run_with(w, &["status", "--json"], env);
        status.ok();
        let explain = run_with(w, &["explain"], env);
        explain.ok();
        let doctor = run_with(w, &["doctor", "--json"], env);
        let views = Views {
            status: serde_json::from_str(&status.stdout())
                .unwrap_or_else(|e| panic!("{e}: {}", status.stdout())),
            explain: explain.stdout(),
            doctor_exit: doctor.code(),
            doctor: serde_json::from_str(&doctor.stdout())
                .unwrap_or_else(|e| panic!("{e}: {}", doctor.stdout())),
            tick,
        };
        views.no_secret(w);
        views
    }

    /// The tick exited `exit` with `code`, and its summary line names the code, the exit and
    /// whose move it is.
    #[track_caller]
    fn tick_says(&self, exit: i32, code: &str, owner: &str) -> &Self {
        self.tick.expect(exit);
        let summary = self
            .tick
            .stderr()
            .lines()
            .find(|l| l.contains("tick: action="))
            .unwrap_or_else(|| panic!("no summary line:\n{}", self.tick.stderr()))
            .to_string();
        for want in [
            format!("code={code}"),
            format!("exit={exit}"),
            format!("owner=\"{owner}\""),
        ] {
            assert!(summary.contains(&want), "{want:?} not in {summary:?}");
        }
        self
    }

    /// `status` and `explain` say the box is not converged, why (`why` in a reason), and whose
    /// move it is.
    #[track_caller]
    fn not_converged(&self, why: &str, owner: Option<&str>) -> &Self {
        assert_eq!(self.status["converged"], false, "{:#}", self.status);
        let reasons = self.status["not_converged"].to_string();
        assert!(reasons.contains(why), "{why:?} not in {reasons}");
        assert!(
            !self.explain.contains("state       converged"),
            "{}",
            self.explain
        );
        assert!(!self.explain.contains("nothing to do"), "{}", self.explain);
        assert!(
            self.explain.contains(why),
            "{why:?} not in\n{}",
            self.explain
        );
        if let Some(owner) = owner {
            assert_eq!(self.status["whose_move"], owner, "{:#}", self.status);
            assert!(
                self.explain.contains(&format!("whose move  {owner}")),
                "{owner:?} not in\n{}",
                self.explain
            );
        }
        self
    }

    /// `doctor` gives `check` the verdict `verdict`, its detail holding `says`.
    #[track_caller]
    fn doctor_says(&self, check: &str, verdict: &str, says: &str) -> &Self {
        let c = self.doctor["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == check)
            .unwrap_or_else(|| panic!("no check {check}: {:#}", self.doctor));
        assert_eq!(c["verdict"], verdict, "{check}: {c:#}");
        let detail = c["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(says), "{check}: {says:?} not in {detail:?}");
        if verdict == "fail" {
            assert_eq!(self.doctor_exit, 1, "{:#}", self.doctor);
            assert_eq!(self.doctor["ok"], false);
        }
        self
    }

    fn no_secret(&self, w: &World) {
        let token = std::fs::read_to_string(w.state_dir().join("bao.token")).unwrap_or_default();
        let all = format!(
            "{}\n{}\n{}\n{}\n{}",
            self.tick.stderr(),
            self.tick.stdout(),
            self.status,
            self.explain,
            self.doctor
        );
        for secret in [GEMINI, PGPASS, REGISTRY_PASS, token.trim()] {
            if !secret.is_empty() {
                assert!(!all.contains(secret), "a secret leaked:\n{all}");
            }
        }
    }
}

#[test]
fn a_failing_healthcheck_names_the_probe_keeps_the_logs_and_is_the_bundle_authors() {
    let w = World::new();
    let good = w.applied();
    w.stub("UNHEALTHY_IF", "web:bad");
    w.publish(&TestBundle::tagged("bad"));
    let v = Views::of(&w, w.tick());
    v.tick_says(1, "UNHEALTHY", "bundle author")
        .not_converged("UNHEALTHY", Some("bundle author"))
        .doctor_says("last tick", "warn", "bundle author");
    // Fallen back, and the failed release's evidence kept and pointed at.
    w.assert_current(&good);
    let logs = v.status["failed_logs"].as_str().unwrap().to_string();
    assert!(logs.ends_with(".log"), "{logs}");
    let meta = std::fs::metadata(&logs).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o600
    );
    assert!(v.explain.contains("monky-deployd logs "), "{}", v.explain);
    let printed = w.run(&["logs"]);
    printed.ok();
    let text = printed.stdout();
    assert!(text.contains("UNHEALTHY: "), "{text}");
    assert!(text.contains("--- compose logs ---"), "{text}");
    for secret in [GEMINI, PGPASS] {
        assert!(!text.contains(secret), "{text}");
    }
    let bad_sha = TestBundle::tagged("bad").sha();
    w.run(&["logs", &bad_sha[..9]]).ok();
    let unknown = w.run(&["logs", "0000000"]);
    unknown.expect(1);
    assert!(
        unknown.stderr().contains("no kept logs"),
        "{}",
        unknown.stderr()
    );
}

#[test]
fn a_port_in_use_is_compose_up_failed_in_dockers_words() {
    let w = World::new();
    w.applied();
    w.stub(
        "UP_FAIL",
        "Error response from daemon: driver failed programming external connectivity on \
         endpoint monky-env-qa-02-web-1: Bind for 0.0.0.0:8080 failed: port is already allocated",
    );
    w.publish(&TestBundle::tagged("2"));
    let v = Views::of(&w, w.tick());
    v.tick_says(1, "COMPOSE_UP_FAILED", "box admin")
        .not_converged("COMPOSE_UP_FAILED", Some("box admin"))
        .doctor_says("last tick", "fail", "port is already allocated");
    let detail = w.last_report().detail.unwrap();
    assert!(
        detail.starts_with("COMPOSE_UP_FAILED: Error response from daemon:")
            && detail.contains("port is already allocated"),
        "{detail}"
    );
    // docker's words, not compose's command line naming a staging path
    assert!(!detail.contains("--env-file"), "{detail}");
    assert!(!detail.contains("staging"), "{detail}");
}

#[test]
fn a_missing_image_tag_is_the_bundle_authors() {
    let w = World::new();
    w.applied();
    w.stub(
        "PULL_FAIL",
        "Error response from daemon: manifest for 127.0.0.1:5000/monky/web:nope not found: manifest unknown: manifest unknown",
    );
    w.publish(&TestBundle::tagged("nope"));
    let v = Views::of(&w, w.tick());
    v.tick_says(1, "IMAGE_NOT_FOUND", "bundle author")
        .not_converged("IMAGE_NOT_FOUND", Some("bundle author"))
        .doctor_says("last tick", "warn", "manifest unknown");
    assert!(v.explain.contains("pushes the image"), "{}", v.explain);
}

#[test]
fn a_revoked_token_is_never_converged_and_doctor_fails_it() {
    let w = World::new();
    w.applied();
    assert!(w.bao.revoke_tokens_for_env(ENV) > 0);
    let v = Views::of(&w, w.tick());
    v.tick.expect(1);
    // The tick dropped the refused token; doctor fails its absence and names the cause it saw.
    v.doctor_says("token", "fail", "revoked or superseded by tenancy");
    assert_eq!(v.status["converged"], false, "{:#}", v.status);
    assert!(!v.explain.contains("nothing to do"), "{}", v.explain);
    assert!(v.explain.contains("box admin"), "{}", v.explain);
}

#[test]
fn tenancy_down_is_temporary_and_not_converged() {
    let w = World::new();
    w.applied();
    w.tenancy.set_fault(
        Endpoint::Checkin,
        Fault::Status {
            status: 503,
            body: "upstream connect error".into(),
        },
    );
    let v = Views::of(&w, w.tick());
    v.tick_says(75, "TENANCY_UNAVAILABLE", "no one (retries on its own)")
        .not_converged("TENANCY_UNAVAILABLE", Some("no one (retries on its own)"))
        .doctor_says("last tick", "warn", "TENANCY_UNAVAILABLE");
    // A second tick with the same failure is counted, not logged again in full.
    let again = w.tick();
    again.expect(75);
    assert!(
        again
            .stderr()
            .contains("(same TENANCY_UNAVAILABLE as the last 1 tick)"),
        "{}",
        again.stderr()
    );
    assert!(!again.stderr().contains("  detail"), "{}", again.stderr());
}

#[test]
fn docker_down_is_named_and_gives_no_false_disk_failure() {
    let w = World::new();
    w.applied();
    std::fs::remove_file(w.stub_dir().join("docker.sock")).unwrap();
    w.stub("DAEMON_DOWN", "1");
    let v = Views::of(&w, w.tick());
    v.tick_says(1, "DOCKER_UNAVAILABLE", "box admin")
        .not_converged("docker does not answer", Some("box admin"))
        .doctor_says("docker socket", "fail", "not reachable");
    let disk = v.doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "disk")
        .unwrap();
    assert_eq!(disk["verdict"], "skip", "{disk:#}");
}

#[test]
fn a_short_disk_fails_the_tick_and_doctor() {
    let w = World::new();
    w.applied();
    w.config_extra("disk_headroom_bytes: 1000000000000000\n");
    w.publish(&TestBundle::tagged("2"));
    let v = Views::of(&w, w.tick());
    v.tick_says(1, "DISK_INSUFFICIENT", "box admin")
        .not_converged("DISK_INSUFFICIENT", Some("box admin"))
        .doctor_says("disk", "fail", "needed");
    assert!(!v.explain.contains("run --once --prune"), "{}", v.explain);
}

#[test]
fn openbao_sealed_is_its_operators_move() {
    let w = World::new();
    w.applied();
    // Sealed to the agent's own calls (tenancy's check of the bearer would otherwise make it
    // TENANCY_UNAVAILABLE first).
    for path in ["auth/token/lookup-self", "auth/jwt-tenancy", "monky/"] {
        w.bao.set_fault(path, BaoFault::Sealed);
    }
    w.publish(&TestBundle::tagged("2"));
    let v = Views::of(&w, w.tick());
    v.tick_says(75, "BAO_SEALED", "OpenBao operators")
        .not_converged("BAO_SEALED", Some("OpenBao operators"))
        .doctor_says("openbao", "fail", "BAO_SEALED");
    // One fix, the code's: nothing about this box's transport.
    let check = v.doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "openbao")
        .unwrap();
    let fix = check["fix"].as_str().unwrap();
    assert!(fix.contains("must unseal it"), "{check:#}");
    assert!(!fix.contains("bao.addr"), "{check:#}");
}

#[test]
fn a_wrong_ca_is_named_by_doctor_with_its_code() {
    let w = World::with(WorldOptions { tls_proxy: true });
    w.applied();
    std::fs::write(w.path("ca.pem"), Pki::new().ca_pem).unwrap();
    w.publish(&TestBundle::tagged("2"));
    let v = Views::of(&w, w.tick());
    v.tick_says(1, "BAO_TLS_UNKNOWN_CA", "box admin")
        .not_converged("BAO_TLS_UNKNOWN_CA", Some("box admin"))
        .doctor_says("openbao", "fail", "BAO_TLS_UNKNOWN_CA");
}

#[test]
fn an_expired_grant_and_a_grant_beside_a_working_token_are_named_by_doctor() {
    use base64::Engine as _;
    let w = World::new();
    w.applied();
    // A grant beside a working token: the tick ignores it, so doctor says so.
    w.stage_grant();
    let v = Views::of(&w, w.tick());
    v.doctor_says("grant", "warn", "working token is in use");
    // An expired one (doctor reads `exp` without trusting it; OpenBao would refuse it).
    let b64 = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    let jwt = format!(
        "{}.{}.c2ln",
        b64(r#"{"alg":"ES256","typ":"JWT"}"#),
        b64(r#"{"exp":1600000000,"env_id":"env-qa-02"}"#)
    );
    std::fs::write(w.bootstrap_path(), jwt).unwrap();
    let doctor = w.run(&["doctor", "--json"]);
    doctor.expect(1);
    assert!(
        doctor.stdout().contains("expired at 2020-09-13"),
        "{}",
        doctor.stdout()
    );
}

#[test]
fn an_upgraded_box_shows_what_it_runs_before_its_first_tick() {
    let w = World::new();
    let sha = w.applied();
    let original = serde_json::json!({
        "env_id": ENV,
        "applied_sha": sha,
        "desired_sha": sha,
        "last_checkin": 1_790_000_000.5,
        "last_result": "applied",
        "last_error": null,
        "token": {"source": "lease"},
    });
    let state = w.state_dir().join("state.json");
    let text = serde_json::to_vec_pretty(&original).unwrap();
    std::fs::write(&state, &text).unwrap();
    let status = w.run(&["status", "--json"]);
    status.ok();
    let doc: Value = serde_json::from_str(&status.stdout()).unwrap();
    assert_eq!(doc["applied_sha"], sha.as_str(), "{doc:#}");
    assert_eq!(doc["desired_sha"], sha.as_str(), "{doc:#}");
    let explain = w.run(&["explain"]);
    explain.ok();
    assert!(
        explain.stdout().contains(&sha[..12]),
        "{}",
        explain.stdout()
    );
    // Read, never written: the tick takes it over under its lock.
    assert_eq!(std::fs::read(&state).unwrap(), text);
}

#[test]
fn at_debug_each_peer_call_is_one_line_and_the_http_stack_is_quiet() {
    let w = World::new();
    w.config_extra("log_level: DEBUG\n");
    w.stage_grant();
    w.publish(&TestBundle::default());
    let run = w.tick();
    run.ok();
    let err = run.stderr();
    assert!(
        err.lines()
            .any(|l| l.contains("tenancy POST /v1/agent/checkin 200 ") && l.ends_with("ms")),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.contains("openbao ") && l.contains(" /v1/") && l.ends_with("ms")),
        "{err}"
    );
    for chatter in [
        "idle connection",
        "new connection",
        "connecting to",
        "flushed",
        "pooling",
    ] {
        assert!(!err.contains(chatter), "{chatter:?} in\n{err}");
    }
    // The same tick with RUST_LOG=debug shows what the filter holds back.
    w.publish(&TestBundle::tagged("2"));
    let loud = Run(w
        .command(&["run", "--once"])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap());
    let loud = loud.stderr();
    // Printed for the record (`--nocapture`): what the filter saves a debug journal.
    eprintln!(
        "a debug apply tick: {} lines at log_level DEBUG, {} with RUST_LOG=debug",
        err.lines().count(),
        loud.lines().count()
    );
    assert!(
        [
            "idle connection",
            "new connection",
            "connecting to",
            "flushed",
            "pooling"
        ]
        .iter()
        .any(|c| loud.contains(c)),
        "{loud}"
    );
    let token = std::fs::read_to_string(w.state_dir().join("bao.token")).unwrap();
    assert!(!err.contains(token.trim()), "the token in the journal");
}

#[test]
fn the_journal_gets_priorities_only_when_stderr_is_the_journal_stream() {
    use std::os::unix::fs::MetadataExt;
    let w = World::new();
    w.applied();
    w.tenancy.set_fault(
        Endpoint::Checkin,
        Fault::Status {
            status: 503,
            body: "upstream connect error".into(),
        },
    );
    // systemd's JOURNAL_STREAM names the stream's device and inode; a file stands in for it.
    let journal = w.path("journal.log");
    let file = std::fs::File::create(&journal).unwrap();
    let meta = file.metadata().unwrap();
    let out = w
        .command(&["run", "--once"])
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stderr(file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(75));
    let text = std::fs::read_to_string(&journal).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(
            ["<3>", "<4>", "<6>", "<7>"]
                .iter()
                .any(|p| l.starts_with(p)),
            "no priority: {l:?}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("<3>") && l.contains("TENANCY_UNAVAILABLE")),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("<4>")
            && l.contains("tick: action=- ")
            && l.contains("exit=75")),
        "{text}"
    );
    // Inherited but pointing elsewhere (a pipe here): no prefixes.
    let piped = w
        .command(&["run", "--once"])
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&piped.stderr);
    assert!(!text.contains("<3>") && !text.contains("<4>"), "{text}");
}

#[test]
fn a_token_of_another_env_is_named_by_the_tick_status_explain_and_doctor() {
    let w = World::new();
    w.applied();
    let text = std::fs::read_to_string(w.config_path())
        .unwrap()
        .replace(&format!("env_id: {ENV}"), "env_id: env-other");
    std::fs::write(w.config_path(), text).unwrap();
    let v = Views::of(&w, w.tick());
    v.tick_says(78, "AGENT_ENV_MISMATCH", "box admin")
        .not_converged("AGENT_ENV_MISMATCH", Some("box admin"))
        .doctor_says("token", "fail", "minted for env \"env-qa-02\"");
}

/// The box's clock 3 days ahead of OpenBao's: stepped within the boot after the last tick read
/// OpenBao's `Date`, so no new OpenBao call sees it; the reading carried on the boot clock does.
/// The release is fine and reported so; the tick, `status`, `explain` and `doctor` name the
/// clock, `TLS_CLOCK`, exit 1, the box admin's move. The clock set right again clears it.
#[cfg(feature = "failpoints")]
#[test]
fn a_clock_3_days_ahead_of_openbaos_is_tls_clock_everywhere() {
    use monky_agent_proto::ReportResult;
    let w = World::new();
    w.applied();
    let clock = [("MONKY_DEPLOYD_TEST_CLOCK", "259200 0")];
    let n = w.bao.agent_requests().len();
    let v = Views::with(&w, run_with(&w, &["run", "--once"], &clock), &clock);
    let ahead = "this box's clock is 3d ahead of OpenBao's";
    v.tick_says(1, "TLS_CLOCK", "box admin")
        .not_converged(ahead, Some("box admin"))
        .doctor_says("clock", "fail", &format!("TLS_CLOCK: {ahead}"))
        .doctor_says("last tick", "fail", ahead);
    assert!(
        v.tick.stderr().contains(&format!("TLS_CLOCK: {ahead}")),
        "{}",
        v.tick.stderr()
    );
    assert!(v.explain.contains("timedatectl"), "{}", v.explain);
    assert_eq!(v.status["next_step"], TLS_CLOCK_STEP, "{:#}", v.status);
    // The tick asked OpenBao nothing (same boot); doctor's one lookup-self is all.
    let asked: Vec<String> = w.bao.agent_requests()[n..]
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(asked, ["/v1/auth/token/lookup-self"], "{asked:?}");
    assert_report(&w.last_report(), ReportResult::Applied, None);
    // The clock right again: converged, doctor's clock ok, without a word from OpenBao.
    let v = Views::of(&w, w.tick());
    v.tick.ok();
    assert_eq!(v.status["converged"], true, "{:#}", v.status);
    v.doctor_says("clock", "ok", "of OpenBao's");
}

/// The box's clock 2 days behind OpenBao's after a reboot: the new boot's first tick asks
/// OpenBao's `lookup-self` (as every new boot does) and reads the skew off its `Date`.
#[cfg(feature = "failpoints")]
#[test]
fn a_clock_2_days_behind_openbaos_after_a_reboot_is_tls_clock_everywhere() {
    let w = World::new();
    w.applied();
    let clock = [("MONKY_DEPLOYD_TEST_CLOCK", "-172800 0 a-later-boot")];
    let n = w.bao.agent_requests().len();
    let v = Views::with(&w, run_with(&w, &["run", "--once"], &clock), &clock);
    let behind = "this box's clock is 2d behind OpenBao's";
    v.tick_says(1, "TLS_CLOCK", "box admin")
        .not_converged(behind, Some("box admin"))
        .doctor_says("clock", "fail", &format!("TLS_CLOCK: {behind}"));
    assert!(
        v.tick.stderr().contains("not yet valid here"),
        "{}",
        v.tick.stderr()
    );
    assert!(
        w.bao.agent_requests()[n..]
            .iter()
            .any(|r| r.path.ends_with("/lookup-self")),
        "the tick read OpenBao's clock off its own call"
    );
    let reading = &w.state()["clock"];
    assert!(
        reading["box_ahead_s"]
            .as_i64()
            .is_some_and(|s| (-172_801..=-172_799).contains(&s)),
        "{reading}"
    );
    // A later tick of that boot, no new OpenBao call: still the clock, counted as a repeat.
    let again = run_with(&w, &["run", "--once"], &clock);
    again.expect(1);
    assert!(
        again
            .stderr()
            .contains("(same TLS_CLOCK as the last 1 tick)"),
        "{}",
        again.stderr()
    );
}
