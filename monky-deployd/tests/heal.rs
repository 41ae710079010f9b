//! The box stays converged between applies (stub docker): drift found on the heartbeat without
//! a process and healed without tenancy's apply, a lease or an OpenBao read; the heal backoff;
//! `self_heal: false`; an operator's hold.

use monky_agent_proto::ReportResult;
use monky_testkit::tenancy::{Desired, Endpoint};
use serde_json::{Value, json};

use crate::apply::compose_sub;
use crate::util::*;

const WEB: &str = "monky-env-qa-02-web-1";

/// The stub engine's model of the project's containers (`containers.json`).
fn model(w: &World) -> Vec<Value> {
    serde_json::from_slice(&std::fs::read(w.stub_dir().join("containers.json")).unwrap()).unwrap()
}

fn set_model(w: &World, containers: &[Value]) {
    std::fs::write(
        w.stub_dir().join("containers.json"),
        serde_json::to_vec(containers).unwrap(),
    )
    .unwrap();
}

/// Changes the first container of the model.
fn edit_web(w: &World, edit: impl FnOnce(&mut Value)) {
    let mut cs = model(w);
    edit(&mut cs[0]);
    set_model(w, &cs);
}

/// A box that applied the default bundle; the calls, tenancy's and OpenBao's requests so far.
struct Applied {
    w: World,
    sha: String,
    calls: usize,
    tenancy: usize,
    bao: usize,
}

fn applied() -> Applied {
    let w = World::new();
    let sha = w.applied();
    assert_report(&w.last_report(), ReportResult::Applied, None);
    Applied {
        calls: w.docker_calls().len(),
        tenancy: w.requests().len(),
        bao: w.bao.agent_requests().len(),
        sha,
        w,
    }
}

impl Applied {
    fn new_calls(&self) -> Vec<String> {
        self.w.docker_calls()[self.calls..].to_vec()
    }

    /// Asserts the ticks since `applied` asked tenancy only checkins and reports and made no
    /// OpenBao request of the agent's.
    #[track_caller]
    fn assert_local(&self) {
        let endpoints: Vec<Option<Endpoint>> = self.w.requests()[self.tenancy..]
            .iter()
            .map(|r| r.endpoint)
            .collect();
        assert!(
            endpoints
                .iter()
                .all(|e| matches!(e, Some(Endpoint::Checkin | Endpoint::Report))),
            "{endpoints:?}"
        );
        assert_eq!(
            self.w.bao.agent_requests().len(),
            self.bao,
            "{:?}",
            self.w.bao.agent_requests()
        );
    }
}

fn subs(calls: &[String]) -> Vec<String> {
    calls
        .iter()
        .map(|c| {
            compose_sub(c).map_or_else(
                || c.split_whitespace().next().unwrap_or("").to_string(),
                str::to_string,
            )
        })
        .collect()
}

#[track_caller]
fn assert_no_secret(w: &World) {
    let reports = format!("{:?}", w.reports());
    let state = std::fs::read_to_string(w.state_dir().join("state.json")).unwrap();
    for v in [GEMINI, PGPASS] {
        assert!(!reports.contains(v), "a secret in a report");
        assert!(!state.contains(v), "a secret in state.json");
    }
}

#[test]
fn a_converged_heartbeat_spawns_no_process() {
    let a = applied();
    a.w.tick().ok();
    a.w.tick().ok();
    assert_eq!(a.new_calls(), Vec::<String>::new());
    assert_report(&a.w.last_report(), ReportResult::Applied, None);
    // The record drift is measured against is in state, hash and image included.
    let rec = &a.w.state()["converged"];
    assert_eq!(rec["sha"], json!(a.sha));
    assert_eq!(rec["containers"][WEB]["config_hash"], json!("hash-web"));
    assert_eq!(
        rec["containers"][WEB]["image_id"],
        json!("sha256:image-web")
    );
}

/// Each drift, made in the engine's model, is healed by the next tick: the report names it,
/// compose brings the release up again (after removing what it would not replace), and nothing
/// but a checkin and a report reaches tenancy, nothing OpenBao.
#[test]
fn each_drift_is_healed_by_the_next_tick_without_tenancy_or_openbao() {
    type Make = fn(&World);
    let cases: &[(&str, Make, &str, bool)] = &[
        ("removed", |w| set_model(w, &[]), "web missing", false),
        (
            "stopped",
            |w| {
                edit_web(w, |c| {
                    c["State"] = json!("exited");
                    c["Status"] = json!("Exited (0) 3 seconds ago");
                })
            },
            "web exited (0)",
            false,
        ),
        (
            "killed",
            |w| {
                edit_web(w, |c| {
                    c["State"] = json!("exited");
                    c["Status"] = json!("Exited (137) 1 second ago");
                })
            },
            "web exited (137)",
            false,
        ),
        (
            "recreated",
            |w| {
                edit_web(w, |c| {
                    c["Labels"]["com.docker.compose.config-hash"] = json!("by-hand");
                })
            },
            "web recreated by hand",
            true,
        ),
        (
            "other image",
            |w| edit_web(w, |c| c["ImageID"] = json!("sha256:other")),
            "web recreated by hand",
            true,
        ),
        (
            "leftover",
            |w| {
                edit_web(w, |c| {
                    c["State"] = json!("created");
                    c["Status"] = json!("Created");
                })
            },
            "web created, never started",
            true,
        ),
        (
            "extra",
            |w| {
                let mut cs = model(w);
                let mut extra = cs[0].clone();
                extra["Names"] = json!(["/monky-env-qa-02-intruder-1"]);
                extra["Labels"]["com.docker.compose.service"] = json!("intruder");
                cs.push(extra);
                set_model(w, &cs);
            },
            "intruder not the release's (monky-env-qa-02-intruder-1)",
            true,
        ),
    ];
    for (name, make, drift, removes) in cases {
        let a = applied();
        make(&a.w);
        a.w.tick().ok();
        let r = a.w.last_report();
        assert_eq!(r.result, ReportResult::Applied, "{name}: {r:?}");
        let detail = r.detail.clone().unwrap_or_default();
        assert!(
            detail.starts_with("HEALED: ") && detail.contains(drift),
            "{name}: {detail}"
        );
        assert_eq!(
            r.sha.as_ref().map(|s| s.as_str()),
            Some(a.sha.as_str()),
            "{name}"
        );
        let calls = a.new_calls();
        // A service that exited by itself: its own last lines are read before the up.
        let mut want = if *name == "stopped" {
            vec!["logs".to_string(), "config".to_string()]
        } else {
            vec!["config".to_string()]
        };
        if *removes {
            want.push("rm".into());
        }
        want.push("up".into());
        assert_eq!(subs(&calls), want, "{name}: {calls:?}");
        if *removes {
            assert!(
                calls[1].ends_with(WEB) || calls[1].contains("intruder"),
                "{name}: {calls:?}"
            );
        }
        a.assert_local();
        assert_no_secret(&a.w);
        assert_eq!(a.w.state()["last_note"], json!(detail), "{name}");
        assert_eq!(a.w.state()["heal_attempts"], json!(1), "{name}");
        // Converged again: the next heartbeat finds nothing and spawns nothing.
        let n = a.w.docker_calls().len();
        a.w.tick().ok();
        assert_report(&a.w.last_report(), ReportResult::Applied, None);
        assert_eq!(a.w.docker_calls().len(), n, "{name}");
    }
}

#[test]
fn a_completed_one_shot_and_a_restarting_container_are_not_drift() {
    let w = World::new();
    w.stub("SERVICES", "migrate web");
    w.applied();
    // The migration exited 0 before the record was taken: a completed one-shot.
    let mut cs = model(&w);
    cs[0]["State"] = json!("exited");
    cs[0]["Status"] = json!("Exited (0) 1 second ago");
    set_model(&w, &cs);
    let rec = json!({"sha": w.state()["applied_sha"], "containers": {
        "monky-env-qa-02-migrate-1": {"service": "migrate", "config_hash": "hash-migrate",
                                      "image_id": "sha256:image-migrate", "completed": true},
        WEB: {"service": "web", "config_hash": "hash-web", "image_id": "sha256:image-web",
              "completed": false}}});
    let mut st = w.state();
    st["converged"] = rec;
    std::fs::write(w.state_dir().join("state.json"), st.to_string()).unwrap();
    cs[1]["State"] = json!("restarting");
    cs[1]["Status"] = json!("Restarting (1) 2 seconds ago");
    set_model(&w, &cs);
    let n = w.docker_calls().len();
    w.tick();
    // Not healed (no compose call); the heartbeat reports health as before.
    assert_eq!(w.docker_calls().len(), n);
    let r = w.last_report();
    assert!(
        !r.detail.clone().unwrap_or_default().contains("HEALED"),
        "{r:?}"
    );
}

#[test]
fn self_heal_off_reports_the_drift_and_touches_nothing() {
    let a = applied();
    a.w.config_extra("self_heal: false\n");
    set_model(&a.w, &[]);
    a.w.tick().expect(1);
    assert_report(
        &a.w.last_report(),
        ReportResult::Failed,
        Some("DRIFT: web missing"),
    );
    assert!(
        a.w.last_report()
            .detail
            .unwrap()
            .contains("self_heal is off"),
        "the report says why nothing was done"
    );
    assert_eq!(a.new_calls(), Vec::<String>::new());
    let explain = a.w.run(&["explain"]);
    explain
        .ok()
        .prints(&["drifted", "self_heal is off, so no tick heals it"]);
    assert!(
        !explain.stdout().contains("the next tick heals it"),
        "{}",
        explain.stdout()
    );
}

/// A service that keeps dying is healed once per backoff step, and the ticks between say they
/// wait; `--force` heals at once.
#[test]
fn a_crash_loop_is_healed_once_per_backoff_step() {
    let a = applied();
    let crash = |w: &World| {
        edit_web(w, |c| {
            c["State"] = json!("exited");
            c["Status"] = json!("Exited (1) 1 second ago");
        })
    };
    let ups = |a: &Applied| subs(&a.new_calls()).iter().filter(|s| *s == "up").count();
    crash(&a.w);
    a.w.tick().ok();
    assert_eq!(ups(&a), 1);
    let st = a.w.state();
    assert_eq!(st["heal_attempts"], json!(1));
    let first_wait = st["next_heal_at"].as_u64().unwrap() - st["last_heal_at"].as_u64().unwrap();
    assert!((54..=66).contains(&first_wait), "{first_wait}");

    // It dies again at once: the next ticks report the drift and wait.
    for _ in 0..2 {
        crash(&a.w);
        a.w.tick().expect(1);
        let r = a.w.last_report();
        assert_report(&r, ReportResult::Failed, Some("DRIFT: web exited (1)"));
        assert!(r.detail.unwrap().contains("waiting: heal 1 ran at"));
        assert_eq!(ups(&a), 1, "no heal while the backoff runs");
    }
    a.w.run(&["explain"])
        .ok()
        .prints(&["drifted", "the next heal may run in"]);

    // The wait ran out: the second heal within the hour, and a longer wait after it. The
    // service came back, but it keeps dying: a crash loop, not a success.
    let mut st = a.w.state();
    st["next_heal_at"] = json!(1);
    st["next_heal_boot"] = Value::Null;
    std::fs::write(a.w.state_dir().join("state.json"), st.to_string()).unwrap();
    let prom = a.w.path("metrics.prom");
    a.w.config_extra(&format!("metrics_textfile: {}\n", prom.display()));
    a.w.tick().expect(1);
    assert_eq!(ups(&a), 2);
    let r = a.w.last_report();
    assert_report(&r, ReportResult::Failed, Some("CRASH_LOOP: web exited (1)"));
    assert!(
        r.detail
            .as_deref()
            .unwrap()
            .contains("web died by its own exit with exit code 1 again within the hour and was healed (2 heals"),
        "{r:?}"
    );
    // OPERATIONS.md's alerts over the file it wrote, served for a quarter of an hour.
    crate::alerts::Timeline::default()
        .served(&prom, 15)
        .fires(&[("MonkyCrashLoop", ""), ("MonkyNotConverged", "")]);
    let st = a.w.state();
    assert_eq!(st["heal_attempts"], json!(2));
    let second_wait = st["next_heal_at"].as_u64().unwrap() - st["last_heal_at"].as_u64().unwrap();
    assert!((108..=132).contains(&second_wait), "{second_wait}");

    // Up again, the next heartbeat finds it running; the box is still not converged: the
    // service must stay up through the hour. Every view says so, the tick's exit and report
    // included.
    a.w.tenancy
        .advance_clock(std::time::Duration::from_secs(60));
    a.w.tick().expect(1);
    assert_report(
        &a.w.last_report(),
        ReportResult::Failed,
        Some("CRASH_LOOP: web died by its own exit"),
    );
    let metrics = std::fs::read_to_string(&prom).unwrap();
    for line in [
        "monky_deployd_converged{env_id=\"env-qa-02\"} 0",
        "monky_deployd_crash_loop{env_id=\"env-qa-02\"} 1",
        "monky_deployd_exit_code{env_id=\"env-qa-02\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
    let status: Value = serde_json::from_str(&a.w.run(&["status", "--json"]).stdout()).unwrap();
    assert_eq!(status["converged"], false, "{status:#}");
    assert!(status.to_string().contains("CRASH_LOOP"), "{status:#}");
    a.w.run(&["explain"])
        .ok()
        .prints(&["CRASH_LOOP", "2 heals"]);
    // An hour later without a heal: converged again.
    let mut st = a.w.state();
    // The loop's moment is kept on both clocks; aged here on the wall: without its moment on
    // the boot clock (which may be younger than an hour on a fresh machine), the record is
    // counted on the wall.
    assert!(st["crash_loop"]["at_boot"]["at_s"].is_u64(), "{st:#}");
    assert!(st["last_heal_boot"]["at_s"].is_u64(), "{st:#}");
    st["crash_loop"]["at"] = json!(st["crash_loop"]["at"].as_u64().unwrap() - 3601);
    st["crash_loop"]["at_boot"] = Value::Null;
    std::fs::write(a.w.state_dir().join("state.json"), st.to_string()).unwrap();
    a.w.tenancy
        .advance_clock(std::time::Duration::from_secs(60));
    a.w.tick().ok();
    let metrics = std::fs::read_to_string(&prom).unwrap();
    assert!(
        metrics.contains("monky_deployd_crash_loop{env_id=\"env-qa-02\"} 0"),
        "{metrics}"
    );

    crash(&a.w);
    // Dead again: --force heals now, and a third heal within the hour is a crash loop again.
    a.w.run(&["run", "--once", "--force"]).expect(1);
    assert_eq!(ups(&a), 3, "--force heals now");
    a.assert_local();
}

/// A service that dies by its own exit again as soon as a heal starts it is the crash loop's
/// from the second heal within the hour, as one that dies later is: its owner stays the bundle
/// author, never the box admin's HEAL_FAILED.
#[test]
fn a_service_that_dies_again_at_once_is_a_crash_loop_not_a_failed_heal() {
    let a = applied();
    let crash = |w: &World| {
        edit_web(w, |c| {
            c["State"] = json!("exited");
            c["Status"] = json!("Exited (1) 1 second ago");
        })
    };
    // Not up after each up: what a service that dies again at once leaves for the readiness
    // poll.
    a.w.stub("HEALTH", "unhealthy");
    crash(&a.w);
    a.w.tick().expect(1);
    assert_report(
        &a.w.last_report(),
        ReportResult::Failed,
        Some("HEAL_FAILED: not healthy after up"),
    );
    crash(&a.w);
    a.w.run(&["run", "--once", "--force"]).expect(1);
    let r = a.w.last_report();
    assert_report(
        &r,
        ReportResult::Failed,
        Some("CRASH_LOOP: not healthy after up"),
    );
    a.w.run(&["explain"])
        .ok()
        .prints(&["CRASH_LOOP", "whose move  bundle author"]);
    let status: Value = serde_json::from_str(&a.w.run(&["status", "--json"]).stdout()).unwrap();
    assert_eq!(status["converged"], false, "{status:#}");
}

#[test]
fn a_heal_that_does_not_come_up_healthy_fails_and_waits() {
    let a = applied();
    set_model(&a.w, &[]);
    a.w.stub("HEALTH", "unhealthy");
    let logs = a.w.path("logs.txt");
    std::fs::write(&logs, "web-1  | booting\nweb-1  | cannot reach db:5432\n").unwrap();
    a.w.stub("LOGS_FILE", logs.to_str().unwrap());
    let run = a.w.tick();
    run.expect(1);
    // The app's own words reach the journal and `logs`, not only tenancy's log view.
    assert!(
        run.stderr().contains("last compose log lines:")
            && run.stderr().contains("cannot reach db:5432"),
        "{}",
        run.stderr()
    );
    a.w.run(&["logs"])
        .ok()
        .prints(&["HEAL_FAILED: not healthy after up", "cannot reach db:5432"]);
    let r = a.w.last_report();
    assert_report(
        &r,
        ReportResult::Failed,
        Some("HEAL_FAILED: not healthy after up"),
    );
    let detail = r.detail.unwrap();
    assert!(
        detail.contains("drift: web missing") && detail.contains("next heal after"),
        "{detail}"
    );
    assert!(
        r.log_tail.contains("--- compose logs ---"),
        "{}",
        r.log_tail
    );
    // The release stays the applied one: a heal never falls back or forgets it.
    assert_eq!(a.w.state()["applied_sha"], json!(a.sha));
    a.w.assert_current(&a.sha);
    assert_no_secret(&a.w);
}

#[test]
fn a_release_changed_on_disk_is_not_healed() {
    let a = applied();
    set_model(&a.w, &[]);
    let env = a.w.env_dir().join(format!("releases/{}/.env", a.sha));
    let mut text = std::fs::read_to_string(&env).unwrap();
    text.push_str("EXTRA=1\n");
    std::fs::write(&env, text).unwrap();
    a.w.tick().expect(1);
    assert_report(
        &a.w.last_report(),
        ReportResult::Failed,
        Some("RELEASE_MODIFIED"),
    );
    assert!(!subs(&a.new_calls()).contains(&"up".to_string()));
}

// ---- hold -----------------------------------------------------------------------------------

#[test]
fn a_held_box_applies_retires_and_heals_nothing_and_says_so() {
    let a = applied();
    a.w.run(&["hold", "--reason", "db migration by hand"])
        .ok()
        .prints(&["HELD: db migration by hand"]);

    // An apply waits.
    let second = a.w.publish(&TestBundle::tagged("2"));
    a.w.tick().ok();
    let r = a.w.last_report();
    assert_eq!(r.result, ReportResult::Applied);
    assert_eq!(
        r.sha.as_ref().map(|s| s.as_str()),
        Some(a.sha.as_str()),
        "the report is about what runs"
    );
    let detail = r.detail.clone().unwrap();
    assert!(
        detail.starts_with("HELD: db migration by hand; until `monky-deployd unhold`")
            && detail.contains(&format!("apply of {} waits", &second[..12])),
        "{detail}"
    );
    let hold = r.hold.clone().expect("the hold travels in the report");
    assert_eq!(hold.reason.as_deref(), Some("db migration by hand"));
    assert_eq!(hold.until, None);
    let checkins: Vec<_> = a.w.requests()[a.tenancy..]
        .iter()
        .filter(|r| r.endpoint == Some(Endpoint::Checkin))
        .map(|r| r.body.clone().unwrap())
        .collect();
    assert_eq!(
        checkins.last().unwrap()["hold"]["reason"],
        json!("db migration by hand")
    );
    a.w.assert_current(&a.sha);

    // Drift waits: what the hold explains is the operator's, no failure.
    set_model(&a.w, &[]);
    a.w.tick().ok();
    let detail = a.w.last_report().detail.unwrap();
    assert!(
        detail.starts_with("HELD: ") && detail.ends_with("no container of the project runs"),
        "{detail}"
    );

    // A retire waits.
    a.w.tenancy.set_desired(ENV, Desired::down(true));
    a.w.tick();
    assert!(a.w.last_report().detail.unwrap().contains("retire waits"));
    assert_eq!(
        a.new_calls(),
        Vec::<String>::new(),
        "held: no docker call at all"
    );
    a.assert_local();
    assert!(a.w.state()["applied_sha"] == json!(a.sha));

    // Status, explain and the metrics show it.
    a.w.run(&["status"])
        .ok()
        .prints(&["held", "db migration by hand"]);
    let status: Value = serde_json::from_str(&a.w.run(&["status", "--json"]).stdout()).unwrap();
    assert_eq!(status["hold"]["reason"], json!("db migration by hand"));
    a.w.run(&["explain"])
        .ok()
        .prints(&["held: HELD: db migration by hand", "unhold"]);

    // Unheld, the retire tenancy asked for goes on.
    a.w.run(&["unhold"]).ok().prints(&["hold removed"]);
    a.w.tick().ok();
    assert_report(&a.w.last_report(), ReportResult::Down, None);
    assert!(a.w.last_report().hold.is_none());
}

#[test]
fn a_hold_ends_by_itself_at_its_until() {
    let a = applied();
    a.w.config_extra(&format!(
        "metrics_textfile: {}\n",
        a.w.path("metrics/agent.prom").display()
    ));
    std::fs::create_dir_all(a.w.path("metrics")).unwrap();
    a.w.run(&["hold", "--until", "2h"]).ok();
    let hold: Value =
        serde_json::from_slice(&std::fs::read(a.w.state_dir().join("hold")).unwrap()).unwrap();
    let until = hold["until"].as_u64().unwrap();
    assert!((7190..=7210).contains(&(until - hold["since"].as_u64().unwrap())));
    let second = a.w.publish(&TestBundle::tagged("2"));
    a.w.tick().ok();
    assert_eq!(a.w.last_report().hold.unwrap().until, Some(until));
    let prom = std::fs::read_to_string(a.w.path("metrics/agent.prom")).unwrap();
    assert!(
        prom.contains(&format!("monky_deployd_held{{env_id=\"{ENV}\"}} 1")),
        "{prom}"
    );
    assert!(prom.contains(&format!(
        "monky_deployd_hold_until_timestamp_seconds{{env_id=\"{ENV}\"}} {until}"
    )));
    a.w.assert_current(&a.sha);

    // The time passes (the hold's end is moved into the past on both clocks, as time would).
    let mut hold = hold;
    hold["until"] = json!(1);
    hold["until_boot"]["at_s"] = json!(1);
    std::fs::write(a.w.state_dir().join("hold"), hold.to_string()).unwrap();
    a.w.run(&["status"]).ok();
    assert!(!a.w.run(&["status"]).stdout().contains("held "));
    a.w.tick().ok();
    assert_report(&a.w.last_report(), ReportResult::Applied, None);
    a.w.assert_current(&second);
    assert!(
        !a.w.state_dir().join("hold").exists(),
        "a hold past its end is removed"
    );
    let prom = std::fs::read_to_string(a.w.path("metrics/agent.prom")).unwrap();
    assert!(
        prom.contains(&format!("monky_deployd_held{{env_id=\"{ENV}\"}} 0")),
        "{prom}"
    );
}

/// A service stopped on purpose during a hold (a restore) is the operator's doing: the tick
/// reports it beside the hold, exits 0, and every view says the move is the operator's; the
/// journal's summary says `held`, with the sha that runs, while tenancy's apply waits.
#[test]
fn a_service_stopped_during_a_hold_is_the_operators_move() {
    let a = applied();
    a.w.run(&["hold", "--reason", "restore"]).ok();
    edit_web(&a.w, |c| {
        c["State"] = json!("exited");
        c["Status"] = json!("Exited (0) 3 seconds ago");
    });
    let second = a.w.publish(&TestBundle::tagged("2"));
    let run = a.w.tick();
    run.ok();
    let r = a.w.last_report();
    assert_eq!(r.result, ReportResult::Applied);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(a.sha.as_str()));
    let detail = r.detail.unwrap();
    assert!(
        detail.starts_with("HELD: restore")
            && detail.contains(&format!("apply of {} waits", &second[..12]))
            && detail.contains(&format!("not running and healthy: {WEB} (exited)")),
        "{detail}"
    );
    assert!(!detail.contains("UNHEALTHY"), "{detail}");
    run.says(&[&format!(
        "tick: action=apply sha={} outcome=held code=- ",
        &a.sha[..12]
    )]);
    run.says(&["exit=0 owner=\"operator\""]);
    a.assert_local();
    a.w.assert_current(&a.sha);
    a.w.run(&["explain"])
        .ok()
        .prints(&["held: HELD: restore", "whose move  operator"]);
    let doctor: Value = serde_json::from_str(&a.w.run(&["doctor", "--json"]).stdout()).unwrap();
    let hold = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "hold")
        .unwrap_or_else(|| panic!("{doctor:#}"));
    assert_eq!(hold["verdict"], "warn", "{hold:#}");
    assert!(
        hold["detail"]
            .as_str()
            .unwrap()
            .starts_with("HELD: restore"),
        "{hold:#}"
    );

    // Unheld: doctor has nothing to say of a hold.
    a.w.run(&["unhold"]).ok();
    let doctor: Value = serde_json::from_str(&a.w.run(&["doctor", "--json"]).stdout()).unwrap();
    let hold = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "hold")
        .unwrap();
    assert_eq!(hold["verdict"], "skip", "{hold:#}");
}

/// A second `hold` does not silently replace the first: refused, naming it, unless
/// `--replace`, which says what it replaced. `--until` takes an offset.
#[test]
fn a_second_hold_names_the_first_and_needs_replace() {
    let w = World::new();
    w.run(&["hold", "--reason", "restore", "--until", "2h"])
        .ok();
    let first = std::fs::read(w.state_dir().join("hold")).unwrap();
    w.run(&["hold", "--reason", "kernel update"])
        .expect(1)
        .says(&["already held (HELD: restore; until ", "--replace"]);
    assert_eq!(std::fs::read(w.state_dir().join("hold")).unwrap(), first);

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // One day on, given in UTC+01:00 local time.
    let end = now + 86_400;
    let local = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(end + 3600),
    )
    .to_string()
    .replace('Z', "+01:00");
    w.run(&[
        "hold",
        "--reason",
        "kernel update",
        "--until",
        &local,
        "--replace",
    ])
    .ok()
    .prints(&[
        "replaced HELD: restore; until ",
        "HELD: kernel update; until ",
    ]);
    let hold: Value =
        serde_json::from_slice(&std::fs::read(w.state_dir().join("hold")).unwrap()).unwrap();
    assert_eq!(hold["reason"], "kernel update");
    assert_eq!(hold["until"], json!(end), "{local}");
    let left = hold["until_boot"]["at_s"].as_u64().unwrap();
    assert!(left > 86_000, "{hold}");
}

#[test]
fn hold_refuses_a_past_or_unreadable_until_and_a_multiline_reason() {
    let w = World::new();
    w.run(&["hold", "--until", "2020-01-01T00:00:00Z"])
        .expect(1)
        .says(&["--until", "in the past"]);
    w.run(&["hold", "--until", "soon"]).expect(1).says(&["2h"]);
    w.run(&["hold", "--reason", "a\nb"])
        .expect(1)
        .says(&["one line"]);
    assert!(!w.state_dir().join("hold").exists());
    w.run(&["unhold"]).ok().prints(&["was not held"]);
}

/// `hold` run as root acts as the state dir's owner, so the agent's tick reads a file of its
/// own; run as that owner it writes as itself. Either way the file is the owner's, 0600.
#[test]
fn hold_writes_the_file_as_the_state_dirs_owner() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let w = World::new();
    let root = rustix::process::geteuid().is_root();
    // As root, the state dir belongs to another user, as on a box (nobody stands in for the
    // agent's user); its parents must let that user through.
    let owner = if root {
        65534
    } else {
        rustix::process::geteuid().as_raw()
    };
    std::fs::create_dir_all(w.state_dir()).unwrap();
    std::fs::set_permissions(w.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(w.state_dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
    if root {
        std::os::unix::fs::chown(w.state_dir(), Some(owner), Some(owner)).unwrap();
    }
    w.run(&["hold", "--reason", "kernel update"]).ok();
    let meta = std::fs::metadata(w.state_dir().join("hold")).unwrap();
    assert_eq!(meta.uid(), owner);
    assert_eq!(meta.mode() & 0o777, 0o600);
    w.run(&["status"]).ok().prints(&["kernel update"]);
    w.run(&["unhold"]).ok().prints(&["hold removed"]);
    assert!(!w.state_dir().join("hold").exists());
}

/// Release 2 failed and waits out its backoff; release 1 runs again. When release 1's
/// container then goes, the tick that backs off from 2 looks at what runs and heals 1; the
/// report never says "running" of a release whose containers are gone.
#[test]
fn the_running_release_is_healed_while_the_new_sha_backs_off() {
    let a = applied();
    a.w.stub("FAULT_IF", "web:2");
    a.w.stub(
        "UP_FAIL",
        "Bind for 0.0.0.0:8080 failed: port is already allocated",
    );
    a.w.publish(&TestBundle::tagged("2"));
    a.w.tick().expect(1);
    assert!(
        a.w.last_report()
            .detail
            .unwrap_or_default()
            .contains(&format!("reverted to {}", &a.sha[..12])),
        "{:?}",
        a.w.last_report()
    );
    // Release 2 backs off; release 1's container goes.
    set_model(&a.w, &[]);
    let from = a.w.docker_calls().len();
    a.w.tenancy
        .advance_clock(std::time::Duration::from_secs(60));
    let run = a.w.tick();
    run.ok();
    let r = a.w.last_report();
    assert_report(&r, ReportResult::Applied, Some("HEALED: web missing"));
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(a.sha.as_str()));
    let ups = subs(&a.w.docker_calls()[from..])
        .iter()
        .filter(|s| *s == "up")
        .count();
    assert_eq!(ups, 1, "one heal of release 1");
    // Nothing of release 1 runs and the heal waits out its own backoff: the report says so.
    set_model(&a.w, &[]);
    a.w.tenancy
        .advance_clock(std::time::Duration::from_secs(60));
    a.w.tick().expect(1);
    let detail = a.w.last_report().detail.unwrap_or_default();
    assert!(
        !detail.contains(&format!("running {}", &a.sha[..12])),
        "{detail}"
    );
}

/// A failed heal leads with its cause, in docker's own words; compose's command line is not in
/// the report or the journal's error line.
#[test]
fn a_failed_heal_leads_with_its_cause() {
    let a = applied();
    a.w.stub(
        "UP_FAIL",
        "Error response from daemon: Bind for 0.0.0.0:8080 failed: port is already allocated",
    );
    set_model(&a.w, &[]);
    let run = a.w.tick();
    run.expect(1);
    let r = a.w.last_report();
    let detail = r.detail.clone().unwrap_or_default();
    assert!(
        detail.starts_with("HEAL_FAILED: Error response from daemon: Bind for 0.0.0.0:8080"),
        "{detail}"
    );
    assert!(!detail.contains("--ansi"), "{detail}");
    let error_line = run
        .stderr()
        .lines()
        .find(|l| l.starts_with("ERROR HEAL_FAILED"))
        .unwrap_or_default()
        .to_string();
    assert!(!error_line.contains("--ansi"), "{}", run.stderr());
}
