//! Crash safety: the agent killed (SIGKILL) at each step of an apply loses nothing, and the next
//! tick converges. Needs the `failpoints` feature (the CI suite runs with --all-features).

#![cfg(feature = "failpoints")]

use monky_agent_proto::ReportResult;
use serde_json::json;

use crate::util::*;

/// Each crash point, and whether the apply had marked itself under way there (from just
/// before `current` moves to the saved outcome): the next tick then recovers it from disk
/// (no bundle, no lease, no OpenBao read) and says so; before it, nothing on the box changed
/// and the next tick applies as any other.
const POINTS: &[(&str, bool)] = &[
    ("after-fetch", false),
    ("after-staging", false),
    ("mid-write:.env", false),
    ("mid-write:state.json", false),
    ("before-swap", true),
    ("after-swap", true),
    ("before-up", true),
    ("after-up", true),
    ("before-save", true),
];

#[test]
fn a_kill_at_any_step_of_an_apply_loses_nothing() {
    for (point, marked) in POINTS {
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
        // Whatever the point after the checkin's own save, the views name what tenancy wants
        // now, not the sha before it.
        if *point != "mid-write:state.json" {
            assert_eq!(w.state()["desired_sha"], json!(second), "{point}");
            w.run(&["status"]).ok().prints(&[&second[..12]]);
        }
        let marker = w.env_dir().join("applying");
        assert_eq!(marker.exists(), *marked, "{point}");
        if *marked {
            // Until the next tick, status and explain say the apply was cut short.
            w.run(&["status"])
                .ok()
                .prints(&["interrupted", &second[..12]]);
            w.run(&["explain"]).ok().prints(&["cut short"]);
            // A killed `compose up` leaves a container created and never started.
            let mut cs: Vec<serde_json::Value> = serde_json::from_slice(
                &std::fs::read(w.stub_dir().join("containers.json")).unwrap(),
            )
            .unwrap();
            cs[0]["State"] = json!("created");
            cs[0]["Status"] = json!("Created");
            std::fs::write(
                w.stub_dir().join("containers.json"),
                serde_json::to_vec(&cs).unwrap(),
            )
            .unwrap();
        }
        let bao_before = w.bao.agent_requests().len();
        let calls_before = w.docker_calls().len();

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
        assert!(!marker.exists(), "{point}: the mark outlived the recovery");
        if *marked {
            let r = w.last_report();
            assert_eq!(r.result, ReportResult::Applied, "{point}: {r:?}");
            assert!(
                r.detail
                    .as_deref()
                    .is_some_and(|d| d.starts_with("APPLY_INTERRUPTED: finished the apply of")),
                "{point}: {r:?}"
            );
            assert_eq!(
                w.bao.agent_requests().len(),
                bao_before,
                "{point}: no OpenBao read"
            );
            let calls = w.docker_calls()[calls_before..].join("\n");
            assert!(
                calls.contains(&format!("rm -f monky-{ENV}-web-1")),
                "{point}: the leftover goes first: {calls}"
            );
        } else {
            assert_report(&w.last_report(), ReportResult::Applied, None);
        }
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

/// Tenancy went back to the running release while an apply was cut short after the swap: the
/// next tick points `current` back at it and brings it up, and says so.
#[test]
fn an_interrupted_apply_tenancy_no_longer_wants_is_rolled_back() {
    let w = World::new();
    let first = w.applied();
    let second = w.publish(&TestBundle::tagged("2"));
    let run = Run(w
        .command(&["run", "--once"])
        .env("MONKY_DEPLOYD_FAILPOINT", "after-swap")
        .output()
        .unwrap());
    assert_eq!(run.0.status.code(), None, "killed");
    w.assert_current(&second);
    w.tenancy
        .set_desired(ENV, monky_testkit::tenancy::Desired::sha(first.clone()));
    w.tick().ok();
    w.assert_current(&first);
    let r = w.last_report();
    assert_eq!(r.result, ReportResult::Applied, "{r:?}");
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(first.as_str()));
    let detail = r.detail.unwrap_or_default();
    assert!(
        detail.starts_with(&format!(
            "APPLY_INTERRUPTED: rolled back the apply of {}",
            &second[..12]
        )) && detail.ends_with(&format!("reverted to {}", &first[..12])),
        "{detail}"
    );
    assert!(!w.env_dir().join("applying").exists());
    assert_eq!(w.state()["applied_sha"], json!(first));
}
