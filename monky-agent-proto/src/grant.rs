//! Deploy grants (feature `grant`): the ES256 JWT tenancy signs at kit reveal and on every lease,
//! and which OpenBao's `jwt-tenancy` mount turns into the agent's token.
//!
//! - [`GrantClaims`]: the claims, as OpenBao's role `see-env` binds them (audience
//!   [`AUDIENCE`], `kind` [`KIND`], user claim `env_id`, `jti` mapped into the token's
//!   metadata as `grant_jti`), valid for [`TTL`].
//! - [`GrantSigner`]: a P-256 key that signs grants (ES256, with its `kid` in the header) and
//!   publishes its public half as the JWK Set the mount's `jwks_url` serves
//!   ([`GrantSigner::jwks`], tenancy's `GET /.well-known/agent-jwks.json`).
//!
//! The agent never signs: it reads a grant from disk or a lease and hands it to OpenBao as is.
//! This module is for tenancy's tooling and the test kit, so both mint exactly what OpenBao
//! accepts.
//!
//! ```
//! use monky_agent_proto::grant::{GrantClaims, GrantSigner, AUDIENCE};
//!
//! let signer = GrantSigner::generate().unwrap();
//! let claims = GrantClaims::new("https://tenancy.example", "env-qa-02").unwrap();
//! let jwt = signer.sign(&claims).unwrap();
//! assert_eq!(claims.aud, AUDIENCE);
//! assert_eq!(signer.jwks()["keys"][0]["kid"], signer.kid());
//! # use secrecy::ExposeSecret;
//! assert_eq!(jwt.expose_secret().split('.').count(), 3);
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use jsonwebtoken::jwk::{Jwk, JwkSet, PublicKeyUse, ThumbprintHash};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};

/// The grants' audience: the OpenBao role's `bound_audiences`.
pub const AUDIENCE: &str = "openbao-see-env";
/// The grants' `kind` claim: the OpenBao role's `bound_claims`.
pub const KIND: &str = "deploy-grant";
/// How long a grant is valid after it is signed.
pub const TTL: Duration = Duration::from_secs(3600);

/// Why a grant could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// The system's random source failed (key or `jti` generation).
    #[error("the system random source failed")]
    Random,
    /// The key could not be made, read or turned into a JWK.
    #[error("the signing key: {0}")]
    Key(String),
    /// The claims could not be signed.
    #[error("signing the grant: {0}")]
    Sign(String),
}

/// A deploy grant's claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantClaims {
    /// The issuer: tenancy's base URL.
    pub iss: String,
    /// Always [`AUDIENCE`].
    pub aud: String,
    /// `agent:<env_id>`.
    pub sub: String,
    /// The environment the token will be bound to (the role's `user_claim`).
    pub env_id: String,
    /// Always [`KIND`].
    pub kind: String,
    /// Single-use id; OpenBao copies it into the token's metadata as `grant_jti`, which tenancy
    /// compares against its current grants.
    pub jti: String,
    /// Issued at, seconds since the epoch.
    pub iat: u64,
    /// Expiry, seconds since the epoch: `iat` + [`TTL`].
    pub exp: u64,
}

impl GrantClaims {
    /// A grant for `env_id` issued by `issuer` now, with a fresh random `jti`.
    ///
    /// # Errors
    /// [`GrantError::Random`] when the random source fails.
    pub fn new(issuer: &str, env_id: &str) -> Result<Self, GrantError> {
        let mut jti = [0u8; 16];
        SystemRandom::new()
            .fill(&mut jti)
            .map_err(|_| GrantError::Random)?;
        let jti = jti.iter().map(|b| format!("{b:02x}")).collect();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Self::at(issuer, env_id, jti, now))
    }

    /// A grant for `env_id` with the given `jti`, issued at `iat` (seconds since the epoch).
    #[must_use]
    pub fn at(issuer: &str, env_id: &str, jti: String, iat: u64) -> Self {
        Self {
            iss: issuer.to_owned(),
            aud: AUDIENCE.to_owned(),
            sub: format!("agent:{env_id}"),
            env_id: env_id.to_owned(),
            kind: KIND.to_owned(),
            jti,
            iat,
            exp: iat.saturating_add(TTL.as_secs()),
        }
    }
}

/// An ES256 signing key for grants and its public JWK Set.
pub struct GrantSigner {
    key: EncodingKey,
    kid: String,
    jwks: serde_json::Value,
}

impl std::fmt::Debug for GrantSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantSigner")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl GrantSigner {
    /// A new random P-256 key.
    ///
    /// # Errors
    /// [`GrantError::Key`] when the key cannot be generated.
    pub fn generate() -> Result<Self, GrantError> {
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
                .map_err(|e| GrantError::Key(e.to_string()))?;
        Self::from_pkcs8_der(pkcs8.as_ref())
    }

    /// The key from its PKCS#8 DER form (tenancy's stored key).
    ///
    /// # Errors
    /// [`GrantError::Key`] when it is not a P-256 key.
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Self, GrantError> {
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der)
            .map_err(|e| GrantError::Key(format!("not a P-256 PKCS#8 key: {e}")))?;
        let key = EncodingKey::from_ec_der(der);
        let mut jwk = Jwk::from_encoding_key(&key, Algorithm::ES256)
            .map_err(|e| GrantError::Key(e.to_string()))?;
        // The RFC 7638 thumbprint: stable for the key, so a restart publishes the same kid.
        let kid = jwk
            .thumbprint(ThumbprintHash::SHA256)
            .map_err(|e| GrantError::Key(e.to_string()))?;
        jwk.common.key_id = Some(kid.clone());
        jwk.common.public_key_use = Some(PublicKeyUse::Signature);
        let jwks = serde_json::to_value(JwkSet { keys: vec![jwk] })
            .map_err(|e| GrantError::Key(e.to_string()))?;
        Ok(Self { key, kid, jwks })
    }

    /// The key id carried in each grant's header and in the JWK.
    #[must_use]
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The JWK Set with this key's public half: the document OpenBao's `jwks_url` serves.
    #[must_use]
    pub fn jwks(&self) -> &serde_json::Value {
        &self.jwks
    }

    /// Signs `claims` (ES256, `kid` in the header).
    ///
    /// # Errors
    /// [`GrantError::Sign`] when signing fails.
    pub fn sign(&self, claims: &GrantClaims) -> Result<SecretString, GrantError> {
        self.sign_claims(claims)
    }

    /// Signs any claims with this key, e.g. a deliberately wrong grant for a test.
    ///
    /// # Errors
    /// [`GrantError::Sign`] when the claims cannot be serialised or signed.
    pub fn sign_claims<T: Serialize>(&self, claims: &T) -> Result<SecretString, GrantError> {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.key)
            .map(SecretString::from)
            .map_err(|e| GrantError::Sign(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{DecodingKey, Validation};
    use secrecy::ExposeSecret;

    #[test]
    fn a_grant_verifies_with_its_jwks_and_carries_what_the_role_binds() {
        let signer = GrantSigner::generate().unwrap();
        let claims = GrantClaims::new("https://tenancy.test", "env-qa-02").unwrap();
        let jwt = signer.sign(&claims).unwrap();
        let set: JwkSet = serde_json::from_value(signer.jwks().clone()).unwrap();
        let header = jsonwebtoken::decode_header(jwt.expose_secret()).unwrap();
        assert_eq!(header.alg, Algorithm::ES256);
        let jwk = set.find(header.kid.as_deref().unwrap()).unwrap();
        let mut v = Validation::new(Algorithm::ES256);
        v.set_audience(&[AUDIENCE]);
        let got = jsonwebtoken::decode::<GrantClaims>(
            jwt.expose_secret(),
            &DecodingKey::from_jwk(jwk).unwrap(),
            &v,
        )
        .unwrap()
        .claims;
        assert_eq!(got, claims);
        assert_eq!(got.kind, KIND);
        assert_eq!(got.sub, "agent:env-qa-02");
        assert_eq!(got.exp - got.iat, 3600);
        assert_eq!(got.jti.len(), 32);
        assert_ne!(
            GrantClaims::new("i", "e").unwrap().jti,
            GrantClaims::new("i", "e").unwrap().jti
        );
    }

    #[test]
    fn the_kid_is_the_keys_own() {
        let a = GrantSigner::generate().unwrap();
        let b = GrantSigner::generate().unwrap();
        assert_ne!(a.kid(), b.kid());
        assert!(!format!("{a:?}").contains("key:"));
    }
}
