//! Files on the box as hostile ground (issue 15, items 1–3): planted temp names and links,
//! symlinked state dirs, state dirs owned or writable by others, unsafe bootstrap grants, a FIFO
//! `.env` on retire, and a release rewritten on disk before the fallback runs it. The attacker
//! is uid 65534 where its uid matters.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use monky_testkit::tenancy::Desired;

use crate::apply::compose_sub;
use crate::util::*;

const NOBODY: u32 = 65534;

/// Runs `sh -c script` as uid/gid 65534 with no supplementary groups.
fn as_nobody(script: &str) {
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("setpriv");
    assert!(
        out.status.success(),
        "as nobody: {script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// Lets uid 65534 reach into the world's directory (a temp dir is 0700).
fn open_world(w: &World) {
    chmod(w.dir.path(), 0o755);
}

/// The pids the next processes on this box will most likely get.
fn next_pids() -> std::ops::RangeInclusive<u32> {
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    last + 1..=last + 20_000
}

/// A root-only file the attacker wants written.
fn victim(w: &World) -> PathBuf {
    let p = w.path("victim");
    std::fs::write(&p, "root only\n").unwrap();
    chmod(&p, 0o600);
    p
}

/// Runs the agent with a deadline: a tick that hangs on a FIFO fails the test, not the suite.
fn run_bounded(w: &World, args: &[&str]) -> Run {
    let mut child = w
        .command(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the agent hung (killed after 60 s)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Run(child.wait_with_output().unwrap())
}

fn logins(w: &World) -> usize {
    w.bao
        .agent_requests()
        .iter()
        .filter(|r| r.path.contains("/login"))
        .count()
}

// ---- item 2: temp files and links ---------------------------------------------------------------

#[test]
fn metrics_temp_names_planted_for_every_pid_are_never_written_through() {
    let w = World::new();
    open_world(&w);
    let victim = victim(&w);
    let dir = w.path("textfile");
    std::fs::create_dir(&dir).unwrap();
    let prom = dir.join("monky.prom");
    w.config_extra(&format!("metrics_textfile: {}\n", prom.display()));

    // A directory the attacker owns: the file is refused, the victim untouched.
    chown(&dir, NOBODY);
    as_nobody(&format!("ln -s {} {}", victim.display(), prom.display()));
    for pid in next_pids() {
        let link = dir.join(format!(".monky.prom.tmp.{pid}"));
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        chown(&link, NOBODY);
    }
    let run = w.tick();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root only\n");
    assert_eq!(mode_of(&victim), 0o600);
    run.expect(1);
    run.says(&["cannot write the metrics file", "owned by uid 65534"]);

    // The same links in a directory the attacker cannot write (left over from before it was
    // fixed): the file is written, as a file of its own, and no link is followed.
    chown(&dir, 0);
    chmod(&dir, 0o755);
    w.tick().expect(1);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root only\n");
    assert_eq!(mode_of(&victim), 0o600);
    let meta = std::fs::symlink_metadata(&prom).unwrap();
    assert!(
        meta.file_type().is_file(),
        "the link was replaced by a file"
    );
    assert_eq!(mode_of(&prom), 0o644);
    assert!(
        std::fs::read_to_string(&prom)
            .unwrap()
            .contains("monky_deployd_exit_code")
    );
}

#[test]
fn a_state_dir_owned_by_another_user_is_refused_before_any_secret_is_written() {
    let w = World::new();
    open_world(&w);
    w.stage_grant();
    w.publish(&TestBundle::default());
    let state = w.state_dir();
    std::fs::create_dir(&state).unwrap();
    chmod(&state, 0o700);
    chown(&state, NOBODY);
    // The attacker plants the names the old agent would write the token, state and .env through.
    as_nobody(&format!(
        "for n in bao.token state.json; do for p in $(seq {} {}); do \
         : > {}/.$n.tmp.$p; done; done; chmod 666 {}/.*.tmp.*",
        next_pids().start(),
        next_pids().start() + 3000,
        state.display(),
        state.display()
    ));
    let run = w.tick();
    assert!(
        !state.join("bao.token").exists(),
        "no token in a foreign dir"
    );
    assert!(!state.join(ENV).exists(), "no release in a foreign dir");
    for e in std::fs::read_dir(&state).unwrap() {
        let e = e.unwrap();
        assert_eq!(e.metadata().unwrap().len(), 0, "{:?} was written", e.path());
    }
    assert_eq!(logins(&w), 0, "the grant was not used");
    assert!(w.bootstrap_path().exists(), "the grant was not consumed");
    assert!(
        w.requests().is_empty(),
        "no tenancy call from a foreign dir"
    );
    run.expect(1);
    run.says(&["STATE_DIR_UNSAFE", "owned by uid 65534"]);
}

#[test]
fn a_group_or_world_writable_state_dir_is_refused() {
    for mode in [0o770, 0o777, 0o1777] {
        let w = World::new();
        w.stage_grant();
        w.publish(&TestBundle::default());
        std::fs::create_dir(w.state_dir()).unwrap();
        chmod(&w.state_dir(), mode);
        let run = w.tick();
        run.expect(1);
        assert!(
            run.stderr().contains("STATE_DIR_UNSAFE")
                && run.stderr().contains("lets group or others write it"),
            "{mode:o}: {}",
            run.stderr()
        );
        assert!(!w.state_dir().join("bao.token").exists());
        assert_eq!(
            mode_of(&w.state_dir()),
            mode,
            "the agent did not take it over"
        );
        assert_eq!(logins(&w), 0);
    }
}

/// A directory outside the state dir an attacker owns, with a file of its own.
fn outside(w: &World) -> PathBuf {
    let o = w.path("outside");
    std::fs::create_dir(&o).unwrap();
    std::fs::write(o.join("mine"), "attacker's").unwrap();
    chmod(&o, 0o755);
    chown(&o, NOBODY);
    o
}

fn assert_outside_untouched(o: &Path) {
    assert_eq!(mode_of(o), 0o755, "{} was chmodded", o.display());
    let names: Vec<_> = std::fs::read_dir(o)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["mine"], "written into {}", o.display());
}

#[test]
fn symlinked_state_dirs_are_refused_and_never_followed() {
    for planted in ["staging", "releases", "releases/<sha>", "docker"] {
        let w = World::new();
        w.stage_grant();
        let b = TestBundle::default().with_registry_auth();
        let sha = w.publish(&b);
        let o = outside(&w);
        let env_dir = w.env_dir();
        std::fs::create_dir_all(env_dir.join("releases")).unwrap();
        for d in [w.state_dir(), env_dir.clone(), env_dir.join("releases")] {
            chmod(&d, 0o700);
        }
        let link = match planted {
            "docker" => w.state_dir().join("docker"),
            "releases/<sha>" => env_dir.join("releases").join(&sha),
            other => {
                std::fs::remove_dir_all(env_dir.join(other)).ok();
                env_dir.join(other)
            }
        };
        std::os::unix::fs::symlink(&o, &link).unwrap();
        let run = w.tick();
        assert_outside_untouched(&o);
        assert!(
            run.stderr().contains("STATE_DIR_UNSAFE"),
            "{planted}: {}",
            run.stderr()
        );
        if planted == "docker" {
            // The registry credential is skipped with a warning; the release itself applies.
            run.ok();
        } else {
            run.expect(1);
            assert!(
                w.state()["last_error"]
                    .as_str()
                    .unwrap()
                    .starts_with("STATE_DIR_UNSAFE: "),
                "{planted}: {}",
                w.state()
            );
            assert!(
                !w.docker_calls()
                    .iter()
                    .any(|c| compose_sub(c) == Some("up")),
                "{planted}: nothing started"
            );
        }
        assert_outside_untouched(&o);
        // A planted link is left for a person to look at, except in staging, which the agent
        // empties after every tick (removing the link itself, never what it points to).
        assert_eq!(
            std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()),
            planted != "staging",
            "{planted}"
        );
    }
}

// ---- item 3: ownership and modes ----------------------------------------------------------------

#[test]
fn an_unsafe_bootstrap_grant_is_refused_by_name_and_never_sent() {
    type Plant = fn(&World) -> Option<String>;
    let cases: [(&str, Plant, &str); 4] = [
        (
            "symlink",
            |w| {
                let target = w.path("etc/private");
                std::fs::create_dir_all(w.path("etc")).unwrap();
                std::fs::write(&target, "root's private file").unwrap();
                chmod(&target, 0o600);
                std::os::unix::fs::symlink(&target, w.bootstrap_path()).unwrap();
                None
            },
            "it is a symlink, not a regular file",
        ),
        (
            "0644",
            |w| {
                w.stage_grant();
                chmod(&w.bootstrap_path(), 0o644);
                None
            },
            "mode 644 lets group or others read it",
        ),
        (
            "fifo",
            |w| {
                std::fs::create_dir_all(w.path("etc")).unwrap();
                let s = Command::new("mkfifo")
                    .arg("-m")
                    .arg("600")
                    .arg(w.bootstrap_path())
                    .status()
                    .unwrap();
                assert!(s.success());
                None
            },
            "it is a FIFO, not a regular file",
        ),
        (
            "/dev/zero",
            |_| Some("bootstrap_file: /dev/zero".into()),
            "it is a character device, not a regular file",
        ),
    ];
    for (name, plant, says) in cases {
        let w = World::new();
        w.publish(&TestBundle::default());
        if let Some(line) = plant(&w) {
            let text = std::fs::read_to_string(w.config_path()).unwrap();
            let text = text
                .lines()
                .map(|l| {
                    if l.starts_with("bootstrap_file:") {
                        line.clone()
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            std::fs::write(w.config_path(), text + "\n").unwrap();
        }
        let run = run_bounded(&w, &["run", "--once"]);
        assert_eq!(logins(&w), 0, "{name}: nothing went to OpenBao's login");
        run.expect(1);
        assert!(
            run.stderr().contains("GRANT_UNSAFE") && run.stderr().contains(says),
            "{name}: {}",
            run.stderr()
        );
        assert!(!w.state_dir().join("bao.token").exists(), "{name}");
        let run = run_bounded(&w, &["doctor", "--json"]);
        let doc: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
        let grant = doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "grant")
            .unwrap_or_else(|| panic!("{name}: no grant check: {doc}"));
        assert_eq!(grant["verdict"], "fail", "{name}: {doc:#}");
        assert!(
            grant["fix"].as_str().unwrap().contains("0600"),
            "{name}: {doc:#}"
        );
    }
}

#[test]
fn doctor_fails_a_foreign_state_dir_and_metrics_dir_and_names_the_fix() {
    let w = World::new();
    w.applied();
    let dir = w.path("textfile");
    std::fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o755);
    w.config_extra(&format!(
        "metrics_textfile: {}\n",
        dir.join("m.prom").display()
    ));
    let doc = |w: &World| -> serde_json::Value {
        serde_json::from_str(&w.run(&["doctor", "--json"]).stdout()).unwrap()
    };
    let find = |doc: &serde_json::Value, name: &str| -> serde_json::Value {
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name}: {doc}"))
    };
    let ok = doc(&w);
    assert_eq!(find(&ok, "state dir")["verdict"], "ok", "{ok:#}");
    assert_eq!(find(&ok, "metrics dir")["verdict"], "ok", "{ok:#}");

    chown(&w.state_dir(), NOBODY);
    chown(&dir, NOBODY);
    let bad = doc(&w);
    let state = find(&bad, "state dir");
    assert_eq!(state["verdict"], "fail", "{bad:#}");
    assert!(
        state["detail"]
            .as_str()
            .unwrap()
            .contains("owned by uid 65534"),
        "{bad:#}"
    );
    assert!(state["fix"].as_str().unwrap().contains("chown"), "{bad:#}");
    let metrics = find(&bad, "metrics dir");
    assert_eq!(metrics["verdict"], "fail", "{bad:#}");
    assert!(
        metrics["fix"].as_str().unwrap().contains("chown"),
        "{bad:#}"
    );
    assert_eq!(bad["ok"], false);
}

// ---- item 1: a release is checked before compose runs it ----------------------------------------

#[test]
fn a_fifo_env_does_not_hang_a_retire() {
    let w = World::new();
    let sha = w.applied();
    let env = w.env_dir().join("releases").join(&sha).join(".env");
    std::fs::remove_file(&env).unwrap();
    let s = Command::new("mkfifo").arg(&env).status().unwrap();
    assert!(s.success());
    w.tenancy.set_desired(ENV, Desired::down(false));
    let run = run_bounded(&w, &["run", "--once"]);
    run.expect(1);
    let last_error = w.state()["last_error"].as_str().unwrap().to_string();
    assert!(
        last_error.starts_with("RELEASE_MODIFIED: ") && last_error.contains("FIFO"),
        "{last_error}"
    );
    assert!(
        !w.docker_calls()
            .iter()
            .any(|c| compose_sub(c) == Some("down")),
        "no compose down on a changed release"
    );
    assert!(w.current_target().is_some(), "current stays");
}

/// Applies release 1, lets `change` rewrite it on disk (as a container binding `.:/cfg`
/// would), then makes release 2 fail its health check so the agent falls back to release 1.
fn fallback_after(change: fn(&Path)) -> (World, String) {
    let w = World::new();
    let first = w.applied();
    change(&w.env_dir().join("releases").join(&first));
    w.stub("FAULT_IF", "web:2");
    w.stub("HEALTH", "unhealthy");
    let second = w.publish(&TestBundle::tagged("2"));
    let ups_before = w
        .docker_calls()
        .iter()
        .filter(|c| compose_sub(c) == Some("up"))
        .count();
    let run = w.tick();
    run.expect(1);
    let ups = w
        .docker_calls()
        .iter()
        .filter(|c| compose_sub(c) == Some("up"))
        .count();
    assert_eq!(
        ups,
        ups_before + 1,
        "only release 2 was started, not the fallback"
    );
    let r = w.last_report();
    let detail = r.detail.clone().unwrap_or_default();
    assert!(
        detail.contains(&format!(
            "fallback to {} refused (RELEASE_MODIFIED)",
            &first[..12]
        )),
        "{detail}"
    );
    run.says(&["RELEASE_MODIFIED"]);
    assert_eq!(
        w.current_target().unwrap(),
        Path::new("releases").join(&second),
        "current is not moved to a changed release"
    );
    assert_eq!(w.state()["applied_sha"], serde_json::Value::Null);
    (w, first)
}

#[test]
fn a_compose_file_rewritten_in_an_old_release_is_not_started_by_the_fallback() {
    fallback_after(|dir| {
        let f = dir.join("docker-compose.yml");
        let text = std::fs::read_to_string(&f).unwrap();
        std::fs::write(
            &f,
            text.replace(
                "    env_file: .env\n",
                "    env_file: .env\n    privileged: true\n    network_mode: host\n",
            ),
        )
        .unwrap();
    });
}

#[test]
fn an_env_rewritten_in_an_old_release_is_not_started_by_the_fallback() {
    fallback_after(|dir| {
        let f = dir.join(".env");
        let mut text = std::fs::read_to_string(&f).unwrap();
        text.push_str("COMPOSE_PROFILES=evil\n");
        std::fs::write(&f, text).unwrap();
    });
}

#[test]
fn a_compose_file_swapped_for_a_link_or_a_new_member_is_not_started() {
    // A link to an identical copy: same bytes, but not a file the agent wrote.
    let (w, first) = fallback_after(|dir| {
        let f = dir.join("docker-compose.yml");
        let copy = dir.join("copy.yml");
        std::fs::rename(&f, &copy).unwrap();
        std::os::unix::fs::symlink("copy.yml", &f).unwrap();
    });
    assert!(
        w.last_report()
            .detail
            .unwrap_or_default()
            .contains(&first[..12])
    );
    // A second compose file planted next to the first one changes the member set.
    fallback_after(|dir| {
        std::fs::write(
            dir.join("compose.yaml"),
            "services:\n  x:\n    image: x\n    privileged: true\n",
        )
        .unwrap();
    });
}

#[test]
fn an_unchanged_fallback_still_runs_and_a_bind_source_dir_is_no_change() {
    let w = World::new();
    let first = w.applied();
    // What a relative bind (`./data:/data`) leaves in the release dir.
    std::fs::create_dir(w.env_dir().join("releases").join(&first).join("data")).unwrap();
    w.stub("FAULT_IF", "web:2");
    w.stub("HEALTH", "unhealthy");
    w.publish(&TestBundle::tagged("2"));
    w.tick().expect(1);
    let detail = w.last_report().detail.unwrap_or_default();
    assert!(
        detail.contains(&format!("reverted to {}", &first[..12])),
        "{detail}"
    );
    w.assert_current(&first);
}
