//! The bundle sha: the one checked spelling of a bundle's content hash, from the wire to disk.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A bundle sha as tenancy names it: exactly 64 lowercase hex digits.
///
/// A checkin answer whose `desired_sha` is anything else does not decode, so no padded,
/// upper-case or non-ASCII spelling can slip past a comparison with a release's own sha or
/// become part of a directory name. It has no string-like traits beyond [`Sha::as_str`] and
/// `Display`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sha(String);

/// Why a text is not a [`Sha`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a sha is exactly 64 lowercase hex digits (got {len} bytes{})", if *.hex { "" } else { ", not all lowercase hex" })]
pub struct ShaError {
    /// The length of the text in bytes.
    pub len: usize,
    /// Whether every byte was a lowercase hex digit.
    pub hex: bool,
}

impl Sha {
    /// The number of hex digits in a sha.
    pub const LEN: usize = 64;

    /// Accepts exactly 64 lowercase hex digits, nothing around them.
    ///
    /// # Errors
    /// [`ShaError`] for anything else.
    pub fn parse(text: &str) -> Result<Self, ShaError> {
        let hex = text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if hex && text.len() == Self::LEN {
            Ok(Sha(text.to_owned()))
        } else {
            Err(ShaError {
                len: text.len(),
                hex,
            })
        }
    }

    /// The sha that spells `digest`: what a bundle's own content hash becomes.
    #[must_use]
    pub fn from_digest(digest: &[u8; 32]) -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut text = String::with_capacity(Self::LEN);
        for byte in digest {
            text.push(char::from(DIGITS[usize::from(byte >> 4)]));
            text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
        }
        Sha(text)
    }

    /// The 64 hex digits.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 digits, as logs show a sha.
    #[must_use]
    pub fn short(&self) -> &str {
        // Every byte is ASCII, so any index is a character boundary.
        &self.0[..12]
    }

    /// The 32 bytes the digits spell, as a bundle's own digest is compared with them.
    #[must_use]
    pub fn digest(&self) -> [u8; 32] {
        // Every digit is `0-9a-f`, checked when the sha was made.
        let nibble = |b: u8| {
            if b.is_ascii_digit() {
                b - b'0'
            } else {
                b - b'a' + 10
            }
        };
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(self.0.as_bytes().chunks_exact(2)) {
            *byte = (nibble(pair[0]) << 4) | nibble(pair[1]);
        }
        out
    }
}

impl fmt::Display for Sha {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Sha {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Sha {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Sha::parse(&text).map_err(|e| serde::de::Error::custom(format!("desired_sha: {e}")))
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Sha {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Sha".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A bundle sha: exactly 64 lowercase hex digits.",
            "type": "string",
            "pattern": "^[0-9a-f]{64}$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sha_spells_its_digest() {
        let sha = Sha::parse(&format!("00ff7a{}", "10".repeat(29))).unwrap();
        let mut want = [0x10u8; 32];
        want[..3].copy_from_slice(&[0x00, 0xff, 0x7a]);
        assert_eq!(sha.digest(), want);
        assert_eq!(Sha::from_digest(&want), sha);
    }
}
