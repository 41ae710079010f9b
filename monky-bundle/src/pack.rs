//! Writing a bundle tar, for tests, fakes and tenancy-side tooling.

use std::collections::BTreeMap;

use crate::member::MemberName;

/// Packs members into an uncompressed tar the way tenancy serves bundles: regular files with
/// plain names, mode 0644, owner 0, mtime 0, in name order. The output is deterministic, so
/// the same members always give the same bytes (and [`Bundle::parse`](crate::Bundle::parse)
/// gives back the same [`bundle_sha`](crate::bundle_sha)).
///
/// ```
/// use std::collections::BTreeMap;
/// use monky_bundle::{MemberName, pack_tar};
///
/// let files = BTreeMap::from([(MemberName::BUNDLE_JSON, br#"{"renderer":"compose"}"#.to_vec())]);
/// assert_eq!(pack_tar(&files), pack_tar(&files));
/// assert_eq!(pack_tar(&files).len() % 512, 0);
/// ```
pub fn pack_tar(files: &BTreeMap<MemberName, Vec<u8>>) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.mode(tar::HeaderMode::Deterministic);
    for (name, content) in files {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        // Known member names are short relative ASCII, and writing into a Vec cannot fail.
        header
            .set_path(name.as_str())
            .expect("a member name fits a ustar header");
        header.set_cksum();
        builder
            .append(&header, content.as_slice())
            .expect("writing to a Vec cannot fail");
    }
    builder.into_inner().expect("writing to a Vec cannot fail")
}
