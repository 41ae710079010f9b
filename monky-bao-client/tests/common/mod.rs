//! Test support: a tiny loopback JWKS issuer that signs ES256 deploy grants, and a fake OpenBao
//! wired to the issuer.

#![allow(dead_code)] // Each test binary uses a different part of this module.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use jsonwebtoken::jwk::{Jwk, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use monky_bao_client::{BaoClient, Token};
use monky_testkit::bao::{BaoPeer, FakeBao, FakeBaoBuilder, RealBao};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use url::Url;

/// One signing key and its public JWK.
struct Key {
    kid: String,
    encoding: EncodingKey,
    jwk: Jwk,
}

impl Key {
    fn generate(kid: &str) -> Key {
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
                .expect("generate a P-256 key");
        let encoding = EncodingKey::from_ec_der(pkcs8.as_ref());
        let mut jwk = Jwk::from_encoding_key(&encoding, Algorithm::ES256).expect("jwk of the key");
        jwk.common.key_id = Some(kid.to_owned());
        jwk.common.public_key_use = Some(PublicKeyUse::Signature);
        Key {
            kid: kid.to_owned(),
            encoding,
            jwk,
        }
    }

    fn sign(&self, claims: &Value) -> SecretString {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        SecretString::from(jsonwebtoken::encode(&header, claims, &self.encoding).expect("sign"))
    }
}

/// A loopback JWKS endpoint and the keys behind it; the newest key signs.
pub struct Issuer {
    keys: Arc<Mutex<Vec<Key>>>,
    fetches: Arc<AtomicUsize>,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    url: Url,
}

impl Drop for Issuer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Issuer {
    pub fn start() -> Issuer {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind"));
        let addr = server.server_addr().to_ip().expect("ip listener");
        let url = Url::parse(&format!("http://{addr}/.well-known/agent-jwks.json")).unwrap();
        let keys = Arc::new(Mutex::new(vec![Key::generate("key-1")]));
        let fetches = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (server, keys, fetches) = (server.clone(), keys.clone(), fetches.clone());
            std::thread::spawn(move || {
                for request in server.incoming_requests() {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    let set = JwkSet {
                        keys: keys.lock().unwrap().iter().map(|k| k.jwk.clone()).collect(),
                    };
                    let body = serde_json::to_string(&set).unwrap();
                    let header =
                        tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
                    let _ =
                        request.respond(tiny_http::Response::from_string(body).with_header(header));
                }
            })
        };
        Issuer {
            keys,
            fetches,
            server,
            thread: Some(thread),
            url,
        }
    }

    pub fn jwks_url(&self) -> Url {
        self.url.clone()
    }

    /// How many times the JWKS was served.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// A deploy grant's claims for `env_id`, valid for an hour from now.
    pub fn claims(&self, env_id: &str) -> Value {
        let now = unix_now();
        json!({
            "iss": "http://tenancy.test",
            "aud": "openbao-see-env",
            "sub": format!("agent:{env_id}"),
            "env_id": env_id,
            "kind": "deploy-grant",
            "jti": format!("jti-{env_id}-{now}"),
            "iat": now,
            "exp": now + 3600,
        })
    }

    /// Signs `claims` with the newest published key.
    pub fn sign(&self, claims: &Value) -> SecretString {
        self.keys.lock().unwrap().last().unwrap().sign(claims)
    }

    /// A valid grant for `env_id`.
    pub fn grant(&self, env_id: &str) -> SecretString {
        self.sign(&self.claims(env_id))
    }

    /// Signs with a key that is not published but claims the newest key's `kid`.
    pub fn sign_forged(&self, claims: &Value) -> SecretString {
        let kid = self.keys.lock().unwrap().last().unwrap().kid.clone();
        Key::generate(&kid).sign(claims)
    }

    /// Publishes a new key, which signs from now on; the old one stays published.
    pub fn rotate(&self, kid: &str) {
        self.keys.lock().unwrap().push(Key::generate(kid));
    }
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// An issuer, an OpenBao that trusts it (a plain-HTTP [`FakeBao`] unless said otherwise), and a
/// client of it: the one set-up of this crate's tests, for the fake and the real server alike.
pub struct Setup<B = FakeBao> {
    pub issuer: Issuer,
    pub bao: B,
    pub client: BaoClient,
}

impl Setup {
    pub fn start() -> Setup {
        Setup::with(|b| b)
    }

    /// A setup whose fake is configured further by `configure`.
    pub fn with(configure: impl FnOnce(FakeBaoBuilder) -> FakeBaoBuilder) -> Setup {
        Setup::on(|jwks| configure(FakeBao::builder().jwks_url(jwks)).start())
    }
}

impl Setup<RealBao> {
    /// A setup on a real OpenBao server set up as production; `None` when
    /// [`monky_testkit::bao::real_skipped`].
    pub fn real() -> Option<Setup<RealBao>> {
        if monky_testkit::bao::real_skipped() {
            return None;
        }
        Some(Setup::on(|jwks| RealBao::builder().jwks_url(jwks).start()))
    }
}

impl<B: BaoPeer> Setup<B> {
    /// An issuer, the OpenBao `start` makes with the issuer's JWKS URL, and a client of it.
    pub fn on(start: impl FnOnce(Url) -> B) -> Setup<B> {
        let issuer = Issuer::start();
        let bao = start(issuer.jwks_url());
        let client = BaoClient::builder(bao.url()).build().unwrap();
        Setup {
            issuer,
            bao,
            client,
        }
    }

    /// The same set-up with its OpenBao behind the trait, for a suite run against both.
    pub fn boxed(self) -> Setup<Box<dyn BaoPeer>>
    where
        B: 'static,
    {
        Setup {
            issuer: self.issuer,
            bao: Box::new(self.bao),
            client: self.client,
        }
    }

    /// Logs `env_id` in with a fresh grant.
    pub fn login(&self, env_id: &str) -> Token {
        self.client
            .login_jwt("jwt-tenancy", "see-env", &self.issuer.grant(env_id))
            .unwrap_or_else(|e| panic!("{} login: {e}", self.bao.kind()))
            .token
    }

    /// The server's root token as a [`Token`].
    pub fn root(&self) -> Token {
        Token::from(self.bao.root_token())
    }
}

/// Asserts that `err` is OpenBao's policy denial of a valid token (403, the multi-error form),
/// not the plain denial of an unknown one.
pub fn assert_acl_denied(err: &monky_bao_client::Error) {
    assert_eq!(err.kind(), monky_bao_client::ErrorKind::PermissionDenied);
    assert_eq!(err.status(), Some(403));
    assert_eq!(
        err.errors(),
        ["1 error occurred:\n\t* permission denied\n\n"]
    );
    assert!(matches!(
        err,
        monky_bao_client::Error::PermissionDenied {
            multi_error: true,
            ..
        }
    ));
}

/// Asserts that neither the error's `Display` nor its `Debug` shows `secret`.
pub fn assert_hidden(err: &monky_bao_client::Error, secret: &str) {
    assert!(!err.to_string().contains(secret), "display leaks: {err}");
    assert!(!format!("{err:?}").contains(secret), "debug leaks: {err:?}");
    assert!(!format!("{err:#}").contains(secret));
}

/// The value of a secret, for assertions.
pub fn reveal(secret: &SecretString) -> &str {
    secret.expose_secret()
}
