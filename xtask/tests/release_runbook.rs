//! docs/OPERATIONS.md's runbook "Release a version", run as written against a loopback fake of
//! GitLab and Gitea (`src/forge.rs`, the fake the release's own tests and the packaging step
//! use). The `cargo xtask release` lines run this crate's binary with the variables the page
//! says to export pointed at the fake, and the folder `cargo xtask dist` fills mapped to a
//! stand-in one; the `curl` line runs in `sh` against what they published; the `git` lines,
//! which would tag and push, are checked to name the workspace's version and not run; the
//! `cargo xtask dist` line is the packaging step's, which builds the real package.

#[allow(dead_code)] // the release's tests use the parts this test does not
#[path = "../src/forge.rs"]
mod forge;

use std::path::{Path, PathBuf};
use std::process::Command;

use forge::{Forge, Tokens};
use sha2::{Digest, Sha256};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const DOC: &str = include_str!("../../docs/OPERATIONS.md");

/// The lines of the `sh` blocks of the runbook `title`.
fn commands(title: &str) -> Vec<String> {
    let runbooks = DOC
        .split("\n## Runbooks\n")
        .nth(1)
        .expect("a Runbooks section");
    let runbooks = runbooks.split("\n## ").next().unwrap();
    let section = runbooks
        .split(&format!("\n### {title}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("no runbook {title:?}"));
    let section = section.split("\n### ").next().unwrap();
    let mut out = Vec::new();
    let mut inside = false;
    for line in section.lines() {
        match (inside, line.trim()) {
            (false, "```sh") => inside = true,
            (true, "```") => inside = false,
            (true, l) if !l.is_empty() => out.push(l.to_string()),
            _ => {}
        }
    }
    out
}

/// A folder as `cargo xtask dist` leaves it, with a stand-in package.
fn dist_dir(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let deb = format!("monky-deployd_{VERSION}_amd64.deb");
    let bytes = b"a stand-in package".repeat(100);
    std::fs::write(dir.join(&deb), &bytes).unwrap();
    let sum: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(dir.join(format!("{deb}.sha256")), format!("{sum}  {deb}\n")).unwrap();
    std::fs::write(
        dir.join("install.sh"),
        format!("#!/bin/bash\nDEFAULT_VERSION=\"{VERSION}\"\n"),
    )
    .unwrap();
}

#[test]
fn the_release_runbook_publishes_what_a_box_downloads() {
    let tokens = Tokens {
        job: "personal-token-0a1b".into(),
        deploy: "deploy-token-2c3d".into(),
        gitea: "gitea-token-4e5f".into(),
    };
    let forge = Forge::start(tokens.clone()).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("release-runbook-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dist_dir(&dir);
    // What the page says to export, pointed at the fake.
    let env: Vec<(&str, String)> = vec![
        ("CI_API_V4_URL", forge.api_v4_url()),
        ("CI_PROJECT_ID", forge::PROJECT_ID.into()),
        ("GITLAB_PRIVATE_TOKEN", tokens.job.clone()),
        ("GITEA_URL", forge.url()),
        ("GITEA_TOKEN", tokens.gitea.clone()),
        ("GITEA_REPO", forge::GITEA_REPO.into()),
        ("T", tokens.deploy.clone()),
    ];

    let lines = commands("Release a version");
    let mut ran = Vec::new();
    let mut downloads = Vec::new();
    for line in &lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["git", "tag", tag] | ["git", "push", "origin", tag] => {
                assert_eq!(
                    *tag,
                    format!("v{VERSION}"),
                    "{line}: the workspace's version"
                );
            }
            ["cargo", "xtask", "dist"] => {}
            ["cargo", "xtask", "release", args @ ..] => {
                let before = forge.received().len();
                let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
                    .arg("release")
                    .args(args)
                    .arg("--dir")
                    .arg(&dir)
                    .env_remove("CI_COMMIT_TAG")
                    .env_remove("CI_JOB_TOKEN")
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .output()
                    .unwrap();
                let said = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                assert!(out.status.success(), "{line}:\n{said}");
                for (_, secret) in &env[..] {
                    if secret.contains("token") {
                        assert!(
                            !said.contains(secret.as_str()),
                            "{line} printed a token:\n{said}"
                        );
                    }
                }
                if args.contains(&"--dry-run") {
                    assert_eq!(forge.received().len(), before, "{line} sent a request");
                    assert!(
                        said.contains("PRIVATE-TOKEN: <$GITLAB_PRIVATE_TOKEN>"),
                        "{said}"
                    );
                }
                ran.push(line.clone());
            }
            // The download check, run below once something is published.
            ["curl", ..] => downloads.push(line.clone()),
            _ => panic!("the release runbook has a line this test does not know: {line}"),
        }
    }
    assert_eq!(ran.len(), 3, "dry run, GitLab, Gitea: {lines:?}");
    assert_eq!(downloads.len(), 1, "{lines:?}");

    // The download check works with the kit's deploy token, as install.sh --source gitlab
    // fetches; with another token it is the registry's 401, as the page says.
    let curl = |token: &str| {
        Command::new("sh")
            .args(["-c", &downloads[0]])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("T", token)
            .output()
            .unwrap()
    };
    let ok = curl(&tokens.deploy);
    assert!(ok.status.success(), "{}: {ok:?}", downloads[0]);
    let refused = curl("revoked-token");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("401"),
        "{refused:?}"
    );

    // GitLab: the three files where install.sh --source gitlab downloads them, and the release.
    let names = [
        format!("monky-deployd_{VERSION}_amd64.deb"),
        format!("monky-deployd_{VERSION}_amd64.deb.sha256"),
        "install.sh".to_string(),
    ];
    for name in &names {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(
            forge
                .file(&format!(
                    "/api/v4/projects/69/packages/generic/monky-deployd/{VERSION}/{name}"
                ))
                .as_ref(),
            Some(&bytes),
            "{name} on GitLab"
        );
        assert_eq!(
            forge
                .file(&format!(
                    "/{}/releases/download/v{VERSION}/{name}",
                    forge::GITEA_REPO
                ))
                .as_ref(),
            Some(&bytes),
            "{name} on Gitea"
        );
    }
    assert!(forge.gitlab_release(&format!("v{VERSION}")).is_some());
    // By hand the token is the personal one, as PRIVATE-TOKEN.
    assert!(
        forge
            .received()
            .iter()
            .filter(|r| r.method == "PUT")
            .all(|r| r.header("private-token") == Some(tokens.job.as_str()))
    );
    let _ = std::fs::remove_dir_all(&dir);
}
