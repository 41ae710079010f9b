//! The tick's deadline: a tick still running at `tick_timeout_s` ends with exit 75, takes its
//! docker children with it, records why, frees the lock and leaves the running release alone.

use std::time::Duration;

use serde_json::json;

use crate::util::*;

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[test]
fn a_tick_past_its_deadline_exits_75_kills_its_children_and_frees_the_lock() {
    let w = World::new();
    let first = w.applied();
    let current = w.current_target();
    let env_file = w.env_dir().join(format!("releases/{first}/.env"));
    let env_before = std::fs::read(&env_file).unwrap();
    // The world's healthy_timeout_s is 5; a registry that never answers holds the pull.
    w.config_extra("tick_timeout_s: 6\n");
    w.stub("PULL_HANG", "300");
    let second = w.publish(&TestBundle::tagged("2"));

    let run = w.tick();
    run.expect(75);
    run.says(&["TICK_TIMEOUT"]);
    let pid: i32 = std::fs::read_to_string(w.stub_dir().join("pull.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for _ in 0..100 {
        if !alive(pid) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !alive(pid),
        "the hung docker compose pull ({pid}) outlived the tick"
    );

    // The running release and its .env are untouched; the timeout is on record.
    assert_eq!(w.current_target(), current);
    assert_eq!(std::fs::read(&env_file).unwrap(), env_before);
    let state = w.state();
    assert_eq!(state["applied_sha"], json!(first));
    assert!(
        state["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("TICK_TIMEOUT: ")),
        "{state}"
    );
    let status = w.run(&["status"]);
    status.prints(&["TICK_TIMEOUT"]);

    // The lock went with the process: the next tick runs, and converges.
    w.clear_stub();
    let next = w.tick();
    next.ok();
    assert!(
        !next.stderr().contains("another tick holds the lock"),
        "{}",
        next.stderr()
    );
    assert_eq!(w.state()["applied_sha"], json!(second));
}

/// A tick its deadline ends leaves what every tick leaves: the journal's summary line (with the
/// repeat count on the next timeout) and metrics that say not converged, exit 75; never the
/// last good tick's.
#[test]
fn a_timed_out_tick_writes_its_summary_line_and_metrics_and_counts_repeats() {
    let w = World::new();
    w.applied();
    let prom = w.path("metrics.prom");
    w.config_extra(&format!(
        "tick_timeout_s: 6\nmetrics_textfile: {}\n",
        prom.display()
    ));
    w.tick().ok();
    let good = std::fs::read_to_string(&prom).unwrap();
    assert!(
        good.contains("monky_deployd_converged{env_id=\"env-qa-02\"} 1"),
        "{good}"
    );
    w.stub("PULL_HANG", "300");
    w.publish(&TestBundle::tagged("2"));

    let first = w.tick();
    first.expect(75);
    first.says(&["code=TICK_TIMEOUT", "exit=75"]);
    let metrics = std::fs::read_to_string(&prom).unwrap();
    for line in [
        "monky_deployd_converged{env_id=\"env-qa-02\"} 0",
        "monky_deployd_exit_code{env_id=\"env-qa-02\"} 75",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    // Past tenancy's checkin bucket: the same hang, counted as a repeat.
    w.tenancy.advance_clock(Duration::from_secs(60));
    let again = w.tick();
    again.expect(75);
    again.says(&["(same TICK_TIMEOUT as the last 1 tick)"]);
}

/// A tick killed (SIGKILL, as a changed kill mode or loop mode's parent leaves it) during
/// `compose up` leaves its `up` running; the next tick ends it before its own, so the two
/// `up`s of the project never overlap: by the stub's own record of each `up`'s start and end.
#[test]
fn a_killed_ticks_orphan_up_never_overlaps_the_next_ticks() {
    let w = World::new();
    w.applied();
    let log = w.stub_dir().join("up.log");
    std::fs::write(&log, "").unwrap();
    w.stub("UP_SLEEP", "120");
    w.publish(&TestBundle::tagged("2"));
    let mut killed = w.command(&["run", "--once"]).spawn().unwrap();
    while !std::fs::read_to_string(&log).unwrap().contains("start") {
        assert!(
            killed.try_wait().unwrap().is_none(),
            "the tick ended before its up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    killed.kill().unwrap();
    killed.wait().unwrap();
    w.stub("UP_SLEEP", "");
    w.tenancy.advance_clock(Duration::from_secs(60));
    let next = w.tick();
    let records = std::fs::read_to_string(&log).unwrap();
    let mut running: Option<&str> = None;
    let mut ups = 0;
    for line in records.lines() {
        match line.split_once(' ') {
            Some(("start", pid)) => {
                assert!(
                    running.is_none(),
                    "an up started while {running:?} ran: {records}"
                );
                running = Some(pid);
                ups += 1;
            }
            Some(("end", pid)) => {
                assert_eq!(running, Some(pid), "{records}");
                running = None;
            }
            _ => panic!("{line:?} in {records}"),
        }
    }
    assert_eq!(running, None, "an up never ended: {records}");
    assert_eq!(
        ups, 2,
        "the killed tick's up and the next tick's: {records}"
    );
    let pids: Vec<i32> = records
        .lines()
        .filter_map(|l| l.strip_prefix("start ")?.parse().ok())
        .collect();
    assert!(pids.iter().all(|p| !alive(*p)), "{records}");
    next.says(&["a killed tick left running"]);
}
