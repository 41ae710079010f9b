//! Hard limits applied while a bundle is read, before anything trusts it.

/// Size and count limits for [`Bundle::parse`](crate::Bundle::parse).
///
/// Every limit is enforced while the bytes are being read: a gzip stream stops decompressing
/// one byte past [`max_bytes`](Self::max_bytes), and a member is never buffered beyond
/// [`max_member_bytes`](Self::max_member_bytes).
///
/// The [`Default`] is sized for a rendered compose bundle, which is a few KiB in practice:
///
/// | field | default |
/// | --- | --- |
/// | `max_bytes` | 4 MiB (4 194 304) of tar stream, after decompression |
/// | `max_members` | 64 tar entries (PAX global headers count too) |
/// | `max_member_bytes` | 2 MiB (2 097 152) per member |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest tar stream accepted, counted on the decompressed bytes when the bundle is gzip.
    pub max_bytes: u64,
    /// Largest number of entries the tar stream may hold.
    pub max_members: usize,
    /// Largest single member.
    pub max_member_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 4 * 1024 * 1024,
            max_members: 64,
            max_member_bytes: 2 * 1024 * 1024,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_matches_the_documented_numbers() {
        let l = Limits::default();
        assert_eq!(l.max_bytes, 4_194_304);
        assert_eq!(l.max_members, 64);
        assert_eq!(l.max_member_bytes, 2_097_152);
    }
}
