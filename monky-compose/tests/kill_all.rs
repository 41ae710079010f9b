//! `process::kill_all`: the children a process has running (and their own children) die with
//! it, and no child started afterwards survives. A test binary of its own, since the kill is
//! process-wide.

use std::time::Duration;

use monky_compose::process::{Invocation, Runner, kill_all};

fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[test]
fn running_children_and_later_ones_are_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let runner = Runner::builder("/tmp/monky-agent-docker").build().unwrap();
    // A child that starts a grandchild, records both pids and then waits for a minute.
    let script = format!("sleep 60 & echo $$ $! > {}; wait", pids.display());
    let inv = Invocation::new("/bin/sh", Duration::from_secs(120)).args(["-c", &script]);
    let call = {
        let (runner, inv) = (runner.clone(), inv.clone());
        std::thread::spawn(move || runner.run(&inv))
    };
    let mut recorded = String::new();
    for _ in 0..200 {
        recorded = std::fs::read_to_string(&pids).unwrap_or_default();
        if recorded.ends_with('\n') {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let ids: Vec<i32> = recorded
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{recorded:?}");

    kill_all();
    // The call returns: its child was killed by a signal, long before its minute was up.
    let out = call.join().unwrap().unwrap();
    assert_eq!(out.code, None, "{out:?}");
    for _ in 0..200 {
        if !ids.iter().any(|p| alive(*p)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    for pid in &ids {
        assert!(!alive(*pid), "{pid} survived kill_all");
    }

    // A child started after kill_all does not get to run its course either.
    let out = runner
        .run(&Invocation::new("/bin/sh", Duration::from_secs(120)).args(["-c", "sleep 60"]))
        .unwrap();
    assert_eq!(out.code, None, "{out:?}");
}
