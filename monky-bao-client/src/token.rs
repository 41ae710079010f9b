//! The OpenBao token type, which never shows its value in `Debug` or `Display`.

use std::fmt;

use secrecy::{ExposeSecret, SecretString};

/// An OpenBao token (`s.`/`hvs.` service tokens, `b.`/`hvb.` batch tokens, or anything else
/// OpenBao hands out). `Debug` and `Display` print `Token(***)`; the value is only reachable
/// through [`Token::expose_secret`].
#[derive(Clone)]
pub struct Token(SecretString);

/// The token family, as told by the token's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenShape {
    /// `s.` (OpenBao's default) or `hvs.` service token.
    Service,
    /// `b.` or `hvb.` batch token.
    Batch,
    /// Any other shape (a legacy UUID, a root token set by hand).
    Other,
}

impl Token {
    /// Wraps a token value.
    pub fn new(value: String) -> Self {
        Token(SecretString::from(value))
    }

    /// The token value, for the `X-Vault-Token` header or the token file.
    pub fn expose_secret(&self) -> &str {
        self.0.expose_secret()
    }

    /// The token family, from the value's prefix.
    pub fn shape(&self) -> TokenShape {
        let v = self.expose_secret();
        if v.starts_with("s.") || v.starts_with("hvs.") {
            TokenShape::Service
        } else if v.starts_with("b.") || v.starts_with("hvb.") {
            TokenShape::Batch
        } else {
            TokenShape::Other
        }
    }
}

impl From<SecretString> for Token {
    fn from(value: SecretString) -> Self {
        Token(value)
    }
}

impl From<Token> for SecretString {
    fn from(value: Token) -> Self {
        value.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(***)")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_never_printed() {
        let t = Token::new("s.Zx1Qw2Er3Ty4Ui5Op6As7Df8".to_owned());
        assert_eq!(format!("{t:?}"), "Token(***)");
        assert_eq!(format!("{t}"), "Token(***)");
        assert_eq!(format!("{:?}", Some(&t)), "Some(Token(***))");
        assert_eq!(t.expose_secret(), "s.Zx1Qw2Er3Ty4Ui5Op6As7Df8");
    }

    #[test]
    fn shapes() {
        let check = |value: &str, expected: TokenShape| {
            assert_eq!(Token::new(value.to_owned()).shape(), expected, "{value}");
        };
        check("s.Zx1Qw2Er3Ty4Ui5Op6As7Df8", TokenShape::Service);
        check("hvs.CAESIND6s", TokenShape::Service);
        check("b.AAAAAQ", TokenShape::Batch);
        check("hvb.AAAAAQ", TokenShape::Batch);
        check("3f9c0b5e-0000-4000-8000-000000000000", TokenShape::Other);
    }
}
