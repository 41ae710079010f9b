//! Disk stays bounded whatever tenancy sends: a new sha every tick is pruned to `keep_releases`
//! after every apply (no `--prune` needed), and `releases_max_bytes` holds before a release is
//! staged, older releases going first, then a refusal that names the cap.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::util::*;

/// Bytes allocated below `dir`, links not followed (as `du`).
fn du(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|e| {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            m.blocks() * 512 + if m.is_dir() { du(&e.path()) } else { 0 }
        })
        .sum()
}

/// Ticks a minute apart, as the timer runs them, for tenancy's rate buckets.
fn minute_later(w: &World) {
    w.tenancy.advance_clock(std::time::Duration::from_secs(60));
}

fn releases(w: &World) -> usize {
    std::fs::read_dir(w.env_dir().join("releases"))
        .unwrap()
        .count()
}

/// A release of about 512 KiB: the compose file padded with comment lines, unique per `i`.
fn big(i: usize) -> TestBundle {
    let mut b = TestBundle::tagged(&format!("big{i}"));
    let line = format!("# padding {i:04} {}\n", "x".repeat(100));
    b.compose
        .push_str(&line.repeat(512 * 1024 / line.len() - 16));
    b
}

#[test]
fn a_new_sha_every_tick_for_50_ticks_keeps_keep_releases_without_prune() {
    let w = World::new();
    w.applied();
    for i in 0..50 {
        let sha = w.publish(&TestBundle::tagged(&format!("t{i}")));
        minute_later(&w);
        w.tick().ok();
        assert_eq!(w.state()["applied_sha"], sha.as_str());
        assert!(releases(&w) <= 5, "tick {i}: {} releases", releases(&w));
    }
    assert_eq!(releases(&w), 5, "keep_releases by default");
    assert!(
        !w.docker_calls()
            .iter()
            .any(|c| c.starts_with("image prune")),
        "images are pruned only with --prune"
    );
}

#[test]
fn fifty_large_releases_stay_under_the_byte_cap() {
    let w = World::new();
    let cap: u64 = 16 << 20;
    // keep_releases alone would let 100 releases of 512 KiB pile up; the cap binds first.
    w.config_extra(&format!("keep_releases: 100\nreleases_max_bytes: {cap}\n"));
    w.applied();
    let mut last_good = String::new();
    for i in 0..50 {
        let sha = w.publish(&big(i));
        minute_later(&w);
        w.tick().ok();
        assert_eq!(w.state()["applied_sha"], sha.as_str());
        let used = du(&w.env_dir().join("releases")) + du(&w.env_dir().join("staging"));
        assert!(used <= cap, "tick {i}: {used} bytes over the cap {cap}");
        last_good = sha;
    }
    assert!(
        (20..=32).contains(&releases(&w)),
        "about cap / 512 KiB releases kept: {}",
        releases(&w)
    );
    w.assert_current(&last_good);
}

#[test]
fn what_a_container_writes_into_its_release_dir_never_blocks_the_next_release() {
    let w = World::new();
    let cap: u64 = 16 << 20;
    w.config_extra(&format!("releases_max_bytes: {cap}\n"));
    let good = w.applied();
    // A container's `./data` bind: 20 MiB of its own, and 40 hard links of one 1 MiB file.
    let data = w.env_dir().join(format!("releases/{good}/data"));
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("blob"), vec![7u8; 20 << 20]).unwrap();
    std::fs::write(data.join("one"), vec![1u8; 1 << 20]).unwrap();
    for i in 0..40 {
        std::fs::hard_link(data.join("one"), data.join(format!("link{i}"))).unwrap();
    }
    let sha = w.publish(&TestBundle::tagged("2"));
    w.tick().expect(0);
    assert_eq!(w.state()["applied_sha"], sha.as_str());
    w.assert_current(&sha);
    assert!(
        data.join("blob").exists(),
        "a container's data is not pruned for room"
    );
}

/// A chain of `depth` directories at `top`, made one level at a time from the parent's fd (its
/// path is longer than any a system call takes), as a container with a `./data` bind makes it.
fn chain(top: &Path, depth: usize) {
    use rustix::fs::{Mode, OFlags};
    std::fs::create_dir(top).unwrap();
    let dir = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut cur = rustix::fs::open(top, dir, Mode::empty()).unwrap();
    for _ in 0..depth {
        rustix::fs::mkdirat(&cur, "d", Mode::from_raw_mode(0o700)).unwrap();
        cur = rustix::fs::openat(&cur, "d", dir, Mode::empty()).unwrap();
    }
}

#[test]
fn a_release_with_a_20000_deep_tree_is_pruned_under_the_units_descriptor_limit() {
    let w = World::new();
    w.config_extra("keep_releases: 1\n");
    let old = w.applied();
    chain(&w.env_dir().join(format!("releases/{old}/data")), 20_000);
    let sha = w.publish(&TestBundle::tagged("2"));
    // The packaged unit's LimitNOFILE: one descriptor per level would run out at ~1000.
    let out = w
        .wrapped_command(&["prlimit", "--nofile=1024:1024", "--"], &["run", "--once"])
        .output()
        .unwrap();
    let run = Run(out);
    // Exits by itself, not by a signal (the recursive removal died of a stack overflow). Its
    // code is not asserted: removing 20,000 levels takes tens of seconds on a busy disk, and
    // OpenBao's `Date`, read before the prune, is judged after it.
    assert!(run.0.status.code().is_some(), "{:?}", run.0.status);
    assert!(
        !run.stderr().contains("fatal runtime error"),
        "{}",
        run.stderr()
    );
    assert_eq!(w.state()["applied_sha"], sha.as_str());
    assert!(
        !w.env_dir().join(format!("releases/{old}")).exists(),
        "the old release is pruned: {}",
        run.stderr()
    );
    assert!(!run.stderr().contains("cannot prune"), "{}", run.stderr());
}

/// A release dir too wide to walk within a tick (the walks' budget made small by the test-only
/// `MONKY_DEPLOYD_TEST_TREE_ENTRIES`) is named in the journal at every prune and in `doctor`,
/// and the prune goes on with the other releases.
#[cfg(feature = "failpoints")]
#[test]
fn a_tree_too_wide_to_walk_is_named_and_the_prune_goes_on() {
    let w = World::new();
    w.config_extra("keep_releases: 1\n");
    let wide = w.applied();
    let data = w.env_dir().join(format!("releases/{wide}/data"));
    std::fs::create_dir(&data).unwrap();
    for i in 0..50 {
        std::fs::write(data.join(format!("f{i}")), "x").unwrap();
    }
    let tick = || {
        minute_later(&w);
        let out = w
            .command(&["run", "--once"])
            .env("MONKY_DEPLOYD_TEST_TREE_ENTRIES", "20")
            .output()
            .unwrap();
        Run(out)
    };
    let second = w.publish(&TestBundle::tagged("2"));
    let run = tick();
    run.expect(0);
    run.says(&["cannot prune", "holds more than 20 entries"]);
    assert!(data.exists(), "named, not removed");
    w.publish(&TestBundle::tagged("3"));
    tick().expect(0).says(&["holds more than 20 entries"]);
    assert!(
        !w.env_dir().join(format!("releases/{second}")).exists(),
        "the prune went on with the other release"
    );
    let doctor = w
        .command(&["doctor"])
        .env("MONKY_DEPLOYD_TEST_TREE_ENTRIES", "20")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&doctor.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("release dirs"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.contains(&wide) && line.contains("holds more than 20 entries"),
        "{stdout}"
    );
}
