//! `cargo xtask dist`: the release binary (`[profile.dist]`: optimised for size, fat LTO, stripped), a Debian
//! package built by `dpkg-deb --root-owner-group`, its `.sha256`, and `install.sh` beside them.
//!
//! Everything in the package comes from `packaging/` or from the built binary itself: its man
//! pages and shell completions are what `monky-deployd generate-docs` (hidden) writes from its
//! clap definition, so the package cannot describe another CLI than it ships, and xtask needs
//! none of the agent's crates.
//! The output folder is `target/dist-pkg/` (or `--out DIR`):
//!
//! ```text
//! monky-deployd_<version>_<arch>.deb
//! monky-deployd_<version>_<arch>.deb.sha256     `sha256sum --check` format
//! install.sh                                    the box one-liner, for the release page
//! ```

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::cmd;
use crate::state;

/// The package's version: the workspace's, which is the agent's too.
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The package name, which is also the binary's and the system user's.
pub const PACKAGE: &str = "monky-deployd";
const MAINTAINER: &str = "Monky maintainers <monky-deployd@tikali.ai>";
const SYSTEMD_UNITS: [&str; 3] = [
    "monky-deployd.service",
    "monky-deployd.timer",
    "monky-deployd-proxy.service",
];
const MAINTAINER_SCRIPTS: [&str; 4] = ["preinst", "postinst", "prerm", "postrm"];

/// What `dist` produced.
#[derive(Debug, Clone)]
pub struct Built {
    /// The .deb.
    pub deb: PathBuf,
    /// The `.sha256` beside it.
    pub sha256: PathBuf,
    /// The .deb's size in bytes.
    pub size: u64,
}

/// Runs dist with the command-line `args` (after `dist`).
pub fn main(args: &[String]) -> Result<()> {
    let mut out = state::workspace_root().join("target").join("dist-pkg");
    let mut build = true;
    let mut test = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--out" => out = PathBuf::from(it.next().context("--out needs a folder")?),
            "--no-build" => build = false,
            "--test" => test = true,
            "-h" | "--help" => {
                println!(
                    "cargo xtask dist [--out DIR] [--no-build] [--test]\n  \
                     builds the release binary (profile dist) and DIR/{PACKAGE}_<version>_<arch>.deb\n  \
                     with its .sha256 and install.sh (DIR defaults to target/dist-pkg)\n  \
                     --no-build  package the binary the last dist build left\n  \
                     --test      then run the packaging tests: lintian, shellcheck, systemd-analyze,\n              \
                     the ansible template, and the .deb installed under systemd in a container"
                );
                return Ok(());
            }
            other => bail!("dist: unknown argument {other:?} (try --help)"),
        }
    }
    let built = dist(&out, build)?;
    println!(
        "dist: {} ({:.1} MiB), sha256 in {}",
        built.deb.display(),
        built.size as f64 / (1024.0 * 1024.0),
        built.sha256.display()
    );
    if test {
        crate::pkgtest::run(&built.deb)?;
    }
    Ok(())
}

/// Builds the binary (unless `build` is false) and the package into `out`.
pub fn dist(out: &Path, build: bool) -> Result<Built> {
    let root = state::workspace_root();
    let version = VERSION;
    // The package's version is the workspace's, with no Debian revision: the install kit and
    // the ansible role already on real boxes download `monky-deployd_<version>_amd64.deb`, and
    // the packaging is versioned with the code anyway.
    let deb_version = version.to_string();
    let arch = cmd::capture(&mut cmd::new("dpkg", ["--print-architecture"]))
        .context("dist builds a Debian package: dpkg is needed")?;
    check_install_sh_version(&root, version)?;

    let binary = target_dir(&root).join("dist").join(PACKAGE);
    if build {
        println!("==> dist: cargo build --profile dist -p {PACKAGE}");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        cmd::run(
            Command::new(cargo)
                .args(["build", "--profile", "dist", "--locked", "-p", PACKAGE])
                .args(["--bin", PACKAGE])
                .current_dir(&root),
        )?;
    }
    ensure!(
        binary.is_file(),
        "{} is missing: run `cargo xtask dist` without --no-build",
        binary.display()
    );

    let name = format!("{PACKAGE}_{deb_version}_{arch}");
    let stage = root.join("target").join("dist-stage").join(&name);
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("cannot clear {}", stage.display()))?;
    }
    println!("==> dist: staging {}", stage.display());
    let pkg = Stage::new(&stage);
    pkg.copy(&binary, "usr/bin/monky-deployd", 0o755)?;
    for unit in SYSTEMD_UNITS {
        pkg.copy(
            &root.join("packaging/systemd").join(unit),
            &format!("lib/systemd/system/{unit}"),
            0o644,
        )?;
    }
    let doc = format!("usr/share/doc/{PACKAGE}");
    pkg.copy(
        &root.join("packaging/config.example.yaml"),
        &format!("{doc}/config.example.yaml"),
        0o644,
    )?;
    // A copy for reading and for an offline box; the release page carries the runnable one.
    pkg.copy(
        &root.join("packaging/install.sh"),
        &format!("{doc}/install.sh"),
        0o644,
    )?;
    pkg.copy(
        &root.join("packaging/debian/copyright"),
        &format!("{doc}/copyright"),
        0o644,
    )?;
    pkg.gzip(
        &fs::read(root.join("CHANGELOG.md")).context("cannot read CHANGELOG.md")?,
        &format!("{doc}/changelog.gz"),
    )?;
    pkg.gzip(
        debian_changelog(&deb_version, &release_date(&root)?).as_bytes(),
        &format!("{doc}/changelog.Debian.gz"),
    )?;
    let docs = root
        .join("target")
        .join("dist-stage")
        .join(format!("{name}.docs"));
    generate_docs(&binary, &docs)?;
    let mut pages: Vec<PathBuf> = fs::read_dir(docs.join("man1"))
        .with_context(|| format!("cannot read {}", docs.join("man1").display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    pages.sort();
    ensure!(
        !pages.is_empty(),
        "{PACKAGE} generate-docs wrote no man page"
    );
    for page in pages {
        let file = page.file_name().context("a man page without a name")?;
        let roff = fs::read(&page).with_context(|| format!("cannot read {}", page.display()))?;
        pkg.gzip(
            &roff,
            &format!("usr/share/man/man1/{}.gz", file.to_string_lossy()),
        )?;
    }
    for (shell, path) in COMPLETIONS {
        pkg.copy(&docs.join("completions").join(shell), path, 0o644)?;
    }
    pkg.copy(
        &root.join("packaging/debian/lintian-overrides"),
        &format!("usr/share/lintian/overrides/{PACKAGE}"),
        0o644,
    )?;
    for script in MAINTAINER_SCRIPTS {
        pkg.copy(
            &root.join("packaging/debian").join(script),
            &format!("DEBIAN/{script}"),
            0o755,
        )?;
    }
    pkg.md5sums()?;
    let depends = shlib_depends(&binary)?;
    let control = control_file(&deb_version, &arch, &depends, pkg.installed_size_kib()?);
    pkg.write(control.as_bytes(), "DEBIAN/control", 0o644)?;

    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let deb = out.join(format!("{name}.deb"));
    println!("==> dist: dpkg-deb --build {}", deb.display());
    cmd::run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;
    let sha256 = out.join(format!("{name}.deb.sha256"));
    let sum = cmd::capture(
        Command::new("sha256sum")
            .arg(format!("{name}.deb"))
            .current_dir(out),
    )?;
    fs::write(&sha256, format!("{sum}\n"))
        .with_context(|| format!("cannot write {}", sha256.display()))?;
    let install_sh = out.join("install.sh");
    fs::copy(root.join("packaging/install.sh"), &install_sh)
        .with_context(|| format!("cannot copy install.sh to {}", out.display()))?;
    fs::set_permissions(&install_sh, fs::Permissions::from_mode(0o755))?;
    let size = fs::metadata(&deb)?.len();
    Ok(Built { deb, sha256, size })
}

/// `CARGO_TARGET_DIR` when set, else `<workspace>/target`.
fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                root.join(dir)
            }
        }
        _ => root.join("target"),
    }
}

/// install.sh installs its own version by default; a release whose script names another would
/// send every box to the wrong package.
fn check_install_sh_version(root: &Path, version: &str) -> Result<()> {
    let text = fs::read_to_string(root.join("packaging/install.sh"))
        .context("cannot read packaging/install.sh")?;
    let wanted = format!("DEFAULT_VERSION=\"{version}\"");
    ensure!(
        text.lines().any(|l| l.trim() == wanted),
        "packaging/install.sh does not say {wanted}: update it to the workspace version"
    );
    Ok(())
}

/// The package tree being assembled.
struct Stage {
    root: PathBuf,
}

impl Stage {
    fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    fn target(&self, rel: &str) -> Result<PathBuf> {
        let path = self.root.join(rel);
        let dir = path.parent().context("a staged file has no folder")?;
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        // dpkg-deb keeps the folders' modes; the build user's umask must not leak into them.
        let mut d = dir;
        while d.starts_with(&self.root) && d != self.root {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))?;
            d = d.parent().context("no parent")?;
        }
        fs::set_permissions(&self.root, fs::Permissions::from_mode(0o755))?;
        Ok(path)
    }

    fn write(&self, bytes: &[u8], rel: &str, mode: u32) -> Result<()> {
        let path = self.target(rel)?;
        fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot chmod {}", path.display()))
    }

    fn copy(&self, from: &Path, rel: &str, mode: u32) -> Result<()> {
        let bytes = fs::read(from).with_context(|| format!("cannot read {}", from.display()))?;
        self.write(&bytes, rel, mode)
    }

    /// Writes `bytes` gzipped the way Debian wants documentation: best compression, no name,
    /// no timestamp (`gzip -9n`), so the same input always gives the same file.
    fn gzip(&self, bytes: &[u8], rel: &str) -> Result<()> {
        let out = cmd::new("gzip", ["-9n", "-c"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("cannot start gzip")
            .and_then(|mut child| {
                child
                    .stdin
                    .take()
                    .context("gzip stdin")?
                    .write_all(bytes)
                    .context("cannot feed gzip")?;
                child.wait_with_output().context("gzip failed")
            })?;
        ensure!(out.status.success(), "gzip -9n failed with {}", out.status);
        self.write(&out.stdout, rel, 0o644)
    }

    /// `DEBIAN/md5sums`, which `dpkg --verify` checks the installed files against.
    fn md5sums(&self) -> Result<()> {
        let mut files = Vec::new();
        let mut dirs = vec![self.root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    if path != self.root.join("DEBIAN") {
                        dirs.push(path);
                    }
                } else {
                    files.push(path.strip_prefix(&self.root)?.to_path_buf());
                }
            }
        }
        files.sort();
        let sums = cmd::capture(
            Command::new("md5sum")
                .arg("--")
                .args(&files)
                .current_dir(&self.root),
        )?;
        self.write(format!("{sums}\n").as_bytes(), "DEBIAN/md5sums", 0o644)
    }

    /// The payload's size in KiB, as `Installed-Size` wants it.
    fn installed_size_kib(&self) -> Result<u64> {
        fn walk(dir: &Path, skip: &Path, total: &mut u64) -> Result<()> {
            for entry in fs::read_dir(dir)? {
                let entry = entry?;
                let path = entry.path();
                if path == skip {
                    continue;
                }
                let meta = entry.metadata()?;
                if meta.is_dir() {
                    walk(&path, skip, total)?;
                } else {
                    *total += meta.len().div_ceil(1024);
                }
            }
            Ok(())
        }
        let mut total = 0;
        walk(&self.root, &self.root.join("DEBIAN"), &mut total)?;
        Ok(total)
    }
}

/// The built binary's own man pages and completions, written into `dir` (cleared first) by
/// its hidden `generate-docs` command.
fn generate_docs(binary: &Path, dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    cmd::run(Command::new(binary).arg("generate-docs").arg(dir))
        .with_context(|| format!("{} generate-docs failed", binary.display()))
}

/// Where each of `generate-docs`' completions goes in the package.
const COMPLETIONS: [(&str, &str); 3] = [
    (
        "bash",
        "usr/share/bash-completion/completions/monky-deployd",
    ),
    ("zsh", "usr/share/zsh/vendor-completions/_monky-deployd"),
    (
        "fish",
        "usr/share/fish/vendor_completions.d/monky-deployd.fish",
    ),
];

/// The release's date, RFC 2822: `SOURCE_DATE_EPOCH` when set, else the last commit's, so a
/// rebuild of the same commit gives the same changelog.
fn release_date(root: &Path) -> Result<String> {
    let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(e) if !e.trim().is_empty() => e.trim().to_owned(),
        _ => cmd::capture(
            Command::new("git")
                .args(["log", "-1", "--format=%ct"])
                .current_dir(root),
        )
        .context("cannot read the last commit's date (set SOURCE_DATE_EPOCH outside git)")?,
    };
    ensure!(
        epoch.chars().all(|c| c.is_ascii_digit()) && !epoch.is_empty(),
        "SOURCE_DATE_EPOCH {epoch:?} is not a number of seconds"
    );
    cmd::capture(
        Command::new("date")
            .args(["-u", "-R", "-d"])
            .arg(format!("@{epoch}")),
    )
}

fn debian_changelog(deb_version: &str, date: &str) -> String {
    format!(
        "{PACKAGE} ({deb_version}) unstable; urgency=medium\n\n  \
         * Built by `cargo xtask dist` from the workspace at version {upstream}. What\n    \
         changed in the agent is in /usr/share/doc/{PACKAGE}/changelog.gz.\n\n \
         -- {MAINTAINER}  {date}\n",
        upstream = deb_version,
    )
}

/// The shared-library dependencies of the binary, as `dpkg-shlibdeps` derives them.
fn shlib_depends(binary: &Path) -> Result<String> {
    // dpkg-shlibdeps wants a source tree with debian/control; an empty scratch one will do.
    let scratch = std::env::temp_dir().join(format!("monky-dist-shlibdeps-{}", std::process::id()));
    fs::create_dir_all(scratch.join("debian"))?;
    fs::write(
        scratch.join("debian/control"),
        format!("Source: {PACKAGE}\n\nPackage: {PACKAGE}\nArchitecture: any\n"),
    )?;
    let out = cmd::capture(
        Command::new("dpkg-shlibdeps")
            .args(["-O", "-e"])
            .arg(binary)
            .current_dir(&scratch),
    );
    let _ = fs::remove_dir_all(&scratch);
    let out = out.context("dpkg-shlibdeps (package dpkg-dev) is needed to compute Depends")?;
    let deps = out
        .lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .context("dpkg-shlibdeps printed no shlibs:Depends")?;
    Ok(deps.trim().to_owned())
}

fn control_file(deb_version: &str, arch: &str, shlibs: &str, size_kib: u64) -> String {
    let mut text = String::new();
    let _ = write!(
        text,
        "Package: {PACKAGE}\n\
         Version: {deb_version}\n\
         Architecture: {arch}\n\
         Maintainer: {MAINTAINER}\n\
         Installed-Size: {size_kib}\n\
         Depends: adduser, ca-certificates, {shlibs}\n\
         Recommends: docker.io | docker-ce, docker-compose (>= 2) | docker-compose-plugin, acl\n\
         Section: admin\n\
         Priority: optional\n\
         Description: on-box pull agent for Monky backends\n \
         A systemd timer runs one tick a minute: check in with tenancy over the\n \
         mesh with the box's own OpenBao token, and converge the box to the bundle\n \
         tenancy wants. An apply fetches the bundle, verifies its sha256, refuses\n \
         unsafe content, reads the environment's secrets from OpenBao, writes .env\n \
         (0600) and runs docker compose pull and up; every tick reports back.\n \
         Nothing pushes into the box, and no secret value reaches a log or report.\n"
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_has_the_fields_dpkg_needs() {
        let c = control_file("0.2.0", "amd64", "libc6 (>= 2.34)", 4242);
        for field in [
            "Package: monky-deployd\n",
            "Version: 0.2.0\n",
            "Architecture: amd64\n",
            "Installed-Size: 4242\n",
            "Depends: adduser, ca-certificates, libc6 (>= 2.34)\n",
        ] {
            assert!(c.contains(field), "{field:?} missing in\n{c}");
        }
        // Every description continuation line starts with one space; a blank one would end
        // the stanza.
        let desc: Vec<&str> = c
            .lines()
            .skip_while(|l| !l.starts_with("Description:"))
            .skip(1)
            .collect();
        assert!(!desc.is_empty());
        assert!(
            desc.iter().all(|l| l.starts_with(' ') && l.len() > 1),
            "{c}"
        );
        // lintian: extended-description-line-too-long above 80 characters.
        assert!(desc.iter().all(|l| l.len() <= 80), "{c}");
    }

    #[test]
    fn changelog_entry_is_debian_shaped() {
        let text = debian_changelog("0.2.0", "Sun, 30 Nov 2025 03:00:00 +0000");
        assert!(text.starts_with("monky-deployd (0.2.0) unstable; urgency=medium\n\n"));
        assert!(text.ends_with(&format!(
            "\n -- {MAINTAINER}  Sun, 30 Nov 2025 03:00:00 +0000\n"
        )));
        assert!(text.contains("version 0.2.0."), "{text}");
    }

    #[test]
    fn install_sh_names_the_workspace_version() {
        check_install_sh_version(&state::workspace_root(), VERSION).unwrap();
        assert!(check_install_sh_version(&state::workspace_root(), "9.9.9").is_err());
    }
}
