//! `monky-deployd bundle check`: every offline finding of an apply, on a bundle on disk.

use serde_json::json;

use crate::util::*;

fn write_dir(w: &World, name: &str, b: &TestBundle) -> std::path::PathBuf {
    let dir = w.path(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("docker-compose.yml"), &b.compose).unwrap();
    std::fs::write(dir.join(".env.template"), &b.env_template).unwrap();
    std::fs::write(dir.join("secrets.manifest.json"), b.manifest.to_string()).unwrap();
    std::fs::write(dir.join("bundle.json"), b.meta.to_string()).unwrap();
    dir
}

fn check(path: &std::path::Path, extra: &[&str]) -> Run {
    let mut args = vec!["bundle", "check", path.to_str().unwrap(), "--env", ENV];
    args.extend_from_slice(extra);
    Run(
        std::process::Command::new(env!("CARGO_BIN_EXE_monky-deployd"))
            .args(&args)
            .output()
            .unwrap(),
    )
}

#[test]
fn a_good_bundle_passes_as_a_directory_and_as_a_tar() {
    let w = World::new();
    let b = TestBundle::default();
    let run = check(&write_dir(&w, "good", &b), &["--sha", &b.sha()]);
    run.ok();
    assert_eq!(
        run.stdout().lines().next().unwrap(),
        format!("sha256 {}", b.sha())
    );
    assert!(
        run.stdout().lines().last().unwrap().starts_with("ok "),
        "{}",
        run.stdout()
    );
    let tar = w.path("good.tar");
    std::fs::write(&tar, b.tar()).unwrap();
    check(&tar, &[]).ok();
}

#[test]
fn every_finding_is_listed_with_its_code() {
    let w = World::new();
    let mut b = TestBundle {
        compose: "services:\n  web:\n    image: x\n    privileged: true\n".into(),
        ..TestBundle::default()
    };
    b.env_template
        .push_str("SEE_ADMIN_TOKEN=${SEE_ADMIN_TOKEN}\n");
    b.manifest["entries"][0]["path"] = json!("monky/env-other/see/gemini_api_key");
    let run = check(&write_dir(&w, "bad", &b), &["--sha", "0000"]);
    run.expect(1);
    let fails: Vec<String> = run
        .stdout()
        .lines()
        .filter_map(|l| {
            l.strip_prefix("FAIL ")
                .map(|f| f.split(':').next().unwrap().to_string())
        })
        .collect();
    assert_eq!(
        fails,
        [
            "BUNDLE_SHA_MISMATCH",
            "MANIFEST_PATH_REFUSED",
            "ENV_INCOMPLETE",
            "PRIVILEGED_REFUSED"
        ],
        "{}",
        run.stdout()
    );
    assert!(run.stdout().contains("SEE_ADMIN_TOKEN"));
    // Each finding says what to do, and a compose finding where it is.
    let out = run.stdout();
    let lines: Vec<&str> = out.lines().collect();
    let privileged = lines
        .iter()
        .position(|l| l.starts_with("FAIL PRIVILEGED_REFUSED"))
        .unwrap();
    assert_eq!(
        lines[privileged + 1],
        "     at docker-compose.yml:4",
        "{out}"
    );
    assert!(lines[privileged + 2].starts_with("     fix: "), "{out}");
    let fixes = lines.iter().filter(|l| l.starts_with("     fix: ")).count();
    assert_eq!(fixes, 4, "{out}");
}

#[test]
fn an_unknown_file_or_a_broken_tar_is_bundle_invalid() {
    let w = World::new();
    let dir = write_dir(&w, "extra", &TestBundle::default());
    std::fs::write(dir.join("notes.txt"), "hi").unwrap();
    let run = check(&dir, &[]);
    run.expect(1);
    assert!(
        run.stdout().starts_with("FAIL BUNDLE_INVALID"),
        "{}",
        run.stdout()
    );
    let tar = w.path("broken.tar");
    std::fs::write(&tar, b"not a tar at all").unwrap();
    let run = check(&tar, &[]);
    run.expect(1);
    assert!(run.stdout().starts_with("FAIL BUNDLE_"), "{}", run.stdout());
}

/// `bundle check` has no box to judge `SECRET_READABLE_ON_HOST` on (its accounts, its
/// engine, the image's `USER`): it notes each service that gets a secret and does not run as
/// root by its own `user:`, and passes.
#[test]
fn a_secret_for_a_non_root_service_is_a_note_not_a_failure() {
    let Some(docker) = crate::policy::docker() else {
        return;
    };
    let w = World::new();
    let b = TestBundle {
        compose: "services:\n  \
                  web:\n    image: 127.0.0.1:5000/monky/web:1\n    user: \"65534\"\n    env_file: .env\n  \
                  api:\n    image: 127.0.0.1:5000/monky/web:1\n    secrets: [pg]\n  \
                  db:\n    image: 127.0.0.1:5000/monky/web:1\n    user: root\n    env_file: .env\n  \
                  cache:\n    image: 127.0.0.1:5000/monky/web:1\n    user: \"65534\"\n\
                  secrets:\n  pg:\n    environment: POSTGRES_PASSWORD\n"
            .into(),
        ..TestBundle::default()
    };
    let run = crate::policy::bundle_check(&w, &docker, "uid-notes", &b);
    run.ok();
    let out = run.stdout();
    let notes: Vec<&str> = out.lines().filter(|l| l.starts_with("note: ")).collect();
    assert_eq!(notes.len(), 2, "{out}");
    assert!(
        notes[0].starts_with("note: api: runs as its image's USER and gets POSTGRES_PASSWORD;")
            && notes[1].starts_with(
                "note: web: runs as uid 65534 and gets GEMINI_API_KEY, POSTGRES_PASSWORD;"
            )
            && notes.iter().all(|n| n.contains("SECRET_READABLE_ON_HOST")),
        "{notes:#?}"
    );
}

/// The count `bundle check` notes is the tick's: a secret inherited through `extends` is
/// noted on the service that runs with it, and a config from a secret counts as the
/// environment does.
#[test]
fn a_secret_by_extends_or_a_config_is_noted_on_the_service_that_gets_it() {
    let Some(docker) = crate::policy::docker() else {
        return;
    };
    let w = World::new();
    let b = TestBundle {
        compose: "services:\n  \
                  base:\n    image: 127.0.0.1:5000/monky/web:1\n    user: root\n    \
                  environment:\n      TOKEN: ${POSTGRES_PASSWORD}\n  \
                  web:\n    extends: {service: base}\n    user: \"65534\"\n  \
                  api:\n    image: 127.0.0.1:5000/monky/web:1\n    user: \"1000\"\n    configs: [c]\n\
                  configs:\n  c:\n    content: \"url=${GEMINI_API_KEY}\"\n"
            .into(),
        ..TestBundle::default()
    };
    let run = crate::policy::bundle_check(&w, &docker, "routes-notes", &b);
    run.ok();
    let out = run.stdout();
    let notes: Vec<&str> = out.lines().filter(|l| l.starts_with("note: ")).collect();
    assert_eq!(notes.len(), 2, "{out}");
    assert!(
        notes[0].starts_with("note: api: runs as uid 1000 and gets GEMINI_API_KEY;")
            && notes[1].starts_with("note: web: runs as uid 65534 and gets POSTGRES_PASSWORD;"),
        "{notes:#?}"
    );
}

/// Each finding gets its own fix (`web: build` is told why the box builds nothing, not that
/// the tar is malformed), and a bind of the release dir, found by both the check of the file
/// and compose's model, is listed once, under the path the bundle names (never under the
/// check's temp dir, gone by the time it is read).
#[test]
fn each_finding_has_its_own_fix_and_is_listed_once() {
    let w = World::new();
    let b = TestBundle {
        compose: "services:\n  web:\n    image: x\n    build: .\n    volumes:\n      - .:/app\n"
            .into(),
        ..TestBundle::default()
    };
    let run = check(&write_dir(&w, "bad", &b), &[]);
    run.expect(1);
    let out = run.stdout();
    assert!(!out.contains("monky-bundle-check"), "{out}");
    assert_eq!(
        out.matches("writable over the release's own files").count(),
        1,
        "{out}"
    );
    let fix_of = |code: &str| {
        let lines: Vec<&str> = out.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with(&format!("FAIL {code}")))
            .unwrap_or_else(|| panic!("no {code}: {out}"));
        lines[at..]
            .iter()
            .find(|l| l.trim_start().starts_with("fix: "))
            .unwrap()
            .to_string()
    };
    let build = fix_of("BUNDLE_INVALID: web: build");
    assert!(build.contains("remove `build` from web"), "{build}");
    assert!(build.contains("builds nothing"), "{build}");
    assert!(!build.contains("tar is malformed"), "{build}");
}
