//! Soak: `monky-deployd run` heartbeats 2,000 times against the testkit peers and the stub
//! docker; open files, resident memory, threads and child processes stay flat and every tick is
//! reported. Needs the `failpoints` feature for the millisecond interval (CI runs
//! --all-features).

#![cfg(feature = "failpoints")]

use std::time::{Duration, Instant};

use monky_testkit::tenancy::{Endpoint, Rate, RateLimits};

use crate::util::*;

const TICKS: usize = 2_000;
/// Where the baseline is taken: caches, pools and the allocator have settled by then.
const WARM: usize = 200;
const INTERVAL_MS: &str = "5";

/// What the agent process holds at one moment.
#[derive(Debug, Clone, Copy)]
struct Sample {
    ticks: usize,
    fds: usize,
    rss_kib: u64,
    threads: u64,
    children: usize,
}

fn sample(pid: u32, ticks: usize) -> Sample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    Sample {
        ticks,
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count(),
        rss_kib: field("VmRSS:"),
        threads: field("Threads:"),
        children: children_of(pid),
    }
}

/// The settled picture: the least of 25 looks 10 ms apart, so that a connection or a thread
/// that only lives during a tick does not count as held. With ticks 5 ms apart most looks land
/// inside one; a quarter of a second of looks finds a gap between two on a loaded machine too.
fn settled(pid: u32, ticks: usize) -> Sample {
    let looks: Vec<Sample> = (0..25)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(10));
            sample(pid, ticks)
        })
        .collect();
    let least = |f: fn(&Sample) -> u64| looks.iter().map(f).min().unwrap_or_default();
    Sample {
        ticks,
        fds: least(|s| s.fds as u64) as usize,
        rss_kib: least(|s| s.rss_kib),
        threads: least(|s| s.threads),
        children: least(|s| s.children as u64) as usize,
    }
}

/// Live processes whose parent is `pid`.
fn children_of(pid: u32) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // The parent pid is the second field after the parenthesised command name.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .is_some_and(|ppid| ppid == pid.to_string())
        })
        .count()
}

fn count(w: &World, endpoint: Endpoint) -> usize {
    w.requests()
        .iter()
        .filter(|r| r.endpoint == Some(endpoint))
        .count()
}

#[test]
fn two_thousand_heartbeats_hold_files_memory_and_processes_flat() {
    let w = World::new();
    let unlimited = Rate::per_minute(1_000_000);
    w.tenancy.set_limits(RateLimits {
        checkin: unlimited,
        report: unlimited,
        ..RateLimits::default()
    });
    w.applied();
    let reports_before = w.reports().len();
    let checkins_before = count(&w, Endpoint::Checkin);

    let mut child = w
        .command(&["run"])
        .env("MONKY_DEPLOYD_TEST_INTERVAL_MS", INTERVAL_MS)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(170);
    let ticks = || w.reports().len() - reports_before;
    let mut warm = None;
    while ticks() < TICKS && Instant::now() < deadline {
        if warm.is_none() && ticks() >= WARM {
            warm = Some(settled(pid, ticks()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let end = settled(pid, ticks());
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let elapsed = started.elapsed();
    let warm = warm.expect("the loop reached the warm-up tick count");
    eprintln!("soak: {warm:?} -> {end:?} in {elapsed:.1?}");

    assert!(
        end.ticks >= TICKS,
        "only {} ticks in {elapsed:?}",
        end.ticks
    );
    // Every tick that checked in also reported, and every report is a healthy heartbeat.
    let reports = &w.reports()[reports_before..];
    assert_eq!(
        reports.len(),
        count(&w, Endpoint::Checkin) - checkins_before
    );
    assert!(
        reports
            .iter()
            .all(|r| r.result == monky_agent_proto::ReportResult::Applied)
    );
    // Flat: no descriptor, thread or child leaks per tick (a leak of one per tick would show as
    // 1,800 here); memory within allocator noise of the warm sample. On a loaded machine every
    // look can land inside a tick, which holds a few connections, a resolver thread and maybe a
    // child for its duration (and the state dir's fd, with the deadline's duplicate of it): the
    // margins allow one tick in flight, far below any per-tick leak.
    assert!(end.fds <= warm.fds + 12, "{warm:?} -> {end:?}");
    assert!(end.threads <= warm.threads + 4, "{warm:?} -> {end:?}");
    assert!(end.children <= warm.children + 2, "{warm:?} -> {end:?}");
    assert!(
        end.rss_kib <= warm.rss_kib + (warm.rss_kib / 4).max(2048),
        "{warm:?} -> {end:?}"
    );
}
