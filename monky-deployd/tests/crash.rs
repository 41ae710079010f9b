//! Crash safety: the agent killed (SIGKILL) at each step of an apply loses nothing, and the next
//! tick converges. Needs the `failpoints` feature (the CI suite runs with --all-features).

#![cfg(feature = "failpoints")]

use monky_agent_proto::ReportResult;
use serde_json::json;

use crate::util::*;

const POINTS: &[&str] = &[
    "after-fetch",
    "after-staging",
    "mid-write",
    "before-swap",
    "after-swap",
    "before-up",
    "after-up",
    "before-save",
];

#[test]
fn a_kill_at_any_step_of_an_apply_loses_nothing() {
    for point in POINTS {
        let w = World::new();
        let first = w.applied();
        let env_before = std::fs::read(w.env_dir().join(format!("releases/{first}/.env"))).unwrap();
        let second = w.publish(&TestBundle::tagged("2"));
        let run = Run(w
            .command(&["run", "--once"])
            .env("MONKY_DEPLOYD_FAILPOINT", point)
            .output()
            .unwrap());
        assert_eq!(
            run.0.status.code(),
            None,
            "{point}: killed by a signal\n{}",
            run.stderr()
        );

        // current names a complete release, the old .env is intact, state.json parses.
        let target = w.current_target().expect("current exists");
        let rel = w.env_dir().join(&target);
        for f in ["docker-compose.yml", ".env", "bundle.json"] {
            assert!(
                rel.join(f).is_file(),
                "{point}: {} lacks {f}",
                rel.display()
            );
        }
        assert_eq!(
            std::fs::read(w.env_dir().join(format!("releases/{first}/.env"))).unwrap(),
            env_before,
            "{point}"
        );
        let _ = w.state();

        // The recovery tick converges and leaves no staging dir or temp file behind.
        w.tick().ok();
        assert_eq!(w.state()["applied_sha"], json!(second), "{point}");
        assert_eq!(
            w.current_target().unwrap(),
            std::path::Path::new("releases").join(&second),
            "{point}"
        );
        assert!(
            !w.env_dir().join("staging").exists(),
            "{point}: staging left behind"
        );
        let temps: Vec<_> = walk_names(&w.state_dir())
            .into_iter()
            .filter(|n| n.contains(".tmp."))
            .collect();
        assert!(temps.is_empty(), "{point}: temp files left: {temps:?}");
        assert_report(&w.last_report(), ReportResult::Applied, None);
    }
}

fn walk_names(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(e.file_name().to_string_lossy().into_owned());
        if e.path().is_dir() && !e.path().is_symlink() {
            out.extend(walk_names(&e.path()));
        }
    }
    out
}
