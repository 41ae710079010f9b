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
