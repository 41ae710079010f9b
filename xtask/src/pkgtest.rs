//! The packaging step of `cargo xtask ci`, also run by `cargo xtask dist --test`: installs the
//! tools the packaging tests use (lintian, shellcheck, systemd-analyze, debootstrap, jinja2),
//! builds the .deb, makes sure a Debian image with systemd exists, publishes dist's folder with
//! `cargo xtask release` to a loopback fake of GitLab and Gitea (`forge.rs`), then runs the
//! ignored `packaging::` tests of monky-deployd's suite with the .deb, the image and the fake's
//! download bases named in the env: the box test installs from what was published, as
//! `install.sh --source gitlab|gitea` does on a real box.
//!
//! The image is debootstrapped from the mirror this machine's own apt sources name, for this
//! machine's release, and imported with `docker import`: nothing is pulled from a registry. It is
//! cached on purpose: it is tagged `monky-deployd-pkgtest:<release>-<key>`, not `monky-e2e-*`
//! and without the suite's image label, so `cargo xtask teardown` keeps it for the next run. The
//! key covers the release, the mirror and the package list, so a change to any of them builds a
//! new image and removes the older ones.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use crate::apt::{self, Apt, OsRelease};
use crate::cmd;
use crate::docker::Docker;
use crate::forge::{Forge, Tokens};
use crate::release::{self, GitLab, Gitea, Release, Retry, Secret};
use crate::state;

/// The cached image's repository name (deliberately outside teardown's `monky-e2e-` prefix).
pub const IMAGE_REPO: &str = "monky-deployd-pkgtest";
/// What the image holds besides a minimal base: systemd as PID 1, the package's dependencies
/// that a minimal base lacks (adduser, ca-certificates), man-db so `systemd-analyze verify` can
/// check the units' man: links, and curl, with which install.sh downloads a release (a box has
/// it: the kit's one-liner is `curl … | bash`).
const IMAGE_PACKAGES: &str = "systemd,systemd-sysv,adduser,ca-certificates,man-db,curl";
/// Bumped when the recipe below changes in a way the key would not see.
const RECIPE: u32 = 1;
/// The host tools the packaging tests call.
const TOOLS: [&str; 7] = [
    "debootstrap",
    "lintian",
    "shellcheck",
    "python3-jinja2",
    "python3-yaml",
    "systemd",
    "dpkg-dev",
];

/// Runs the whole packaging step on dist's `.deb`.
pub fn run(deb: &Path) -> Result<()> {
    let started = Instant::now();
    println!("==> packaging: tools ({})", TOOLS.join(", "));
    Apt::new().ensure_installed(&TOOLS)?;
    let docker = Docker::find().context("docker is not on PATH: run `cargo xtask setup` first")?;
    ensure!(
        docker.engine_up(),
        "the docker engine does not answer: run `cargo xtask setup` first"
    );
    let image_started = Instant::now();
    let (image, fresh) = ensure_image(&docker)?;
    println!(
        "    image {image}: {} in {:.1}s",
        if fresh { "built (cold)" } else { "cached" },
        image_started.elapsed().as_secs_f64()
    );

    let tokens = Tokens {
        job: format!("job-{}", state::random_hex(12)?),
        deploy: format!("deploy-{}", state::random_hex(12)?),
        gitea: format!("gitea-{}", state::random_hex(12)?),
    };
    let forge = Forge::start(tokens.clone())?;
    publish(deb, &forge, &tokens)?;

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut test = Command::new(cargo);
    // The same flags as ci's test step, so the test binary it built is reused.
    test.args(["test", "--workspace", "--all-features", "--locked"])
        .args(["--test", "tests", "packaging::", "--", "--ignored"])
        // One at a time with their output: the figures they print (exposure, sizes, timings)
        // belong in the ci log.
        .args(["--nocapture", "--test-threads=1"])
        .current_dir(state::workspace_root())
        .env("MONKY_PKG_DEB", deb)
        .env("MONKY_PKG_IMAGE", &image)
        .env("MONKY_E2E_ENV", state::e2e_env_path())
        .env("MONKY_E2E_REQUIRED", "1")
        .env("MONKY_PKG_GITLAB_URL", forge.generic_base())
        .env("MONKY_PKG_GITEA_URL", forge.gitea_download_base())
        .env("MONKY_PKG_DEPLOY_TOKEN", &tokens.deploy);
    println!("==> packaging: {}", cmd::display(&test));
    let tests_started = Instant::now();
    cmd::run(&mut test)?;
    // The box downloaded the package and its sha256 from both, with the deploy token from
    // GitLab.
    let served: Vec<_> = forge
        .received()
        .into_iter()
        .filter(|r| r.method == "GET")
        .collect();
    let deb_name = deb
        .file_name()
        .context("the .deb's name")?
        .to_string_lossy();
    for base in [
        "/api/v4/projects/",
        "/mdella/monky-deployd/releases/download/",
    ] {
        for name in [deb_name.to_string(), format!("{deb_name}.sha256")] {
            ensure!(
                served
                    .iter()
                    .any(|r| r.path.starts_with(base) && r.path.ends_with(&format!("/{name}"))),
                "packaging: the box never downloaded {name} from the fake's {base}"
            );
        }
    }
    println!(
        "<== packaging: tests {:.1}s, whole step {:.1}s",
        tests_started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Publishes dist's folder with `cargo xtask release`'s own publish, as a tag pipeline's jobs
/// do (`--gitlab --gitea`), against `forge`, and checks that the forge holds each file byte for
/// byte where install.sh downloads it. (The command line and its variables are run as written
/// by `xtask/tests/release_runbook.rs`.)
fn publish(deb: &Path, forge: &Forge, tokens: &Tokens) -> Result<()> {
    let dir = deb.parent().context("the .deb's folder")?;
    let version = env!("CARGO_PKG_VERSION");
    println!(
        "==> packaging: cargo xtask release to a fake GitLab and Gitea at {}",
        forge.url()
    );
    release::publish(&Release {
        dir: dir.to_path_buf(),
        tag: format!("v{version}"),
        gitlab: Some(GitLab {
            api: forge.api_v4_url(),
            project: crate::forge::PROJECT_ID.into(),
            auth: ("JOB-TOKEN", Secret::new("CI_JOB_TOKEN", &tokens.job)),
        }),
        gitea: Some(Gitea {
            url: forge.url(),
            repo: crate::forge::GITEA_REPO.into(),
            token: Secret::new("GITEA_TOKEN", &tokens.gitea),
        }),
        dry_run: false,
        retry: Retry::default(),
    })?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let bytes = std::fs::read(entry.path())?;
        for path in [
            format!(
                "/api/v4/projects/{}/packages/generic/monky-deployd/{version}/{name}",
                crate::forge::PROJECT_ID
            ),
            format!(
                "/{}/releases/download/v{version}/{name}",
                crate::forge::GITEA_REPO
            ),
        ] {
            ensure!(
                forge.file(&path).as_deref() == Some(bytes.as_slice()),
                "packaging: the release did not leave {name} at {path}"
            );
        }
    }
    ensure!(
        forge.gitlab_release(&format!("v{version}")).is_some(),
        "packaging: the release created no GitLab release"
    );
    Ok(())
}

/// The image tag for this machine, and whether it had to be built now.
fn ensure_image(docker: &Docker) -> Result<(String, bool)> {
    let os = OsRelease::read()?;
    if os.id != "debian" {
        bail!(
            "the install test debootstraps the machine's own Debian release; this is {} {}",
            os.id,
            os.codename
        );
    }
    let sources = apt::system_sources()?;
    let mirror = apt::pick_mirror(&sources, &os.codename).with_context(|| {
        format!(
            "no apt source serves `{} main` (looked in /etc/apt/sources.list and \
             /etc/apt/sources.list.d): cannot pick a mirror to debootstrap from",
            os.codename
        )
    })?;
    let tag = format!(
        "{IMAGE_REPO}:{}-{:016x}",
        os.codename,
        key(&os.codename, &mirror.uri)
    );
    if cmd::succeeds(&mut docker.cmd(["image", "inspect", &tag])) {
        return Ok((tag, false));
    }
    let rootfs = state::workspace_root()
        .join("target")
        .join("pkgtest-rootfs");
    remove_rootfs(&rootfs)?;
    println!(
        "    debootstrap {} from {} (mirror of {})",
        os.codename,
        mirror.uri,
        mirror.file.display()
    );
    let mut boot = cmd::new(
        "debootstrap",
        [
            "--variant=minbase".to_owned(),
            format!("--include={IMAGE_PACKAGES}"),
        ],
    );
    if let Some(keyring) = &mirror.signed_by {
        boot.arg(format!("--keyring={keyring}"));
    }
    boot.arg(&os.codename).arg(&rootfs).arg(&mirror.uri);
    let out = cmd::output(&mut boot)?;
    if !out.status.success() {
        let log = rootfs.join("debootstrap/debootstrap.log");
        bail!(
            "debootstrap failed with {}:\n{}\n{}",
            out.status,
            cmd::tail(&String::from_utf8_lossy(&out.stderr), 20),
            cmd::log_tail(&log, 20)
        );
    }
    // An offline box: the package lists are dropped, so `apt-get install ./x.deb` can only use
    // what the image holds, and a missing dependency fails the test instead of downloading.
    for dir in ["var/lib/apt/lists", "var/cache/apt/archives"] {
        let path = rootfs.join(dir);
        for entry in std::fs::read_dir(&path).with_context(|| format!("{}", path.display()))? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                std::fs::remove_file(entry.path())?;
            }
        }
    }
    println!("    docker import {tag}");
    let mut tar = Command::new("tar")
        .args(["--numeric-owner", "-C"])
        .arg(&rootfs)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start tar")?;
    let import = docker
        .cmd([
            "import",
            "--change",
            "ENV container=docker",
            "--change",
            "CMD [\"/sbin/init\"]",
            "-",
            &tag,
        ])
        .stdin(tar.stdout.take().context("tar stdout")?)
        .stdout(Stdio::null())
        .status()
        .context("cannot run docker import")?;
    let tar_status = tar.wait()?;
    ensure!(
        tar_status.success() && import.success(),
        "tar | docker import failed ({tar_status}, {import})"
    );
    remove_rootfs(&rootfs)?;
    remove_older_images(docker, &tag)?;
    Ok((tag, true))
}

/// The cache key: the release, the mirror, the package list and the recipe.
fn key(codename: &str, mirror: &str) -> u64 {
    // DefaultHasher::new() uses fixed keys, so the value is stable for one toolchain; a new
    // toolchain at worst builds the image once more.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (codename, mirror, IMAGE_PACKAGES, RECIPE).hash(&mut h);
    h.finish()
}

fn remove_rootfs(rootfs: &Path) -> Result<()> {
    if rootfs.exists() {
        // debootstrap leaves device nodes and root-owned files; rm copes with both.
        cmd::run(&mut cmd::new(
            "rm",
            [PathBuf::from("-rf"), rootfs.to_path_buf()],
        ))?;
    }
    Ok(())
}

fn remove_older_images(docker: &Docker, keep: &str) -> Result<()> {
    let listed = docker.capture([
        "image",
        "ls",
        IMAGE_REPO,
        "--format",
        "{{.Repository}}:{{.Tag}}",
    ])?;
    for old in listed.lines().filter(|t| *t != keep && !t.is_empty()) {
        println!("    removing the outdated {old}");
        let _ = docker.capture(["rmi", old]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_follows_release_and_mirror() {
        let a = key("bookworm", "http://mirror.test/debian");
        assert_eq!(a, key("bookworm", "http://mirror.test/debian"));
        assert_ne!(a, key("trixie", "http://mirror.test/debian"));
        assert_ne!(a, key("bookworm", "http://other.test/debian"));
    }

    #[test]
    fn the_cached_image_is_outside_teardowns_reach() {
        assert!(!IMAGE_REPO.starts_with(state::NAME_PREFIX));
    }
}
