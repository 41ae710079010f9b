//! Reading a bundle: the tar (optionally gzip) in memory, under limits, into checked members.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;

use sha2::{Digest, Sha256};
use tar::EntryType;

use crate::Sha;
use crate::error::Result;
use crate::limits::Limits;
use crate::manifest::Manifest;
use crate::member::MemberName;
use crate::meta::BundleMeta;
use crate::refusal::{Refusal, RefusalCode, printable};

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The bundle sha of the protocol:
/// `sha256(for name in sorted(files): name + "\0" + content + "\0")`, as a [`Sha`] (lower-case
/// hex).
///
/// Names are sorted by their bytes (the order Python's `sorted` gives for these names). This is
/// the function tenancy's Rust tooling calls to publish a bundle.
///
/// ```
/// let sha = monky_bundle::bundle_sha([("b", &b"2"[..]), ("a", &b"1"[..])]);
/// assert_eq!(sha, monky_bundle::bundle_sha([("a", &b"1"[..]), ("b", &b"2"[..])]));
/// assert_eq!(sha.as_str().len(), 64);
/// ```
pub fn bundle_sha<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Sha {
    Sha::from_digest(&bundle_digest(files))
}

/// [`bundle_sha`] as the digest's 32 bytes.
fn bundle_digest<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> [u8; 32] {
    let mut files: Vec<(&str, &[u8])> = files.into_iter().collect();
    files.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut h = Sha256::new();
    for (name, content) in files {
        h.update(name.as_bytes());
        h.update([0u8]);
        h.update(content);
        h.update([0u8]);
    }
    h.finalize().into()
}

/// A parsed, structurally valid bundle.
///
/// Holding a `Bundle` means: the tar held only regular files with known plain names, no
/// duplicates, within [`Limits`]; exactly one compose file, `.env.template`,
/// `secrets.manifest.json` and `bundle.json` are present and UTF-8; the manifest carries no
/// values; the renderer is `compose`. The refusal checks that need outside facts (desired sha,
/// provided secrets, history, free space, interpolation values) are separate calls.
#[derive(Clone)]
pub struct Bundle {
    files: BTreeMap<MemberName, Vec<u8>>,
    sha: Sha,
    /// `sha`'s 32 bytes, what [`Bundle::check_sha`] compares.
    digest: [u8; 32],
    compose_name: MemberName,
    compose: String,
    env_template: String,
    manifest: Manifest,
    meta: BundleMeta,
}

impl fmt::Debug for Bundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bundle")
            .field("sha", &self.sha.as_str())
            .field(
                "members",
                &self
                    .files
                    .keys()
                    .map(MemberName::as_str)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Bundle {
    /// Parses a bundle from the bytes tenancy served: a tar, or a gzip-compressed tar
    /// (recognised by its magic bytes).
    ///
    /// Nothing is written to disk. Limits are enforced while reading: a gzip stream is
    /// decompressed at most one byte past `limits.max_bytes`, so a gzip bomb costs no more
    /// than the limit. PAX extended headers (Python's `tarfile` default) are honoured, PAX
    /// global headers are accepted unless they try to set a member's path, link or size.
    ///
    /// Every refusal is an [`Error::Refused`](crate::Error::Refused): `BUNDLE_TOO_LARGE` for a
    /// limit, `BUNDLE_INVALID` naming the member for anything that is not a plain regular file
    /// with a known name (symlinks, hardlinks, devices, FIFOs, directories, duplicates, unknown
    /// or non-canonical names such as `./bundle.json`), for missing members and malformed JSON;
    /// `MANIFEST_VALUE_REFUSED` and `RENDERER_REFUSED` from the manifest and `bundle.json`.
    pub fn parse(bytes: &[u8], limits: &Limits) -> Result<Bundle> {
        let decompressed;
        let tar_bytes: &[u8] = if bytes.starts_with(&GZIP_MAGIC) {
            decompressed = read_limited(flate2::read::GzDecoder::new(bytes), limits.max_bytes)?;
            &decompressed
        } else {
            if bytes.len() as u64 > limits.max_bytes {
                return Err(too_large(format!("over {} bytes", limits.max_bytes)).into());
            }
            bytes
        };
        let files = read_members(tar_bytes, limits)?;
        Ok(Bundle::from_members(files)?)
    }

    /// Builds a bundle from members already proven safe (the tail of [`Bundle::parse`]).
    fn from_members(files: BTreeMap<MemberName, Vec<u8>>) -> Result<Bundle, Refusal> {
        let [yml, yaml] = MemberName::COMPOSE_FILES;
        let compose_name = match (files.contains_key(&yml), files.contains_key(&yaml)) {
            (true, false) => yml,
            (false, true) => yaml,
            (true, true) => {
                return Err(Refusal::invalid(
                    "both docker-compose.yml and compose.yaml present",
                ));
            }
            (false, false) => return Err(Refusal::invalid("missing docker-compose.yml")),
        };
        for required in [
            MemberName::ENV_TEMPLATE,
            MemberName::SECRETS_MANIFEST,
            MemberName::BUNDLE_JSON,
        ] {
            if !files.contains_key(&required) {
                return Err(Refusal::invalid(format!("missing {}", required.as_str())));
            }
        }
        for (name, content) in &files {
            if std::str::from_utf8(content).is_err() {
                return Err(Refusal::invalid(format!(
                    "{}: not utf-8 text",
                    name.as_str()
                )));
            }
        }
        let text = |name: &MemberName| {
            files
                .get(name)
                .and_then(|c| std::str::from_utf8(c).ok())
                .unwrap_or_default()
                .to_owned()
        };
        let compose = text(&compose_name);
        let env_template = text(&MemberName::ENV_TEMPLATE);
        let manifest =
            Manifest::parse(files.get(&MemberName::SECRETS_MANIFEST).map_or(&[], |v| v))?;
        let meta = BundleMeta::parse(files.get(&MemberName::BUNDLE_JSON).map_or(&[], |v| v))?;
        let digest = bundle_digest(files.iter().map(|(n, c)| (n.as_str(), c.as_slice())));
        Ok(Bundle {
            files,
            sha: Sha::from_digest(&digest),
            digest,
            compose_name,
            compose,
            env_template,
            manifest,
            meta,
        })
    }

    /// The bundle sha (see [`bundle_sha`]).
    pub fn sha(&self) -> &Sha {
        &self.sha
    }

    /// Every member and its content, in name order.
    pub fn files(&self) -> &BTreeMap<MemberName, Vec<u8>> {
        &self.files
    }

    /// `docker-compose.yml` or `compose.yaml`, whichever the bundle has.
    pub fn compose_file_name(&self) -> &str {
        self.compose_name.as_str()
    }

    /// The compose file's text.
    pub fn compose(&self) -> &str {
        &self.compose
    }

    /// The `.env.template` text.
    pub fn env_template(&self) -> &str {
        &self.env_template
    }

    /// The `.env.example` text, when the bundle has one.
    pub fn env_example(&self) -> Option<&str> {
        self.files
            .get(&MemberName::ENV_EXAMPLE)
            .and_then(|c| std::str::from_utf8(c).ok())
    }

    /// The parsed `secrets.manifest.json`.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The parsed `bundle.json`.
    pub fn meta(&self) -> &BundleMeta {
        &self.meta
    }

    /// Refuses with `BUNDLE_SHA_MISMATCH` unless the content hashes to `desired`, the 32
    /// bytes of the sha the bundle was asked for (a checked sha's digest: there is no spelling
    /// of it to trim or fold). The names give both shas' first 12 hex digits.
    pub fn check_sha(&self, desired: &[u8; 32]) -> Result<(), Refusal> {
        if self.digest == *desired {
            return Ok(());
        }
        Err(self.sha_mismatch(&hex::encode(desired)))
    }

    /// The `BUNDLE_SHA_MISMATCH` refusal of this bundle against `desired`, named by its first
    /// 12 characters: what [`Bundle::check_sha`] refuses with, for a caller whose desired text
    /// is not even a sha (an operator's typo).
    #[must_use]
    pub fn sha_mismatch(&self, desired: &str) -> Refusal {
        let desired: String = desired.chars().take(12).collect();
        Refusal::new(
            RefusalCode::BundleShaMismatch,
            [
                format!("desired {}", printable(&desired, 12)),
                // Lower-case hex: any 12 bytes are 12 characters.
                format!("content {}", self.sha.short()),
            ],
        )
    }
}

fn too_large(what: String) -> Refusal {
    Refusal::one(RefusalCode::BundleTooLarge, what)
}

/// Reads `reader` to the end, refusing as soon as more than `limit` bytes come out.
pub(crate) fn read_limited(reader: impl Read, limit: u64) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|_| Refusal::invalid("gzip: corrupt stream"))?;
    if out.len() as u64 > limit {
        return Err(too_large(format!("decompressed over {limit} bytes")));
    }
    Ok(out)
}

fn tar_error(e: &std::io::Error) -> Refusal {
    Refusal::invalid(format!("tar: {}", printable(&e.to_string(), 120)))
}

/// What an entry type is called in a refusal, or `None` for a regular file.
fn refused_type(t: EntryType) -> Option<String> {
    let what = match t {
        EntryType::Regular => return None,
        EntryType::Link => "hardlink",
        EntryType::Symlink => "symlink",
        EntryType::Char => "character device",
        EntryType::Block => "block device",
        EntryType::Directory => "directory",
        EntryType::Fifo => "fifo",
        EntryType::Continuous => "contiguous file",
        EntryType::GNUSparse => "sparse file",
        other => {
            return Some(format!(
                "unsupported entry type {:?}",
                other.as_byte() as char
            ));
        }
    };
    Some(what.to_owned())
}

/// PAX records that would change what a later member is, refused in a global header: readers
/// disagree on whether a global `path` applies, and that disagreement is an attack surface.
const GLOBAL_PAX_REFUSED: [&str; 4] = ["path", "linkpath", "size", "GNU.sparse.name"];

fn read_members(
    tar_bytes: &[u8],
    limits: &Limits,
) -> Result<BTreeMap<MemberName, Vec<u8>>, Refusal> {
    let mut archive = tar::Archive::new(tar_bytes);
    let entries = archive.entries().map_err(|e| tar_error(&e))?;
    let mut files = BTreeMap::new();
    let mut seen = 0usize;
    for entry in entries {
        let mut entry = entry.map_err(|e| tar_error(&e))?;
        seen += 1;
        if seen > limits.max_members {
            return Err(too_large(format!(
                "more than {} members",
                limits.max_members
            )));
        }
        let entry_type = entry.header().entry_type();
        if entry_type == EntryType::XGlobalHeader {
            check_global_pax(&mut entry, limits)?;
            continue;
        }
        let raw_name = entry.path_bytes().into_owned();
        let shown = printable(&String::from_utf8_lossy(&raw_name), 80);
        if let Some(what) = refused_type(entry_type) {
            return Err(Refusal::invalid(format!("{shown}: {what}")));
        }
        let name = MemberName::parse(&raw_name)?;
        if files.contains_key(&name) {
            return Err(Refusal::invalid(format!("{shown}: duplicate member")));
        }
        let size = entry.size();
        if size > limits.max_member_bytes {
            return Err(too_large(format!(
                "{shown}: over {} bytes",
                limits.max_member_bytes
            )));
        }
        let mut content = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        (&mut entry)
            .take(limits.max_member_bytes.saturating_add(1))
            .read_to_end(&mut content)
            .map_err(|e| tar_error(&e))?;
        if content.len() as u64 != size {
            return Err(Refusal::invalid(format!("{shown}: truncated member")));
        }
        files.insert(name, content);
    }
    Ok(files)
}

fn check_global_pax(entry: &mut tar::Entry<'_, &[u8]>, limits: &Limits) -> Result<(), Refusal> {
    if entry.size() > limits.max_member_bytes {
        return Err(too_large(format!(
            "pax global header over {} bytes",
            limits.max_member_bytes
        )));
    }
    let records = entry.pax_extensions().map_err(|e| tar_error(&e))?;
    for record in records.into_iter().flatten() {
        let record = record.map_err(|e| tar_error(&e))?;
        let key = record.key_bytes();
        if let Some(k) = GLOBAL_PAX_REFUSED.iter().find(|k| k.as_bytes() == key) {
            return Err(Refusal::invalid(format!("pax global header sets {k}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that never ends, standing in for a gzip bomb's output.
    struct Endless;

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            buf.fill(0);
            Ok(buf.len())
        }
    }

    #[test]
    fn read_limited_stops_one_byte_past_the_limit() {
        let err = read_limited(Endless, 1000).unwrap_err();
        assert_eq!(
            err.to_string(),
            "BUNDLE_TOO_LARGE: decompressed over 1000 bytes"
        );
        assert_eq!(read_limited(&[7u8; 1000][..], 1000).unwrap().len(), 1000);
    }

    #[test]
    fn sha_of_the_empty_set_is_sha256_of_nothing() {
        assert_eq!(
            bundle_sha(std::iter::empty()).as_str(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn sha_framing_separates_name_and_content() {
        // "a" + "bc" and "ab" + "c" must not collide.
        assert_ne!(
            bundle_sha([("a", &b"bc"[..])]),
            bundle_sha([("ab", &b"c"[..])])
        );
    }
}
